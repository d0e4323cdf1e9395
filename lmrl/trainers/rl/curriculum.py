"""Online difficulty curriculum for `lmrl rl` (RLHF book §7.2.3, practice 2): a prompt whose group just scored
outside [lo, hi] sits out the next ``curriculum_sit_out`` epochs.

A prompt every sample solves, or none does, gives its group zero advantage: sampling it again soon spends a
rollout on nothing. After each step every prompt of the batch has a group pass rate (the mean reward of its G
samples; with a 0/1 verifier, the fraction solved). Prompts outside ``curriculum=[lo, hi]`` are skipped when the
data order reaches them during the next ``curriculum_sit_out`` epochs, then come back (a model that improved may
now sometimes solve a hard one, or sometimes fail an easy one).

The data order is `common.epoch_batch_indices`' (one seeded permutation per epoch), read from a cursor, so with
no prompt sitting out the batches are exactly those of a run without the curriculum; the cursor and the
sit-outs are checkpointed (exact resume).
"""

from __future__ import annotations

from typing import Any

import torch


class Curriculum:
    def __init__(self, num_rows: int, seed: int, lo: float, hi: float, sit_out: int = 1):
        self.num_rows, self.seed, self.lo, self.hi, self.sit_out = num_rows, seed, lo, hi, sit_out
        self.cursor = 0  # position in the endless stream of epoch permutations
        self.returns_at: dict[int, int] = {}  # row -> first epoch in which it is drawn again
        self._perm: tuple[int, list[int]] | None = None
        self.last_skipped = 0

    def _row_at(self, position: int) -> tuple[int, int]:
        """(epoch, row) at a stream position: the same permutations as `common.epoch_batch_indices`."""
        epoch, offset = divmod(position, self.num_rows)
        if self._perm is None or self._perm[0] != epoch:
            generator = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
            self._perm = (epoch, torch.randperm(self.num_rows, generator=generator).tolist())
        return epoch, self._perm[1][offset]

    def next_batch(self, size: int) -> list[int]:
        """The next ``size`` rows of the data order that are not sitting out (all rows, if every one is)."""
        rows, skipped = [], 0
        while len(rows) < size:
            if skipped >= self.num_rows:  # every prompt is out of range: the curriculum has nothing to offer
                self.returns_at.clear()
            epoch, row = self._row_at(self.cursor)
            self.cursor += 1
            if self.returns_at.get(row, 0) > epoch:
                skipped += 1
                continue
            rows.append(row)
        self.last_skipped = skipped
        return rows

    def record(self, rows: list[int], pass_rates: list[float]) -> None:
        """After a step: each prompt's group pass rate; out-of-range prompts sit out the next epochs."""
        epoch = (self.cursor - 1) // self.num_rows
        for row, rate in zip(rows, pass_rates):
            if rate < self.lo or rate > self.hi:
                self.returns_at[row] = epoch + 1 + self.sit_out
            else:
                self.returns_at.pop(row, None)

    def metrics(self) -> dict[str, float]:
        epoch = self.cursor // self.num_rows
        return {
            "rollout/curriculum_skipped": float(self.last_skipped),
            "rollout/curriculum_sitting_out": float(sum(e > epoch for e in self.returns_at.values())),
        }

    def state_dict(self) -> dict[str, Any]:
        return {"cursor": self.cursor, "returns_at": dict(self.returns_at)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.cursor, self.returns_at = int(state["cursor"]), {int(k): int(v) for k, v in state["returns_at"].items()}

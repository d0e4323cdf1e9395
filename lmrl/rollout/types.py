"""Engine-independent rollout types: what to sample (`SamplingParams`) and what came out (`RolloutBatch`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

FINISH_REASONS = ("stop", "length")


@dataclass
class SamplingParams:
    """How to sample completions. Checked on construction; a bad value raises ValueError."""

    max_new_tokens: int = 64
    """Maximum completion length in tokens; a row that reaches it without a stop is `truncated`."""
    temperature: float = 1.0
    """Logits are divided by it before sampling (>0). With `greedy`, it only scales the stored log-probs (0 means 1)."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p (0 < top_p <= 1; 1 = off)."""
    top_k: int = 0
    """Keep only the k most likely tokens (0 = off)."""
    stop_strings: tuple[str, ...] = ()
    """A row stops once its decoded completion contains one of these; the text is cut before it, the tokens are kept."""
    stop_token_ids: tuple[int, ...] | None = None
    """Token ids that end a row (the stop token is part of the completion). None = the tokenizer's eos; () = none."""
    greedy: bool = False
    """Take the argmax instead of sampling (top_k/top_p are then irrelevant)."""

    def __post_init__(self) -> None:
        if isinstance(self.stop_strings, str):
            self.stop_strings = (self.stop_strings,)
        self.stop_strings = tuple(self.stop_strings)
        if self.stop_token_ids is not None:
            self.stop_token_ids = tuple(int(i) for i in self.stop_token_ids)
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(
                f"SamplingParams.max_new_tokens must be a positive int, got {self.max_new_tokens!r}. "
                "It is the maximum number of tokens generated per completion; set it to e.g. 64."
            )
        if not self.greedy and not self.temperature > 0:
            raise ValueError(
                f"SamplingParams.temperature must be > 0 when sampling, got {self.temperature!r}. "
                "Use greedy=True for argmax decoding instead of temperature=0."
            )
        if self.greedy and self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature!r}.")
        if not 0 < self.top_p <= 1:
            raise ValueError(
                f"SamplingParams.top_p must be in (0, 1], got {self.top_p!r}. "
                "Use top_p=1.0 to disable nucleus sampling."
            )
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"SamplingParams.top_k must be an int >= 0 (0 disables it), got {self.top_k!r}.")
        if any(not isinstance(s, str) or s == "" for s in self.stop_strings):
            raise ValueError(
                f"SamplingParams.stop_strings must be non-empty strings, got {self.stop_strings!r}. "
                "Remove empty entries (an empty stop string would stop every row at once)."
            )
        if self.stop_token_ids is not None and any(i < 0 for i in self.stop_token_ids):
            raise ValueError(f"SamplingParams.stop_token_ids must be token ids >= 0, got {self.stop_token_ids!r}.")

    @property
    def logp_temperature(self) -> float:
        """The temperature of the distribution whose log-probs are stored (greedy with temperature 0 -> 1)."""
        return self.temperature if self.temperature > 0 else 1.0


@dataclass(frozen=True, eq=False)
class RolloutBatch:
    """N = num_prompts * group_size sampled completions, prompt-major: rows i*G..(i+1)*G-1 belong to prompt i.

    `input_ids` / `attention_mask` give the concatenated prompt+completion sequence (N, P+T) for learner
    forward passes; completion token j sits at position P+j and is predicted by the logits at P+j-1.
    """

    prompt_ids: torch.Tensor
    """LongTensor (N, P): prompt tokens, left-padded with the pad id."""
    prompt_mask: torch.Tensor
    """LongTensor (N, P): 1 on real prompt tokens, 0 on left padding."""
    completion_ids: torch.Tensor
    """LongTensor (N, T): sampled tokens, right-padded with the pad id after the row ended."""
    completion_mask: torch.Tensor
    """FloatTensor (N, T): 1 on real completion tokens, including the sampled stop token; 0 on padding."""
    sampler_logp: torch.Tensor
    """FloatTensor (N, T): log-prob of each sampled token under the temperature-scaled FULL distribution,
    log_softmax(logits / temperature), i.e. what the learner recomputes. With top-k/top-p this is not the
    log-prob under the truncated distribution that was actually sampled from. 0 on padding."""
    truncated: torch.Tensor
    """BoolTensor (N,): the row hit max_new_tokens without a stop token or stop string."""
    finish_reason: list[str]
    """N entries, "stop" or "length"."""
    prompts: list[str]
    """N decoded prompts (one per row, repeated within a group), without padding."""
    completions: list[str]
    """N decoded completions: special tokens skipped, cut before the first stop string."""
    group_size: int
    """G, completions per prompt."""
    linear_outputs: Any = None
    """`lmrl.models.replay.LinearOutputs` of the sampling forwards, when the engine was asked to record them;
    an on-policy update reuses them instead of recomputing the layers' matmuls. None otherwise."""
    loss_mask: torch.Tensor | None = None
    """FloatTensor (N, T) or None: 1 on the completion tokens the policy loss trains. Multi-turn rollouts set it
    (0 on tool outputs and other environment tokens, which stay in `completion_mask` for attention);
    None = `completion_mask` (single-turn)."""
    info: list[dict] | None = None
    """N dicts of per-trajectory details from multi-turn rollouts (turn spans, transcript, finish); else None."""

    def __post_init__(self) -> None:
        n, p = self.prompt_ids.shape
        t = self.completion_ids.shape[1]
        checks = {
            "prompt_mask": (self.prompt_mask.shape, (n, p)),
            "completion_ids": (self.completion_ids.shape, (n, t)),
            "completion_mask": (self.completion_mask.shape, (n, t)),
            "sampler_logp": (self.sampler_logp.shape, (n, t)),
            "truncated": (self.truncated.shape, (n,)),
            **({"loss_mask": (self.loss_mask.shape, (n, t))} if self.loss_mask is not None else {}),
        }
        for name, (got, want) in checks.items():
            if tuple(got) != want:
                raise ValueError(f"RolloutBatch.{name} has shape {tuple(got)}, expected {want} (N={n}, P={p}, T={t}).")
        for name in ("finish_reason", "prompts", "completions", "info"):
            if getattr(self, name) is not None and len(getattr(self, name)) != n:
                raise ValueError(
                    f"RolloutBatch.{name} has {len(getattr(self, name))} entries, expected one per row (N={n})."
                )
        if self.group_size < 1 or n % self.group_size:
            raise ValueError(
                f"RolloutBatch.group_size={self.group_size} does not divide the number of rows N={n}; "
                "rows must be prompt-major groups of group_size completions."
            )
        bad = set(self.finish_reason) - set(FINISH_REASONS)
        if bad:
            raise ValueError(f"RolloutBatch.finish_reason has unknown values {sorted(bad)}; allowed: {FINISH_REASONS}.")

    def __len__(self) -> int:
        return self.prompt_ids.shape[0]

    @property
    def num_prompts(self) -> int:
        """B = N / G."""
        return len(self) // self.group_size

    @property
    def train_mask(self) -> torch.Tensor:
        """FloatTensor (N, T): the tokens the loss trains (`loss_mask`, or `completion_mask` when it is None)."""
        return self.completion_mask if self.loss_mask is None else self.loss_mask

    @property
    def completion_lengths(self) -> torch.Tensor:
        """LongTensor (N,): number of real completion tokens per row."""
        return self.completion_mask.sum(dim=1).long()

    @property
    def input_ids(self) -> torch.Tensor:
        """LongTensor (N, P+T): prompt followed by completion."""
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        """LongTensor (N, P+T): prompt_mask followed by completion_mask."""
        return torch.cat([self.prompt_mask, self.completion_mask.to(self.prompt_mask.dtype)], dim=1)

    def select(self, indices: Sequence[int] | torch.Tensor) -> RolloutBatch:
        """The sub-batch of rows `indices` (ints, or a bool mask of shape (N,)), in the order given.

        group_size is kept when the selection is whole groups in order (each run of G indices is
        i*G, ..., i*G+G-1 for some prompt i); otherwise the result has group_size 1.
        """
        n = len(self)
        idx = torch.as_tensor(indices, dtype=torch.long if not _is_bool(indices) else torch.bool)
        if idx.dtype == torch.bool:
            if idx.shape != (n,):
                raise ValueError(f"RolloutBatch.select: a bool mask must have shape ({n},), got {tuple(idx.shape)}.")
            idx = idx.nonzero().squeeze(1)
        idx = idx.reshape(-1).cpu()
        if idx.numel() and (idx.min() < 0 or idx.max() >= n):
            raise ValueError(
                f"RolloutBatch.select: row indices must be in [0, {n}), got min {idx.min()} max {idx.max()}."
            )
        g = self.group_size
        keeps_groups = False
        if idx.numel() % g == 0:
            chunks = idx.view(-1, g)  # (groups, G)
            keeps_groups = bool((chunks == chunks[:, :1] + torch.arange(g)).all() and (chunks[:, 0] % g == 0).all())
        rows = idx.tolist()
        dev = self.prompt_ids.device
        take = idx.to(dev)
        return RolloutBatch(
            prompt_ids=self.prompt_ids[take],
            prompt_mask=self.prompt_mask[take],
            completion_ids=self.completion_ids[take],
            completion_mask=self.completion_mask[take],
            sampler_logp=self.sampler_logp[take],
            truncated=self.truncated[take],
            finish_reason=[self.finish_reason[i] for i in rows],
            prompts=[self.prompts[i] for i in rows],
            completions=[self.completions[i] for i in rows],
            group_size=g if keeps_groups else 1,
            linear_outputs=None if self.linear_outputs is None else self.linear_outputs.select(take),
            loss_mask=None if self.loss_mask is None else self.loss_mask[take],
            info=None if self.info is None else [self.info[i] for i in rows],
        )

    def trimmed(self) -> RolloutBatch:
        """The same rows with the completion columns after the longest row's last token removed (right padding
        only: same tokens, same masks); itself when there are none. The recorded linear outputs are kept whole
        (`lmrl.models.replay` replays a prefix of them)."""
        width = int(self.completion_mask.any(dim=0).nonzero().max()) + 1 if self.completion_mask.any() else 1
        if width == self.completion_ids.shape[1]:
            return self
        cut = {
            name: getattr(self, name)[:, :width]
            for name in ("completion_ids", "completion_mask", "sampler_logp", "loss_mask")
            if getattr(self, name) is not None
        }
        return dataclasses.replace(self, **cut)

    def select_groups(self, groups: Sequence[int] | torch.Tensor) -> RolloutBatch:
        """The sub-batch of whole prompt groups `groups` (prompt indices, or a bool mask of shape (B,))."""
        g_idx = torch.as_tensor(groups, dtype=torch.long if not _is_bool(groups) else torch.bool).reshape(-1).cpu()
        if g_idx.dtype == torch.bool:
            if g_idx.shape != (self.num_prompts,):
                raise ValueError(
                    f"RolloutBatch.select_groups: a bool mask must have shape ({self.num_prompts},), "
                    f"got {tuple(g_idx.shape)}."
                )
            g_idx = g_idx.nonzero().squeeze(1)
        if g_idx.numel() and (g_idx.min() < 0 or g_idx.max() >= self.num_prompts):
            raise ValueError(f"RolloutBatch.select_groups: group indices must be in [0, {self.num_prompts}).")
        rows = (g_idx[:, None] * self.group_size + torch.arange(self.group_size)).reshape(-1)  # (len(groups) * G,)
        return self.select(rows)


def _is_bool(x: Sequence[int] | torch.Tensor) -> bool:
    if isinstance(x, torch.Tensor):
        return x.dtype == torch.bool
    return len(x) > 0 and all(isinstance(v, bool) for v in x)


def concat_batches(batches: Sequence[RolloutBatch], pad_id: int) -> RolloutBatch:
    """The rows of ``batches`` in order as one batch (same group size, no recorded linear outputs): prompts are
    left-padded and completions right-padded with ``pad_id`` (masked) to the widest."""
    if len(batches) == 1:
        return batches[0]
    p = max(b.prompt_ids.shape[1] for b in batches)
    t = max(b.completion_ids.shape[1] for b in batches)

    def cat(name: str, width: int, left: bool, value: float) -> torch.Tensor:
        parts = [getattr(b, name) for b in batches]
        pad = [(width - x.shape[1], 0) if left else (0, width - x.shape[1]) for x in parts]
        return torch.cat([torch.nn.functional.pad(x, w, value=value) for x, w in zip(parts, pad)])

    def join(name: str) -> list | None:
        return None if batches[0].__dict__[name] is None else [v for b in batches for v in getattr(b, name)]

    has_loss_mask = batches[0].loss_mask is not None
    return RolloutBatch(
        prompt_ids=cat("prompt_ids", p, True, pad_id),
        prompt_mask=cat("prompt_mask", p, True, 0),
        completion_ids=cat("completion_ids", t, False, pad_id),
        completion_mask=cat("completion_mask", t, False, 0),
        sampler_logp=cat("sampler_logp", t, False, 0),
        truncated=torch.cat([b.truncated for b in batches]),
        finish_reason=join("finish_reason"),
        prompts=join("prompts"),
        completions=join("completions"),
        group_size=batches[0].group_size,
        loss_mask=cat("loss_mask", t, False, 0) if has_loss_mask else None,
        info=join("info"),
    )

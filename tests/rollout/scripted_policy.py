"""A scripted policy behind the engine interface: it 'samples' fixed replies, one per turn, for tests."""

from __future__ import annotations

import torch

from lmrl.rollout.types import RolloutBatch


class ScriptedEngine:
    """generate() answers the k-th call with replies[row][k] (text + the end-of-turn token), in token ids of
    `tokenizer`, with log-prob -0.5 per token; a reply ending in '...' is cut without its end-of-turn token
    (finish 'length'). Rows are matched to scripts by the order of the prompts they were first given."""

    device = torch.device("cpu")
    model = None  # no model: no context limit

    def __init__(self, tokenizer, replies: list[list[str]]):
        self.tokenizer, self.replies = tokenizer, replies
        self.calls = 0
        self.contexts: list[list[list[int]]] = []
        self.row_of: dict[tuple[int, ...], int] = {}
        self.turn_of = [0] * len(replies)

    def generate(self, prompt_ids, params, n=1, generator=None):
        assert n == 1
        self.contexts.append([list(p) for p in prompt_ids])
        rows = []
        for p in prompt_ids:
            row = next((r for r, k in self.row_of.items() if tuple(p[: len(r)]) == r), None)
            if row is None:
                row = tuple(p)
                self.row_of[row] = len(self.row_of)
            rows.append(self.row_of[row])
        outs, finish = [], []
        for r in rows:
            text = self.replies[r][self.turn_of[r]]
            self.turn_of[r] += 1
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            if text.endswith("..."):
                finish.append("length")
            else:
                ids = ids + [self.tokenizer.eos_token_id]
                finish.append("stop")
            outs.append(ids[: params.max_new_tokens])
            if len(ids) > params.max_new_tokens:
                finish[-1] = "length"
        t = max(len(o) for o in outs)
        comp = torch.zeros(len(outs), t, dtype=torch.long)
        mask = torch.zeros(len(outs), t)
        for i, o in enumerate(outs):
            comp[i, : len(o)] = torch.tensor(o)
            mask[i, : len(o)] = 1
        prompt = torch.ones(len(outs), 1, dtype=torch.long)
        return RolloutBatch(prompt_ids=prompt, prompt_mask=prompt, completion_ids=comp, completion_mask=mask,
                            sampler_logp=-0.5 * mask, truncated=torch.tensor([f == "length" for f in finish]),
                            finish_reason=finish, prompts=["p"] * len(outs),
                            completions=[self.tokenizer.decode(o, skip_special_tokens=True) for o in outs],
                            group_size=1)

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
        return scripted_batch(self.tokenizer, outs, finish)


def scripted_batch(tokenizer, outs: list[list[int]], finish: list[str], group_size: int = 1) -> RolloutBatch:
    """The `RolloutBatch` of completions ``outs`` (token ids) after a one-token prompt, right-padded."""
    t = max(len(o) for o in outs)
    comp = torch.zeros(len(outs), t, dtype=torch.long)
    mask = torch.zeros(len(outs), t)
    for i, o in enumerate(outs):
        comp[i, : len(o)] = torch.tensor(o)
        mask[i, : len(o)] = 1
    prompt = torch.ones(len(outs), 1, dtype=torch.long)
    return RolloutBatch(
        prompt_ids=prompt,
        prompt_mask=prompt,
        completion_ids=comp,
        completion_mask=mask,
        sampler_logp=-0.5 * mask,
        truncated=torch.tensor([f == "length" for f in finish]),
        finish_reason=finish,
        prompts=["p"] * len(outs),
        completions=[tokenizer.decode(o, skip_special_tokens=True) for o in outs],
        group_size=group_size,
    )


class CalculatorPolicy:
    """Stands in for HFEngine(model, tokenizer, ...) on `tool_arithmetic` with `tool_parser=pythonic`: it calls the
    calculator with the problem's expression, then answers with the tool's output when the first operand is even
    and 0 when it is odd (so the accuracy is the share of even first operands). Sampled turns (not greedy) answer 0
    with probability 1/2 instead, drawn from the generator."""

    device = torch.device("cpu")
    model = None  # no context limit

    def __init__(self, model=None, tokenizer=None, autocast_dtype=None, **_):
        self.tokenizer = tokenizer

    @staticmethod
    def reply(context: str, lucky: bool) -> str:
        import re

        expression = re.findall(r"user\n(\d+\*\d+)=", context)[-1]
        said = re.findall(r"<\|im_start\|>tool\n(.*?)<\|im_end\|>", context, re.S)
        if not said:
            return f"[calculator(expression='{expression}')]"
        return said[-1] if int(expression.split("*")[0]) % 2 == 0 and lucky else "0"

    def generate(self, prompt_ids, params, n=1, generator=None):
        outs = []
        for ids in prompt_ids:
            context = self.tokenizer.decode(ids)
            for _ in range(n):
                lucky = params.greedy or bool(torch.rand(1, generator=generator) < 0.5)
                text = self.reply(context, lucky)
                outs.append(self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id])
        return scripted_batch(self.tokenizer, outs, ["stop"] * len(outs), group_size=n)

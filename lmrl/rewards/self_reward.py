"""Quality self-reward R_Q of Language Self-Play: a frozen model grades each (query, answer) on 7 points.

Kuba et al. 2025 (arXiv 2509.07414, §2 and Box 3): the reference model reviews the interaction
with an additive 7-point integer scale (base 0, +1 per criterion that holds), justifies itself
in at most 100 words, writes ``<Calculation>1+0+...=k</Calculation>`` and ends with
``<Score>k</Score>``. The prompt below is our paraphrase (the paper's exact text is not public
as code). The score is the integer in the LAST ``<Score>`` tag; a judgement with no such tag, or
a value outside 0..7, is a parse failure and gets ``fallback`` (default 0: the paper does not
say, `spec/language-self-play.md` §2.2). Failures are counted (``last_stats`` per call, logged
by `RewardSet` as ``reward/<name>/parse_failures``; ``failures`` over the run).

    judge = SelfReward(ref_model, tokenizer, fallback=0.0)
    scores = judge(queries, answers)          # list of floats in 0..7 (or the fallback)
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import torch

from lmrl.data.prompt_format import PromptFormat
from lmrl.rollout.engines.hf import HFEngine, SamplingParams

MAX_SCORE = 7

QUALITY_PROMPT = """Review the user-assistant interaction below and grade it with an additive 7-point integer score. Start from 0 and add one point for each criterion that holds:
1. The task is identifiable from the instruction.
2. The instruction is clear, specific and well-structured.
3. The user will be able to understand the response.
4. The response addresses a significant portion of the instruction.
5. The response usefully and comprehensively answers the core elements of the instruction.
6. The response is clearly written, concise, well organized and helpful.
7. The user will likely like the form and style of the response.

<Instruction>{instruction}</Instruction>
<Response>{response}</Response>

Justify your grade in at most 100 words. Then write the sum of the points as <Calculation>1+0+...=k</Calculation> and end with <Score>k</Score>, where k is an integer from 0 to 7."""
"""Box 3 of the paper, paraphrased; ``{instruction}`` and ``{response}`` are filled in."""

_SCORE = re.compile(r"<Score>\s*([+-]?\d+)\s*</Score>", re.IGNORECASE)


def quality_prompt(instruction: str, response: str, template: str = QUALITY_PROMPT) -> str:
    """The judge's prompt for one interaction (plain replacement: braces in the texts stay as they are)."""
    return template.replace("{instruction}", instruction).replace("{response}", response)


def parse_score(judgement: str, max_score: int = MAX_SCORE) -> int | None:
    """The integer k of the last ``<Score>k</Score>`` in ``judgement`` if 0 <= k <= max_score, else None."""
    found = _SCORE.findall(judgement) if isinstance(judgement, str) else []
    if not found:
        return None
    k = int(found[-1])
    return k if 0 <= k <= max_score else None


class SelfReward:
    """A reward function ``fn(prompts, completions, **columns) -> list[float]`` judged by a frozen model.

    model, tokenizer: the judge (in LSP the frozen reference model). template: the judge prompt with
    ``{instruction}`` and ``{response}`` (default `QUALITY_PROMPT`). fallback: the score of an
    unparseable judgement. Judgements are greedy, at most ``max_new_tokens`` tokens, ``batch_size``
    prompts per generate call. After each call ``last_stats`` holds ``parse_failures`` and
    ``parse_fail_frac`` of that call, ``last_judgements`` the judge's texts; ``failures`` counts all.
    """

    __name__ = "self_reward"

    def __init__(
        self,
        model,
        tokenizer,
        *,
        template: str = QUALITY_PROMPT,
        fallback: float = 0.0,
        max_new_tokens: int = 256,
        batch_size: int = 16,
        autocast_dtype: torch.dtype | None = None,
    ):
        missing = [key for key in ("{instruction}", "{response}") if key not in template]
        if missing:
            raise ValueError(
                f"The self-reward judge prompt must contain {missing} where the query and the answer go; "
                "fix `judge_prompt` (or leave it at 'lsp' for the paper's 7-point prompt)."
            )
        if batch_size < 1 or max_new_tokens < 1:
            raise ValueError(
                f"SelfReward: batch_size and max_new_tokens must be >= 1, got {batch_size}, {max_new_tokens}."
            )
        self.model, self.tokenizer, self.template = model, tokenizer, template
        self.fallback, self.batch_size = float(fallback), batch_size
        self.engine = HFEngine(model, tokenizer, autocast_dtype=autocast_dtype)
        self.params = SamplingParams(max_new_tokens=max_new_tokens, greedy=True)
        self.failures = 0
        self.last_stats: dict[str, float] = {}
        self.last_judgements: list[str] = []

    def judge(self, instructions: Sequence[str], responses: Sequence[str]) -> list[str]:
        """The judge's raw texts for each (instruction, response)."""
        texts: list[str] = []
        for start in range(0, len(responses), self.batch_size):
            ids = [
                PromptFormat().ids(self.tokenizer, quality_prompt(q, a, self.template))
                for q, a in zip(
                    instructions[start : start + self.batch_size], responses[start : start + self.batch_size]
                )
            ]
            texts += self.engine.generate(ids, self.params, n=1).completions
        return texts

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **columns: Any) -> list[float]:
        if len(prompts) != len(completions):
            raise ValueError(f"SelfReward: {len(prompts)} prompts but {len(completions)} completions; give one each.")
        self.last_judgements = self.judge(list(prompts), list(completions)) if completions else []
        scores = [parse_score(text) for text in self.last_judgements]
        failed = sum(s is None for s in scores)
        self.failures += failed
        self.last_stats = {"parse_failures": float(failed), "parse_fail_frac": failed / max(1, len(scores))}
        return [float(s) if s is not None else self.fallback for s in scores]

"""LLM judges: pairwise verdicts with position swapping, and weighted-rubric scores.

**Pairwise** (RLHF book ch. 5 "generative reward models" and ch. 12; MT-Bench, Zheng et al. 2023): the judge
reads a question and two answers, is told to ignore the order, the length and any names, to explain briefly and
to end with ``[[A]]``, ``[[B]]`` or ``[[C]]`` (tie). Decoding is greedy (temperature 0, spec §3). The verdict of
one judgement is its LAST tag (`parse_verdict`); no tag is a parse failure. With ``swap=True`` each pair is
judged twice, as (a, b) and as (b, a), and `combine_verdicts` keeps a win only when both orders agree:

    order (a, b) \\ order (b, a) mapped back |  A     B     tie   fail
    A                                      |  A     tie   tie   None
    B                                      |  tie   B     tie   None
    tie (C)                                |  tie   tie   tie   None
    fail                                   |  None  None  None  None

(MT-Bench's conservative rule: a disagreement between the orders is position bias, so it is a tie and is
counted as ``inconsistent``.) A pair whose verdict is None is a judge failure: counted (``failures``, and
``parse_failures`` per judgement), never raised; callers skip it or give it a fallback.

**Rubric** (ch. 12, spec §4): criteria with weights w_i (negative for pitfalls). The judge rates each criterion
0..``max_score`` and writes one tag ``[[i: s_i]]`` per criterion (the last tag of an id counts; a value out of
range is unparsed). With P the parsed criteria and s_i scaled to [0, 1] (s_i / max_score):

    score = Σ_{i∈P} w_i·s_i / Σ_{i∈P, w_i>0} w_i          (the spec's suggested aggregation, over parsed ones)

so with positive weights it is the weighted mean in [0, 1], and a met pitfall subtracts. If no positive-weight
criterion parses, the sample gets ``fallback`` and counts as a parse failure.

    judge = PairwiseJudge(model, tokenizer)                  # any HF causal LM or built-in model
    judge.judge(prompts, answers_a, answers_b)               # ["A", "tie", None, ...]
    rubric = RubricJudge(model, tokenizer, [{"title": "Correct", "weight": 3}, "Concise"])
    rubric(prompts, completions)                             # a RewardFn: list of floats

As rewards (`lmrl.rewards.REWARDS`): ``judge`` (completion vs a reference column: 1 win, 0.5 tie, 0 loss) and
``rubric``; both take ``model=PATH`` (the judge) and log ``reward/<name>/parse_failures``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from lmrl.rewards.columns import get_column
from lmrl.rewards.judge_text import (
    PAIRWISE_PROMPT,
    RUBRIC_PROMPT,
    Verdict,
    aggregate_rubric,
    check_template,
    combine_verdicts,
    disagree,
    fill,
    format_criteria,
    parse_rubric,
    parse_rubric_scores,
    parse_verdict,
    question_text,
    single_verdict,
)
from lmrl.rewards.registry import RewardFn, register_reward

# ----------------------------------------------------------------------------- judges


class GreedyGenerator:
    """Greedy judgements (temperature 0) from a causal LM, `batch_size` prompts per generate call."""

    def __init__(
        self, model, tokenizer, max_new_tokens: int, batch_size: int, chat: bool, autocast_dtype: torch.dtype | None
    ):
        from lmrl.rollout.engines.hf import HFEngine, SamplingParams  # loads transformers: import on use

        if batch_size < 1 or max_new_tokens < 1:
            raise ValueError(
                f"A judge needs batch_size >= 1 and max_new_tokens >= 1, got {batch_size}, {max_new_tokens}."
            )
        self.tokenizer, self.chat, self.batch_size = tokenizer, chat, batch_size
        self.engine = HFEngine(model, tokenizer, autocast_dtype=autocast_dtype)
        self.params = SamplingParams(max_new_tokens=max_new_tokens, greedy=True)

    def __call__(self, texts: Sequence[str]) -> list[str]:
        from lmrl.data.prompt_format import PromptFormat

        out: list[str] = []
        prompt_format = PromptFormat(self.chat)
        for start in range(0, len(texts), self.batch_size):
            chunk = texts[start : start + self.batch_size]
            ids = [prompt_format.ids(self.tokenizer, t) for t in chunk]
            out += self.engine.generate(ids, self.params, n=1).completions
        return out


class PairwiseJudge:
    """Pairwise LLM-as-judge with the MT-Bench-style prompt and position swapping (module docstring).

    model, tokenizer: any HF causal LM or built-in model. prompt: a template with ``{question}``,
    ``{answer_a}``, ``{answer_b}``. swap: judge both orders and combine (`combine_verdicts`). chat: render the
    judge prompt with the tokenizer's chat template. After each `judge` call: ``last_stats`` (parse_failures,
    failures, inconsistent, ties, *_frac), ``last_judgements`` (texts, order (a, b) then (b, a)); over the run:
    ``parse_failures`` (unparsed judgements) and ``failures`` (pairs with no verdict). generate: replaces
    the local model (model, tokenizer may then be None), e.g. `remote.chat_generator` (an OpenAI-compatible server).
    """

    def __init__(
        self,
        model,
        tokenizer,
        prompt: str = PAIRWISE_PROMPT,
        swap: bool = True,
        *,
        max_new_tokens: int = 256,
        batch_size: int = 16,
        chat: bool = True,
        autocast_dtype: torch.dtype | None = None,
        generate: Callable[[Sequence[str]], list[str]] | None = None,
    ):
        check_template(prompt, ("question", "answer_a", "answer_b"), "pairwise")
        self.prompt, self.swap = prompt, swap
        self.generate = generate or GreedyGenerator(model, tokenizer, max_new_tokens, batch_size, chat, autocast_dtype)
        self.parse_failures = 0
        self.failures = 0
        self.last_stats: dict[str, float] = {}
        self.last_judgements: list[str] = []

    def judge(
        self,
        prompts: Sequence[Any],
        answers_a: Sequence[str],
        answers_b: Sequence[str],
        context: Sequence[Mapping[str, str]] | None = None,
    ) -> list[Verdict]:
        """Per pair "A" (a better), "B", "tie", or None (judge failure, counted). ``context``: per pair, values of
        further ``{keys}`` of the prompt template (e.g. Constitutional AI's ``{principles}``)."""
        n = len(prompts)
        context = context if context is not None else [{}] * n
        if len(answers_a) != n or len(answers_b) != n:
            raise ValueError(
                f"PairwiseJudge.judge: {n} prompts, {len(answers_a)} answers_a and {len(answers_b)} "
                "answers_b; give one answer of each per prompt."
            )
        questions = [question_text(p) for p in prompts]
        texts = [
            fill(self.prompt, question=q, answer_a=a, answer_b=b, **c)
            for q, a, b, c in zip(questions, answers_a, answers_b, context)
        ]
        if self.swap:
            texts += [
                fill(self.prompt, question=q, answer_a=b, answer_b=a, **c)
                for q, a, b, c in zip(questions, answers_a, answers_b, context)
            ]
        self.last_judgements = self.generate(texts) if n else []
        letters = [parse_verdict(t) for t in self.last_judgements]
        if self.swap:
            verdicts = [combine_verdicts(x, y) for x, y in zip(letters[:n], letters[n:])]
            inconsistent = sum(disagree(x, y) for x, y in zip(letters[:n], letters[n:]))
        else:
            verdicts, inconsistent = [single_verdict(x) for x in letters], 0
        unparsed, failed = sum(x is None for x in letters), sum(v is None for v in verdicts)
        self.parse_failures += unparsed
        self.failures += failed
        self.last_stats = {
            "parse_failures": float(unparsed),
            "parse_fail_frac": unparsed / max(1, len(letters)),
            "failures": float(failed),
            "inconsistent": float(inconsistent),
            "inconsistent_frac": inconsistent / max(1, n),
            "tie_frac": sum(v == "tie" for v in verdicts) / max(1, n),
        }
        return verdicts


class RubricJudge:
    """A reward function ``fn(prompts, completions, **columns) -> list[float]``: weighted-rubric scores.

    criteria: a fixed rubric (`parse_rubric` input), or None to read each sample's rubric from the ``rubric``
    column (per-prompt rubrics, book ch. 12). max_score: the top grade per criterion. fallback: the score of a
    sample with no parsed positive-weight criterion. After each call ``last_stats`` holds ``parse_failures``
    (samples given the fallback), ``parse_fail_frac`` and ``missing_criteria`` (unparsed criteria over all
    samples); ``failures`` counts fallbacks over the run, ``last_judgements`` keeps the texts. generate: as in
    `PairwiseJudge`.
    """

    __name__ = "rubric"

    def __init__(
        self,
        model,
        tokenizer,
        criteria: Any = None,
        prompt: str = RUBRIC_PROMPT,
        *,
        max_score: float = 10,
        fallback: float = 0.0,
        max_new_tokens: int = 256,
        batch_size: int = 16,
        chat: bool = True,
        autocast_dtype: torch.dtype | None = None,
        generate: Callable[[Sequence[str]], list[str]] | None = None,
    ):
        check_template(prompt, ("question", "answer", "criteria"), "rubric")
        if not max_score > 0:
            raise ValueError(f"RubricJudge: max_score must be > 0, got {max_score!r}.")
        self.criteria = None if criteria is None else parse_rubric(criteria)
        self.prompt, self.max_score, self.fallback = prompt, float(max_score), float(fallback)
        self.generate = generate or GreedyGenerator(model, tokenizer, max_new_tokens, batch_size, chat, autocast_dtype)
        self.failures = 0
        self.last_stats: dict[str, float] = {}
        self.last_judgements: list[str] = []

    def __call__(self, prompts: Sequence[Any], completions: Sequence[str], **columns: Any) -> list[float]:
        n = len(completions)
        if len(prompts) != n:
            raise ValueError(f"RubricJudge: {len(prompts)} prompts but {n} completions; give one each.")
        if self.criteria is not None:
            rubrics = [self.criteria] * n
        else:
            raw = get_column(
                columns,
                "rubric",
                n,
                "rubric",
                "It holds each sample's criteria; or set reward_kwargs.rubric.criteria for one rubric for all samples.",
            )
            rubrics = [parse_rubric(r, f"rubric of sample {i}") for i, r in enumerate(raw)]
        max_text = f"{self.max_score:g}"
        texts = [
            fill(self.prompt, question=question_text(p), answer=c, criteria=format_criteria(r), max_score=max_text)
            for p, c, r in zip(prompts, completions, rubrics)
        ]
        self.last_judgements = self.generate(texts) if n else []
        scores, missing = [], 0
        for text, rubric in zip(self.last_judgements, rubrics):
            parsed = parse_rubric_scores(text, len(rubric), self.max_score)
            missing += sum(s is None for s in parsed)
            scores.append(aggregate_rubric(parsed, [c.weight for c in rubric], self.max_score))
        failed = sum(s is None for s in scores)
        self.failures += failed
        self.last_stats = {
            "parse_failures": float(failed),
            "parse_fail_frac": failed / max(1, n),
            "missing_criteria": float(missing),
        }
        return [self.fallback if s is None else s for s in scores]


# ----------------------------------------------------------------------------- registered rewards


def load_judge_model(path: str, seed: int = 0):
    """(model, tokenizer) of a judge: a local path, a cached hub id, or a built-in model (random: garbage
    verdicts, useful for tests), frozen in eval mode."""
    from lmrl.models.setup import ModelSetup

    return ModelSetup(seed=seed).judge(path)


VERDICT_REWARD = {"A": 1.0, "tie": 0.5, "B": 0.0}
"""`judge` reward of a completion (answer a) against the reference (answer b): win 1, tie 0.5, loss 0."""


def verdict_reward(pairwise: PairwiseJudge, reference: str, fallback: float, name: str) -> RewardFn:
    """The reward ``name`` from ``pairwise``'s verdicts: r_i = `VERDICT_REWARD` of completion_i (answer a) against
    the ``reference`` column's answer (answer b), ``fallback`` for a failed verdict; ``last_stats`` after each
    call, and the judge as ``pairwise``."""

    def reward(prompts: Sequence[Any], completions: Sequence[str], **columns: Any) -> list[float]:
        refs = get_column(
            columns,
            reference,
            len(completions),
            name,
            f"It holds the reference answer each completion is compared with (reward_kwargs.{name}.reference "
            "names the column).",
        )
        verdicts = pairwise.judge(prompts, completions, [str(r) for r in refs])
        reward.last_stats = dict(pairwise.last_stats)
        return [fallback if v is None else VERDICT_REWARD[v] for v in verdicts]

    reward.__name__ = name
    reward.last_stats = {}
    reward.pairwise = pairwise
    return reward


@register_reward("judge")
def make_judge_reward(
    model: str,
    reference: str = "chosen",
    prompt: str = PAIRWISE_PROMPT,
    swap: bool = True,
    fallback: float = 0.5,
    max_new_tokens: int = 256,
    batch_size: int = 16,
    precision: str = "auto",
    seed: int = 0,
) -> RewardFn:
    """`judge`: r_i = 1 if the judge prefers completion_i to the `reference` column's answer in both orders,
    0 if it prefers the reference, 0.5 otherwise (`VERDICT_REWARD`); a failed verdict gets `fallback`.

    A win rate against a reference (AlpacaEval-style). Options: `model` (judge path), `reference` (column),
    `prompt`, `swap`, `max_new_tokens`, `batch_size`, `precision`, `seed` (built-in judge init).
    """
    from lmrl.models import autocast_dtype

    judge_model, tokenizer = load_judge_model(model, seed)
    pairwise = PairwiseJudge(
        judge_model,
        tokenizer,
        prompt,
        swap,
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
        autocast_dtype=autocast_dtype(precision),
    )
    return verdict_reward(pairwise, reference, fallback, "judge")


@register_reward("rubric")
def make_rubric_reward(
    model: str,
    criteria: Any = None,
    prompt: str = RUBRIC_PROMPT,
    max_score: float = 10,
    fallback: float = 0.0,
    max_new_tokens: int = 256,
    batch_size: int = 16,
    precision: str = "auto",
    seed: int = 0,
) -> RewardFn:
    """`rubric`: r_i = the weighted rubric score of completion_i (module docstring) graded by the judge `model`;
    `criteria` (one rubric for all samples) or a `rubric` column per sample; failures get `fallback`."""
    from lmrl.models import autocast_dtype

    judge_model, tokenizer = load_judge_model(model, seed)
    return RubricJudge(
        judge_model,
        tokenizer,
        criteria,
        prompt,
        max_score=max_score,
        fallback=fallback,
        max_new_tokens=max_new_tokens,
        batch_size=batch_size,
        autocast_dtype=autocast_dtype(precision),
    )

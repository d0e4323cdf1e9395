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
``rubric``; both take ``model=PATH`` (the judge) and log ``rewards/<name>/parse_failures``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import torch

from lmrl.rewards.columns import get_column
from lmrl.rewards.registry import RewardFn, register_reward

Verdict = Literal["A", "B", "tie"] | None

PAIRWISE_PROMPT = """You are an impartial judge. Compare the two AI assistant answers below to the user's question and decide which one answers it better: more helpful, relevant, accurate and detailed. Do not let the order of the answers, their length or the assistants' names sway you. Explain your comparison briefly, then give your final verdict in exactly this form: [[A]] if assistant A is better, [[B]] if assistant B is better, [[C]] for a tie.

[Question]
{question}

[Answer of assistant A]
{answer_a}

[Answer of assistant B]
{answer_b}"""
"""Our paraphrase of the MT-Bench pairwise judge prompt (RLHF book ch. 5); ``{question}``, ``{answer_a}``,
``{answer_b}`` are filled in."""

RUBRIC_PROMPT = """You are an impartial grader. Grade the answer to the user's question below against each criterion, from 0 (not met at all) to {max_score} (fully met). For a pitfall criterion, grade how much the answer falls into the pitfall. Explain briefly, then write one tag per criterion in exactly this form: [[1: score]] [[2: score]] and so on.

[Question]
{question}

[Answer]
{answer}

[Criteria]
{criteria}"""
"""Rubric grading prompt; ``{question}``, ``{answer}``, ``{criteria}`` (numbered) and ``{max_score}``."""

_VERDICT = re.compile(r"\[\[\s*([ABC])\s*\]\]")
_RUBRIC_TAG = re.compile(r"\[\[\s*(\d+)\s*:\s*([+-]?\d+(?:\.\d+)?)\s*\]\]")
_SWAP = {"A": "B", "B": "A", "C": "C"}  # a verdict letter of the order (b, a) in terms of (a, b)
_CHATML_USER = re.compile(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", re.DOTALL)


# ----------------------------------------------------------------------------- pure parsing


def parse_verdict(text: str) -> Literal["A", "B", "C"] | None:
    """The letter of the LAST ``[[A]]``/``[[B]]``/``[[C]]`` tag in `text` (spaces inside allowed), else None."""
    found = _VERDICT.findall(text) if isinstance(text, str) else []
    return found[-1] if found else None


def combine_verdicts(first: str | None, swapped: str | None) -> Verdict:
    """One pair's verdict from the (a, b) judgement and the (b, a) judgement (module table).

    `first`, `swapped`: parsed letters "A"/"B"/"C" or None; in `swapped` "A" names answer b.
    """
    if first is None or swapped is None:
        return None
    back = _SWAP[swapped]  # the swapped order's verdict in (a, b) terms
    return first if first == back and first != "C" else "tie"


def disagree(first: str | None, swapped: str | None) -> bool:
    """Both orders parsed but name different winners (position bias): A/B, A/tie, B/tie in (a, b) terms."""
    return first is not None and swapped is not None and first != _SWAP[swapped]


def single_verdict(letter: str | None) -> Verdict:
    """A verdict from one order only (``swap=False``): C is a tie."""
    return None if letter is None else ("tie" if letter == "C" else letter)


def parse_rubric_scores(text: str, num_criteria: int, max_score: float) -> list[float | None]:
    """Per criterion 1..n the value of its LAST ``[[i: s]]`` tag if 0 <= s <= max_score, else None."""
    scores: list[float | None] = [None] * num_criteria
    for idx, value in (_RUBRIC_TAG.findall(text) if isinstance(text, str) else []):
        i = int(idx) - 1
        if 0 <= i < num_criteria:
            v = float(value)
            scores[i] = v if 0 <= v <= max_score else None
    return scores


def aggregate_rubric(scores: Sequence[float | None], weights: Sequence[float], max_score: float) -> float | None:
    """Σ_{i∈P} w_i·(s_i/max_score) / Σ_{i∈P, w_i>0} w_i over the parsed criteria P; None if no w_i > 0 is in P.

    Spec §4 (RLHF book ch. 12 gives no rule; this is the spec's suggestion, restricted to parsed criteria).
    """
    if len(scores) != len(weights):
        raise ValueError(f"aggregate_rubric: {len(scores)} scores for {len(weights)} weights; give one per criterion.")
    parsed = [(w, s / max_score) for s, w in zip(scores, weights) if s is not None]
    positive = sum(w for w, _ in parsed if w > 0)
    if positive <= 0:
        return None
    return sum(w * s for w, s in parsed) / positive


def question_text(prompt: Any) -> str:
    """The user's question in a prompt: a string as is (a ChatML-rendered one: its last user turn), or the
    content of the last user message of a message list."""
    if isinstance(prompt, str):
        turns = _CHATML_USER.findall(prompt)
        return turns[-1] if turns else prompt
    if isinstance(prompt, Sequence):
        users = [m.get("content", "") for m in prompt if isinstance(m, Mapping) and m.get("role") == "user"]
        if users:
            return str(users[-1])
    raise ValueError(f"A judge needs a prompt as text or a message list with a user turn, got {prompt!r}.")


def fill(template: str, **values: Any) -> str:
    """`template` with each ``{key}`` replaced in ONE pass: braces inside the inserted texts stay as they are
    (an answer containing "{answer_b}" is not substituted again; str.format would also choke on "{x}")."""
    pattern = re.compile("|".join(re.escape("{" + k + "}") for k in values))
    return pattern.sub(lambda m: str(values[m.group(0)[1:-1]]), template)


def _check_template(template: str, keys: Sequence[str], what: str) -> None:
    missing = [f"{{{k}}}" for k in keys if f"{{{k}}}" not in template]
    if missing:
        raise ValueError(f"The {what} judge prompt must contain {missing} where those texts go; fix the prompt "
                         "or leave it at its default.")


# ----------------------------------------------------------------------------- rubrics


@dataclasses.dataclass(frozen=True)
class Criterion:
    """One rubric item (book ch. 12 schema A): a title, a description, a weight (negative for pitfalls)."""

    title: str
    description: str = ""
    weight: float = 1.0


def parse_rubric(items: Any, where: str = "rubric") -> list[Criterion]:
    """Criteria from a list of `Criterion`, strings (weight 1), or dicts {title | criterion, description,
    weight} (a JSON string of such a list is accepted); errors name the item."""
    if isinstance(items, str):
        try:
            items = json.loads(items)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where}: not a list of criteria and not valid JSON ({err}).") from None
    if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Sequence) or not items:
        raise ValueError(f"{where}: a rubric is a non-empty list of criteria (strings or {{title, description, "
                         f"weight}} dicts), got {items!r}.")
    out = []
    for i, item in enumerate(items, 1):
        if isinstance(item, Criterion):
            crit = item
        elif isinstance(item, str) and item.strip():
            crit = Criterion(item.strip())
        elif isinstance(item, Mapping) and str(item.get("title") or item.get("criterion") or "").strip():
            unknown = set(item) - {"title", "criterion", "description", "weight", "reasoning"}
            if unknown:
                raise ValueError(f"{where}: criterion {i} has unknown keys {sorted(unknown)}; use title, "
                                 "description, weight.")
            weight = item.get("weight", 1.0)
            if isinstance(weight, bool) or not isinstance(weight, (int, float)):
                raise ValueError(f"{where}: criterion {i} has weight {weight!r}; give a number (negative for a pitfall).")
            crit = Criterion(str(item.get("title") or item["criterion"]).strip(), str(item.get("description", "")),
                             float(weight))
        else:
            raise ValueError(f"{where}: criterion {i} is {item!r}; give a string or a dict with a title.")
        if not math.isfinite(crit.weight) or crit.weight == 0:
            raise ValueError(f"{where}: criterion {i} ({crit.title!r}) has weight {crit.weight}; use a finite "
                             "non-zero number (negative for a pitfall).")
        out.append(crit)
    if not any(c.weight > 0 for c in out):
        raise ValueError(f"{where}: every weight is negative; a rubric needs at least one positive criterion "
                         "(the score is normalised by the positive weights).")
    return out


def format_criteria(criteria: Sequence[Criterion]) -> str:
    """Numbered criteria for the prompt: ``1. Title: description`` (pitfalls marked)."""
    lines = []
    for i, c in enumerate(criteria, 1):
        kind = " (pitfall)" if c.weight < 0 else ""
        lines.append(f"{i}. {c.title}{kind}" + (f": {c.description}" if c.description else ""))
    return "\n".join(lines)


# ----------------------------------------------------------------------------- judges


class GreedyGenerator:
    """Greedy judgements (temperature 0) from a causal LM, `batch_size` prompts per generate call."""

    def __init__(self, model, tokenizer, max_new_tokens: int, batch_size: int, chat: bool,
                 autocast_dtype: torch.dtype | None):
        from lmrl.rollout.hf import HFEngine, SamplingParams  # loads transformers: import on use

        if batch_size < 1 or max_new_tokens < 1:
            raise ValueError(f"A judge needs batch_size >= 1 and max_new_tokens >= 1, got {batch_size}, "
                             f"{max_new_tokens}.")
        self.tokenizer, self.chat, self.batch_size = tokenizer, chat, batch_size
        self.engine = HFEngine(model, tokenizer, autocast_dtype=autocast_dtype)
        self.params = SamplingParams(max_new_tokens=max_new_tokens, greedy=True)

    def __call__(self, texts: Sequence[str]) -> list[str]:
        from lmrl.data.chat import render_prompt

        out: list[str] = []
        for start in range(0, len(texts), self.batch_size):
            chunk = texts[start : start + self.batch_size]
            rendered = [render_prompt(self.tokenizer, t) if self.chat else t for t in chunk]
            ids = [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t in rendered]
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

    def __init__(self, model, tokenizer, prompt: str = PAIRWISE_PROMPT, swap: bool = True, *,
                 max_new_tokens: int = 256, batch_size: int = 16, chat: bool = True,
                 autocast_dtype: torch.dtype | None = None, generate: Callable[[Sequence[str]], list[str]] | None = None):
        _check_template(prompt, ("question", "answer_a", "answer_b"), "pairwise")
        self.prompt, self.swap = prompt, swap
        self.generate = generate or GreedyGenerator(model, tokenizer, max_new_tokens, batch_size, chat, autocast_dtype)
        self.parse_failures = 0
        self.failures = 0
        self.last_stats: dict[str, float] = {}
        self.last_judgements: list[str] = []

    def judge(self, prompts: Sequence[Any], answers_a: Sequence[str], answers_b: Sequence[str],
              context: Sequence[Mapping[str, str]] | None = None) -> list[Verdict]:
        """Per pair "A" (a better), "B", "tie", or None (judge failure, counted). ``context``: per pair, values of
        further ``{keys}`` of the prompt template (e.g. Constitutional AI's ``{principles}``)."""
        n = len(prompts)
        context = context if context is not None else [{}] * n
        if len(answers_a) != n or len(answers_b) != n:
            raise ValueError(f"PairwiseJudge.judge: {n} prompts, {len(answers_a)} answers_a and {len(answers_b)} "
                             "answers_b; give one answer of each per prompt.")
        questions = [question_text(p) for p in prompts]
        texts = [fill(self.prompt, question=q, answer_a=a, answer_b=b, **c)
                 for q, a, b, c in zip(questions, answers_a, answers_b, context)]
        if self.swap:
            texts += [fill(self.prompt, question=q, answer_a=b, answer_b=a, **c)
                      for q, a, b, c in zip(questions, answers_a, answers_b, context)]
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
        self.last_stats = {"parse_failures": float(unparsed), "parse_fail_frac": unparsed / max(1, len(letters)),
                           "failures": float(failed), "inconsistent": float(inconsistent),
                           "inconsistent_frac": inconsistent / max(1, n),
                           "tie_frac": sum(v == "tie" for v in verdicts) / max(1, n)}
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

    def __init__(self, model, tokenizer, criteria: Any = None, prompt: str = RUBRIC_PROMPT, *,
                 max_score: float = 10, fallback: float = 0.0, max_new_tokens: int = 256, batch_size: int = 16,
                 chat: bool = True, autocast_dtype: torch.dtype | None = None,
                 generate: Callable[[Sequence[str]], list[str]] | None = None):
        _check_template(prompt, ("question", "answer", "criteria"), "rubric")
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
            raw = get_column(columns, "rubric", n, "rubric", "It holds each sample's criteria; or set "
                             "reward_kwargs.rubric.criteria for one rubric for all samples.")
            rubrics = [parse_rubric(r, f"rubric of sample {i}") for i, r in enumerate(raw)]
        max_text = f"{self.max_score:g}"
        texts = [fill(self.prompt, question=question_text(p), answer=c, criteria=format_criteria(r),
                      max_score=max_text) for p, c, r in zip(prompts, completions, rubrics)]
        self.last_judgements = self.generate(texts) if n else []
        scores, missing = [], 0
        for text, rubric in zip(self.last_judgements, rubrics):
            parsed = parse_rubric_scores(text, len(rubric), self.max_score)
            missing += sum(s is None for s in parsed)
            scores.append(aggregate_rubric(parsed, [c.weight for c in rubric], self.max_score))
        failed = sum(s is None for s in scores)
        self.failures += failed
        self.last_stats = {"parse_failures": float(failed), "parse_fail_frac": failed / max(1, n),
                           "missing_criteria": float(missing)}
        return [self.fallback if s is None else s for s in scores]


# ----------------------------------------------------------------------------- registered rewards


def load_judge_model(path: str, seed: int = 0):
    """(model, tokenizer) of a judge: a local path, a cached hub id, or a built-in model (random: garbage
    verdicts, useful for tests), frozen in eval mode."""
    from lmrl.models.setup import ModelSetup

    return ModelSetup(seed=seed).judge(path)


VERDICT_REWARD = {"A": 1.0, "tie": 0.5, "B": 0.0}
"""`judge` reward of a completion (answer a) against the reference (answer b): win 1, tie 0.5, loss 0."""


@register_reward("judge")
def make_judge_reward(model: str, reference: str = "chosen", prompt: str = PAIRWISE_PROMPT, swap: bool = True,
                      fallback: float = 0.5, max_new_tokens: int = 256, batch_size: int = 16,
                      precision: str = "auto", seed: int = 0) -> RewardFn:
    """`judge`: r_i = 1 if the judge prefers completion_i to the `reference` column's answer in both orders,
    0 if it prefers the reference, 0.5 otherwise (`VERDICT_REWARD`); a failed verdict gets `fallback`.

    A win rate against a reference (AlpacaEval-style). Options: `model` (judge path), `reference` (column),
    `prompt`, `swap`, `max_new_tokens`, `batch_size`, `precision`, `seed` (built-in judge init).
    """
    from lmrl.models import autocast_dtype

    judge_model, tokenizer = load_judge_model(model, seed)
    pairwise = PairwiseJudge(judge_model, tokenizer, prompt, swap, max_new_tokens=max_new_tokens,
                             batch_size=batch_size, autocast_dtype=autocast_dtype(precision))

    def judge(prompts: Sequence[Any], completions: Sequence[str], **columns: Any) -> list[float]:
        refs = get_column(columns, reference, len(completions), "judge",
                          "It holds the reference answer each completion is compared with (reward_kwargs.judge."
                          "reference names the column).")
        verdicts = pairwise.judge(prompts, completions, [str(r) for r in refs])
        judge.last_stats = dict(pairwise.last_stats)
        return [fallback if v is None else VERDICT_REWARD[v] for v in verdicts]

    judge.last_stats = {}
    judge.pairwise = pairwise
    return judge


@register_reward("rubric")
def make_rubric_reward(model: str, criteria: Any = None, prompt: str = RUBRIC_PROMPT, max_score: float = 10,
                       fallback: float = 0.0, max_new_tokens: int = 256, batch_size: int = 16,
                       precision: str = "auto", seed: int = 0) -> RewardFn:
    """`rubric`: r_i = the weighted rubric score of completion_i (module docstring) graded by the judge `model`;
    `criteria` (one rubric for all samples) or a `rubric` column per sample; failures get `fallback`."""
    from lmrl.models import autocast_dtype

    judge_model, tokenizer = load_judge_model(model, seed)
    return RubricJudge(judge_model, tokenizer, criteria, prompt, max_score=max_score, fallback=fallback,
                       max_new_tokens=max_new_tokens, batch_size=batch_size, autocast_dtype=autocast_dtype(precision))

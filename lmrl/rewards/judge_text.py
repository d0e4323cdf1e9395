"""What an LLM judge reads and writes, as text: the default prompts, the parsing of its verdict and rubric tags,
the aggregation of rubric scores, and rubric criteria. Pure string functions (no model, no torch); the rules, with
the table of combined verdicts and the rubric formula, are in `lmrl.rewards.judge`, whose judges run them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

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
    for idx, value in _RUBRIC_TAG.findall(text) if isinstance(text, str) else []:
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


def check_template(template: str, keys: Sequence[str], what: str) -> None:
    missing = [f"{{{k}}}" for k in keys if f"{{{k}}}" not in template]
    if missing:
        raise ValueError(
            f"The {what} judge prompt must contain {missing} where those texts go; fix the prompt "
            "or leave it at its default."
        )


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
        raise ValueError(
            f"{where}: a rubric is a non-empty list of criteria (strings or {{title, description, "
            f"weight}} dicts), got {items!r}."
        )
    out = []
    for i, item in enumerate(items, 1):
        if isinstance(item, Criterion):
            crit = item
        elif isinstance(item, str) and item.strip():
            crit = Criterion(item.strip())
        elif isinstance(item, Mapping) and str(item.get("title") or item.get("criterion") or "").strip():
            unknown = set(item) - {"title", "criterion", "description", "weight", "reasoning"}
            if unknown:
                raise ValueError(
                    f"{where}: criterion {i} has unknown keys {sorted(unknown)}; use title, description, weight."
                )
            weight = item.get("weight", 1.0)
            if isinstance(weight, bool) or not isinstance(weight, (int, float)):
                raise ValueError(
                    f"{where}: criterion {i} has weight {weight!r}; give a number (negative for a pitfall)."
                )
            crit = Criterion(
                str(item.get("title") or item["criterion"]).strip(), str(item.get("description", "")), float(weight)
            )
        else:
            raise ValueError(f"{where}: criterion {i} is {item!r}; give a string or a dict with a title.")
        if not math.isfinite(crit.weight) or crit.weight == 0:
            raise ValueError(
                f"{where}: criterion {i} ({crit.title!r}) has weight {crit.weight}; use a finite "
                "non-zero number (negative for a pitfall)."
            )
        out.append(crit)
    if not any(c.weight > 0 for c in out):
        raise ValueError(
            f"{where}: every weight is negative; a rubric needs at least one positive criterion "
            "(the score is normalised by the positive weights)."
        )
    return out


def format_criteria(criteria: Sequence[Criterion]) -> str:
    """Numbered criteria for the prompt: ``1. Title: description`` (pitfalls marked)."""
    lines = []
    for i, c in enumerate(criteria, 1):
        kind = " (pitfall)" if c.weight < 0 else ""
        lines.append(f"{i}. {c.title}{kind}" + (f": {c.description}" if c.description else ""))
    return "\n".join(lines)

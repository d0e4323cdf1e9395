"""The built-in preference task: arithmetic prompts (`12+34=`), completions ranked by a hidden gold score.

Sources (loaded by name with `lmrl.data.preference.load_preference_rows`):
  builtin:prefs  K completions per prompt of varying quality, ranked by `gold_score` (the hidden rule);
  builtin:orm    one completion per prompt, label = the completion is correct;
  builtin:prm    step-by-step solutions of multi-operand sums, one labelled step per line.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator, Sequence
from typing import Any

# --------------------------------------------------------------------------- the hidden gold score

BREVITY_PENALTY = 0.05
"""Gold score lost per character of a completion that is not its answer integer."""

_INTEGER = re.compile(r"-?\d+")


def _answer_of(prompt: str, meta: dict | None) -> int:
    from lmrl.data.tasks.expr import evaluate

    if meta and "answer" in meta:
        return int(meta["answer"])
    result = evaluate(prompt.strip().rstrip("="))
    if result is None or result[0].denominator != 1:
        raise ValueError(
            f"gold_score: cannot find the answer of prompt {prompt!r}: pass meta={{'answer': ...}} or an "
            "integer arithmetic prompt such as '12+34='."
        )
    return int(result[0])


def gold_score(prompt: str, completion: str, meta: dict | None = None) -> float:
    """The hidden rule ranking completions of the built-in preference task: correctness + closeness + brevity.

    With a = the true answer (`meta["answer"]`, else the value of the prompt expression), v = the last
    integer in the stripped completion and e = its number of characters that are not v:
        g = [v = a] + 1/(1 + |v − a|) − 0.05·e     if the completion contains an integer,
        g = −1 − 0.05·e                            otherwise (e = its whole length).
    So "46" scores 2 for `12+34=`, "47" 0.5, "the answer is 46" 1.3 and "xyz" −1.15.
    """
    text = completion.strip()
    numbers = _INTEGER.findall(text)
    if not numbers:
        return -1.0 - BREVITY_PENALTY * len(text)
    value, answer = int(numbers[-1]), _answer_of(prompt, meta)
    extra = len(text) - len(numbers[-1])
    return float(value == answer) + 1.0 / (1.0 + abs(value - answer)) - BREVITY_PENALTY * extra


# --------------------------------------------------------------------------- built-in generators

CANDIDATE_KINDS = ("correct", "near", "far", "verbose", "garbage")
"""Kinds of candidate completions of the built-in preference task (drawn uniformly by default)."""

_PHRASES = ("the answer is", "it is", "result:", "=")
_GARBAGE = "abcdefghijklmnopqrstuvwxyz?!#"


def candidate(kind: str, answer: int, rng: random.Random) -> str:
    """A completion of `kind` for a problem whose answer is `answer`, drawn with `rng`."""
    if kind == "correct":
        return str(answer)
    if kind == "near":
        return str(answer + rng.choice((-2, -1, 1, 2)))
    if kind == "far":
        return str(answer + rng.choice((-1, 1)) * rng.randint(5, 25))
    if kind == "verbose":
        value = answer if rng.random() < 0.5 else answer + rng.choice((-1, 1))
        return f"{rng.choice(_PHRASES)} {value}"
    if kind == "garbage":
        return "".join(rng.choice(_GARBAGE) for _ in range(rng.randint(1, 6)))
    raise ValueError(f"unknown candidate kind {kind!r}; the kinds are {CANDIDATE_KINDS}.")


def _seeded_prompts(
    name: str, n: int, split: str, seed: int, **arithmetic: Any
) -> Iterator[tuple[dict, random.Random]]:
    """n arithmetic rows of `split`, each with the generator of its completions (seeded by `name`, split, seed and
    row); a small test split is cycled (each row gets fresh completions)."""
    from lmrl.data.tasks import get_task, make_rows

    rows = make_rows(get_task("arithmetic", **arithmetic), n, split=split, seed=seed, allow_fewer=True)
    for i in range(n):
        yield rows[i % len(rows)], random.Random(f"lmrl:{name}:{split}:{seed}:{i}")


def _check_kinds(kinds: Sequence[str]) -> None:
    for kind in kinds:
        candidate(kind, 0, random.Random(0))  # unknown kinds fail here


def preference_rows(
    n: int,
    split: str = "train",
    seed: int = 0,
    num_completions: int = 2,
    kinds: Sequence[str] = CANDIDATE_KINDS,
    digits: int = 1,
    always_correct: bool = False,
    **arithmetic: Any,
) -> list[dict]:
    """Rows of the built-in preference task: K = `num_completions` completions per arithmetic prompt,
    distinct in gold score, ranked by `gold_score`.

    K = 2 gives pairwise rows (prompt, chosen, rejected, chosen_score, rejected_score); K > 2 ranked
    rows (prompt, completions in random order, scores). Every row also has answer, meta and task, so
    the same prompts serve `gold_score`, the `task` reward and generation evals. `digits` (default 1:
    learnable by the tiny built-in model in a minute) and `arithmetic` (ops, n_operands) configure the
    arithmetic task's prompts (`style="chat"` asks them as questions for an instruct model). `always_correct`
    puts the correct answer (the bare integer, the best gold score) among every row's completions: with only
    wrong kinds (`kinds=("near", "far")`) the chosen completion is then always the correct answer and the rejected
    a wrong one.
    """
    if num_completions < 2:
        raise ValueError(f"builtin:prefs: num_completions must be >= 2, got {num_completions}.")
    _check_kinds(kinds)
    out = []
    for base, rng in _seeded_prompts("prefs", n, split, seed, digits=digits, **arithmetic):
        answer = int(base["answer"])
        meta = {**base["meta"], "answer": answer}
        texts: dict[str, float] = {}
        if always_correct:
            texts[str(answer)] = round(gold_score(base["prompt"], str(answer), meta), 9)
        for _ in range(200):
            text = candidate(rng.choice(list(kinds)), answer, rng)
            score = round(gold_score(base["prompt"], text, meta), 9)
            if text not in texts and score not in texts.values():
                texts[text] = score
            if len(texts) == num_completions:
                break
        else:
            raise ValueError(
                f"builtin:prefs: could not draw {num_completions} completions with distinct gold scores from "
                f"kinds {list(kinds)}; lower num_completions or add kinds."
            )
        row = {"prompt": base["prompt"], "answer": base["answer"], "meta": meta, "task": "arithmetic"}
        ranked = sorted(texts, key=texts.get, reverse=True)
        if num_completions == 2:
            row.update(
                chosen=ranked[0], rejected=ranked[1], chosen_score=texts[ranked[0]], rejected_score=texts[ranked[1]]
            )
        else:
            order = list(texts)
            rng.shuffle(order)
            row.update(completions=order, scores=[texts[t] for t in order])
        out.append(row)
    return out


def orm_rows(
    n: int,
    split: str = "train",
    seed: int = 0,
    wrong_kinds: Sequence[str] = ("near", "far"),
    digits: int = 1,
    **arithmetic: Any,
) -> list[dict]:
    """Outcome-labelled rows (prompt, completion, label), half correct answers (label 1), half wrong ones (label
    0) drawn from `wrong_kinds` of the preference task's candidates; so the majority-class accuracy is 0.5."""
    _check_kinds(wrong_kinds)
    out = []
    for base, rng in _seeded_prompts("orm", n, split, seed, digits=digits, **arithmetic):
        answer = int(base["answer"])
        label = int(rng.random() < 0.5)
        text = str(answer) if label else candidate(rng.choice(list(wrong_kinds)), answer, rng)
        numbers = _INTEGER.findall(text)
        if not label and numbers and int(numbers[-1]) == answer:  # a verbose candidate may carry the right answer
            label = 1
        out.append({"prompt": base["prompt"], "completion": text, "label": label, "answer": base["answer"]})
    return out


def prm_rows(
    n: int, split: str = "train", seed: int = 0, n_operands: int = 3, digits: int = 1, error_rate: float = 0.5
) -> list[dict]:
    """Stepwise-labelled solutions (prompt, completions = steps, labels) of `a+b-c=` problems.

    Step i computes running total r_i = r_{i-1} op x_i as the line "r_{i-1}op x_i=r_i". With
    probability `error_rate` one step's result is off by 1-3. Labels: +1 before the error, −1 on it, 0
    after it (arithmetic right, but carried from a wrong value); +1 everywhere without an error.
    """
    out = []
    for base, rng in _seeded_prompts("prm", n, split, seed, digits=digits, ops="+-", n_operands=n_operands):
        parts = re.findall(r"[+-]|\d+", base["meta"]["expression"])
        wrong_at = rng.randrange(n_operands - 1) if rng.random() < error_rate else -1
        total, steps, labels = int(parts[0]), [], []
        for j, (op, x) in enumerate(zip(parts[1::2], parts[2::2])):
            value = total + int(x) if op == "+" else total - int(x)
            if j == wrong_at:
                value += rng.choice((-1, 1)) * rng.randint(1, 3)
            steps.append(f"{total}{op}{x}={value}")
            labels.append(1 if wrong_at < 0 or j < wrong_at else (-1 if j == wrong_at else 0))
            total = value
        out.append({"prompt": base["prompt"], "completions": steps, "labels": labels, "answer": base["answer"]})
    return out


BUILTIN_SOURCES = {"builtin:prefs": preference_rows, "builtin:orm": orm_rows, "builtin:prm": prm_rows}

"""Preference data: built-in arithmetic preferences with a hidden gold score, row validation, tokenisation.

Row formats (RLHF book ch. 10-11; TRL's column names):
  pairwise     {"prompt", "chosen", "rejected"} (text, or message lists as in TRL's conversational
               format), optional "margin" or "chosen_score"/"rejected_score" (ratings, higher = better);
  messages     {"chosen": [...], "rejected": [...]} full conversations without a prompt column: the
               prompt is every message up to the last user turn and must be the same in both;
  ranked       {"prompt", "completions": [...], "ranking" | "scores"}: "ranking" lists completion
               indices best first (a permutation, no ties), "scores" rates each completion;
  unpaired     {"prompt", "completion", "label"} with a 0/1 or bool label (KTO, outcome RMs);
  stepwise     {"prompt", "completions": [step, ...], "labels": [...]} with -1/0/+1 (or bool) per
               step (process RMs; TRL's stepwise-supervision format).
Every problem raises one ValueError naming the row (1-based) and the fix.

Built-in sources (`load_preference_rows`), all over the arithmetic task's prompts (`12+34=`):
  builtin:prefs  K completions per prompt of varying quality, ranked by `gold_score` (the hidden rule);
  builtin:orm    one completion per prompt, label = the completion is correct;
  builtin:prm    step-by-step solutions of multi-operand sums, one labelled step per line.
"""

from __future__ import annotations

import dataclasses
import math
import random
import re
from collections.abc import Sequence
from typing import Any, Literal

import torch

from lmrl.data.chat import IGNORE_INDEX, tokenize_prompt_completion
from lmrl.data.loading import check_completion, check_prompt, coerce_messages, load_rows, row_where

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


def _prompts(n: int, split: str, seed: int, **arithmetic: Any) -> list[dict]:
    """n arithmetic rows of `split`; a small test split is cycled (each row gets fresh completions)."""
    from lmrl.data.tasks import get_task, make_rows

    rows = make_rows(get_task("arithmetic", **arithmetic), n, split=split, seed=seed, allow_fewer=True)
    return [rows[i % len(rows)] for i in range(n)]


def preference_rows(n: int, split: str = "train", seed: int = 0, num_completions: int = 2,
                    kinds: Sequence[str] = CANDIDATE_KINDS, digits: int = 1, **arithmetic: Any) -> list[dict]:
    """Rows of the built-in preference task: K = `num_completions` completions per arithmetic prompt,
    distinct in gold score, ranked by `gold_score`.

    K = 2 gives pairwise rows (prompt, chosen, rejected, chosen_score, rejected_score); K > 2 ranked
    rows (prompt, completions in random order, scores). Every row also has answer, meta and task, so
    the same prompts serve `gold_score`, the `task` reward and generation evals. `digits` (default 1:
    learnable by the tiny built-in model in a minute) and `arithmetic` (ops, n_operands) configure the
    arithmetic task's prompts.
    """
    if num_completions < 2:
        raise ValueError(f"builtin:prefs: num_completions must be >= 2, got {num_completions}.")
    for kind in kinds:
        candidate(kind, 0, random.Random(0))  # unknown kinds fail here
    out = []
    for i, base in enumerate(_prompts(n, split, seed, digits=digits, **arithmetic)):
        rng = random.Random(f"lmrl:prefs:{split}:{seed}:{i}")
        answer = int(base["answer"])
        meta = {**base["meta"], "answer": answer}
        texts: dict[str, float] = {}
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
            row.update(chosen=ranked[0], rejected=ranked[1], chosen_score=texts[ranked[0]],
                       rejected_score=texts[ranked[1]])
        else:
            order = list(texts)
            rng.shuffle(order)
            row.update(completions=order, scores=[texts[t] for t in order])
        out.append(row)
    return out


def orm_rows(n: int, split: str = "train", seed: int = 0, wrong_kinds: Sequence[str] = ("near", "far"),
             digits: int = 1, **arithmetic: Any) -> list[dict]:
    """Outcome-labelled rows (prompt, completion, label), half correct answers (label 1), half wrong ones (label
    0) drawn from `wrong_kinds` of the preference task's candidates; so the majority-class accuracy is 0.5."""
    for kind in wrong_kinds:
        candidate(kind, 0, random.Random(0))  # unknown kinds fail here
    out = []
    for i, base in enumerate(_prompts(n, split, seed, digits=digits, **arithmetic)):
        rng = random.Random(f"lmrl:orm:{split}:{seed}:{i}")
        answer = int(base["answer"])
        label = int(rng.random() < 0.5)
        text = str(answer) if label else candidate(rng.choice(list(wrong_kinds)), answer, rng)
        numbers = _INTEGER.findall(text)
        if not label and numbers and int(numbers[-1]) == answer:  # a verbose candidate may carry the right answer
            label = 1
        out.append({"prompt": base["prompt"], "completion": text, "label": label, "answer": base["answer"]})
    return out


def prm_rows(n: int, split: str = "train", seed: int = 0, n_operands: int = 3, digits: int = 1,
             error_rate: float = 0.5) -> list[dict]:
    """Stepwise-labelled solutions (prompt, completions = steps, labels) of `a+b-c=` problems.

    Step i computes running total r_i = r_{i-1} op x_i as the line "r_{i-1}op x_i=r_i". With
    probability `error_rate` one step's result is off by 1-3. Labels: +1 before the error, −1 on it, 0
    after it (arithmetic right, but carried from a wrong value); +1 everywhere without an error.
    """
    out = []
    for i, base in enumerate(_prompts(n, split, seed, digits=digits, ops="+-", n_operands=n_operands)):
        rng = random.Random(f"lmrl:prm:{split}:{seed}:{i}")
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


def completion_rows(rows: Sequence[dict]) -> list[dict]:
    """Every completion of preference rows as a {prompt, completion} row: SFT data for a reference policy
    that generates the same kinds of completions the preferences rank (the setting DPO assumes)."""
    out = []
    for row in rows:
        texts = row["completions"] if "completions" in row else [row["chosen"], row["rejected"]]
        out += [{"prompt": row["prompt"], "completion": text} for text in texts]
    return out


BUILTIN_SOURCES = {"builtin:prefs": preference_rows, "builtin:orm": orm_rows, "builtin:prm": prm_rows}
DEFAULT_BUILTIN_ROWS = 1000


def load_preference_rows(source: str, split: str = "train", limit: int | None = None, **data_args: Any) -> list[dict]:
    """Rows of a built-in source (`builtin:prefs|orm|prm`, `data_args` are its parameters plus `seed`)
    or of any source `lmrl.data.loading.load_rows` reads (files, HF datasets)."""
    if source in BUILTIN_SOURCES:
        args = dict(data_args)
        n = int(args.pop("n", None) or limit or DEFAULT_BUILTIN_ROWS)
        try:
            return BUILTIN_SOURCES[source](n, split=split, **args)
        except TypeError as exc:
            raise ValueError(f"{source}: bad data_args {sorted(data_args)} ({exc}).") from exc
    if source.startswith("builtin:"):
        raise ValueError(f"unknown built-in preference source {source!r}; they are {sorted(BUILTIN_SOURCES)}.")
    return load_rows(source, split=split, limit=limit, **data_args)


def export_rows(source: str, path: str, n: int = DEFAULT_BUILTIN_ROWS, split: str = "train", seed: int = 0,
                **data_args: Any) -> int:
    """Write `n` rows of a built-in source as JSONL; `source` "builtin:prefs-sft" writes `completion_rows` of
    builtin:prefs (SFT data for a reference policy). Returns the number of rows written."""
    import json
    from pathlib import Path

    sft = source == "builtin:prefs-sft"
    rows = load_preference_rows("builtin:prefs" if sft else source, split, n, seed=seed, **data_args)
    rows = completion_rows(rows) if sft else rows
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return len(rows)


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m lmrl.data.preference builtin:prefs-sft runs/prefs_sft.jsonl --n 1000 [--split test] [--seed 1]`."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m lmrl.data.preference",
                                     description="Export a built-in preference source to JSONL.")
    parser.add_argument("source", choices=[*BUILTIN_SOURCES, "builtin:prefs-sft"])
    parser.add_argument("out", help="output .jsonl path")
    parser.add_argument("--n", type=int, default=DEFAULT_BUILTIN_ROWS, help="rows (prompts) to generate")
    parser.add_argument("--split", default="train", choices=["train", "test"])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    count = export_rows(args.source, args.out, args.n, args.split, args.seed)
    print(f"wrote {count} rows of {args.source} ({args.split}) to {args.out}")


# --------------------------------------------------------------------------- validation

Text = str | list  # a completion or prompt: text, or a list of {"role", "content"} messages


@dataclasses.dataclass(frozen=True)
class PreferenceGroup:
    """One prompt with K >= 2 completions ranked best first (K = 2: chosen, rejected)."""

    prompt: Text
    completions: tuple  # best first
    scores: tuple[float, ...] | None  # ratings of the completions (best first), if the row has them
    margin: float | None  # the row's `margin`, else chosen_score − rejected_score (K = 2), else None
    row: dict  # the source row (answer, meta, ... for evaluation)
    where: str

    @property
    def k(self) -> int:
        return len(self.completions)


@dataclasses.dataclass(frozen=True)
class LabelledExample:
    """One prompt/completion with a label: 0/1 outcome (KTO desirability, ORM), or per-step −1/0/+1 (PRM)."""

    prompt: Text
    completion: Text  # PRM: the steps joined with STEP_SEPARATOR
    label: int | tuple[int, ...]
    where: str
    steps: tuple[str, ...] = ()


STEP_SEPARATOR = "\n"
"""Steps of a stepwise completion are joined with this; each step's label sits on its last token."""


def _number(value: Any, what: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{where}: {what} must be a finite number, got {value!r}. Fix or drop the row.")
    return float(value)


def _completion(value: Any, what: str, where: str) -> Text:
    if value is None:
        raise ValueError(f"{where}: `{what}` is missing (null). Every preference row needs it; drop the row.")
    check_completion(value, f"{where} ({what})")
    return value


def _split_conversation(messages: Any, what: str, where: str) -> tuple[list, list]:
    """(prompt = messages up to the last user turn, completion = the rest) of a full conversation."""
    from lmrl.data.chat import validate_messages

    messages = coerce_messages(messages, where)
    validate_messages(messages, f"{where} ({what})")
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    return list(messages[: last_user + 1]), list(messages[last_user + 1 :])


def _messages_pair(row: dict, where: str) -> tuple[list, list, list]:
    """prompt, chosen, rejected of a messages-style row, checking both share the same prompt."""
    p_c, chosen = _split_conversation(row["chosen"], "chosen", where)
    p_r, rejected = _split_conversation(row["rejected"], "rejected", where)
    if p_c != p_r:
        j = next((j for j, (a, b) in enumerate(zip(p_c, p_r)) if a != b), min(len(p_c), len(p_r)))
        show = lambda p: repr(p[j]["content"][:60]) if j < len(p) else "(no message)"  # noqa: E731
        raise ValueError(
            f"{where}: chosen and rejected conversations have different prompts (every message up to the last "
            f"user turn must match): they differ at message {j}: chosen {show(p_c)} vs rejected {show(p_r)}. "
            "Both must answer the same prompt; fix or drop the row."
        )
    return p_c, chosen, rejected


def _ranking(row: dict, k: int, where: str) -> list[int]:
    """Completion indices best first, from `ranking` (a permutation) or `scores` (no ties)."""
    if "ranking" in row:
        ranking = row["ranking"]
        if not isinstance(ranking, list) or not ranking:
            raise ValueError(f"{where}: `ranking` must be a list of completion indices best first, got {ranking!r}.")
        ties = [r for r in ranking if isinstance(r, list) and len(r) > 1]
        if ties:
            raise ValueError(
                f"{where}: `ranking` has tied completions {ties[0]}; rankings must be strict. Break the tie, "
                "drop one of the tied completions, or give `scores` and use pairs without ties."
            )
        flat = [r[0] if isinstance(r, list) and len(r) == 1 else r for r in ranking]
        if not all(isinstance(r, int) and not isinstance(r, bool) and 0 <= r < k for r in flat):
            raise ValueError(f"{where}: `ranking` entries must be completion indices in 0..{k - 1}, got {ranking}.")
        missing = sorted(set(range(k)) - set(flat))
        if missing or len(flat) != k:
            dupes = sorted({r for r in flat if flat.count(r) > 1})
            raise ValueError(
                f"{where}: `ranking` {ranking} must list each of the {k} completions exactly once; missing "
                f"{missing}{f', repeated {dupes}' if dupes else ''}. Rank every completion or drop the unranked ones."
            )
        return flat
    scores = row["scores"]
    if not isinstance(scores, list) or len(scores) != k:
        raise ValueError(f"{where}: `scores` must be a list of {k} numbers (one per completion), got {scores!r}.")
    values = [_number(s, "every score", where) for s in scores]
    order = sorted(range(k), key=lambda i: -values[i])
    for a, b in zip(order, order[1:]):
        if values[a] == values[b]:
            raise ValueError(
                f"{where}: completions {a} and {b} are tied (both scored {values[a]}); a ranking needs distinct "
                "scores. Drop one of them, or turn the row into pairs without ties."
            )
    return order


def parse_preference_row(row: Any, where: str) -> PreferenceGroup:
    """Validate one pairwise, messages-style or ranked row into a `PreferenceGroup`."""
    if not isinstance(row, dict):
        raise ValueError(f"{where}: a row must be an object with named columns, got {type(row).__name__}.")
    if "completions" in row and ("ranking" in row or "scores" in row):
        if "prompt" not in row:
            raise ValueError(f"{where}: ranked rows need a `prompt` column next to `completions`; found {sorted(row)}.")
        check_prompt(row["prompt"], where)
        completions = row["completions"]
        if not isinstance(completions, list) or len(completions) < 2:
            raise ValueError(f"{where}: `completions` must be a list of >= 2 completions to rank, got {completions!r}.")
        completions = [_completion(c, f"completion {i}", where) for i, c in enumerate(completions)]
        order = _ranking(row, len(completions), where)
        ranked = tuple(completions[i] for i in order)
        if len({str(c) for c in ranked}) < len(ranked):
            raise ValueError(f"{where}: `completions` has identical entries; a ranking needs distinct completions.")
        scores = tuple(float(row["scores"][i]) for i in order) if "scores" in row else None
        return PreferenceGroup(row["prompt"], ranked, scores, None, row, where)
    if "chosen" not in row or "rejected" not in row:
        found = sorted(row)
        missing = [c for c in ("chosen", "rejected") if c not in row]
        raise ValueError(
            f"{where}: preference rows need `chosen` and `rejected` (missing {missing}; found columns {found}), "
            "or `completions` with `ranking`/`scores`. Rename the columns or drop the row."
        )
    if "prompt" in row:
        check_prompt(row["prompt"], where)
        prompt = row["prompt"]
        chosen = _completion(row["chosen"], "chosen", where)
        rejected = _completion(row["rejected"], "rejected", where)
    else:
        prompt, chosen, rejected = _messages_pair(row, where)
        check_completion(chosen, f"{where} (chosen)")
        check_completion(rejected, f"{where} (rejected)")
    if chosen == rejected:
        raise ValueError(f"{where}: chosen and rejected are identical ({str(chosen)[:60]!r}); a pair needs two "
                         "different completions. Drop the row.")
    scores = None
    if "chosen_score" in row and "rejected_score" in row:
        scores = (_number(row["chosen_score"], "chosen_score", where),
                  _number(row["rejected_score"], "rejected_score", where))
    margin = _number(row["margin"], "margin", where) if row.get("margin") is not None else (
        scores[0] - scores[1] if scores else None)
    return PreferenceGroup(prompt, (chosen, rejected), scores, margin, row, where)


def parse_preference_rows(rows: Sequence[Any], where: str = "dataset") -> list[PreferenceGroup]:
    """Every row validated (errors name the 1-based row of `where`)."""
    if not rows:
        raise ValueError(f"{where}: no rows.")
    return [parse_preference_row(row, row_where(i, where)) for i, row in enumerate(rows)]


def to_pairs(groups: Sequence[PreferenceGroup], mode: Literal["all", "best_worst"] = "all") -> list[PreferenceGroup]:
    """K = 2 groups: all C(K,2) ordered pairs of each ranking, or only best vs worst."""
    pairs = []
    for g in groups:
        idx = [(0, g.k - 1)] if mode == "best_worst" else [(i, j) for i in range(g.k) for j in range(i + 1, g.k)]
        for i, j in idx:
            scores = (g.scores[i], g.scores[j]) if g.scores else None
            margin = g.margin if g.k == 2 else (scores[0] - scores[1] if scores else None)
            pair = (g.completions[i], g.completions[j])
            pairs.append(PreferenceGroup(g.prompt, pair, scores, margin, g.row, g.where))
    return pairs


def _label(value: Any, allowed: tuple, what: str, where: str) -> int:
    if isinstance(value, bool):
        return {True: allowed[-1], False: allowed[0]}[value]
    if isinstance(value, (int, float)) and value in allowed:
        return int(value)
    raise ValueError(f"{where}: {what} must be one of {list(allowed)} or a bool, got {value!r}. Fix or drop the row.")


def parse_labelled_rows(rows: Sequence[Any], where: str = "dataset") -> list[LabelledExample]:
    """Unpaired rows {prompt, completion, label} (KTO, ORM), label 1 = desirable/correct."""
    out = []
    for i, row in enumerate(rows):
        name = row_where(i, where)
        if not isinstance(row, dict) or any(c not in row for c in ("prompt", "completion", "label")):
            found = sorted(row) if isinstance(row, dict) else type(row).__name__
            raise ValueError(f"{name}: unpaired rows need columns prompt, completion, label (0/1); found {found}.")
        check_prompt(row["prompt"], name)
        completion = _completion(row["completion"], "completion", name)
        out.append(LabelledExample(row["prompt"], completion, _label(row["label"], (0, 1), "label", name), name))
    return out


def parse_step_rows(rows: Sequence[Any], where: str = "dataset") -> list[LabelledExample]:
    """Stepwise rows {prompt, completions: [step, ...], labels: [-1/0/+1 or bool, ...]} (PRM)."""
    out = []
    for i, row in enumerate(rows):
        name = row_where(i, where)
        if not isinstance(row, dict) or any(c not in row for c in ("prompt", "completions", "labels")):
            found = sorted(row) if isinstance(row, dict) else type(row).__name__
            raise ValueError(f"{name}: stepwise rows need columns prompt, completions (steps), labels; found {found}.")
        check_prompt(row["prompt"], name)
        steps, labels = row["completions"], row["labels"]
        if not isinstance(steps, list) or not steps or not isinstance(labels, list) or len(labels) != len(steps):
            raise ValueError(f"{name}: `completions` must be a non-empty list of steps with one label each in "
                             f"`labels`, got {len(steps) if isinstance(steps, list) else steps!r} steps and "
                             f"{len(labels) if isinstance(labels, list) else labels!r} labels.")
        for j, s in enumerate(steps):
            if not isinstance(s, str) or not s.strip() or STEP_SEPARATOR in s.strip():
                raise ValueError(f"{name}: step {j} must be non-empty text without {STEP_SEPARATOR!r} "
                                 f"(steps are joined with it), got {s!r}.")
        steps = tuple(s.strip() for s in steps)
        values = tuple(_label(v, (-1, 0, 1), f"label of step {j}", name) for j, v in enumerate(labels))
        out.append(LabelledExample(row["prompt"], STEP_SEPARATOR.join(steps), values, name, steps))
    return out


# --------------------------------------------------------------------------- tokenisation


@dataclasses.dataclass(frozen=True)
class Tokenized:
    """A prompt/completion as the policy sees it: completion tokens follow the prompt's generation prompt."""

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]  # up to and including the last learned token (the end-of-turn/EOS)
    learn: tuple[int, ...]  # 1 on completion tokens of the completion's assistant turns, 0 on others

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)


def tokenize(tokenizer: Any, prompt: Text, completion: Text, chat: bool = True, where: str = "row") -> Tokenized:
    """Token ids of a prompt/completion, split where the completion's first learned token starts.

    Uses `tokenize_prompt_completion` (chat template, end-of-turn, prompt/answer boundary tokenized
    separately), then drops what follows the last learned token (e.g. ChatML's newline after
    `<|im_end|>`), so the sequence ends the way a generated completion ends.
    """
    ids, labels = tokenize_prompt_completion(tokenizer, prompt, completion, chat, where)
    learned = [j for j, y in enumerate(labels) if y != IGNORE_INDEX]
    first, last = learned[0], learned[-1]
    if first == 0:
        raise ValueError(f"{where}: the prompt renders to no tokens; a completion needs a prompt to condition on.")
    learn = tuple(int(labels[j] != IGNORE_INDEX) for j in range(first, last + 1))
    return Tokenized(tuple(ids[:first]), tuple(ids[first : last + 1]), learn)


def step_positions(tokenizer: Any, tokenized: Tokenized, steps: Sequence[str], where: str = "row") -> list[int]:
    """Index in `tokenized.completion_ids` of the token that ends each step (its last character)."""
    text = STEP_SEPARATOR.join(steps)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), enc["offset_mapping"]
    if list(tokenized.completion_ids[: len(ids)]) != ids:
        raise ValueError(
            f"{where}: the tokenizer splits the step text differently inside the chat template than alone, so "
            "step labels cannot be placed; use chat=false or a tokenizer whose template keeps the assistant text "
            "as is (ChatML does)."
        )
    positions, start = [], 0
    for step in steps:
        last_char = start + len(step) - 1
        positions.append(next(t for t, (a, b) in enumerate(offsets) if a <= last_char < b))
        start += len(step) + len(STEP_SEPARATOR)
    return positions


def collate_sequences(items: Sequence[Tokenized], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded prompt+completion: input_ids, attention_mask (N, L) and `learn` (N, L), 1 on learned tokens."""
    width = max(len(x) for x in items)
    input_ids = torch.full((len(items), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(items), width), dtype=torch.long)
    learn = torch.zeros((len(items), width), dtype=torch.long)
    for b, x in enumerate(items):
        p, n = len(x.prompt_ids), len(x)
        input_ids[b, :n] = torch.tensor(x.prompt_ids + x.completion_ids)
        attention_mask[b, :n] = 1
        learn[b, p:n] = torch.tensor(x.learn)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "learn": learn}


def collate_completions(items: Sequence[Tokenized], pad_id: int) -> dict[str, torch.Tensor]:
    """The rollout layout: prompts left-padded to P, completions right-padded to T.

    input_ids, attention_mask (N, P+T); completion_mask (N, T) float, 1 on learned completion tokens;
    completion_start = P (as a 0-d tensor).
    """
    p_width = max(len(x.prompt_ids) for x in items)
    t_width = max(len(x.completion_ids) for x in items)
    n = len(items)
    input_ids = torch.full((n, p_width + t_width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((n, p_width + t_width), dtype=torch.long)
    completion_mask = torch.zeros((n, t_width))
    for b, x in enumerate(items):
        p, t = len(x.prompt_ids), len(x.completion_ids)
        input_ids[b, p_width - p : p_width] = torch.tensor(x.prompt_ids)
        input_ids[b, p_width : p_width + t] = torch.tensor(x.completion_ids)
        attention_mask[b, p_width - p : p_width + t] = 1
        completion_mask[b, :t] = torch.tensor(x.learn, dtype=torch.float)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "completion_mask": completion_mask,
            "completion_start": torch.tensor(p_width)}


if __name__ == "__main__":
    main()

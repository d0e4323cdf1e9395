"""``lmrl cai``: Constitutional AI data (Bai et al. 2022; RLHF book ch. 12, spec §4).

``mode=revise`` — supervised critique-and-revise data. For each prompt x the model answers (y^0, greedy); then for
i = 1..n a principle c_i is drawn from the constitution, the model critiques y^{i-1} by c_i and revises it into y^i.
The rows (x, y^n) are SFT data (``lmrl sft dataset=...``); each row also keeps y^0, the critiques, the revisions and
the principles used.

``mode=label`` — AI feedback on pairs. For each pair (a, b) of a preference dataset the feedback model (``judge``,
default: ``model``) sees x, a random subset of ``principles_per_judgement`` principles and both answers, and picks
one (pairwise judge with position swapping: a win only when both orders agree, `lmrl.rewards.judge`). Pairs it
prefers are written as (chosen, rejected) rows that ``lmrl dpo`` and ``lmrl reward`` read; ties and failures are
dropped and counted.

On the built-in preference task (``dataset=builtin:prefs``) both modes report the hidden gold score
(`lmrl.data.preference_builtin.gold_score`): the mean gold score of y^0 and of y^n (revise), and how often the AI
label agrees with the gold ranking (label).

    lmrl cai mode=revise model=runs/sft/final dataset=prompts.jsonl revisions=2 output_file=data/cai_sft.jsonl
    lmrl cai mode=label model=Qwen/Qwen2.5-7B-Instruct dataset=pairs.jsonl output_file=data/cai_pairs.jsonl
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
from pathlib import Path
from typing import Any, Literal

from lmrl.config import ChatSection, ConfigError, ModelSection, field
from lmrl.tracking import console

PRINCIPLES = [
    "The response should answer exactly the question that was asked, and answer it correctly.",
    "The response should be honest: it should not state as fact anything it has no grounds for.",
    "The response should be concise and leave out anything the question did not call for.",
    "The response should not help anyone cause harm to people, property or themselves.",
    "The response should treat the user with respect and avoid insulting or demeaning language.",
    "The response should be clear and easy to follow for the person who asked.",
]
"""The built-in constitution: short, general principles (replace it with ``principles=[...]`` or a file)."""

CRITIQUE_PROMPT = """Here is a question and a response to it.

Question: {question}
Response: {response}

Principle: {principle}

Point out in one or two sentences how the response falls short of the principle."""

REVISION_PROMPT = """Here is a question, a response to it and a critique of the response.

Question: {question}
Response: {response}
Critique: {critique}

Rewrite the response so that it follows this principle: {principle}
Reply with the rewritten response only."""

LABEL_PROMPT = """You are judging two AI assistant answers by these principles:
{principles}

[Question]
{question}

[Answer of assistant A]
{answer_a}

[Answer of assistant B]
{answer_b}

Decide which answer follows the principles better. Do not let the order or the length of the answers sway you.
Explain briefly, then end with [[A]] if A is better, [[B]] if B is better, or [[C]] for a tie."""


@dataclasses.dataclass
class CAIConfig(ChatSection, ModelSection):
    mode: Literal["revise", "label"] = field(
        "revise", "revise: critique-and-revise SFT data; label: AI-feedback preference pairs"
    )
    dataset: str = field(
        "builtin:prefs",
        "prompts (revise) or pairs with prompt/chosen/rejected (label): builtin:prefs, a file or an HF dataset",
    )
    split: str = field("train", "dataset split")
    rows: int | None = field(200, "rows to process (null: all)")
    principles: list[str] = field(PRINCIPLES, "the constitution: a list of principles")
    principles_file: str | None = field(
        None, "the constitution from a text file, one principle per line (replaces 'principles')"
    )
    revisions: int = field(2, "revise: critique-and-revise rounds n, one principle drawn per round")
    principles_per_judgement: int = field(2, "label: principles the feedback model sees per pair (a random subset)")
    judge: str | None = field(None, "label: the feedback model (default: model)")
    swap: bool = field(True, "label: judge both answer orders, keep a preference only when they agree")
    max_new_tokens: int = field(128, "tokens per answer, critique, revision or judgement")
    batch_size: int = field(16, "prompts per generate call")
    output_file: str = field("data/cai.jsonl", "JSONL written: SFT rows (revise) or preference pairs (label)")

    def __post_init__(self) -> None:
        super().__post_init__()
        self.principles = load_principles(self.principles_file or self.principles)
        if self.revisions < 1 or self.max_new_tokens < 1 or self.batch_size < 1:
            raise ConfigError("'revisions', 'max_new_tokens' and 'batch_size' must be >= 1.")
        if not 1 <= self.principles_per_judgement <= len(self.principles):
            raise ConfigError(
                f"'principles_per_judgement' must be in [1, {len(self.principles)}] (the number of "
                f"principles), got {self.principles_per_judgement}."
            )


def load_principles(value: list[str] | str) -> list[str]:
    """A list of principles as given, or (a path) the non-empty lines of a text file."""
    if isinstance(value, str):
        path = Path(value).expanduser()
        if not path.is_file():
            raise ConfigError(
                f"principles_file={value!r} is not a file: give a text file with one principle per "
                "line, or the list as principles=[...]."
            )
        value = path.read_text(encoding="utf-8").splitlines()
    principles = [p.strip() for p in value if isinstance(p, str) and p.strip()]
    if not principles:
        raise ConfigError("the constitution is empty: give at least one principle.")
    return principles


def strip_answer(text: str) -> str:
    """A generated response without a leading 'Response:'/'Rewritten response:' label (small models copy it)."""
    return re.sub(r"^\s*(rewritten response|response)\s*:\s*", "", text, flags=re.IGNORECASE).strip()


def revise(generate, prompts: list[str], principles: list[str], revisions: int, rng: random.Random) -> list[dict]:
    """Critique-and-revise every prompt ``revisions`` times; ``generate(texts) -> texts`` is the model (greedy)."""
    from lmrl.rewards.judge_text import fill

    responses = [strip_answer(t) for t in generate(prompts)]
    rows = [
        {"prompt": p, "initial": r, "critiques": [], "revisions": [], "principles": []}
        for p, r in zip(prompts, responses)
    ]
    for _ in range(revisions):
        chosen = [rng.choice(principles) for _ in prompts]
        critiques = generate(
            [fill(CRITIQUE_PROMPT, question=p, response=r, principle=c) for p, r, c in zip(prompts, responses, chosen)]
        )
        responses = [
            strip_answer(t)
            for t in generate(
                [
                    fill(REVISION_PROMPT, question=p, response=r, critique=k, principle=c)
                    for p, r, k, c in zip(prompts, responses, critiques, chosen)
                ]
            )
        ]
        for row, c, k, r in zip(rows, chosen, critiques, responses):
            row["principles"].append(c)
            row["critiques"].append(k)
            row["revisions"].append(r)
    for row, r in zip(rows, responses):
        row["completion"] = r
    return rows


def label(judge, rows: list[dict], principles: list[str], per_judgement: int, rng: random.Random) -> list[dict]:
    """AI-feedback labels of the (chosen, rejected) pairs in ``rows``: each pair judged under its own random subset
    of principles; the answer the judge prefers becomes ``chosen``. Rows keep ``principles`` and ``ai_verdict``
    ("A": the source's chosen won, "B": its rejected won, "tie", None: failure)."""
    subsets = [sorted(rng.sample(range(len(principles)), per_judgement)) for _ in rows]
    context = [{"principles": "\n".join(f"- {principles[i]}" for i in s)} for s in subsets]
    verdicts = judge.judge(
        [r["prompt"] for r in rows], [r["chosen"] for r in rows], [r["rejected"] for r in rows], context=context
    )
    out = []
    for row, subset, verdict in zip(rows, subsets, verdicts):
        labelled = {**row, "principles": [principles[i] for i in subset], "ai_verdict": verdict}
        if verdict == "B":
            labelled["chosen"], labelled["rejected"] = row["rejected"], row["chosen"]
        out.append(labelled)
    return out


def gold_report(mode: str, rows: list[dict]) -> dict[str, float]:
    """Gold-score figures on the built-in preference task (its rows carry ``meta.answer``)."""
    from lmrl.data.preference_builtin import gold_score

    def gold(row: dict, text: str) -> float:
        return gold_score(row["prompt"], text, row.get("meta"))

    if mode == "revise":
        return {
            "gold/initial": sum(gold(r, r["initial"]) for r in rows) / len(rows),
            "gold/revised": sum(gold(r, r["completion"]) for r in rows) / len(rows),
        }
    decided = [r for r in rows if r["ai_verdict"] in ("A", "B")]
    agree = sum(gold(r, r["chosen"]) > gold(r, r["rejected"]) for r in decided)
    return {"gold/agreement": agree / max(1, len(decided)), "gold/decided": float(len(decided))}


def run(config: CAIConfig) -> dict[str, float]:
    """Write the revised SFT rows or the AI-labelled pairs; print the counts (and gold figures on builtin:prefs)."""
    from lmrl.data.preference import load_preference_rows
    from lmrl.models.setup import ModelSetup
    from lmrl.rewards.judge import GreedyGenerator, PairwiseJudge
    from lmrl.rewards.judge_text import question_text

    rows = load_preference_rows(config.dataset, split=config.split, limit=config.rows)
    needed = {"prompt"} if config.mode == "revise" else {"prompt", "chosen", "rejected"}
    missing = sorted(needed - set(rows[0]))
    if missing:
        raise ValueError(
            f"{config.dataset}: mode={config.mode} needs columns {sorted(needed)}; {missing} missing "
            f"(found {sorted(rows[0])})."
        )
    setup = ModelSetup.from_config(config)
    rng = random.Random(config.seed)
    if config.mode == "revise":
        model, tokenizer = setup.policy()
        generate = GreedyGenerator(
            model.eval(), tokenizer, config.max_new_tokens, config.batch_size, config.chat, setup.dtype
        )
        out = revise(generate, [question_text(r["prompt"]) for r in rows], config.principles, config.revisions, rng)
        for row, source in zip(out, rows):
            row["meta"] = source.get("meta")
        kept = out
    else:
        model, tokenizer = setup.judge(config.judge or config.model)
        judge = PairwiseJudge(
            model,
            tokenizer,
            LABEL_PROMPT,
            config.swap,
            max_new_tokens=config.max_new_tokens,
            batch_size=config.batch_size,
            chat=config.chat,
            autocast_dtype=setup.dtype,
        )
        out = label(judge, rows, config.principles, config.principles_per_judgement, rng)
        kept = [r for r in out if r["ai_verdict"] in ("A", "B")]
    path = Path(config.output_file)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in kept))
    stats: dict[str, Any] = {"rows": float(len(rows)), "written": float(len(kept))}
    if config.mode == "label":
        stats.update(
            {
                "flipped": float(sum(r["ai_verdict"] == "B" for r in out)),
                "ties": float(sum(r["ai_verdict"] == "tie" for r in out)),
                "failures": float(sum(r["ai_verdict"] is None for r in out)),
            }
        )
    if config.dataset == "builtin:prefs":
        stats.update(gold_report(config.mode, out))
    console.print(
        " ".join(
            f"{k}={v:.3f}" if isinstance(v, float) and not v.is_integer() else f"{k}={v:g}" for k, v in stats.items()
        )
    )
    console.print(f"wrote {len(kept)} rows -> {path}")
    return stats

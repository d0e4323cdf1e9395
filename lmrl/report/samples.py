"""Rows of samples.jsonl as the report and the dashboard show them: training samples and held-out samples apart,
chat-template markup shown as one ``role: text`` line per message.

samples.jsonl holds two kinds of rows, both written by `Tracker.log_samples`: those a training step sampled (RL,
rejection sampling, self-play, online DPO, a swarm node's own completions), with the reward they were trained on,
and those an evaluation generated from held-out rows (every method's ``evaluate``). A row does not say which; an
evaluation's rows are the ones with a column only evaluations write (`HELD_OUT_COLUMNS`).
"""

from __future__ import annotations

import re
from typing import Any

HELD_OUT_COLUMNS = ("score", "gold_score", "reward_chosen", "continuation")
"""Greedy task accuracy's and `lmrl eval`'s ``score`` (with ``answer``), DPO's ``gold_score``, a reward model's
held-out ``reward_chosen`` (or ``score``), pretraining's ``continuation``. Training rows carry ``reward``
(``challenger_reward`` in self-play, ``chosen_score`` in online DPO) instead."""

TAGS = (
    "<|im_start|>",
    "<|im_end|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|begin_of_text|>",
    "<start_of_turn>",
    "<end_of_turn>",
)
"""The markup of ChatML (lmrl's template, Qwen, SmolLM2), Llama 3 and Gemma."""
TURN_START = re.compile(
    r"<\|im_start\|>(\w+)\n|<\|start_header_id\|>(\w+)<\|end_header_id\|>\n*|<start_of_turn>(\w+)\n"
)
TURN_END = re.compile(r"<\|im_end\|>\n?|<\|eot_id\|>|<\|begin_of_text\|>|<end_of_turn>\n?|<bos>")


def is_held_out(row: dict[str, Any]) -> bool:
    """Whether a samples.jsonl row was written by an evaluation: its ``held_out`` mark (`Tracker.log_samples`), or in
    a file from before the mark, one of `HELD_OUT_COLUMNS`."""
    if "held_out" in row:
        return bool(row["held_out"])
    return any(column in row for column in HELD_OUT_COLUMNS)


def uncut(text: str) -> tuple[str, str]:
    """("…", text with its first tag completed) when ``text`` starts inside a tag, else ("", text): samples.jsonl keeps
    the last 60 characters of a single-turn RL prompt, which may begin in the middle of ``<|im_start|>``. Of the tags
    that end as it starts, the longest match that reads as a turn's start or end is taken."""
    cuts = sorted(
        ((len(tag) - k, tag) for tag in TAGS for k in range(1, len(tag) - 1) if text.startswith(tag[k:])), reverse=True
    )
    for length, tag in cuts:
        whole = tag + text[length:]
        if TURN_START.match(whole) or TURN_END.match(whole):
            return "…", whole
    return "", text


def chat_text(text: str) -> str:
    """``text`` with chat-template markup shown as one ``role: content`` line per message; the generation prompt
    (an empty last turn) is left out and a message's own newlines are shown as ``\\n``, so text without markup is
    one line with its whitespace visible."""
    cut, text = uncut(text)
    starts = list(TURN_START.finditer(text))
    ends = [m.start() for m in starts[1:]] + [len(text)]
    messages = [("", text[: starts[0].start()] if starts else text)]  # a completion's first turn has no tag
    messages += [(next(role for role in m.groups() if role), text[m.end() : end]) for m, end in zip(starts, ends)]
    messages = [(role, TURN_END.sub("", content).replace("\n", "\\n")) for role, content in messages]
    if len(messages) > 1 and not messages[0][1]:  # nothing before the first tag
        messages.pop(0)
    if len(messages) > 1 and not messages[-1][1]:  # the generation prompt
        messages.pop()
    return cut + "\n".join(f"{role}: {content}" if role else content for role, content in messages)


def sample_table(rows: list[dict[str, Any]]) -> tuple[list[str], list[dict[str, Any]]]:
    """(columns, rows) of a samples table, every text as `chat_text`. Old and new samples.jsonl alike: structured
    fields of multi-turn rows (`messages`, `turns`, `token_roles`) stay in the file; `token_roles` is shown as a
    `tokens` summary (``12 assistant, 9 tool (masked), ...``), every other list or mapping is left out of the table."""
    out = []
    for row in rows:
        shown = {
            k: chat_text(v) if isinstance(v, str) else v
            for k, v in row.items()
            if not isinstance(v, (list, dict)) and k != "held_out"  # which table a row is in says it
        }
        roles = row.get("token_roles")
        if isinstance(roles, list):
            shown["tokens"] = ", ".join(
                f"{r[2]} {r[0]}{'' if r[1] else ' (masked)'}" for r in roles if isinstance(r, list) and len(r) == 3
            )
        out.append(shown)
    return list(dict.fromkeys(k for r in out for k in r)), out


def sample_tables(rows: list[dict[str, Any]], newest: int) -> dict[str, dict[str, Any]]:
    """``{"training": {"cols", "rows"}, "held_out": {...}}``: the ``newest`` rows of each kind as `sample_table`."""
    tables = {}
    for kind, held_out in (("training", False), ("held_out", True)):
        kept = [row for row in rows if is_held_out(row) == held_out]
        cols, shown = sample_table(kept[-newest:] if newest else [])
        tables[kind] = {"cols": cols, "rows": shown}
    return tables

"""SFT examples: tokenize, mask and length-check rows of either format; collate into padded batches.

Loss masking follows the RLHF book ch. 4: prompt tokens get label -100, only
completions (assistant turns) are learned.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Literal

import torch

from lmrl.data.chat import IGNORE_INDEX, tokenize_messages, tokenize_prompt_completion
from lmrl.data.loading import check_completion, check_messages, check_prompt, detect_format, row_where
from lmrl.data.tool_chat import ToolContext, has_tool_turns, tokenize_tool_conversation, tool_row_messages

Overlong = Literal["truncate", "drop", "error"]


@dataclasses.dataclass
class SFTExample:
    """One tokenized example; `labels` equals `input_ids` on learned tokens and -100 elsewhere."""

    input_ids: list[int]
    labels: list[int]


def _has_target(labels: Sequence[int]) -> bool:
    """Whether any token is a next-token target: labels[0] never is (causal LMs shift by one)."""
    return any(x != IGNORE_INDEX for x in labels[1:])


def tokenize_row(
    row: dict,
    tokenizer: Any,
    fmt: str,
    train_on: str = "all",
    chat: bool = True,
    where: str = "row",
    tool_context: ToolContext | None = None,
) -> SFTExample:
    """Validate and tokenize one row of format `fmt` ("messages" or "prompt_completion").

    A messages row with tool turns (tool messages, `tool_calls`) needs `tool_context`: the tools rendered by the
    template, the call format, and whether call tokens are learned; tool outputs are never learned."""
    if fmt == "messages" and has_tool_turns(row):
        if tool_context is None:
            raise ValueError(
                f"{where}: the row has tool turns; set tools=[...] (and tool_parser) so that the chat "
                "template can render them."
            )
        messages = tool_row_messages(row, tool_context.parser)
        ids, labels = tokenize_tool_conversation(
            tokenizer,
            messages,
            row.get("tools") or tool_context.tools,
            tool_context.parser,
            tool_context.train_calls,
            where,
        )
        return SFTExample(ids, labels)
    if fmt == "messages":
        messages = check_messages(row["messages"], where)
        if not chat:
            raise ValueError(f"{where}: chat=False needs prompt/completion rows, got messages.")
        if train_on not in ("all", "last"):
            raise ValueError(f"train_on must be 'all' or 'last', got {train_on!r}.")
        assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        ids, labels = tokenize_messages(tokenizer, messages, assistant if train_on == "all" else assistant[-1:])
    else:
        check_prompt(row["prompt"], where)
        check_completion(row["completion"], where)
        ids, labels = tokenize_prompt_completion(tokenizer, row["prompt"], row["completion"], chat, where)
    return SFTExample(ids, labels)


def build_sft_examples(
    rows: Sequence[dict],
    tokenizer: Any,
    max_length: int,
    overlong: Overlong = "truncate",
    train_on: Literal["all", "last"] = "all",
    chat: bool = True,
    where: str = "dataset",
    tool_context: ToolContext | None = None,
) -> tuple[list[SFTExample], dict[str, int]]:
    """Tokenized examples of `rows` and stats {"rows", "overlong", "dropped", "truncated"}.

    Rows longer than `max_length` tokens are counted ("overlong") and, per
    `overlong`: "truncate" keeps the first max_length tokens (a row left with no
    learned token is dropped instead), "drop" drops them, "error" raises. Any
    invalid row raises a ValueError naming it (1-based row number).
    """
    if overlong not in ("truncate", "drop", "error"):
        raise ValueError(f"overlong must be 'truncate', 'drop' or 'error', got {overlong!r}.")
    if max_length < 2:
        raise ValueError(f"max_length must be >= 2 tokens, got {max_length}.")
    if not rows:
        raise ValueError(f"{where}: no rows to build SFT examples from.")
    fmt = detect_format(list(rows[0]), where)
    needed = ["messages"] if fmt == "messages" else ["prompt", "completion"]
    examples: list[SFTExample] = []
    stats = {"rows": len(rows), "overlong": 0, "dropped": 0, "truncated": 0}
    overlong_rows: list[int] = []
    for i, row in enumerate(rows):
        row_name = row_where(i, where)
        if not isinstance(row, dict) or any(c not in row for c in needed):
            found = sorted(row) if isinstance(row, dict) else type(row).__name__
            raise ValueError(f"{row_name}: needs columns {needed}, found {found}. Fix or drop the row.")
        ex = tokenize_row(row, tokenizer, fmt, train_on, chat, row_name, tool_context)
        if len(ex.input_ids) > max_length:
            stats["overlong"] += 1
            overlong_rows.append(i + 1)
            if overlong == "drop":
                stats["dropped"] += 1
                continue
            if overlong == "truncate":
                ex = SFTExample(ex.input_ids[:max_length], ex.labels[:max_length])
                if not _has_target(ex.labels):
                    stats["dropped"] += 1
                    continue
                stats["truncated"] += 1
        examples.append(ex)
    if overlong == "error" and stats["overlong"]:
        shown = ", ".join(map(str, overlong_rows[:10])) + (", ..." if len(overlong_rows) > 10 else "")
        raise ValueError(
            f"{where}: {stats['overlong']} of {len(rows)} rows are longer than max_length="
            f"{max_length} tokens (rows {shown}). Set overlong=truncate or overlong=drop, or raise "
            "max_length."
        )
    if not examples:
        raise ValueError(
            f"{where}: all {len(rows)} rows were dropped ({stats['overlong']} longer than "
            f"max_length={max_length}). Raise max_length."
        )
    return examples, stats


def collate_sft(examples: Sequence[SFTExample], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded batch: `input_ids` (B, T) padded with pad_id, `attention_mask` (B, T), `labels` (B, T) with -100 on pads."""
    if not examples:
        raise ValueError("collate_sft: got an empty list of examples.")
    T = max(len(ex.input_ids) for ex in examples)
    B = len(examples)
    input_ids = torch.full((B, T), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((B, T), dtype=torch.long)
    labels = torch.full((B, T), IGNORE_INDEX, dtype=torch.long)
    for b, ex in enumerate(examples):
        if len(ex.input_ids) != len(ex.labels):
            raise ValueError(f"collate_sft: example {b} has {len(ex.input_ids)} input ids but {len(ex.labels)} labels.")
        n = len(ex.input_ids)
        input_ids[b, :n] = torch.tensor(ex.input_ids, dtype=torch.long)
        attention_mask[b, :n] = 1
        labels[b, :n] = torch.tensor(ex.labels, dtype=torch.long)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}

"""Multiple choice by log-likelihood (spec §8, the pretraining-style eval): each choice's log-probability as
the continuation of the row's prompt, the summed and the per-token (length-normalised) choice picked
(`lmrl.eval.metrics.choose`).

A row has ``prompt`` (text or messages), ``choices`` (a list of strings) and ``answer`` (the index of the right
choice, or its text). With ``chat=True`` the prompt is rendered with the chat template and each choice is the
start of the assistant reply; with ``chat=False`` the raw prompt text is followed directly by the choice text
(include a leading space in the choices if the format wants one, as lm-evaluation-harness does).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from lmrl.data.chat import encode_prompt
from lmrl.eval.metrics import choose
from lmrl.models.logprobs import completion_logprobs


def check_choice_rows(rows: Sequence[dict[str, Any]], source: str) -> None:
    """Start-up check: a non-empty `choices` list and an `answer` naming one of them in every row."""
    for i, row in enumerate(rows):
        choices = row.get("choices")
        if not isinstance(choices, (list, tuple)) or len(choices) < 2 or not all(isinstance(c, str) and c for c in choices):
            raise ValueError(f"{source}: row {i} needs a 'choices' column with two or more non-empty strings for "
                             f"metric loglik (columns: {sorted(row)}).")
        gold_index(row, source, i)


def gold_index(row: dict[str, Any], source: str = "row", i: int = 0) -> int:
    """The index of the right choice: `answer` as an index, or as the text of a choice."""
    answer, choices = row.get("answer"), list(row["choices"])
    if isinstance(answer, int) and not isinstance(answer, bool) and 0 <= answer < len(choices):
        return answer
    if isinstance(answer, str) and answer in choices:
        return choices.index(answer)
    raise ValueError(f"{source}: row {i} has answer {answer!r}, which is neither an index into its "
                     f"{len(choices)} choices nor one of their texts. Give the index (0-based) or the right choice's "
                     "text as 'answer'.")


@torch.no_grad()
def choice_logprobs(model, tokenizer, context: list[int], choices: Sequence[str],
                    dtype: torch.dtype | None = None) -> tuple[list[float], list[int]]:
    """Summed log p(choice tokens | context) and the token count of each choice, in one batched forward."""
    choice_ids = [list(tokenizer(c, add_special_tokens=False)["input_ids"]) for c in choices]
    if any(not ids for ids in choice_ids):
        raise ValueError(f"a choice tokenizes to no tokens: {choices!r}.")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    width = max(len(ids) for ids in choice_ids)  # T
    n, p = len(choice_ids), len(context)
    input_ids = torch.full((n, p + width), pad, dtype=torch.long)  # (N, P+T): shared context, right-padded choices
    mask = torch.zeros((n, p + width), dtype=torch.long)
    for row, ids in enumerate(choice_ids):
        input_ids[row, :p] = torch.tensor(context)
        input_ids[row, p : p + len(ids)] = torch.tensor(ids)
        mask[row, : p + len(ids)] = 1
    device = next(model.parameters()).device
    logp = completion_logprobs(model, input_ids.to(device), mask.to(device), p, autocast_dtype=dtype)  # (N, T)
    return logp.sum(-1).tolist(), [len(ids) for ids in choice_ids]


def evaluate_choices(model, tokenizer, rows: Sequence[dict[str, Any]], chat: bool = True,
                     dtype: torch.dtype | None = None, progress=None) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """``loglik/acc`` (summed log-prob picks the gold choice), ``loglik/acc_norm`` (per-token mean picks it) and
    ``tokens/loglik`` (tokens run through the model: context once per choice, plus the choices), with per-row
    records (the two picks and the sums)."""
    was_training = model.training
    model.eval()
    records = []
    try:
        for i, row in enumerate(rows):
            context = encode_prompt(tokenizer, row["prompt"], chat)
            sums, counts = choice_logprobs(model, tokenizer, context, row["choices"], dtype)
            gold = gold_index(row)
            records.append({"gold": gold, "pick": choose(sums, counts, False), "pick_norm": choose(sums, counts, True),
                            "logps": sums, "tokens": counts, "forward_tokens": len(context) * len(counts) + sum(counts)})
            if progress:
                progress(i + 1)
    finally:
        model.train(was_training)
    n = max(1, len(records))
    return {"loglik/acc": sum(r["pick"] == r["gold"] for r in records) / n,
            "loglik/acc_norm": sum(r["pick_norm"] == r["gold"] for r in records) / n,
            "tokens/loglik": float(sum(r["forward_tokens"] for r in records))}, records

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
from lmrl.models.forward_plan import ForwardPlan


def check_choice_rows(rows: Sequence[dict[str, Any]], source: str) -> None:
    """Start-up check: a non-empty `choices` list and an `answer` naming one of them in every row."""
    for i, row in enumerate(rows):
        choices = row.get("choices")
        if (
            not isinstance(choices, (list, tuple))
            or len(choices) < 2
            or not all(isinstance(c, str) and c for c in choices)
        ):
            raise ValueError(
                f"{source}: row {i} needs a 'choices' column with two or more non-empty strings for "
                f"metric loglik (columns: {sorted(row)})."
            )
        gold_index(row, source, i)


def gold_index(row: dict[str, Any], source: str = "row", i: int = 0) -> int:
    """The index of the right choice: `answer` as an index, or as the text of a choice."""
    answer, choices = row.get("answer"), list(row["choices"])
    if isinstance(answer, int) and not isinstance(answer, bool) and 0 <= answer < len(choices):
        return answer
    if isinstance(answer, str) and answer in choices:
        return choices.index(answer)
    raise ValueError(
        f"{source}: row {i} has answer {answer!r}, which is neither an index into its "
        f"{len(choices)} choices nor one of their texts. Give the index (0-based) or the right choice's "
        "text as 'answer'."
    )


@torch.no_grad()
def choice_logprobs(
    model, tokenizer, context: list[int], choices: Sequence[str], dtype: torch.dtype | None = None
) -> tuple[list[float], list[int]]:
    """Summed log p(choice tokens | context) and the token count of each choice, in one batched forward."""
    sums, counts = batch_logprobs(model, tokenizer, [(context, list(choices))], dtype)
    return sums[0], counts[0]


@torch.no_grad()
def batch_logprobs(
    model, tokenizer, items: Sequence[tuple[list[int], list[str]]], dtype: torch.dtype | None = None
) -> tuple[list[list[float]], list[list[int]]]:
    """For each (context ids, choice texts): the summed log-prob and token count of every choice, all choices of
    all items in one forward (contexts left-padded to a common length, choices right-padded)."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    seqs = []  # (context, choice ids) per sequence
    for context, choices in items:
        for c in choices:
            ids = list(tokenizer(c, add_special_tokens=False)["input_ids"])
            if not ids:
                raise ValueError(f"a choice tokenizes to no tokens: {c!r}.")
            seqs.append((context, ids))
    p = max(len(ctx) for ctx, _ in seqs)  # P
    width = max(len(ids) for _, ids in seqs)  # T
    input_ids = torch.full((len(seqs), p + width), pad, dtype=torch.long)  # (N, P+T)
    mask = torch.zeros((len(seqs), p + width), dtype=torch.long)
    for row, (ctx, ids) in enumerate(seqs):
        input_ids[row, p - len(ctx) : p] = torch.tensor(ctx)
        input_ids[row, p : p + len(ids)] = torch.tensor(ids)
        mask[row, p - len(ctx) : p + len(ids)] = 1
    device = next(model.parameters()).device
    logp = ForwardPlan(dtype=dtype).logprobs(model, input_ids.to(device), mask.to(device), p)  # (N, T)
    flat_sums, flat_counts = logp.sum(-1).tolist(), [len(ids) for _, ids in seqs]
    sums, counts, i = [], [], 0
    for _, choices in items:
        sums.append(flat_sums[i : i + len(choices)])
        counts.append(flat_counts[i : i + len(choices)])
        i += len(choices)
    return sums, counts


def evaluate_choices(
    model,
    tokenizer,
    rows: Sequence[dict[str, Any]],
    chat: bool = True,
    dtype: torch.dtype | None = None,
    progress=None,
    batch_size: int = 64,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """``loglik/acc`` (summed log-prob picks the gold choice), ``loglik/acc_norm`` (per-token mean picks it) and
    ``tokens/loglik`` (tokens run through the model: context once per choice, plus the choices), with per-row
    records (the two picks and the sums)."""
    was_training = model.training
    model.eval()
    records = []
    try:
        for start in range(0, len(rows), batch_size):
            chunk = rows[start : start + batch_size]
            contexts = [encode_prompt(tokenizer, row["prompt"], chat) for row in chunk]
            all_sums, all_counts = batch_logprobs(
                model, tokenizer, [(c, list(r["choices"])) for c, r in zip(contexts, chunk)], dtype
            )
            for row, context, sums, counts in zip(chunk, contexts, all_sums, all_counts):
                records.append(
                    {
                        "gold": gold_index(row),
                        "pick": choose(sums, counts, False),
                        "pick_norm": choose(sums, counts, True),
                        "logps": sums,
                        "tokens": counts,
                        "forward_tokens": len(context) * len(counts) + sum(counts),
                    }
                )
            if progress:
                progress(start + len(chunk))
    finally:
        model.train(was_training)
    n = max(1, len(records))
    return {
        "loglik/acc": sum(r["pick"] == r["gold"] for r in records) / n,
        "loglik/acc_norm": sum(r["pick_norm"] == r["gold"] for r in records) / n,
        "tokens/loglik": float(sum(r["forward_tokens"] for r in records)),
    }, records

"""Packing: rows of different lengths concatenated into sequences of at most ``max_tokens`` tokens, so a batch whose
mean length is far below its longest row stops paying for padding.

Each packed sequence restarts its position ids at every row. HF transformers reads such position ids (with no
attention mask and no cache) as packed rows and keeps attention within a row: a block-diagonal causal mask for
SDPA/eager (``masking_utils.find_packed_sequence_indices``), the varlen kernel for flash attention. The label of a
row's first token is never trained (it would be predicted from the previous row's last token). Rows go into bins
first-fit-decreasing (`first_fit_decreasing`), and bins to ranks by token count (`balance`), as verl's
``seqlen_balancing`` does. `packed_forward_agrees` checks on a model that packing changes nothing, since a model
whose attention ignores packed position ids would silently attend across rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lmrl.numerics import Agreement, agreement, compute_dtype, model_ulps, rounding_bound

IGNORE_INDEX = -100


def first_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Indices of ``lengths`` grouped into bins of total <= ``capacity``: longest first, each into the first bin
    with room (FFD uses at most 11/9 OPT + 6/9 bins). Bins keep their rows' order of insertion."""
    if capacity < 1:
        raise ValueError(f"max_tokens_per_microbatch must be >= 1, got {capacity}.")
    too_long = [n for n in lengths if n > capacity]
    if too_long:
        raise ValueError(
            f"A row of {max(too_long)} tokens does not fit max_tokens_per_microbatch={capacity}: "
            f"raise it to at least {max(too_long)} (the longest row: max_length, or prompt + "
            f"max_new_tokens)."
        )
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        slot = next((b for b, free in enumerate(room) if free >= lengths[i]), None)
        if slot is None:
            bins.append([])
            room.append(capacity)
            slot = len(bins) - 1
        bins[slot].append(i)
        room[slot] -= lengths[i]
    return bins


def balance(bins: list[list[int]], lengths: Sequence[int], world: int) -> list[list[list[int]]]:
    """Bins dealt to ``world`` ranks, largest first to the least-loaded rank that has fewer than its share of
    ceil(len(bins)/world): token counts even out and bin counts differ by at most one."""
    share = -(-len(bins) // world)
    ranks: list[list[list[int]]] = [[] for _ in range(world)]
    load = [0] * world
    for b in sorted(bins, key=lambda b: -sum(lengths[i] for i in b)):
        r = min((r for r in range(world) if len(ranks[r]) < share), key=lambda r: (load[r], r))
        ranks[r].append(b)
        load[r] += sum(lengths[i] for i in b)
    return ranks


def pack(input_ids: Sequence[Sequence[int]], labels: Sequence[Sequence[int]]) -> dict[str, torch.Tensor]:
    """One packed sequence (1, sum of lengths): ``input_ids``, ``position_ids`` restarting at 0 per row, ``labels``
    with each row's first label set to -100 (no target crosses a row boundary), and ``row_ids`` (which row each
    token belongs to). No attention mask: HF builds the block-diagonal one from the position ids."""
    if not input_ids:
        raise ValueError("pack: got no rows.")
    ids, pos, lab, rows = [], [], [], []
    for r, (x, y) in enumerate(zip(input_ids, labels, strict=True)):
        if len(x) != len(y) or not x:
            raise ValueError(f"pack: row {r} has {len(x)} input ids and {len(y)} labels.")
        ids += list(x)
        pos += range(len(x))
        lab += [IGNORE_INDEX, *y[1:]]
        rows += [r] * len(x)
    as_row = lambda v: torch.tensor([v], dtype=torch.long)  # noqa: E731
    return {"input_ids": as_row(ids), "position_ids": as_row(pos), "labels": as_row(lab), "row_ids": as_row(rows)}


def packed_forward_agrees(model, vocab_size: int, lengths: Sequence[int] = (5, 3, 4)) -> bool:
    """True when `packed_forward_agreement` holds."""
    return bool(packed_forward_agreement(model, vocab_size, lengths))


@torch.no_grad()
def packed_forward_agreement(model, vocab_size: int, lengths: Sequence[int] = (5, 3, 4)) -> Agreement:
    """Whether ``model``'s logits for rows packed into one sequence equal its logits for each row alone (eval mode,
    fixed random tokens), up to rounding: the model keeps attention within a row and restarts positions. The bound
    is measured (`lmrl.numerics.rounding_bound`): each row alone again as the first row of a batch of 2 (another float
    order), and a floor of sqrt(hidden) * layers roundoffs. Measured on 15 architectures' tiny random models: OPT
    (positions from the attention mask) leaks (0.11), every other one agrees within 2e-7, and a leak changes logits by
    0.09-0.6."""
    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(0, vocab_size, (n,), generator=g).tolist() for n in lengths]
    device = next(model.parameters()).device
    logits = lambda ids: model(input_ids=ids.to(device), use_cache=False).logits.float()  # noqa: E731
    was_training = model.training
    model.eval()
    try:
        batch = pack(rows, rows)
        packed = (
            model(
                input_ids=batch["input_ids"].to(device), position_ids=batch["position_ids"].to(device), use_cache=False
            )
            .logits[0]
            .float()
        )
        alone = torch.cat([logits(torch.tensor([r]))[0] for r in rows])
        again = torch.cat([logits(torch.tensor([r, r[::-1]]))[0] for r in rows])
        bound = rounding_bound(alone, [again], dtype=compute_dtype(model), floor_ulps=model_ulps(model))
    finally:
        model.train(was_training)
    return agreement(packed, alone, bound)


def check_packable(model, vocab_size: int) -> None:
    """Start-up check for ``max_tokens_per_microbatch``: a clear error when ``model`` attends across packed rows."""
    if not packed_forward_agrees(model, vocab_size):
        raise ValueError(
            f"max_tokens_per_microbatch: {type(model).__name__} attends across packed rows (its attention "
            f"ignores position ids that restart per row, e.g. OPT, whose positions come from the attention "
            f"mask). Fix: max_tokens_per_microbatch=null."
        )

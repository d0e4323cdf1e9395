"""Per-token log-probs and entropies, and the forwards of completions they come from (the pieces
`lmrl.models.forward_plan.completion_logprobs` puts together under a run's plan).

Layout (same as `RolloutBatch.input_ids`): a left-padded prompt of width P followed by a right-padded
completion of width T. Completion token j sits at position P+j and is predicted by the logits at P+j-1,
so the completion log-probs come from logits P-1 .. P+T-2.
"""

from __future__ import annotations

import contextlib

import torch

from lmrl.models.head import DEFAULT_CHUNK_MB, chunked_head
from lmrl.models.hf_compat import (
    accepts_kwarg,
    cache_kwarg,
    new_dynamic_cache,
    output_cache,
)

__all__ = [
    "accepts_kwarg",
    "entropy_from_logits",
    "labelled_logprobs",
    "prompt_groups",
    "selective_log_softmax",
    "shared_prompt_outputs",
]


def _row_chunks(n_rows: int, vocab: int, chunk_size: int | None) -> int:
    """Rows per chunk: `chunk_size` if given, else enough rows for ~16M fp32 values (64 MB) per chunk."""
    if chunk_size is not None:
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive number of rows, got {chunk_size}.")
        return chunk_size
    return max(1, min(n_rows, (1 << 24) // max(vocab, 1)))


def selective_log_softmax(
    logits: torch.Tensor, index: torch.Tensor, *, temperature: float = 1.0, chunk_size: int | None = None
) -> torch.Tensor:
    """log_softmax(logits / temperature)[..., index], in fp32, without materialising the full log-softmax.

    log p(index) = z[index] - logsumexp(z), z = logits / temperature, computed over chunks of rows so the
    fp32 temporaries are (chunk, V) at most. logits: (..., V); index: (...) long. Returns fp32 (...).
    Equal to `torch.log_softmax(logits.float() / temperature, -1).gather(-1, index[..., None])[..., 0]`.
    """
    if logits.shape[:-1] != index.shape:
        raise ValueError(
            f"selective_log_softmax: index shape {tuple(index.shape)} must equal logits shape without the vocab "
            f"dimension {tuple(logits.shape[:-1])}."
        )
    if not temperature > 0:
        raise ValueError(f"selective_log_softmax: temperature must be > 0, got {temperature}.")
    vocab = logits.shape[-1]
    flat_logits = logits.reshape(-1, vocab)  # (M, V)
    flat_index = index.reshape(-1, 1)  # (M, 1)
    step = _row_chunks(flat_logits.shape[0], vocab, chunk_size)
    out = []
    for start in range(0, flat_logits.shape[0], step):
        z = flat_logits[start : start + step].float()  # (m, V) fp32
        z = z / temperature if temperature != 1.0 else z  # no pass over (m, V) for nothing
        picked = z.gather(-1, flat_index[start : start + step]).squeeze(-1)  # (m,)
        out.append(picked - torch.logsumexp(z, dim=-1))
    if not out:
        return torch.zeros(index.shape, dtype=torch.float32, device=logits.device)
    return torch.cat(out).view(index.shape)


def entropy_from_logits(
    logits: torch.Tensor, *, temperature: float = 1.0, chunk_size: int | None = None
) -> torch.Tensor:
    """Entropy H = -sum_v p_v log p_v of softmax(logits / temperature), per row, in fp32, over chunks of rows.

    Computed as H = logsumexp(z) - sum_v softmax(z)_v z_v (finite even when some p_v underflow to 0).
    logits: (..., V). Returns fp32 (...).
    """
    if not temperature > 0:
        raise ValueError(f"entropy_from_logits: temperature must be > 0, got {temperature}.")
    vocab = logits.shape[-1]
    flat = logits.reshape(-1, vocab)  # (M, V)
    step = _row_chunks(flat.shape[0], vocab, chunk_size)
    out = []
    for start in range(0, flat.shape[0], step):
        z = flat[start : start + step].float()  # (m, V)
        z = z / temperature if temperature != 1.0 else z
        out.append(torch.logsumexp(z, dim=-1) - (z.softmax(dim=-1) * z).sum(dim=-1))
    if not out:
        return torch.zeros(logits.shape[:-1], dtype=torch.float32, device=logits.device)
    return torch.cat(out).view(logits.shape[:-1])


def labelled_logprobs(
    model, batch: dict[str, torch.Tensor], autocast_dtype: torch.dtype | None = None, chunk_mb: float = DEFAULT_CHUNK_MB
) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(labels[:, t+1] | tokens <= t) (B, L-1), 0 where the label is -100, and that mask (B, L-1) bool.

    ``batch``: ``input_ids`` and ``labels`` (B, L) with either an ``attention_mask`` (right-padded rows) or
    ``position_ids`` that restart at every row of a packed sequence (`lmrl.data.packing`; no mask: HF keeps
    attention within a row). One forward; the LM head in chunks when the logits would exceed ``chunk_mb``."""
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "position_ids") if k in batch}
    targets = batch["labels"][:, 1:]  # (B, L-1): token t+1 is predicted at t
    labelled = targets != -100
    parts = chunked_head(model, targets.numel(), chunk_mb, sharded=True)
    ctx = (
        torch.autocast(targets.device.type, dtype=autocast_dtype)
        if autocast_dtype is not None
        else contextlib.nullcontext()
    )
    with ctx:
        if parts is not None:
            logp = parts.run(
                lambda: parts.logprobs(
                    parts.decoder(**inputs, use_cache=False).last_hidden_state[:, :-1],
                    targets.clamp(min=0),
                    chunk_mb=chunk_mb,
                )
            )
        else:
            extra = {"use_cache": False} if accepts_kwarg(model, "use_cache") else {}
            logits = model(**inputs, **extra).logits[:, :-1]
    if parts is None:
        logp = selective_log_softmax(logits, targets.clamp(min=0))
    return torch.where(labelled, logp, torch.zeros_like(logp)), labelled


def valid_head_logprobs(parts, hidden: torch.Tensor, targets: torch.Tensor, valid: torch.Tensor, **kwargs):
    """`HeadParts.logprobs` at the positions that hold a completion token only, zeros elsewhere: hidden (N, T, H),
    targets and valid (N, T) -> (N, T) (a tuple with the entropy too). The padding after a row's stop costs no
    LM-head FLOPs (with a 49,152-token vocabulary the head is most of a small model's training step)."""
    if bool(valid.all()):
        return parts.logprobs(hidden, targets, **kwargs)
    out = parts.logprobs(hidden[valid], targets[valid], **kwargs)  # (M,) each, M = valid.sum()

    def place(x: torch.Tensor) -> torch.Tensor:
        return x.new_zeros(valid.shape).index_put((valid,), x)

    return tuple(place(x) for x in out) if isinstance(out, tuple) else place(out)


def adapters_off(model) -> contextlib.AbstractContextManager:
    """The LoRA reference view's `disable_adapter()` (its decoder is the policy's), else nothing."""
    policy = getattr(model, "policy", None)
    return (
        policy.disable_adapter()
        if policy is not None and hasattr(policy, "disable_adapter")
        else contextlib.nullcontext()
    )


def packed_rows(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_start: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The real tokens of left/right-padded rows (N, P+T) as one packed row: ``input_ids`` and ``position_ids``
    (1, L), restarting at 0 per row, and ``index`` (N, T): the packed position whose output predicts completion
    token j of row b (the position of column P+j-1; padding positions point anywhere and are masked by the caller)."""
    mask = attention_mask.bool()
    lengths = mask.sum(dim=1)  # (N,)
    offsets = lengths.cumsum(0) - lengths  # (N,) each row's first packed position
    total = int(lengths.sum())
    positions = torch.arange(total, device=input_ids.device) - offsets.repeat_interleave(lengths)  # (L,)
    first = mask.long().argmax(dim=1)  # (N,) each row's first real column (after its left padding)
    width = input_ids.shape[1] - completion_start
    columns = completion_start - 1 + torch.arange(width, device=input_ids.device)  # (T,)
    index = (offsets[:, None] + columns[None, :] - first[:, None]).clamp(0, total - 1)  # (N, T)
    return input_ids[mask][None], positions[None], index


def packed_outputs(
    module, input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_start: int, key: str
) -> torch.Tensor:
    """``module``'s output ``key`` (logits or last_hidden_state) at the positions that predict the completion
    tokens, (N, T, D), from one forward over the rows packed (`packed_rows`; no mask, no KV cache: HF keeps attention
    within a row only then)."""
    ids, positions, index = packed_rows(input_ids, attention_mask, completion_start)
    extra = {"use_cache": False} if accepts_kwarg(module, "use_cache") else {}
    out = getattr(module(input_ids=ids, position_ids=positions, **extra), key)[0]  # (L, D)
    return out[index]  # (N, T, D)


def completion_hidden(
    decoder,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    completion_start: int,
    groups: tuple[torch.Tensor, torch.Tensor] | None,
) -> torch.Tensor:
    """The decoder's last hidden states (N, T, H) at positions P-1 .. P+T-2 (they predict the completion tokens);
    with ``groups`` each distinct prompt runs once (`shared_prompt_outputs`)."""
    width = input_ids.shape[1] - completion_start
    if groups is not None:
        return shared_prompt_outputs(
            decoder, input_ids, attention_mask, position_ids, completion_start, *groups, key="last_hidden_state"
        )
    extra = {"use_cache": False} if accepts_kwarg(decoder, "use_cache") else {}
    out = decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **extra)
    return out.last_hidden_state[:, -(width + 1) : -1]


def prompt_groups(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_start: int
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(first row of each distinct prompt (U,), each row's prompt index (N,)), or None if no prompt repeats.

    A prompt is its ids and mask over the first `completion_start` positions; rows may come in any order. Prompts
    are numbered in order of first appearance, so rows grouped by prompt (prompt-major) get non-decreasing indices.
    """
    prompts = torch.cat([input_ids[:, :completion_start], attention_mask[:, :completion_start].long()], 1)  # (N, 2P)
    _, inverse = torch.unique(prompts, dim=0, return_inverse=True)  # (N,) ids of distinct prompts, sorted
    n_unique = int(inverse.max()) + 1
    if n_unique == len(inverse):
        return None
    rows = torch.arange(len(inverse), device=inverse.device)
    first = torch.full((n_unique,), len(inverse), device=inverse.device).scatter_reduce(0, inverse, rows, "amin")
    order = torch.argsort(first)  # unique ids by first appearance
    rank = torch.empty_like(order)
    rank[order] = torch.arange(n_unique, device=order.device)
    return first[order], rank[inverse]


def shared_prompt_outputs(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    completion_start: int,
    first: torch.Tensor,
    inverse: torch.Tensor,
    key: str = "logits",
) -> torch.Tensor:
    """Logits (N, T, V) at positions P-1 .. P+T-2, running each distinct prompt once (``key="last_hidden_state"``
    with a decoder: its hidden states (N, T, H) at those positions).

    Forward 1: the U distinct prompts (U, P), keeping their KV cache and the last position's logits.
    Forward 2: the N completions (N, T) on the cache rows `inverse` (indexing is differentiable, so the prompt
    tokens get the gradient of every completion of their group), with the full (N, P+T) attention mask.
    """
    p = completion_start
    name = cache_kwarg(model)
    extra = {"logits_to_keep": 1} if accepts_kwarg(model, "logits_to_keep") else {}
    out = model(
        input_ids=input_ids[first, :p],
        attention_mask=attention_mask[first, :p],
        position_ids=position_ids[first, :p],
        use_cache=True,
        **{name: new_dynamic_cache(model.config)},
        **extra,
    )
    cache = output_cache(out)
    _expand_cache(cache, inverse)  # (U, ...) -> (N, ...) per layer
    last_prompt = getattr(out, key)[inverse, -1:]  # (N, 1, V): predicts completion token 0
    if input_ids.shape[1] == p + 1:  # T = 1: the prompt's output is all there is
        return last_prompt
    completion = model(
        input_ids=input_ids[:, p:-1],
        attention_mask=attention_mask[:, :-1],
        position_ids=position_ids[:, p:-1],
        use_cache=True,
        **{name: cache},
    )
    return torch.cat([last_prompt, getattr(completion, key)], 1)  # (N, T, V)


def _expand_cache(cache, inverse: torch.Tensor) -> None:
    """Give row i of the cache the keys/values of prompt inverse[i]. When rows are grouped by prompt (inverse
    non-decreasing, the prompt-major layout), a repeat whose backward is a sum over each group: `expand` for equal
    groups (measured 0.15 ms per (8, 8, 25, 48) tensor, forward and backward), else `repeat_interleave` (0.3 ms);
    otherwise indexing (an accumulating scatter in the backward, 1.5 ms)."""
    layers = getattr(cache, "layers", None)
    grouped = bool((inverse.diff() >= 0).all())
    if not grouped or not layers or not all(hasattr(layer, "keys") and hasattr(layer, "values") for layer in layers):
        cache.batch_select_indices(inverse)
        return
    counts = torch.bincount(inverse)  # (U,): every prompt has at least its first row
    size = int(counts[0])
    for layer in layers:
        if bool((counts == size).all()):
            layer.keys, layer.values = (_repeat_rows(t, size) for t in (layer.keys, layer.values))
        else:
            layer.keys = layer.keys.repeat_interleave(counts, dim=0, output_size=len(inverse))
            layer.values = layer.values.repeat_interleave(counts, dim=0, output_size=len(inverse))


def _repeat_rows(tensor: torch.Tensor, times: int) -> torch.Tensor:
    """(U, ...) -> (U * times, ...), each row `times` times in a row: repeat_interleave(times, 0), summed backward."""
    return tensor.unsqueeze(1).expand(tensor.shape[0], times, *tensor.shape[1:]).reshape(-1, *tensor.shape[1:])

"""A memory-bounded LM head: log-probs (and entropy) of target tokens from hidden states, chunk by chunk.

Full logits cost rows x tokens x vocab: with Qwen2.5's 151,936-token vocabulary, 128 completions x 1,024 tokens
are 80 GB in fp32. Here the LM head, log-softmax, gather and entropy run on chunks of at most `chunk_mb` of fp32
logits; in training each chunk is recomputed in the backward instead of kept, so the peak is about ``chunk_mb``
whatever the batch (the fused path's chunks are half that: a chunk's logits and one temporary of the same size). A plain bias-free ``nn.Linear`` head (every HF causal LM's)
takes a fused path (`FusedHeadLogprobs`: the gradient of log-softmax written out, dz = (onehot(y) - p) / T, so a
chunk costs 5 passes over its logits forward and 3 backward instead of autograd's ~20); other heads checkpoint each
chunk. When everything fits in one chunk (small vocabularies, the built-in models) the head runs once, as an
ordinary forward: same values, same speed.

    hidden = decoder(...).last_hidden_state          # (N, T, H)
    logp, entropy = head_logprobs(hidden, lm_head, targets, chunk_mb=128)   # (N, T) each
"""

from __future__ import annotations

import weakref
from typing import Any, NamedTuple

import torch
from torch.utils.checkpoint import checkpoint

DEFAULT_CHUNK_MB = 128
SPLIT_FORWARD = "lmrl_split_forward"
"""The method `lmrl.parallel.wrap` registers on an FSDP-sharded model as a forward (`HeadParts.run`)."""

__all__ = [
    "DEFAULT_CHUNK_MB",
    "SPLIT_FORWARD",
    "FusedHeadLogprobs",
    "HeadParts",
    "chunk_tokens",
    "chunked_head",
    "decoder_and_head",
    "fusable",
    "head_logprobs",
]


def chunk_tokens(vocab: int, chunk_mb: float) -> int:
    """Token positions per chunk: as many rows of fp32 logits (4 x vocab bytes each) as fit in ``chunk_mb``."""
    return max(1, int(chunk_mb * 2**20) // (4 * vocab))


class HeadParts(NamedTuple):
    """An HF causal LM split as logits = post(lm_head(decoder(...).last_hidden_state)), where post multiplies by
    ``scale`` (Granite's 1 / logits_scaling, Cohere's logit_scale) and then soft-caps, z -> c tanh(z / c), with
    c = ``softcap`` (Gemma-2/3's final_logit_softcapping; None: no cap)."""

    decoder: torch.nn.Module
    head: torch.nn.Module
    scale: float = 1.0
    softcap: float | None = None
    runner: Any = None  # an FSDP-sharded model's `SPLIT_FORWARD` method (`run`)

    @property
    def plain(self) -> bool:
        return self.scale == 1.0 and self.softcap is None

    def run(self, fn, *args):
        """``fn(*args)``, which calls `decoder` and `logprobs`; on an FSDP-sharded model inside its registered forward
        method, so FSDP gathers the root's parameters (embeddings, final norm, head) around it and reduces their
        gradients in the backward, as for the model's own forward."""
        return self.runner(fn, *args) if self.runner is not None else fn(*args)

    def logprobs(self, hidden: torch.Tensor, targets: torch.Tensor, **kwargs):
        """`head_logprobs` through this head and its post-processing."""
        return head_logprobs(hidden, self.head, targets, scale=self.scale, softcap=self.softcap, **kwargs)


_VERIFIED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> whether the split reproduces it


def decoder_and_head(model, verified: bool = False) -> HeadParts | None:
    """The decoder, LM head and logit post-processing of an HF causal LM (through a peft wrapper), checked once per
    model against its own forward on a few tokens; None (full logits, as usual) for models without those parts or
    whose logits the split does not reproduce (a post-processing lmrl does not know), with a warning.
    ``verified=True`` skips that check (for a caller that checks only when it will use the split)."""
    lm = _language_model(model)
    decoder = getattr(lm, "base_model", None)
    get_head = getattr(lm, "get_output_embeddings", None)
    head = get_head() if get_head is not None else None
    hf_config = getattr(lm, "config", None)  # transformers' config: its keys vary by architecture
    if decoder is None or decoder is lm or head is None or hf_config is None or not hasattr(head, "weight"):
        return None
    scale = float(getattr(lm, "logit_scale", None) or 1.0) / float(getattr(hf_config, "logits_scaling", None) or 1.0)
    parts = HeadParts(
        decoder,
        head,
        scale,
        getattr(hf_config, "final_logit_softcapping", None) or None,
        getattr(model, SPLIT_FORWARD, None),
    )
    return parts if verified else _checked(lm, parts)


def _language_model(model):
    """The HF causal LM inside a peft wrapper or `BaseModelView`, or the model itself."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _checked(lm, parts: HeadParts) -> HeadParts | None:
    if lm not in _VERIFIED:
        _VERIFIED[lm] = _reproduces_logits(lm, parts)
    return parts if _VERIFIED[lm] else None


def _reproduces_logits(lm, parts: HeadParts) -> bool:
    """Whether the split reproduces ``lm``'s logits (`head_agreement`); says so in one line when it does not."""
    from lmrl.notices import model_name, switched_off

    outcome = head_agreement(lm, parts)
    if not outcome:
        switched_off(
            "the chunked LM head",
            model_name(lm),
            f"its logits are not lm_head(hidden states) with a known scale or soft-cap ({outcome}); log-probs use the "
            "full logits, so memory grows with the vocabulary (metric update/chunked_head: 0)",
        )
    return bool(outcome)


def head_agreement(lm, parts: HeadParts):
    """How far post(head(decoder(x))) equals lm(x).logits on 4 tokens up to rounding (fp32 where the weights are, eval
    mode, modes restored after). The rounding bound is measured (`lmrl.numerics.rounding_bound`): lm(x).logits again
    as the second row of a batch of 2, and a floor of sqrt(hidden) * layers roundoffs; a missing scale or soft-cap
    moves logits by O(1) of their scale."""
    from lmrl.models.hf_compat import accepts_kwarg
    from lmrl.models.modes import evaluating
    from lmrl.numerics import agreement, compute_dtype, model_ulps, rounding_bound

    device = parts.head.weight.device
    ids = torch.arange(1, 5, device=device)[None] % parts.head.weight.shape[0]  # (1, 4)
    extra = {"use_cache": False} if accepts_kwarg(lm, "use_cache") else {}
    with torch.no_grad(), torch.autocast(device.type, enabled=False), evaluating(lm):
        logits = lm(input_ids=ids, **extra).logits.float()[0]
        again = lm(input_ids=torch.cat([ids.flip(1), ids]), **extra).logits.float()[1]
        split = parts.run(
            lambda: _post(
                parts.head(parts.decoder(input_ids=ids, **extra).last_hidden_state).float(), parts.scale, parts.softcap
            )
        )[0]
        bound = rounding_bound(logits, [again], dtype=compute_dtype(lm), floor_ulps=model_ulps(lm))
    return agreement(split, logits, bound)


def _post(z: torch.Tensor, scale: float, softcap: float | None) -> torch.Tensor:
    """The model's logit post-processing: z * scale, then softcap * tanh(z / softcap)."""
    if scale != 1.0:
        z = z * scale
    return z if softcap is None else torch.tanh(z / softcap) * softcap


def chunked_head(model, positions: int, chunk_mb: float, sharded: bool = False) -> HeadParts | None:
    """The split model (`decoder_and_head`) when ``positions`` rows of fp32 logits would exceed ``chunk_mb``; None
    when one ordinary forward is the way (everything fits in one chunk, the model cannot be split, or it is
    FSDP-sharded and the caller does not take that: ``sharded=True`` callers run the split through `HeadParts.run`)."""
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule) and not (sharded and getattr(model, SPLIT_FORWARD, None) is not None):
        return None
    parts = decoder_and_head(model, verified=True)
    if parts is None or positions <= chunk_tokens(parts.head.weight.shape[0], chunk_mb):
        return None
    return _checked(_language_model(model), parts)


def _chunk_logprobs(
    hidden: torch.Tensor,
    weight_module: torch.nn.Module,
    targets: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    scale: float = 1.0,
    softcap: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """log_softmax(post(head(h)) / T)[target] and (no grad) the entropy, for one chunk (m, H) -> (m,), (m,)."""
    z = _post(weight_module(hidden).float(), scale, softcap)  # (m, V)
    z = z / temperature if temperature != 1.0 else z
    lse = torch.logsumexp(z, dim=-1)  # (m,)
    logp = z.gather(-1, targets[:, None]).squeeze(-1) - lse
    if not with_entropy:
        return logp, torch.zeros_like(logp).detach()
    with torch.no_grad():
        entropy = lse - (z.softmax(dim=-1) * z).sum(dim=-1)
    return logp, entropy


def _compute_dtype(device: torch.device, weight: torch.Tensor) -> torch.dtype:
    """The head's matmul dtype: autocast's where it is on (as ``nn.Linear`` would run), else the weight's."""
    return torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else weight.dtype


def _logits(
    hidden: torch.Tensor, weight: torch.Tensor, temperature: float, out: torch.Tensor, low: torch.Tensor | None
) -> torch.Tensor:
    """z = h W^T / T in fp32 (m, V), written into ``out``; hidden and weight already in the compute dtype, whose
    matmul result goes through ``low`` (m, V) first when that dtype is not fp32."""
    if low is None:
        torch.mm(hidden, weight.T, out=out)
    else:
        out.copy_(torch.mm(hidden, weight.T, out=low))
    return out.div_(temperature) if temperature != 1.0 else out


class _ChunkBuffers:
    """The (rows, V) buffers one call of `FusedHeadLogprobs` reuses for every chunk: fp32 logits, one fp32
    temporary and the compute-dtype matmul output (and, for dW, one (V, H) product). Fresh tensors per chunk would
    each be a new allocation, and above glibc's mmap threshold (32 MiB) a new mapping whose pages fault in again:
    a 49,152-token vocabulary at 341 rows is 64 MiB of fp32 logits per chunk."""

    def __init__(self, rows: int, weight: torch.Tensor, dtype: torch.dtype, with_part: bool = False):
        vocab, device = weight.shape[0], weight.device
        self.z = torch.empty(rows, vocab, device=device)
        self.tmp = torch.empty(rows, vocab, device=device)
        self.low = None if dtype == torch.float32 else torch.empty(rows, vocab, dtype=dtype, device=device)
        self.part = (
            torch.empty(weight.shape, dtype=dtype, device=device) if with_part and self.low is not None else None
        )

    def logits(self, hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
        m = hidden.shape[0]
        return _logits(hidden, weight, temperature, self.z[:m], None if self.low is None else self.low[:m])


class FusedHeadLogprobs(torch.autograd.Function):
    """logp_i = z_i[y_i] - logsumexp(z_i) and (no gradient) H_i = logsumexp(z_i) - sum_v p_iv z_iv, z_i = h_i W^T / T,
    over row chunks of ``rows``; the backward recomputes each chunk's z and applies d logp_i / d z_i = (onehot(y_i)
    - p_i) / T, then dh = dz W and dW = sum over chunks of dz^T h (fp32). Only h, W, y and logsumexp are saved; the
    chunks reuse one set of buffers per call (`_ChunkBuffers`)."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature: float, rows: int, with_entropy: bool):
        dtype = _compute_dtype(hidden.device, weight)
        h_all, w = hidden.to(dtype), weight.to(dtype)
        n = hidden.shape[0]
        logp, lse = torch.empty(n, device=hidden.device), torch.empty(n, device=hidden.device)  # (M,) fp32
        entropy = torch.zeros(n, device=hidden.device)  # (M,)
        buffers = _ChunkBuffers(min(rows, n), weight, dtype)
        with torch.autocast(hidden.device.type, enabled=False):
            for start in range(0, n, rows):
                at = slice(start, start + rows)
                z = buffers.logits(h_all[at], w, temperature)  # (m, V)
                top = z.amax(dim=-1, keepdim=True)  # (m, 1)
                e = torch.sub(z, top, out=buffers.tmp[: len(z)]).exp_()  # (m, V) = exp(z - max)
                total = e.sum(dim=-1)  # (m,)
                lse[at] = top.squeeze(-1) + total.log()
                if with_entropy:
                    entropy[at] = lse[at] - e.mul_(z).sum(dim=-1) / total  # sum_v p_v z_v = sum_v e_v z_v / total
                logp[at] = z.gather(-1, targets[at, None]).squeeze(-1) - lse[at]
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.temperature, ctx.rows, ctx.dtype = temperature, rows, dtype
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, _grad_entropy):
        hidden, weight, targets, lse = ctx.saved_tensors
        h_all, w = hidden.to(ctx.dtype), weight.to(ctx.dtype)
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(hidden) if want_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_w else None
        scale = grad_logp.float() / ctx.temperature  # (M,)
        buffers = _ChunkBuffers(min(ctx.rows, hidden.shape[0]), weight, ctx.dtype, with_part=want_w)
        with torch.autocast(hidden.device.type, enabled=False):
            for start in range(0, hidden.shape[0], ctx.rows):
                at = slice(start, start + ctx.rows)
                dz = buffers.logits(h_all[at], w, ctx.temperature).sub_(lse[at, None]).exp_()  # (m, V) = p
                dz.mul_(-scale[at, None]).scatter_add_(-1, targets[at, None], scale[at, None])  # (onehot - p) g / T
                if buffers.low is not None:
                    dz = buffers.low[: len(dz)].copy_(dz)  # in the compute dtype
                if want_h:
                    grad_h[at] = (dz @ w).to(hidden.dtype)
                if want_w and buffers.part is None:  # fp32: accumulate in place
                    grad_w.addmm_(dz.T, h_all[at])
                elif want_w:
                    grad_w.add_(torch.mm(dz.T, h_all[at], out=buffers.part))
        return grad_h, None if grad_w is None else grad_w.to(weight.dtype), None, None, None, None


def fusable(lm_head: torch.nn.Module) -> bool:
    """A head `FusedHeadLogprobs` computes exactly: a plain, bias-free ``nn.Linear`` (adapters or hooks on it: no)."""
    return (
        type(lm_head) is torch.nn.Linear
        and lm_head.bias is None
        and not lm_head._forward_hooks
        and not lm_head._forward_pre_hooks
    )


def head_logprobs(
    hidden: torch.Tensor,
    lm_head: torch.nn.Module,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_mb: float = DEFAULT_CHUNK_MB,
    return_entropy: bool = False,
    scale: float = 1.0,
    softcap: float | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """log softmax(post(lm_head(hidden)) / temperature) at ``targets``, in fp32, never holding more than
    ``chunk_mb`` of fp32 logits (forward and backward); post(z) = softcap tanh(scale z / softcap) (`HeadParts`).
    hidden (..., H), targets (...) long -> (...) fp32; with return_entropy also the entropy (...) of the same
    distributions, without gradient. Gradients reach ``hidden`` and the head's weights and equal those of the
    unchunked computation. The fused path takes a scale as a temperature: scale z / T = z / (T / scale)."""
    if hidden.shape[:-1] != targets.shape:
        raise ValueError(
            f"head_logprobs: targets {tuple(targets.shape)} must be hidden {tuple(hidden.shape)} "
            "without its last dimension."
        )
    flat_h, flat_t = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)  # (M, H), (M,)
    step = chunk_tokens(lm_head.weight.shape[0], chunk_mb)
    if flat_h.shape[0] > step and fusable(lm_head) and softcap is None:  # a chunk's logits + one temporary: half-size
        logp, entropy = FusedHeadLogprobs.apply(
            flat_h, lm_head.weight, flat_t, temperature / scale, max(1, step // 2), return_entropy
        )
    elif flat_h.shape[0] <= step:  # one chunk: an ordinary forward (nothing to gain from recomputing)
        logp, entropy = _chunk_logprobs(flat_h, lm_head, flat_t, temperature, return_entropy, scale, softcap)
    else:
        recompute = torch.is_grad_enabled() and (flat_h.requires_grad or lm_head.weight.requires_grad)
        parts = []
        for start in range(0, flat_h.shape[0], step):
            args = (
                flat_h[start : start + step],
                lm_head,
                flat_t[start : start + step],
                temperature,
                return_entropy,
                scale,
                softcap,
            )
            parts.append(
                checkpoint(_chunk_logprobs, *args, use_reentrant=False) if recompute else _chunk_logprobs(*args)
            )
        logp, entropy = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    logp = logp.view(targets.shape)
    return (logp, entropy.view(targets.shape)) if return_entropy else logp

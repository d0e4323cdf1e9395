"""Direct alignment (DPO-family) losses as pure tensor functions.

Source: RLHF book ch. 8 (direct alignment) and eq. 139 (DPO+NLL), as specified
in `spec/rlhf-book-advanced.md` §1 and §7; formulas the book only names come
from the paper or reference code cited on each entry.

Entry point: `preference_loss(name, batch, **opts) -> Tensor (B,)`, one loss
per example; the trainer reduces it (usually `.mean()`).

Paired batch fields, each a float tensor of shape (B,):
    chosen, rejected           SUM of completion-token log-probs under the policy
    ref_chosen, ref_rejected   the same under the frozen reference policy
    chosen_len, rejected_len   number of completion tokens (> 0)
Extra fields, named on the entries that need them: `chosen_nll` (orpo,
dpo_nll), `delta` (bco), `chosen_score`/`rejected_score` (odpo); KTO is
unpaired: `logp`, `ref_logp`, `label`, `kl_ref`.

Entries declare what a trainer must provide as traits (`PREFERENCE_LOSSES.trait(name, key)`), so no trainer
tests a loss's name: ``unpaired`` (KTO: labelled single completions), ``needs_scores`` (ODPO: chosen/rejected
ratings), ``running_delta`` (BCO: the running mean δ of the implicit rewards, kept by a `RunningDelta`),
``reference_free`` (SimPO, ORPO: no π_ref).

Notation: u = logπθ(y) − logπref(y) (summed log-ratio of one completion),
h = u_c − u_r (the DPO logit), σ = sigmoid, avg(y) = logπθ(y) / |y|.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor

from .registry import Registry, check_options, keyword_options

PREFERENCE_LOSSES = Registry("preference loss")

PAIRED = ("chosen", "rejected", "ref_chosen", "ref_rejected")
LENGTHS = ("chosen_len", "rejected_len")


# ----------------------------------------------------------------------------
# batch and option checks
# ----------------------------------------------------------------------------


def _field(batch: Mapping[str, Tensor], key: str, loss: str) -> Tensor:
    """Fetch `batch[key]` as a 1-D tensor, or raise naming the loss and the fix."""
    if key not in batch:
        raise ValueError(
            f"preference loss {loss!r} needs the batch field {key!r}, but the batch has "
            f"only {sorted(batch)}. Add {key!r} as a (B,) tensor (see the docstring of "
            f"lmrl.algorithms.preference for what each field holds)."
        )
    value = batch[key]
    if not isinstance(value, Tensor) or value.dim() != 1:
        shape = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
        raise ValueError(
            f"preference loss {loss!r}: batch field {key!r} must be a 1-D tensor of shape "
            f"(B,), one value per example, but got {shape}. Sum per-token log-probs over "
            f"the completion (mask the prompt) before calling the loss."
        )
    return value


def _fields(batch: Mapping[str, Tensor], keys: tuple[str, ...], loss: str) -> list[Tensor]:
    """Fetch several (B,) fields and check they share one batch size."""
    values = [_field(batch, key, loss) for key in keys]
    sizes = {key: v.shape[0] for key, v in zip(keys, values)}
    if len(set(sizes.values())) > 1:
        raise ValueError(
            f"preference loss {loss!r}: batch fields must all have the same batch size B, "
            f"but got {sizes}. Build every field from the same B examples."
        )
    return values


def _lengths(batch: Mapping[str, Tensor], loss: str, like: Tensor) -> tuple[Tensor, Tensor]:
    """Fetch `chosen_len`, `rejected_len` in the dtype of `like`, checking they are positive."""
    chosen_len, rejected_len = _fields(batch, LENGTHS, loss)
    if chosen_len.shape != like.shape:
        raise ValueError(
            f"preference loss {loss!r}: token counts have batch size {chosen_len.shape[0]} but "
            f"the log-probs have {like.shape[0]}. Pass one count per example."
        )
    if bool((chosen_len <= 0).any()) or bool((rejected_len <= 0).any()):
        raise ValueError(
            f"preference loss {loss!r} divides by the completion lengths, but some of "
            f"`chosen_len`/`rejected_len` are <= 0. Drop empty completions from the batch."
        )
    return chosen_len.to(like), rejected_len.to(like)


def _shift(batch: Mapping[str, Tensor], key: str, loss: str, like: Tensor) -> Tensor:
    """Fetch an optional scalar-or-(B,) reference point, default 0, detached, as `like`."""
    value = torch.as_tensor(batch.get(key, 0.0)).detach().to(like)
    if value.dim() > 1 or (value.dim() == 1 and value.shape != like.shape):
        raise ValueError(
            f"preference loss {loss!r}: batch field {key!r} must be a scalar or a (B,) tensor "
            f"with B={like.shape[0]}, but got shape {tuple(value.shape)}."
        )
    return value


def _positive(loss: str, **values: float) -> None:
    for key, value in values.items():
        if not value > 0:
            raise ValueError(
                f"preference loss {loss!r}: option {key!r} must be > 0, got {value}. "
                f"It is a temperature/scale; typical values are in the entry's docstring."
            )


def _non_negative(loss: str, **values: float) -> None:
    for key, value in values.items():
        if not value >= 0:
            raise ValueError(
                f"preference loss {loss!r}: option {key!r} must be >= 0, got {value}; it weights a loss term."
            )


# ----------------------------------------------------------------------------
# public entry points
# ----------------------------------------------------------------------------


def preference_loss(name: str, batch: Mapping[str, Tensor], **opts: object) -> Tensor:
    """Per-example loss (B,) of the DPO-family loss registered as `name`.

    `batch` holds the fields listed in the module docstring; `opts` are the
    keyword options of that entry (e.g. `beta`). Unknown names or options raise.
    """
    fn = PREFERENCE_LOSSES.get(name)
    check_options(f"preference loss {name!r}", opts, keyword_options(fn))
    return fn(batch, **opts)


def implicit_rewards(batch: Mapping[str, Tensor], beta: float) -> tuple[Tensor, Tensor]:
    """DPO implicit rewards r̂(y) = β(logπθ(y) − logπref(y)), detached [B eq. 80]."""
    chosen, rejected, ref_chosen, ref_rejected = _fields(batch, PAIRED, "implicit_rewards")
    return (
        (beta * (chosen - ref_chosen)).detach(),  # (B,)
        (beta * (rejected - ref_rejected)).detach(),  # (B,)
    )


def preference_stats(batch: Mapping[str, Tensor], beta: float, reference_free: bool = False) -> dict[str, float]:
    """Batch means for logging: implicit rewards [B eq. 80], margin, accuracy, log-probs.

    `policy/reward_accuracy` is the fraction of pairs with r̂(yc) > r̂(yr). Log
    `policy/logp_*` separately: both usually fall during DPO (preference
    displacement, book ch. 8). With `reference_free=True` (SimPO, ORPO) the
    reference is taken as 0, so r̂(y) = β·logπθ(y), and `ref_*` are not needed.
    """
    if reference_free:
        chosen, rejected = _fields(batch, ("chosen", "rejected"), "preference_stats")
        zero = torch.zeros_like(chosen)
        batch = {"chosen": chosen, "rejected": rejected, "ref_chosen": zero, "ref_rejected": zero}
    chosen_rewards, rejected_rewards = implicit_rewards(batch, beta)
    return {
        "policy/reward_chosen": chosen_rewards.mean().item(),
        "policy/reward_rejected": rejected_rewards.mean().item(),
        "policy/reward_margin": (chosen_rewards - rejected_rewards).mean().item(),
        "policy/reward_accuracy": (chosen_rewards > rejected_rewards).to(chosen_rewards).mean().item(),
        "policy/logp_chosen": batch["chosen"].detach().mean().item(),
        "policy/logp_rejected": batch["rejected"].detach().mean().item(),
    }


def kto_reference_kl(logp_mismatched: Tensor, ref_logp_mismatched: Tensor) -> Tensor:
    """KTO reference point z0 = max(0, mean(logπθ(y'|x) − logπref(y'|x))), detached.

    The pairs (x, y') are mismatched in-batch (y' answers another prompt), as
    in the KTO paper (Ethayarajh et al. 2024, §4.2) and TRL's KTOTrainer.
    """
    if logp_mismatched.shape != ref_logp_mismatched.shape or logp_mismatched.dim() != 1:
        raise ValueError(
            "kto_reference_kl needs two (M,) tensors of summed log-probs of the same "
            f"mismatched completions, got shapes {tuple(logp_mismatched.shape)} and "
            f"{tuple(ref_logp_mismatched.shape)}."
        )
    return (logp_mismatched - ref_logp_mismatched).mean().clamp(min=0).detach()


# ----------------------------------------------------------------------------
# registry entries: all take (batch, *, options) and return (B,)
# ----------------------------------------------------------------------------


def _logratios(batch: Mapping[str, Tensor], loss: str) -> tuple[Tensor, Tensor]:
    """u_c, u_r: summed policy/reference log-ratios of chosen and rejected, (B,) each."""
    chosen, rejected, ref_chosen, ref_rejected = _fields(batch, PAIRED, loss)
    return chosen - ref_chosen, rejected - ref_rejected


def _chosen_nll(batch: Mapping[str, Tensor], loss: str) -> Tensor:
    """`chosen_nll` if given, else the length-normalised NLL −logπθ(yc)/|yc|."""
    chosen = _field(batch, "chosen", loss)
    if "chosen_nll" in batch:
        return _fields(batch, ("chosen", "chosen_nll"), loss)[1]
    chosen_len, _ = _lengths(batch, loss, chosen)
    return -chosen / chosen_len


@PREFERENCE_LOSSES.register("dpo")
def dpo(batch: Mapping[str, Tensor], *, beta: float = 0.1) -> Tensor:
    """DPO: L = −log σ(β·h), h = u_c − u_r [B eq. 79; Rafailov et al. 2023]."""
    _positive("dpo", beta=beta)
    u_c, u_r = _logratios(batch, "dpo")
    return -F.logsigmoid(beta * (u_c - u_r))


@PREFERENCE_LOSSES.register("cdpo")
def cdpo(batch: Mapping[str, Tensor], *, beta: float = 0.1, label_smoothing: float = 0.0) -> Tensor:
    """Conservative DPO: L = −(1−ε)·log σ(βh) − ε·log σ(−βh), ε = `label_smoothing`.

    ε is the assumed fraction of flipped labels, in [0, 0.5]; ε = 0 is DPO
    (Mitchell 2023, "A note on DPO with noisy preferences"; TRL `label_smoothing`).
    """
    _positive("cdpo", beta=beta)
    if not 0.0 <= label_smoothing <= 0.5:
        raise ValueError(
            f"preference loss 'cdpo': label_smoothing is the fraction of flipped labels and "
            f"must be in [0, 0.5], got {label_smoothing}."
        )
    u_c, u_r = _logratios(batch, "cdpo")
    logits = beta * (u_c - u_r)  # (B,)
    return -(1 - label_smoothing) * F.logsigmoid(logits) - label_smoothing * F.logsigmoid(-logits)


@PREFERENCE_LOSSES.register("robust")
def robust(batch: Mapping[str, Tensor], *, beta: float = 0.1, label_smoothing: float = 0.0) -> Tensor:
    """Robust DPO: L = [−(1−ε)·log σ(βh) + ε·log σ(−βh)] / (1 − 2ε).

    An unbiased estimate of the clean-label DPO loss when a fraction ε of the
    labels is flipped (Chowdhury et al. 2024, rDPO; TRL `robust`).
    """
    _positive("robust", beta=beta)
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(
            f"preference loss 'robust': label_smoothing must be in [0, 0.5) (the loss divides "
            f"by 1 − 2ε), got {label_smoothing}."
        )
    u_c, u_r = _logratios(batch, "robust")
    logits = beta * (u_c - u_r)  # (B,)
    eps = label_smoothing
    return (-(1 - eps) * F.logsigmoid(logits) + eps * F.logsigmoid(-logits)) / (1 - 2 * eps)


@PREFERENCE_LOSSES.register("ipo")
def ipo(batch: Mapping[str, Tensor], *, tau: float = 0.1, length_normalize: bool = True) -> Tensor:
    """IPO: L = (h' − 1/(2τ))², minimised at h' = 1/(2τ) (Azar et al. 2023, eq. 17).

    h' uses length-averaged log-ratios u_c/|yc| − u_r/|yr| by default, as TRL
    does (confirmed there with the IPO authors; spec §1 "TRL uses
    token-averaged log-probs for IPO"); `length_normalize=False` uses the
    summed h of the paper's notation, whose optimum grows with length.
    """
    _positive("ipo", tau=tau)
    u_c, u_r = _logratios(batch, "ipo")
    if length_normalize:
        chosen_len, rejected_len = _lengths(batch, "ipo", u_c)
        u_c, u_r = u_c / chosen_len, u_r / rejected_len
    return (u_c - u_r - 1 / (2 * tau)) ** 2


@PREFERENCE_LOSSES.register("hinge")
def hinge(batch: Mapping[str, Tensor], *, beta: float = 0.1) -> Tensor:
    """SLiC-style hinge: L = max(0, 1 − β·h).

    SLiC-HF (Zhao et al. 2023) puts a hinge on logπ(yc) − logπ(yr); this is the
    reference-normalised form of RSO (Liu et al. 2023) and TRL `hinge`.
    """
    _positive("hinge", beta=beta)
    u_c, u_r = _logratios(batch, "hinge")
    return torch.relu(1 - beta * (u_c - u_r))


@PREFERENCE_LOSSES.register("simpo", reference_free=True)
def simpo(batch: Mapping[str, Tensor], *, beta: float = 2.0, gamma: float = 0.5) -> Tensor:
    """SimPO: L = −log σ(β·logπθ(yc)/|yc| − β·logπθ(yr)/|yr| − γ). No reference.

    Meng et al. 2024; paper defaults β ≈ 2–2.5, γ ≈ 0.5 (spec §1).
    Needs `chosen`, `rejected`, `chosen_len`, `rejected_len` only.
    """
    _positive("simpo", beta=beta)
    chosen, rejected = _fields(batch, ("chosen", "rejected"), "simpo")
    chosen_len, rejected_len = _lengths(batch, "simpo", chosen)
    return -F.logsigmoid(beta * chosen / chosen_len - beta * rejected / rejected_len - gamma)


def _log1mexp(x: Tensor) -> Tensor:
    """log(1 − eˣ) for x < 0, stable on both sides of −log 2 (Mächler 2012).

    Each branch gets its input clamped to its own side, so the branch that
    `where` discards cannot put inf/NaN into the gradient.
    """
    log_half = -math.log(2)
    near_zero = torch.log(-torch.expm1(x.clamp(min=log_half)))  # accurate for x > −log 2
    far = torch.log1p(-torch.exp(x.clamp(max=log_half)))  # accurate for x <= −log 2
    return torch.where(x > log_half, near_zero, far)


@PREFERENCE_LOSSES.register("orpo", reference_free=True)
def orpo(batch: Mapping[str, Tensor], *, lam: float = 0.1) -> Tensor:
    """ORPO: L = NLL(yc) + λ·(−log σ(log odds(yc) − log odds(yr))). No reference.

    P(y) = exp(avg(y)) with avg the per-token MEAN log-prob, odds = P/(1−P), so
    log odds = avg − log(1 − exp(avg)) (Hong et al. 2024, eqs. 4 and 7; TRL ORPO).
    NLL(yc) is `chosen_nll` if the batch has it, else −logπθ(yc)/|yc|.
    Needs `chosen`, `rejected`, `chosen_len`, `rejected_len` [+ `chosen_nll`].
    """
    _non_negative("orpo", lam=lam)
    chosen, rejected = _fields(batch, ("chosen", "rejected"), "orpo")
    chosen_len, rejected_len = _lengths(batch, "orpo", chosen)
    avg_c, avg_r = chosen / chosen_len, rejected / rejected_len  # (B,) each
    if bool((avg_c >= 0).any()) or bool((avg_r >= 0).any()):
        raise ValueError(
            "preference loss 'orpo': log odds need mean log-probs < 0 (probabilities < 1), "
            "but some `chosen`/`rejected` are >= 0. Pass log-probs (log_softmax), not logits."
        )
    log_odds = (avg_c - avg_r) - (_log1mexp(avg_c) - _log1mexp(avg_r))  # (B,)
    return _chosen_nll(batch, "orpo") - lam * F.logsigmoid(log_odds)


@PREFERENCE_LOSSES.register("dpo_nll")
def dpo_nll(batch: Mapping[str, Tensor], *, beta: float = 0.1, alpha: float = 1.0) -> Tensor:
    """DPO + NLL: L = −log σ(β·h) + α·NLL(yc), NLL(yc) = −logπθ(yc)/|yc| [B eq. 139].

    Winner only (Pang et al. 2024, iterative RPO). NLL is `chosen_nll` if the
    batch has it (e.g. over CoT + answer tokens), else from `chosen`/`chosen_len`.
    """
    _positive("dpo_nll", beta=beta)
    _non_negative("dpo_nll", alpha=alpha)
    u_c, u_r = _logratios(batch, "dpo_nll")
    return -F.logsigmoid(beta * (u_c - u_r)) + alpha * _chosen_nll(batch, "dpo_nll")


@PREFERENCE_LOSSES.register("odpo", needs_scores=True)
def odpo(batch: Mapping[str, Tensor], *, beta: float = 0.1, alpha: float = 1.0) -> Tensor:
    """ODPO: L = −log σ(β·h − Δ), Δ = α·log(s_c − s_r) (Amini et al. 2024).

    Needs the paired fields plus `chosen_score`, `rejected_score` (B,) with
    s_c > s_r (e.g. reward-model scores or ratings); the gap must beat Δ.
    """
    _positive("odpo", beta=beta)
    _non_negative("odpo", alpha=alpha)
    u_c, u_r = _logratios(batch, "odpo")
    s_c, s_r = _fields(batch, ("chosen", "chosen_score", "rejected_score"), "odpo")[1:]
    if bool((s_c <= s_r).any()):
        raise ValueError(
            "preference loss 'odpo': the offset log(s_c − s_r) needs chosen_score > "
            "rejected_score for every pair. Drop ties and mislabelled pairs first."
        )
    return -F.logsigmoid(beta * (u_c - u_r) - alpha * torch.log(s_c - s_r).detach())


@PREFERENCE_LOSSES.register("bco", running_delta=True)
def bco(batch: Mapping[str, Tensor], *, beta: float = 0.1) -> Tensor:
    """BCO (paired): L = −log σ(β·u_c − δ) − log σ(δ − β·u_r) (Jung et al. 2024).

    δ is batch field `delta` (scalar or (B,), detached; default 0 = TRL
    `bco_pair`): the running mean of the implicit rewards β·u over chosen and
    rejected completions seen so far, kept by the trainer.
    """
    _positive("bco", beta=beta)
    u_c, u_r = _logratios(batch, "bco")
    delta = _shift(batch, "delta", "bco", u_c)
    return -F.logsigmoid(beta * u_c - delta) - F.logsigmoid(delta - beta * u_r)


@PREFERENCE_LOSSES.register("cal_dpo")
def cal_dpo(batch: Mapping[str, Tensor], *, beta: float = 0.1) -> Tensor:
    """Cal-DPO: L = −log σ(u_c − u_r) + ½[(u_c − 1/(2β))² + (u_r + 1/(2β))²].

    Xiao et al. 2024 (official code, tengxiao1/Cal-DPO): β enters only through
    the calibration targets ±1/(2β), not inside the sigmoid.
    """
    _positive("cal_dpo", beta=beta)
    u_c, u_r = _logratios(batch, "cal_dpo")
    target = 1 / (2 * beta)
    return -F.logsigmoid(u_c - u_r) + 0.5 * ((u_c - target) ** 2 + (u_r + target) ** 2)


@PREFERENCE_LOSSES.register("kto", unpaired=True)
def kto(
    batch: Mapping[str, Tensor],
    *,
    beta: float = 0.1,
    lambda_d: float = 1.0,
    lambda_u: float = 1.0,
) -> Tensor:
    """KTO (unpaired): L = λ_y − v(x, y) per example (Ethayarajh et al. 2024, eq. 7).

    r = logπθ(y) − logπref(y), z0 = max(0, `kl_ref`) detached, and
    v = λD·σ(β(r − z0)) if desirable, λU·σ(β(z0 − r)) if undesirable.
    Batch fields: `logp`, `ref_logp` (B,) summed log-probs; `label` (B,), 1 for
    desirable and 0 for undesirable; `kl_ref`, a scalar or (B,) estimate of
    KL(πθ‖πref) from mismatched pairs (see `kto_reference_kl`). Keep
    λD·n_D / (λU·n_U) in [1, 4/3] (spec §1).
    """
    _positive("kto", beta=beta, lambda_d=lambda_d, lambda_u=lambda_u)
    logp, ref_logp, label = _fields(batch, ("logp", "ref_logp", "label"), "kto")
    if "kl_ref" not in batch:
        raise ValueError(
            "preference loss 'kto' needs the batch field 'kl_ref', the reference point "
            "(a KL estimate from mismatched pairs; see kto_reference_kl). Pass 0.0 to disable it."
        )
    if not bool(((label == 0) | (label == 1)).all()):
        raise ValueError(
            "preference loss 'kto': `label` must be 1 (desirable) or 0 (undesirable) for "
            f"every example, got values {sorted(set(label.tolist()))}."
        )
    z0 = _shift(batch, "kl_ref", "kto", logp).clamp(min=0)
    r = logp - ref_logp  # (B,)
    desirable = label.bool()
    value = torch.where(
        desirable,
        lambda_d * torch.sigmoid(beta * (r - z0)),
        lambda_u * torch.sigmoid(beta * (z0 - r)),
    )  # (B,) v(x, y)
    weight = lambda_u + (lambda_d - lambda_u) * desirable.to(value)  # (B,) λ_y
    return weight - value


class RunningDelta:
    """BCO's δ: the running mean of β·u over every chosen and rejected completion so far; state (sum, count)."""

    def __init__(self, total: float = 0.0, count: int = 0) -> None:
        self.total, self.count = float(total), int(count)

    @property
    def value(self) -> float:
        return self.total / max(1, self.count)

    def update(self, batch: Mapping[str, Tensor], beta: float, rows: int) -> None:
        """Add β·u of the first ``rows`` pairs' chosen and rejected completions."""
        u = torch.stack([batch["chosen"] - batch["ref_chosen"], batch["rejected"] - batch["ref_rejected"]])[:, :rows]
        self.total += beta * u.detach().sum().item()
        self.count += u.numel()

    def state_dict(self) -> tuple[float, int]:
        return self.total, self.count

"""Reward-model losses (RLHF book ch. 5) as pure tensor functions.

Source: `spec/rlhf-book-core.md` §3 (Bradley-Terry, margin, K-wise pairs,
Plackett-Luce, ORM, PRM) and book eq. 140 (margin).

Entry point: `reward_model_loss(name, batch, **opts) -> scalar Tensor`, the
batch-mean loss ready for `.backward()`. Batch fields per entry:
    bt              chosen_scores (B,), rejected_scores (B,), optional margin (scalar or (B,))
    bt_kwise        scores (B, K), optional ranking (B, K)
    plackett_luce   scores (B, K), optional ranking (B, K)
    orm             logits (B, T), labels (B, T) in {0, 1} or -100 (ignored)
    prm             logits (B, T, C), labels (B, T) in [0, C) or -100 (ignored)
Traits tell a trainer what each entry needs without testing its name: ``data`` (``ranked`` completions per
prompt, ``labelled`` completions with a 0/1 label, or ``steps`` labelled -1/0/+1), ``head`` (the `RewardModel`
kind whose head it trains), ``margin`` (bt takes a per-pair margin) and ``listwise`` (one loss over the whole
ranking rather than its pairs).
`scores` are ranked best first, unless `ranking` is given: then `ranking[b, k]`
is the column of `scores[b]` holding the k-th best completion (a permutation
of 0..K-1, the σ of the Plackett-Luce formula).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor

from .registry import Registry, check_options, keyword_options

REWARD_MODEL_LOSSES = Registry("reward-model loss")

IGNORE_INDEX = -100


def reward_model_loss(name: str, batch: Mapping[str, Tensor], **opts: object) -> Tensor:
    """Scalar batch-mean loss of the reward-model loss registered as `name`.

    `batch` holds the fields listed in the module docstring for that entry;
    unknown names or options raise ValueError.
    """
    fn = REWARD_MODEL_LOSSES.get(name)
    check_options(f"reward-model loss {name!r}", opts, keyword_options(fn))
    return fn(batch, **opts)


# ----------------------------------------------------------------------------
# batch checks
# ----------------------------------------------------------------------------


def _field(batch: Mapping[str, Tensor], key: str, loss: str, dims: int, what: str) -> Tensor:
    """Fetch `batch[key]` as a tensor with `dims` dimensions, or raise naming the fix."""
    if key not in batch:
        raise ValueError(
            f"reward-model loss {loss!r} needs the batch field {key!r} ({what}), but the batch "
            f"has only {sorted(batch)}. See lmrl.algorithms.reward_model for the fields."
        )
    value = batch[key]
    if not isinstance(value, Tensor) or value.dim() != dims:
        shape = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
        raise ValueError(
            f"reward-model loss {loss!r}: batch field {key!r} must be {what}, got shape "
            f"{shape}. A head of width 1 gives (..., 1): squeeze(-1) it first."
        )
    return value


def _same_shape(first: Tensor, second: Tensor, names: tuple[str, str], loss: str, shape: str) -> None:
    if first.shape != second.shape:
        raise ValueError(
            f"reward-model loss {loss!r}: {names[0]} {tuple(first.shape)} and {names[1]} {tuple(second.shape)} "
            f"must have the same shape {shape}."
        )


def _ordered_scores(batch: Mapping[str, Tensor], loss: str) -> Tensor:
    """Scores (B, K) reordered best first, using `ranking` if the batch has one."""
    scores = _field(batch, "scores", loss, 2, "a (B, K) tensor of scores")
    if scores.shape[1] < 2:
        raise ValueError(
            f"reward-model loss {loss!r} ranks K >= 2 completions per prompt, got K = "
            f"{scores.shape[1]}. Drop prompts with a single completion."
        )
    if "ranking" not in batch:
        return scores
    ranking = _field(batch, "ranking", loss, 2, "a (B, K) permutation, best first").long()
    expected = torch.arange(scores.shape[1], device=ranking.device).expand_as(scores)
    if ranking.shape != scores.shape or not torch.equal(ranking.sort(dim=1).values, expected):
        raise ValueError(
            f"reward-model loss {loss!r}: `ranking` must have the shape of `scores` "
            f"{tuple(scores.shape)} and each row must be a permutation of 0..K-1 "
            "(ranking[b, k] = column of the k-th best completion); ties are not supported."
        )
    return scores.gather(1, ranking)  # (B, K), best first


def _labelled(labels: Tensor, loss: str, allowed: str, valid: Tensor) -> Tensor:
    """Mask (B, T) of labelled positions, checking labels are `allowed` or -100."""
    mask = labels != IGNORE_INDEX  # (B, T)
    if not bool((valid | ~mask).all()):
        bad = sorted(set(labels[mask & ~valid].tolist()))
        raise ValueError(
            f"reward-model loss {loss!r}: labels must be {allowed} or {IGNORE_INDEX} (ignored), got {bad}."
        )
    if not bool(mask.any()):
        raise ValueError(
            f"reward-model loss {loss!r}: every label is {IGNORE_INDEX}, so there is nothing "
            "to learn from; check that the labelling step marks completion/step tokens."
        )
    return mask


# ----------------------------------------------------------------------------
# registry entries: all take (batch, *, options) and return a scalar
# ----------------------------------------------------------------------------


@REWARD_MODEL_LOSSES.register("bt", data="ranked", head="bt", margin=True)
def bt(batch: Mapping[str, Tensor], *, center_coef: float = 0.0) -> Tensor:
    """Bradley-Terry: L = mean(−log σ(r_c − r_r − m)) + c·mean((r_c + r_r)²).

    m is the optional batch field `margin` (Llama 2 rating gap, book eq. 140;
    default 0 gives the plain BT loss of book ch. 5). `center_coef` c pulls the
    rewards towards zero mean (Eisenstein et al. 2023; TRL
    `center_rewards_coefficient`); 0 disables it.
    """
    if not center_coef >= 0:
        raise ValueError(f"reward-model loss 'bt': center_coef must be >= 0, got {center_coef}.")
    chosen = _field(batch, "chosen_scores", "bt", 1, "a (B,) tensor of chosen scores")
    rejected = _field(batch, "rejected_scores", "bt", 1, "a (B,) tensor of rejected scores")
    _same_shape(chosen, rejected, ("chosen_scores", "rejected_scores"), "bt", "(B,), one score per pair")
    margin = torch.as_tensor(batch.get("margin", 0.0)).to(chosen)
    if margin.dim() > 1 or (margin.dim() == 1 and margin.shape != chosen.shape):
        raise ValueError(
            f"reward-model loss 'bt': margin must be a scalar or a (B,) tensor with B = "
            f"{chosen.shape[0]}, got shape {tuple(margin.shape)}."
        )
    loss = -F.logsigmoid(chosen - rejected - margin).mean()
    if center_coef:
        loss = loss + center_coef * ((chosen + rejected) ** 2).mean()
    return loss


@REWARD_MODEL_LOSSES.register("bt_kwise", data="ranked", head="bt")
def bt_kwise(batch: Mapping[str, Tensor]) -> Tensor:
    """K-wise Bradley-Terry: per prompt, the mean of −log σ(r_i − r_j) over all
    C(K,2) pairs with i ranked above j; then the mean over prompts.

    InstructGPT (Ouyang et al. 2022, eq. 1): all pairs of a prompt in one batch.
    """
    ordered = _ordered_scores(batch, "bt_kwise")  # (B, K)
    k = ordered.shape[1]
    diff = ordered[:, :, None] - ordered[:, None, :]  # (B, K, K): r_i − r_j
    above = torch.ones(k, k, dtype=torch.bool, device=ordered.device).triu(diagonal=1)  # i < j
    pair_losses = -F.logsigmoid(diff[:, above])  # (B, C(K,2))
    return pair_losses.mean()


@REWARD_MODEL_LOSSES.register("plackett_luce", data="ranked", head="bt", listwise=True)
def plackett_luce(batch: Mapping[str, Tensor]) -> Tensor:
    """Plackett-Luce NLL: −Σ_k [r_σ(k) − log Σ_{j≥k} exp r_σ(j)], mean over prompts.

    Book ch. 5 (Starling; Zhu et al. 2023); with K = 2 it equals Bradley-Terry.
    """
    ordered = _ordered_scores(batch, "plackett_luce")  # (B, K), best first
    tail_lse = ordered.flip(1).logcumsumexp(dim=1).flip(1)  # (B, K): log Σ_{j≥k} exp r_σ(j)
    return -(ordered - tail_lse).sum(dim=1).mean()


@REWARD_MODEL_LOSSES.register("orm", data="labelled", head="orm")
def orm(batch: Mapping[str, Tensor]) -> Tensor:
    """Outcome RM: per-token BCE −[y·log p + (1−y)·log(1−p)], p = σ(logit), mean
    over labelled tokens (Cobbe et al. 2021; book ch. 5).

    `labels` (B, T) copy the outcome (0/1) to every completion token, -100 elsewhere.
    """
    logits = _field(batch, "logits", "orm", 2, "a (B, T) tensor of per-token logits")
    labels = _field(batch, "labels", "orm", 2, "a (B, T) tensor of 0/1/-100 labels")
    _same_shape(logits, labels, ("logits", "labels"), "orm", "(B, T)")
    mask = _labelled(labels, "orm", "0 or 1", (labels == 0) | (labels == 1))
    return F.binary_cross_entropy_with_logits(logits[mask], labels[mask].to(logits))


@REWARD_MODEL_LOSSES.register("prm", data="steps", head="prm")
def prm(batch: Mapping[str, Tensor]) -> Tensor:
    """Process RM: cross-entropy over C classes at labelled step positions, mean
    over steps (Lightman et al. 2023; book ch. 5; TRL PRMTrainer).

    C = 3 in practice (step label −1/0/+1 mapped to ids 0/1/2); `labels` (B, T)
    hold the class id at each step-separator token and -100 elsewhere.
    """
    logits = _field(batch, "logits", "prm", 3, "a (B, T, C) tensor of per-token class logits")
    labels = _field(batch, "labels", "prm", 2, "a (B, T) tensor of class ids or -100")
    if logits.shape[:2] != labels.shape:
        raise ValueError(
            f"reward-model loss 'prm': logits {tuple(logits.shape)} must be (B, T, C) with "
            f"(B, T) = labels' shape {tuple(labels.shape)}."
        )
    num_classes = logits.shape[2]
    valid = (labels >= 0) & (labels < num_classes)
    mask = _labelled(labels, "prm", f"class ids in [0, {num_classes})", valid)
    return F.cross_entropy(logits[mask], labels[mask].long())  # logits[mask]: (S, C)

"""avatarl: dense reward over an active token set and its REINFORCE loss.

avatarl (tokenbender, 2025; spec `spec/avatarl.md`) pretrains a language model
with policy gradient instead of cross-entropy. There is no sampling: at every
teacher-forced position t

1. active set   A_t = dedup({y_t} ∪ topk(S_t, k) ∪ topk(C_t, k)),  |A_t| <= 2k+1
2. reality      p_r(y_t) = 1-ε,  p_r(a) = ε/(|A_t|-1) for the other a ∈ A_t
                (p_r(y_t) = 1 when |A_t| = 1)
3. critic       p_m = softmax(C_t) over the full vocabulary
4. consensus    q(a) = p_r(a)^w_r · p_m(a)^w_m on A_t,  s = Σ_{a∈A_t} q(a),  q̂ = q/s
5. threshold    keep a iff q̂(a) > τ, with τ = s/|A_t| (code) or 1/|A_t| (true mean)
6. reward       r(a) = scale·q̂(a) on kept tokens, else 0; then, if max r > c,
                r ← r·c/max r  (the proportional "clamp", c = 1.5)
7. loss         L_t = -(Σ_{a∈A_t} r(a)·log π(a|s_t)) / |A_t|  - β·H[π(·|s_t)]
                (or, in temperature mode, π = softmax(S_t/(1+β)) and no H term);
                L = mean of L_t over non-ignored positions.

S, C are student and critic logits and y the gold (next) token. Steps 1-6 are
`avatarl_rewards` (no gradient, here), step 7 is `avatarl_loss` (`lmrl.algorithms.avatarl_reinforce`). Every point where the
write-up and the public code disagree is a field of `AvatarlOptions`.

Memory: both functions work on chunks of `chunk_size` positions, so at most a
few (chunk, V) float tensors exist at once; the loss computes its gradient chunk
by chunk during the forward pass and keeps only that (B·T, V) gradient for
backward, instead of one softmax per position.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

__all__ = ["AvatarlOptions", "AvatarlRewards", "avatarl_rewards"]

Threshold = Literal["sum_over_size", "mean"]
EntropyMode = Literal["bonus", "temperature"]


@dataclass(frozen=True)
class AvatarlOptions:
    """Every knob of the avatarl reward and loss, with the chosen defaults."""

    top_k: int = 16
    """k of the student and critic top-k. The write-up says k=16 (|A|≈33) and so does
    the blog-time run (455cbdc); the HEAD config uses 4. Default 16, the value the
    write-up and the only reported run use."""

    epsilon: float = 0.1
    """ε of the active-set label smoothing: gold gets 1-ε, the other |A|-1 tokens of
    the set share ε. Write-up and code agree on 0.1. Must be in [0, 1)."""

    reality_weight: float = 0.7
    """w_r, exponent of the reality expert in q = p_r^w_r · p_m^w_m. Write-up and code: 0.7."""

    mentor_weight: float = 0.3
    """w_m, exponent of the critic (mentor) expert. Write-up and code: 0.3. With 0 the
    critic only enters through its top-k in the active set (0^0 = 1, as torch.pow)."""

    threshold: Threshold = "sum_over_size"
    """Which tokens earn a reward. The write-up says "above the mean" of the
    renormalised consensus, i.e. q̂ > 1/|A| ("mean"). Every code version compares q̂
    with s/|A|, the *un-normalised* sum over |A| ("sum_over_size"); since s < 1 this
    is a lower bar that rewards ~2.3 tokens per position at k=4 instead of ~1.1.
    Default "sum_over_size": that quirk is what makes the signal dense (spec §1.2.6)."""

    reward_scale: float = 100.0
    """Multiplier on q̂ of the kept tokens (write-up "×100", code 100). With the 1.5
    clamp on, it cancels whenever scale·max q̂ > clamp, which always holds for |A| < 66."""

    reward_clamp: float | None = 1.5
    """c of the per-position proportional rescale: if max_a r(a) > c, all rewards of the
    position are multiplied by c/max r (not an elementwise clip, not a PPO ratio clip).
    Code since 455cbdc: 1.5; the blog's charts come from an older unclamped version
    (None disables it). Default 1.5, as the code."""

    critic_topk: bool = True
    """Include the critic's top-k in the active set. Write-up and the avataRL code: yes
    (A has 2k+1 slots); the pretrain-zero-rl fork drops it (A = student top-k + gold,
    k+1 slots). Default True."""

    entropy_mode: EntropyMode = "bonus"
    """How `entropy_coef` acts. "bonus": loss -= β·H[softmax(S)] over the full vocabulary
    (write-up and blog-time code 455cbdc). "temperature": no H term, the student log-probs
    use softmax(S/(1+β)) (HEAD since 9d9df27/fb40379; not equivalent). Default "bonus":
    it is the method as written and the version the write-up's results describe."""

    entropy_coef: float = 0.01
    """β of the entropy bonus, or the temperature offset T = 1+β. Write-up and code: 0.01."""

    ignore_index: int = -100
    """Target id of positions that get no reward and no loss (padding, prompt tokens)."""

    chunk_size: int | None = 1024
    """Positions processed at once; None processes all B·T positions in one go. Results
    are identical for every value; it only bounds memory (a few (chunk, V) tensors)."""

    def __post_init__(self) -> None:
        _check(
            isinstance(self.top_k, int) and self.top_k >= 1,
            "top_k",
            self.top_k,
            "an integer >= 1 (the size of each top-k in the active set)",
        )
        _check(
            0.0 <= self.epsilon < 1.0,
            "epsilon",
            self.epsilon,
            "in [0, 1): the gold token keeps 1-epsilon of the reality mass",
        )
        _check(self.reality_weight >= 0.0, "reality_weight", self.reality_weight, ">= 0")
        _check(self.mentor_weight >= 0.0, "mentor_weight", self.mentor_weight, ">= 0")
        _check(
            self.threshold in ("sum_over_size", "mean"),
            "threshold",
            self.threshold,
            "'sum_over_size' (as the avataRL code) or 'mean' (as the write-up)",
        )
        _check(self.reward_scale > 0.0, "reward_scale", self.reward_scale, "> 0")
        _check(
            self.reward_clamp is None or self.reward_clamp > 0.0,
            "reward_clamp",
            self.reward_clamp,
            "> 0, or None to disable the proportional rescale",
        )
        _check(
            self.entropy_mode in ("bonus", "temperature"),
            "entropy_mode",
            self.entropy_mode,
            "'bonus' (-beta*H term) or 'temperature' (T = 1+beta)",
        )
        _check(self.entropy_coef >= 0.0, "entropy_coef", self.entropy_coef, ">= 0")
        _check(
            self.chunk_size is None or (isinstance(self.chunk_size, int) and self.chunk_size >= 1),
            "chunk_size",
            self.chunk_size,
            "a positive integer, or None for no chunking",
        )

    @property
    def num_slots(self) -> int:
        """Width A of the action tensors: 2k+1 with the critic's top-k, else k+1."""
        return (2 if self.critic_topk else 1) * self.top_k + 1


def _check(ok: bool, name: str, value: object, requirement: str) -> None:
    if not ok:
        raise ValueError(
            f"avatarl option {name}={value!r} is invalid: it must be {requirement}. Fix the value passed for {name}."
        )


def _resolve(options: AvatarlOptions | None, opts: dict) -> AvatarlOptions:
    """Merge an options object and keyword overrides; unknown names are refused."""
    known = {f.name for f in dataclasses.fields(AvatarlOptions)}
    unknown = sorted(set(opts) - known)
    if unknown:
        raise ValueError(
            f"unknown avatarl option(s) {unknown}. Valid names are {sorted(known)}; check the spelling of the key."
        )
    base = options if options is not None else AvatarlOptions()
    return dataclasses.replace(base, **opts) if opts else base


@dataclass(frozen=True)
class AvatarlRewards:
    """Rewards over the active set of every position.

    Slot 0 always holds the gold token (valid wherever the target is not ignored);
    the other slots hold the student top-k, then the critic top-k, with repeats of
    an earlier slot masked out. Masked slots keep an in-range but meaningless id.
    """

    actions: Tensor
    """(B, T, A) long: token ids of the active set, A = 2k+1 (k+1 without critic top-k)."""
    mask: Tensor
    """(B, T, A) bool: slot holds a distinct action at a non-ignored position."""
    rewards: Tensor
    """(B, T, A) float32: reward of each slot, 0 on masked slots; no gradient."""

    @property
    def active_size(self) -> Tensor:
        """(B, T) long: |A_t|, 0 at ignored positions."""
        return self.mask.sum(-1)

    @property
    def gold_reward(self) -> Tensor:
        """(B, T): reward of the gold token (0 at ignored positions)."""
        return self.rewards[..., 0]

    @property
    def num_rewarded(self) -> Tensor:
        """(B, T) long: tokens with a positive reward (the "density" of the signal)."""
        return (self.rewards > 0).sum(-1)


def _validate_logits(student_logits: Tensor, critic_logits: Tensor, targets: Tensor, top_k: int) -> None:
    if student_logits.dim() != 3:
        raise ValueError(
            f"avatarl: student_logits must be (B, T, V), got shape {tuple(student_logits.shape)}. "
            "Pass the model's logits before flattening."
        )
    vocab, critic_vocab = student_logits.shape[-1], critic_logits.shape[-1]
    if critic_logits.dim() != 3 or critic_vocab != vocab:
        raise ValueError(
            f"avatarl: the critic's vocabulary ({critic_vocab} logits, shape "
            f"{tuple(critic_logits.shape)}) differs from the student's ({vocab} logits). "
            "The reward compares token ids, so student and critic must share one "
            "tokenizer and vocabulary size; pad or pick a matching critic."
        )
    if critic_logits.shape[:2] != student_logits.shape[:2]:
        raise ValueError(
            f"avatarl: critic_logits {tuple(critic_logits.shape)} and student_logits "
            f"{tuple(student_logits.shape)} must have the same (B, T). Run both models "
            "on the same input ids."
        )
    if targets.shape != student_logits.shape[:2] or targets.dtype.is_floating_point:
        raise ValueError(
            f"avatarl: targets must be integer token ids of shape {tuple(student_logits.shape[:2])}, "
            f"got {targets.dtype} {tuple(targets.shape)}. Pass the next-token ids."
        )
    if top_k > vocab:
        raise ValueError(f"avatarl: top_k={top_k} is larger than the vocabulary size {vocab}; choose top_k <= {vocab}.")


def _position_chunks(n: int, chunk_size: int | None) -> list[slice]:
    """Slices of at most `chunk_size` positions covering range(n); one empty slice if n == 0."""
    step = max(n, 1) if chunk_size is None else chunk_size
    return [slice(i, min(i + step, n)) for i in range(0, max(n, 1), step)]


def active_set(
    student_logits: Tensor, critic_logits: Tensor, gold: Tensor, valid: Tensor, top_k: int, critic_topk: bool = True
) -> tuple[Tensor, Tensor]:
    """A = dedup([y] + topk(S, k) + topk(C, k)), keeping the first occurrence.

    Inputs are flat: logits (N, V), gold and valid (N,). Returns actions (N, A) and
    mask (N, A) with gold at slot 0; invalid positions get an all-False mask.
    """
    parts = [gold.unsqueeze(-1), student_logits.topk(top_k, dim=-1).indices]
    if critic_topk:
        parts.append(critic_logits.topk(top_k, dim=-1).indices)
    actions = torch.cat(parts, dim=-1)  # (N, A)
    same = actions.unsqueeze(-1) == actions.unsqueeze(-2)  # (N, A, A): slot j == slot i
    earlier = torch.ones(actions.shape[-1], actions.shape[-1], dtype=torch.bool, device=actions.device).tril(
        -1
    )  # (A, A): i < j
    repeat = (same & earlier).any(-1)  # (N, A): slot j repeats an earlier slot
    return actions, ~repeat & valid.unsqueeze(-1)


def consensus_rewards(critic_logits: Tensor, actions: Tensor, mask: Tensor, opts: AvatarlOptions) -> Tensor:
    """Steps 2-6 of the module docstring on flat inputs: critic (N, V), actions/mask (N, A).

    Computed in log space, q = exp(w_r·log p_r + w_m·log p_m), so that a critic
    probability that underflows in float32 cannot zero the whole position.
    """
    size = mask.sum(-1, keepdim=True).to(torch.float32)  # (N, 1) = |A|
    is_gold = torch.zeros_like(mask)
    is_gold[:, 0] = True
    log_gold = torch.where(size == 1, 0.0, math.log1p(-opts.epsilon))  # (N, 1)
    log_other = torch.log(opts.epsilon / (size - 1).clamp_min(1))  # (N, 1), -inf when ε = 0
    log_reality = torch.where(is_gold, log_gold, log_other)  # (N, A)
    log_mentor = critic_logits.gather(-1, actions) - critic_logits.logsumexp(-1, keepdim=True)  # (N, A)
    log_q = torch.zeros_like(log_mentor)
    if opts.reality_weight != 0:  # p^0 = 1 even where p = 0, as torch.pow in the reference
        log_q = log_q + opts.reality_weight * log_reality
    if opts.mentor_weight != 0:
        log_q = log_q + opts.mentor_weight * log_mentor
    log_q = log_q.masked_fill(~mask, -math.inf)  # (N, A)
    log_s = log_q.logsumexp(-1, keepdim=True)  # (N, 1) = log Σ_A q
    has_mass = torch.isfinite(log_s)
    q_hat = torch.where(mask & has_mass, torch.exp(log_q - log_s), 0.0)  # (N, A), sums to 1 on A
    if opts.threshold == "sum_over_size":
        tau = torch.exp(log_s) / size.clamp_min(1)  # s/|A|, the reference code's "mean"
    else:
        tau = 1.0 / size.clamp_min(1)  # true mean of q̂ over A
    rewards = torch.where(mask & (q_hat > tau), opts.reward_scale * q_hat, 0.0)  # (N, A)
    if opts.reward_clamp is not None:
        peak = rewards.amax(-1, keepdim=True)  # (N, 1)
        factor = torch.where(peak > opts.reward_clamp, opts.reward_clamp / peak.clamp_min(1e-30), 1.0)
        rewards = rewards * factor
    return rewards


@torch.no_grad()
def avatarl_rewards(
    student_logits: Tensor, critic_logits: Tensor, targets: Tensor, options: AvatarlOptions | None = None, **opts
) -> AvatarlRewards:
    """Active set and dense consensus reward of every position (no gradient).

    student_logits, critic_logits: (B, T, V); targets: (B, T) next-token ids, with
    `ignore_index` on positions to skip. Options: an `AvatarlOptions` and/or its
    field names as keywords. Formula: module docstring; source: avataRL
    `compute_avatarl_loss` and the avatarl write-up (spec/avatarl.md §1.2).
    """
    o = _resolve(options, opts)
    _validate_logits(student_logits, critic_logits, targets, o.top_k)
    batch, seq, vocab = student_logits.shape
    gold = targets.reshape(-1)  # (N,)
    valid = gold != o.ignore_index
    bad = valid & ((gold < 0) | (gold >= vocab))
    if bad.any():
        raise ValueError(
            f"avatarl: targets hold ids outside [0, {vocab}) (e.g. {int(gold[bad][0])}) that are "
            f"not ignore_index={o.ignore_index}. Mark padding with ignore_index or fix the tokenizer."
        )
    gold = torch.where(valid, gold, 0)
    student = student_logits.detach().reshape(-1, vocab)  # (N, V), a view when contiguous
    critic = critic_logits.detach().reshape(-1, vocab)  # (N, V)
    outputs = []
    for rows in _position_chunks(gold.shape[0], o.chunk_size):
        s, c = student[rows].float(), critic[rows].float()  # (n, V)
        actions, mask = active_set(s, c, gold[rows], valid[rows], o.top_k, o.critic_topk)
        outputs.append((actions, mask, consensus_rewards(c, actions, mask, o)))
    width = o.num_slots
    actions, mask, rewards = (torch.cat(parts).reshape(batch, seq, width) for parts in zip(*outputs))
    return AvatarlRewards(actions=actions, mask=mask, rewards=rewards)

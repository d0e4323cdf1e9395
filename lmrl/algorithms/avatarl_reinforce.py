"""avatarl's loss (step 7 of `lmrl.algorithms.avatarl`): REINFORCE over the active set, chunk by chunk.

    L_t = -(Σ_{a∈A_t} r(a)·log π(a|s_t)) / |A_t|  - β·H[π(·|s_t)]      (or π = softmax(S_t/(1+β)), no H term)

over the actions, mask and rewards of `avatarl_rewards`; `lmrl.algorithms.avatarl_head` runs the same terms
(`_position_terms`, `_reduce`, `_stats`) from hidden states.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lmrl.algorithms.avatarl import AvatarlOptions, _position_chunks, _resolve

__all__ = ["avatarl_loss"]


def _position_terms(
    logits: Tensor, actions: Tensor, mask: Tensor, rewards: Tensor, temperature: float, entropy_grad: bool
) -> tuple[Tensor, Tensor]:
    """Per position: pg = -(Σ_A r·log π(a)) / |A| and H[softmax(S)]; flat (n, V) logits."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 -> fp32, fp64 kept
    scaled = logits / temperature if temperature != 1.0 else logits  # (n, V)
    log_pi = scaled.gather(-1, actions) - scaled.logsumexp(-1, keepdim=True)  # (n, A)
    weighted = torch.where(mask & (rewards != 0), rewards * log_pi, 0.0)  # (n, A)
    pg = -weighted.sum(-1) / mask.sum(-1).clamp_min(1)  # (n,)
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        log_p = torch.log_softmax(logits, dim=-1)  # (n, V)
        entropy = -(log_p.exp() * log_p).sum(-1)  # (n,)
    return pg, entropy


def _reduce(pg: Tensor, entropy: Tensor, valid: Tensor, n_valid: Tensor, entropy_coef: float, bonus: bool) -> Tensor:
    """Mean over valid positions of pg - β·H ("bonus") or of pg ("temperature")."""
    per_position = pg - entropy_coef * entropy if bonus else pg  # (n,)
    return torch.where(valid, per_position, 0.0).sum() / n_valid


class _ChunkedLoss(torch.autograd.Function):
    """The loss over position chunks, with d loss/d logits computed chunk by chunk.

    Forward runs autograd on one chunk at a time and writes its rows of the gradient
    into a single (N, V) buffer, so the backward pass holds one (N, V) tensor (the
    gradient it must return anyway) instead of one softmax per chunk. Every chunk's
    gradient rows only depend on that chunk, so the result does not depend on
    `chunk_size`. No double backward.
    """

    @staticmethod
    def forward(
        ctx,
        logits: Tensor,
        actions: Tensor,
        mask: Tensor,
        rewards: Tensor,
        valid: Tensor,
        n_valid: Tensor,
        temperature: float,
        entropy_coef: float,
        bonus: bool,
        chunks: list[slice],
    ) -> tuple[Tensor, Tensor, Tensor]:
        grad = torch.empty_like(logits)  # (N, V), in the logits' dtype
        pgs, entropies = [], []
        for rows in chunks:
            x = logits[rows].detach().requires_grad_(True)  # (n, V)
            with torch.enable_grad():
                pg, entropy = _position_terms(x, actions[rows], mask[rows], rewards[rows], temperature, bonus)
                part = _reduce(pg, entropy, valid[rows], n_valid, entropy_coef, bonus)
                (grad[rows],) = torch.autograd.grad(part, x)
            pgs.append(pg.detach())
            entropies.append(entropy.detach())
        pg, entropy = torch.cat(pgs), torch.cat(entropies)  # (N,), (N,)
        ctx.save_for_backward(grad)
        ctx.mark_non_differentiable(pg, entropy)
        return _reduce(pg, entropy, valid, n_valid, entropy_coef, bonus), pg, entropy

    @staticmethod
    def backward(ctx, grad_loss: Tensor, *unused: Tensor):
        (grad,) = ctx.saved_tensors
        if bool(grad_loss != 1):  # avoid a second (N, V) tensor in the common case
            grad = grad * grad_loss.to(grad.dtype)
        return (grad,) + (None,) * 9


def avatarl_loss(
    student_logits: Tensor,
    actions: Tensor,
    mask: Tensor,
    rewards: Tensor,
    options: AvatarlOptions | None = None,
    **opts,
) -> tuple[Tensor, dict[str, float]]:
    """REINFORCE over the active set, averaged as the avataRL code does.

    L = mean over non-ignored t of [ -(Σ_{a∈A_t} r_t(a)·log π(a|s_t)) / |A_t| - β·H_t ]
    ("bonus"; π = softmax(S_t), H_t its full-vocabulary entropy), or with
    π = softmax(S_t/(1+β)) and no H term ("temperature"). Dividing by |A_t| and
    then averaging positions is the reference normalisation (455cbdc and HEAD); the
    reference averages over all B·T positions because it has no padding, we average
    over positions with a non-empty active set. Rewards are treated as constants.
    The gradient is built chunk by chunk (`chunk_size`); double backward is not supported.
    Source: avataRL `compute_avatarl_loss`; Williams (1992) REINFORCE.
    Returns (loss, stats) with float stats under `avatarl/...`; stats read the gold
    reward from slot 0, the layout of `avatarl_rewards`.
    """
    o = _resolve(options, opts)
    if student_logits.dim() != 3:
        raise ValueError(
            f"avatarl_loss: student_logits must be (B, T, V), got {tuple(student_logits.shape)}. "
            "Pass the model's logits before flattening."
        )
    batch, seq, vocab = student_logits.shape
    for name, t in (("actions", actions), ("mask", mask), ("rewards", rewards)):
        if t.dim() != 3 or t.shape[:2] != (batch, seq) or t.shape != actions.shape:
            raise ValueError(
                f"avatarl_loss: {name} must be (B, T, A) = ({batch}, {seq}, A) like actions, got "
                f"{tuple(t.shape)}. Pass the fields of one avatarl_rewards(...) result."
            )
    if actions.numel() and (int(actions.min()) < 0 or int(actions.max()) >= vocab):
        raise ValueError(
            f"avatarl_loss: action ids must lie in [0, {vocab}) (the student's vocabulary); got "
            f"range [{int(actions.min())}, {int(actions.max())}]. Were the rewards computed "
            "for another model?"
        )
    bonus = o.entropy_mode == "bonus"
    temperature = 1.0 if bonus else 1.0 + o.entropy_coef
    logits = student_logits.reshape(-1, vocab)  # (N, V)
    actions = actions.reshape(-1, actions.shape[-1])  # (N, A)
    mask = mask.bool().reshape(-1, mask.shape[-1])  # (N, A)
    rewards = rewards.detach().to(torch.promote_types(rewards.dtype, torch.float32)).reshape(-1, rewards.shape[-1])
    valid = mask.any(-1)  # (N,) positions with a non-empty active set
    n_valid = valid.sum().clamp_min(1)
    chunks = _position_chunks(logits.shape[0], o.chunk_size)
    if torch.is_grad_enabled() and logits.requires_grad:
        loss, pg, entropy = _ChunkedLoss.apply(
            logits, actions, mask, rewards, valid, n_valid, temperature, o.entropy_coef, bonus, chunks
        )
    else:
        terms = [_position_terms(logits[r], actions[r], mask[r], rewards[r], temperature, False) for r in chunks]
        pg, entropy = (torch.cat(parts) for parts in zip(*terms))  # (N,), (N,)
        loss = _reduce(pg, entropy, valid, n_valid, o.entropy_coef, bonus)
    return loss, _stats(loss, pg, entropy, valid, mask, rewards)


@torch.no_grad()
def _stats(loss: Tensor, pg: Tensor, entropy: Tensor, valid: Tensor, mask: Tensor, rewards: Tensor) -> dict[str, float]:
    """Float diagnostics; means over non-ignored positions (rewards: over valid actions)."""
    n_pos = valid.sum().clamp_min(1)
    n_act = mask.sum().clamp_min(1)

    def pos_mean(x: Tensor) -> float:
        return float(torch.where(valid, x.detach().float(), 0.0).sum() / n_pos)

    return {
        "avatarl/loss": float(loss.detach()),
        "avatarl/pg_loss": pos_mean(pg),
        "avatarl/entropy": pos_mean(entropy),
        "avatarl/reward_mean": float(torch.where(mask, rewards, 0.0).sum() / n_act),
        "avatarl/reward_max": float(rewards.max()) if rewards.numel() else 0.0,
        "avatarl/gold_reward": pos_mean(rewards[:, 0]) if rewards.shape[-1] else 0.0,
        "avatarl/active_size": pos_mean(mask.sum(-1)),
        "avatarl/rewarded_per_position": pos_mean(((rewards > 0) & mask).sum(-1)),
    }

"""avatarl from hidden states: the student's and critic's LM heads, the reward and the loss, chunk by chunk.

`avatarl_rewards` + `avatarl_loss` take full (B, T, V) student and critic logits: with a 151,936-token vocabulary a
batch of 8 x 1,024 positions is 5 GB of fp32 logits each. Here both heads run on chunks of positions: per chunk
the student logits S = h W^T and critic logits C = h_c W_c^T (fp32, m x V each), the active set and consensus
reward (`active_set`, `consensus_rewards`), the loss terms and their gradient dS (`_position_terms`), then
dh = dS W and dW += dS^T h. Nothing of size (N, V) outlives its chunk; the backward returns the saved dh and dW
(same formulas, same values as the unchunked path up to float summation order).

    loss, stats = avatarl_head_loss(hidden, lm_head.weight, critic_hidden, critic_head.weight, targets, options,
                                    rows=256)
"""

from __future__ import annotations

import torch
from torch import Tensor

from lmrl.algorithms.avatarl import AvatarlOptions, active_set, consensus_rewards
from lmrl.algorithms.avatarl_reinforce import _position_terms, _reduce, _stats

__all__ = ["avatarl_head_loss"]


def _head(hidden: Tensor, weight: Tensor, dtype: torch.dtype) -> Tensor:
    """Logits h W^T in the compute dtype (autocast's, as ``nn.Linear`` would run), returned in fp32 (fp64 kept)."""
    logits = hidden.to(dtype) @ weight.to(dtype).T  # (m, V)
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


class _AvatarlHead(torch.autograd.Function):
    """Forward computes the loss and, chunk by chunk, d loss / d hidden and d loss / d weight; backward scales them."""

    @staticmethod
    def forward(ctx, hidden, weight, critic_hidden, critic_weight, gold, valid, options: AvatarlOptions, rows: int):
        device = hidden.device
        dtype = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else weight.dtype
        bonus = options.entropy_mode == "bonus"
        temperature = 1.0 if bonus else 1.0 + options.entropy_coef
        n_valid = valid.sum().clamp_min(1)
        grad_h = torch.zeros_like(hidden)
        grad_w = torch.zeros(weight.shape, dtype=torch.promote_types(weight.dtype, torch.float32), device=weight.device)
        parts: dict[str, list[Tensor]] = {k: [] for k in ("pg", "entropy", "mask", "rewards", "expected", "ce")}
        with torch.autocast(device.type, enabled=False):
            for start in range(0, hidden.shape[0], rows):
                at = slice(start, start + rows)
                h = hidden[at].detach()
                with torch.no_grad():
                    critic = _head(critic_hidden[at], critic_weight, dtype)  # (m, V)
                    student = _head(h, weight, dtype)  # (m, V)
                    # the reward in fp32, as `avatarl_rewards` computes it (a no-op for fp32 logits)
                    actions, mask = active_set(
                        student.float(), critic.float(), gold[at], valid[at], options.top_k, options.critic_topk
                    )
                    rewards = consensus_rewards(critic.float(), actions, mask, options)  # (m, A)
                    del critic
                    log_p = student.log_softmax(-1)  # (m, V)
                    parts["expected"].append((log_p.gather(-1, actions).exp() * rewards).sum(-1))
                    parts["ce"].append(-log_p.gather(-1, gold[at, None]).squeeze(-1))
                    del log_p
                x = student.requires_grad_(True)
                with torch.enable_grad():
                    pg, entropy = _position_terms(x, actions, mask, rewards, temperature, bonus)
                    part = _reduce(pg, entropy, valid[at], n_valid, options.entropy_coef, bonus)
                    (dz,) = torch.autograd.grad(part, x)  # (m, V)
                del x, student
                dz = dz.to(dtype)
                grad_h[at] = (dz @ weight.to(dtype)).to(hidden.dtype)
                grad_w.add_(dz.T @ h.to(dtype))
                del dz
                for key, value in (("pg", pg), ("entropy", entropy), ("mask", mask), ("rewards", rewards)):
                    parts[key].append(value.detach())
        pg, entropy, mask, rewards, expected, ce = (torch.cat(parts[k]) for k in parts)
        ctx.save_for_backward(grad_h, grad_w.to(weight.dtype))
        ctx.mark_non_differentiable(pg, entropy, mask, rewards, expected, ce)
        return (
            _reduce(pg, entropy, valid, n_valid, options.entropy_coef, bonus),
            pg,
            entropy,
            mask,
            rewards,
            expected,
            ce,
        )

    @staticmethod
    def backward(ctx, grad_loss, *unused):
        grad_h, grad_w = ctx.saved_tensors
        return (
            grad_h * grad_loss.to(grad_h.dtype),
            grad_w * grad_loss.to(grad_w.dtype),
            None,
            None,
            None,
            None,
            None,
            None,
        )


def avatarl_head_loss(
    hidden: Tensor,
    weight: Tensor,
    critic_hidden: Tensor,
    critic_weight: Tensor,
    targets: Tensor,
    options: AvatarlOptions,
    rows: int,
) -> tuple[Tensor, dict[str, float]]:
    """The avatarl loss (`avatarl_loss` of `avatarl_rewards`) from the student's last hidden states (B, T, H) and
    bias-free head weight (V, H) and the critic's (B, T, H_c), (V, H_c), in chunks of ``rows`` positions. Gradients
    reach ``hidden`` and ``weight``. Stats: `avatarl_loss`'s, plus ``avatarl/expected_reward`` (E_π[r], the return
    REINFORCE ascends) and ``loss/ce`` (mean -log π(y_t) over valid positions)."""
    if critic_weight.shape[0] != weight.shape[0]:
        raise ValueError(
            f"avatarl: the critic's vocabulary ({critic_weight.shape[0]} rows of its LM head) differs "
            f"from the student's ({weight.shape[0]}). Train the critic with the student's tokenizer."
        )
    gold = targets.reshape(-1)
    valid = gold != options.ignore_index
    gold = torch.where(valid, gold, 0)
    flat_h, flat_c = hidden.reshape(-1, hidden.shape[-1]), critic_hidden.reshape(-1, critic_hidden.shape[-1])
    loss, pg, entropy, mask, rewards, expected, ce = _AvatarlHead.apply(
        flat_h, weight, flat_c.detach(), critic_weight.detach(), gold, valid, options, max(1, rows)
    )
    stats = _stats(loss, pg, entropy, valid, mask, rewards)
    n = valid.sum().clamp_min(1)
    stats["avatarl/expected_reward"] = float(expected.sum() / max(1, gold.numel()))
    stats["loss/ce"] = float(torch.where(valid, ce, 0.0).sum() / n)
    return loss, stats

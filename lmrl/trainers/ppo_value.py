"""PPO's value model in online RL (`lmrl.trainers.rl.trainer`): per-token values, GAE targets and the value-loss term.

Several processes: each rank runs GAE on its own whole sequences (exact: GAE is per sequence); the whitening of the
advantages (mean and std) and the value loss's normalisation are over every rank's tokens and rows, so two processes
compute what one process computes on the same global batch.
"""

from __future__ import annotations

import torch

from lmrl.algorithms import gae, kl_penalized_rewards, value_loss, whiten
from lmrl.models import autocast
from lmrl.models.value import ValueModel
from lmrl.parallel import runtime
from lmrl.rollout.types import RolloutBatch


def completion_values(value_model: ValueModel, batch: RolloutBatch, dtype) -> torch.Tensor:
    """V(s_t) for each completion token t: the value head at the position that predicts token t. (N, T)"""
    p, t = batch.prompt_ids.shape[1], batch.completion_ids.shape[1]
    with autocast(batch.input_ids.device.type, dtype):
        values = value_model(batch.input_ids, batch.attention_mask)  # (N, P+T)
    return values[:, p - 1 : p + t - 1].float() * batch.train_mask


def ppo_targets(value_model, batch, rewards, ref_logp, old_logp, gamma: float, lam: float, kl_coef: float, dtype):
    """GAE advantages (whitened over every rank's completion tokens) and returns, on KL-shaped per-token rewards
    (``kl_coef``: the step's coefficient, adaptive or the config's)."""
    mask = batch.train_mask
    with torch.no_grad():
        old_values = completion_values(value_model, batch, dtype)
    runtime.reshard(value_model)  # FSDP: its root unit must not stay gathered into the training backward
    kl_tok = (old_logp - ref_logp) if ref_logp is not None else torch.zeros_like(old_logp)  # k1 in the reward
    token_rewards = kl_penalized_rewards(rewards.to(mask.device), kl_tok, mask, kl_coef)  # rewards: CPU
    adv, returns = gae(token_rewards, old_values, mask, gamma, lam)
    return whiten(adv, mask, all_sum=runtime.all_sum), returns, old_values


def value_term(
    value_model, sub: RolloutBatch, old_values, returns, value_clip: float | None, dtype, mb_rows
) -> tuple[torch.Tensor, dict]:
    """The clipped value loss of the rows of ``sub`` as their part of the minibatch's: sum_i l_i / mb_rows, l_i the
    row's token-mean loss (RLHF book §6.1: per-sequence mean, then batch mean) and ``mb_rows`` the minibatch's trained
    rows over every rank, so neither grad_accum nor the number of processes changes it. Returns (that part, stats)."""
    values = completion_values(value_model, sub, dtype)
    vloss, stats = value_loss(values, old_values, returns, sub.train_mask, clip=value_clip)  # mean_i l_i
    return vloss * (len(sub) / mb_rows), stats  # rows without a trained token have l_i = 0

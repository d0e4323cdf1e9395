"""PPO-ptx: a pretraining log-likelihood term in online RL, and the forgetting it is meant to prevent.

InstructGPT's objective (Ouyang et al. 2022; RLHF book eq. 137):

    J(theta) = E_{(x, y) ~ pi_theta}[ r(x, y) - beta KL ] + gamma E_{x ~ D_pretrain}[ log pi_theta(x) ]

so each optimizer step of `lmrl rl` adds gamma * CE(pi_theta; windows of pretraining text) to the RL loss
(``ptx_coef`` = gamma, ``ptx_batch_size`` windows of ``ptx_block_size`` tokens from ``ptx_dataset``). With
``ptx_dataset`` set, every evaluation logs ``eval/ptx_ce``: the policy's cross-entropy on held-out windows of that
text, i.e. how much of the pretraining distribution RL has forgotten — also with ``ptx_coef=0``, to compare.
"""

from __future__ import annotations

from types import SimpleNamespace

from lmrl.models.placement import model_device
from lmrl.trainers import common
from lmrl.trainers.lm_windows import load_windows, mean_ce, validation_stats


class PretrainingMix:
    """Windows of ``ptx_dataset`` (train / held-out), the ptx term's backward and the forgetting metric."""

    def __init__(self, config, tokenizer):
        """``config``: the run's (`lmrl.trainers.rl.sections.PtxSection` keys and ``seed``)."""
        source = SimpleNamespace(
            data=config.ptx_dataset,
            data_split="train",
            text_column="text",
            val_fraction=0.05,
            block_size=config.ptx_block_size,
        )
        windows = load_windows(source, tokenizer)
        self.train, self.val, self.summary = windows.train, windows.val[:64], windows.summary
        self.coef, self.batch_size, self.seed = config.ptx_coef, config.ptx_batch_size, config.seed

    def backward(self, model, position: int, dtype, chunk_mb: float) -> float:
        """Add gamma * CE of the batch at data ``position`` (1-based, one per optimizer step) to the gradients;
        returns the CE (nats/token)."""
        rows = common.epoch_batch_indices(len(self.train), self.batch_size, position, self.seed)
        ce = mean_ce(model, self.train[rows].to(model_device(model)), dtype, chunk_mb)
        common.check_finite(ce, position)
        (ce * self.coef).backward()
        return ce.item()

    def forgetting(self, model, dtype, chunk_mb: float) -> dict[str, float]:
        return {"eval/ptx_ce": validation_stats(model, self.val, self.batch_size, dtype, chunk_mb)["eval/ce"]}

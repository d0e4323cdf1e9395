"""A step's learning targets, by the algorithm's advantage estimator (`lmrl.algorithms.ADVANTAGES`).

    targets = make_targets(config)                           # once per run
    adv = targets.outcome(scored)                            # group advantages, on whole groups (None: per token)
    targets.per_token(parts, batch, rewards, adv, ...)       # the `Targets` the update trains on

An outcome estimator (reinforce, rloo, grpo, ...) turns each row's reward into its advantage from every rank's rewards,
before any group is dropped; an estimator with the ``value_model`` trait (``gae``) needs a value model's per-token
values: GAE on KL-shaped rewards, and the returns and old values of PPO's value loss (`lmrl.trainers.ppo_value`).
"""

from __future__ import annotations

import dataclasses

import torch

from lmrl.algorithms import ADVANTAGES, advantages
from lmrl.parallel import runtime
from lmrl.trainers.ppo_value import ppo_targets
from lmrl.trainers.rl.dynamic import Scored
from lmrl.trainers.update import Targets


def group_advantages(rewards: torch.Tensor, name: str, group_size: int, options: dict, trained=None) -> torch.Tensor:
    """(N,) advantages of this rank's rows, from every rank's rewards (REINFORCE's baseline and adv_scale=batch are
    statistics of the whole batch); with ``trained`` (N,) bool, from the trained rows only (refill's pads get 0)."""
    every = runtime.all_gather(rewards)
    if trained is None:
        adv = advantages(name, every, group_size, **options)
    else:
        keep = runtime.all_gather(trained.long()).bool()
        adv = torch.zeros_like(every)
        adv[keep] = advantages(name, every[keep], group_size, **options)
    return adv.view(runtime.world(), -1)[runtime.rank()]


@dataclasses.dataclass(frozen=True)
class OutcomeTargets:
    """Outcome advantages of whole groups; old log-probs only when the batch trains more than one update."""

    name: str
    group_size: int
    options: dict
    updates_per_step: int = 1

    def outcome(self, scored: Scored) -> torch.Tensor:
        return group_advantages(scored.rewards, self.name, self.group_size, self.options, scored.trained)

    def needs_old(self, has_reference: bool) -> bool:
        """Old log-probs from a forward of their own: with one on-policy update they come free (pi_old = pi_theta)."""
        return self.updates_per_step > 1

    def per_token(self, parts, scored: Scored, ref_logp, old_logp, kl_coef, dtype) -> Targets:
        return Targets(scored.advantages, old_logp, ref_logp)


@dataclasses.dataclass(frozen=True)
class ValueTargets(OutcomeTargets):
    """GAE on the value model's values (PPO): whitened per-token advantages, returns and old values."""

    gamma: float = 1.0
    lam: float = 0.95
    kl_coef: float = 0.0

    def outcome(self, scored: Scored) -> None:
        return None

    def needs_old(self, has_reference: bool) -> bool:
        return self.updates_per_step > 1 or has_reference  # the KL-shaped rewards read the old policy's log-probs

    def per_token(self, parts, scored: Scored, ref_logp, old_logp, kl_coef, dtype) -> Targets:
        old = old_logp if old_logp is not None else scored.batch.sampler_logp
        coef = self.kl_coef if kl_coef is None else kl_coef
        adv, returns, old_values = ppo_targets(
            parts.value_model, scored.batch, scored.rewards, ref_logp, old, self.gamma, self.lam, coef, dtype
        )
        return Targets(adv, old_logp, ref_logp, returns, old_values)


def make_targets(config) -> OutcomeTargets:
    """The targets of an `RLConfig`'s advantage estimator."""
    name, options = config.advantage, ADVANTAGES.own_options(config.advantage, {"scale": config.adv_scale})
    common = (name, config.samples_per_prompt, options, config.updates_per_step)
    if ADVANTAGES.trait(name, "value_model", False):
        return ValueTargets(*common, config.gamma, config.lam, config.kl_coef)
    return OutcomeTargets(*common)

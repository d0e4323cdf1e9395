"""The group sampler of multi-turn runs (``lmrl rl tools=[...]`` / ``env=...``): G episodes per prompt.

Each episode is one row of the step's `RolloutBatch` (`lmrl.rollout.tools.multiturn.run_episodes`: the model's turns
from the engine, the environment's messages in between, a `loss_mask` that leaves them out), so the policy-gradient
step is the single-turn one.

    sampler = EpisodeGroups(engine, tokenizer, GroupOptions.from_config(config), env_factory, config.turn_options())
    batch = sampler.sample(rows, step)       # rows * G episodes, prompt-major
"""

from __future__ import annotations

from lmrl.rollout.protocol import Engine
from lmrl.rollout.samplers.groups import GroupOptions, LocalGroups, seeded_shards
from lmrl.rollout.tools.env import EnvFactory
from lmrl.rollout.tools.multiturn import MultiTurnOptions, run_episodes
from lmrl.rollout.types import RolloutBatch, concat_batches


class EpisodeGroups(LocalGroups):
    """`LocalGroups` whose completions are episodes: one environment per trajectory (``env_factory(row)``)."""

    def __init__(
        self, engine: Engine, tokenizer, options: GroupOptions, env_factory: EnvFactory, turns: MultiTurnOptions
    ):
        super().__init__(engine, tokenizer, options)
        self.env_factory, self.turns = env_factory, turns

    def sample(self, rows: list[dict], step: int) -> RolloutBatch:
        """G episodes per prompt (prompt-major) of this rank's ``rows``, in its ``sampling_shards`` (whole groups;
        shard k with the CPU generator of (seed, step, k): resume-exact, and independent of the number of processes).
        Each rank runs its episodes alone (several processes: the policy is unsharded for the rollout), so episodes
        of different lengths or turn counts need no padding: every rank's batch has the same number of rows."""
        options, G = self.options, self.options.samples_per_prompt
        batches = []
        for _, part, generator in seeded_shards(rows, options.sampling_shards, options.seed, step):
            episodes = [row for row in part for _ in range(G)]
            envs = [self.env_factory(row) for row in episodes]
            batches.append(
                run_episodes(
                    self.engine, self.tokenizer, envs, episodes, options.params, self.turns, generator, group_size=G
                )
            )
        return concat_batches(batches, self.tokenizer.pad_token_id)

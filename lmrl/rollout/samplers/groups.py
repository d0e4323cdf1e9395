"""G completions per prompt, in seeded shards: the rollout of `lmrl rl`, of its Ray workers and of the multi-turn
(`lmrl.rollout.samplers.episodes`) and distillation samplers.

The step's rows are cut into ``sampling_shards`` shards (`lmrl.parallel.shards`), each sampled with the generator
of (seed, step, shard): a run's samples are resume-exact and do not depend on how many processes share the step.

    sampler = LocalGroups(engine, tokenizer, GroupOptions.from_config(config))
    sampler.sync(model, step - 1)
    batch = sampler.sample(rows, step)       # RolloutBatch, rows * G, prompt-major
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from lmrl.config_sections import SamplingSection
from lmrl.data.prompt_format import PromptFormat
from lmrl.models.replay import SamplingRecorder
from lmrl.parallel.shards import rank_shards, shard_generator
from lmrl.rollout.protocol import Engine
from lmrl.rollout.types import RolloutBatch, SamplingParams, concat_batches


def sampling_params(config) -> SamplingParams:
    """The run's sampling parameters from its `max_new_tokens`, `temperature`, `top_p`, `top_k` and `stop` keys."""
    return SamplingParams(
        max_new_tokens=config.max_new_tokens,
        temperature=config.temperature,
        top_p=config.top_p,
        top_k=config.top_k,
        stop_strings=tuple(config.stop) if isinstance(config, SamplingSection) else (),
    )


def seeded_shards(
    rows: Sequence, sampling_shards: int, seed: int, step: int, device: torch.device | str = "cpu"
) -> Iterator[tuple[int, list, torch.Generator]]:
    """(step-wide shard index, rows, generator) of each shard of this rank's ``rows``."""
    for k, part in rank_shards(rows, sampling_shards):
        yield k, part, shard_generator(seed, step, k, device)


@dataclass(frozen=True)
class GroupOptions:
    """How a step's groups are sampled, built once from the config."""

    samples_per_prompt: int
    """G, completions per prompt"""
    params: SamplingParams
    sampling_shards: int
    """shards of a step, each with its own seeded generator (0: one per process)"""
    seed: int
    recorder: SamplingRecorder | None = None
    """keeps the sampling forwards' layer outputs for the update to replay (`lmrl.models.replay`): the run's
    `ForwardPlan.recorder`, which decided where a record can be replayed (None: nothing recorded)"""
    prompt: PromptFormat = PromptFormat()
    """how a row's prompt becomes the model's prompt ids (`lmrl.data.prompt_format`)"""

    @classmethod
    def from_config(cls, config, recorder: SamplingRecorder | None = None) -> GroupOptions:
        return cls(
            config.samples_per_prompt,
            sampling_params(config),
            config.sampling_shards,
            config.seed,
            recorder,
            PromptFormat.from_config(config),
        )


def sample_shard(
    engine: Engine, tokenizer, rows: list[dict], options: GroupOptions, generator: torch.Generator, recorder=None
) -> RolloutBatch:
    """G completions of each of ``rows`` (their ``prompt``s, encoded by ``options.prompt``) with ``generator``."""
    ids = [options.prompt.ids(tokenizer, row["prompt"]) for row in rows]
    return engine.generate(ids, options.params, n=options.samples_per_prompt, generator=generator, recorder=recorder)


def sample_groups(engine: Engine, tokenizer, rows: list[dict], options: GroupOptions, step: int) -> RolloutBatch:
    """This rank's rows sampled shard by shard (with the recorder: one shard, the plan's rule)."""
    shards = seeded_shards(rows, options.sampling_shards, options.seed, step, engine.device)
    batches = [sample_shard(engine, tokenizer, part, options, gen, options.recorder) for _, part, gen in shards]
    return concat_batches(batches, tokenizer.pad_token_id)


class LocalGroups:
    """The group sampler of placement=local: this process's engine samples the step's groups."""

    def __init__(self, engine: Engine, tokenizer, options: GroupOptions):
        self.engine, self.tokenizer, self.options = engine, tokenizer, options

    def sample(self, rows: list[dict], step: int) -> RolloutBatch:
        return sample_groups(self.engine, self.tokenizer, rows, self.options, step)

    def sync(self, model: torch.nn.Module, version: int) -> None:
        self.engine.sync(model, version)

    def metrics(self) -> dict[str, float]:
        return self.engine.metrics()

    def close(self) -> None:
        self.engine.close()

    def state_dict(self) -> dict:
        return {}  # nothing sampled ahead: every step samples with the weights it trains

    def load_state_dict(self, state: dict) -> None:
        pass

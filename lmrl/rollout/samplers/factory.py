"""Which group sampler gives `lmrl rl` its steps' completions: ONE table, read once at start-up.

    sampler = make_sampler(config, model, tokenizer, dtype, rows_of=rows_of, env_factory=env_factory)
    sampler.sync(model, step - 1)            # before each rollout (`lmrl.rollout.protocol`)
    batch = sampler.sample(rows, step)       # RolloutBatch, rows * G, prompt-major

| name           | picked when                               | sampler                                                        |
| -------------- | ----------------------------------------- | -------------------------------------------------------------- |
| `ray`          | placement=ray                             | `RayRollouts`: rollout-worker actors, each with a policy copy  |
| `episodes`     | tools, mcp_servers or env (multi-turn)    | `EpisodeGroups`: tool/environment episodes through the engine  |
| `server_ahead` | async_steps > 0 (engine=vllm on servers)  | `ServerAhead`: the servers sample the next steps meanwhile     |
| `local`        | otherwise                                 | `LocalGroups`: this process's engine samples the step's groups |

`config` is an `lmrl rl` config (`lmrl.trainers.rl.config.RLConfig`), whose checks refuse the combinations no entry
serves (placement=ray with multi-turn or engine=vllm, async_steps without vLLM servers or with multi-turn). Every
entry but `ray` samples through this process's engine (`lmrl.rollout.engines.factory.make_engine`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from lmrl.models.replay import SamplingRecorder
from lmrl.rollout.engines.factory import make_engine
from lmrl.rollout.protocol import GroupSampler
from lmrl.rollout.samplers.episodes import EpisodeGroups
from lmrl.rollout.samplers.groups import GroupOptions, LocalGroups
from lmrl.rollout.samplers.ray import RayRollouts
from lmrl.rollout.samplers.server_ahead import ServerAhead
from lmrl.rollout.tools.env import EnvFactory

RowsOf = Callable[[int], list[dict]]
"""rows_of(step): the step's prompts in the fixed data order (what the samplers that run ahead request)."""


def make_sampler(
    config,
    model: torch.nn.Module,
    tokenizer,
    dtype: torch.dtype | None,
    *,
    rows_of: RowsOf,
    env_factory: EnvFactory | None = None,
    longest_prompt: int = 1,
    recorder: SamplingRecorder | None = None,
) -> GroupSampler:
    """The group sampler `sampler_name(config)` names (`SAMPLERS`), sampling from `model`.

    dtype: the run's autocast dtype (None: fp32); env_factory: multi-turn runs' environments
    (`lmrl.rollout.tools.section.build_env_factory`); longest_prompt: the longest prompt in tokens (engine=vllm
    checks it at start-up); recorder: the run's `ForwardPlan.recorder` (the local sampler records with it)."""
    name = sampler_name(config)
    return SAMPLERS[name](config, model, tokenizer, dtype, rows_of, env_factory, longest_prompt, recorder)


def sampler_name(config) -> str:
    """The `SAMPLERS` entry of a config (the module docstring's table)."""
    if config.placement == "ray":
        return "ray"
    if config.multi_turn:
        return "episodes"
    return "server_ahead" if config.async_steps else "local"


def local_sampler(config, model, tokenizer, dtype, rows_of, env_factory, longest_prompt, recorder) -> GroupSampler:
    options = GroupOptions.from_config(config, recorder)
    engine = make_engine(config, model, tokenizer, dtype, sampling=options.params, longest_prompt=longest_prompt)
    return LocalGroups(engine, tokenizer, options)


def episodes_sampler(config, model, tokenizer, dtype, rows_of, env_factory, longest_prompt, recorder) -> GroupSampler:
    options = GroupOptions.from_config(config)
    engine = make_engine(config, model, tokenizer, dtype, sampling=options.params, longest_prompt=longest_prompt)
    return EpisodeGroups(engine, tokenizer, options, env_factory, config.turn_options())


def server_ahead_sampler(
    config, model, tokenizer, dtype, rows_of, env_factory, longest_prompt, recorder
) -> GroupSampler:
    options = GroupOptions.from_config(config)
    engine = make_engine(config, model, tokenizer, dtype, sampling=options.params, longest_prompt=longest_prompt)
    return ServerAhead(
        engine, tokenizer, options, rows_of, config.async_steps, config.max_steps, config.async_abort_on_push
    )


def ray_sampler(config, model, tokenizer, dtype, rows_of, env_factory, longest_prompt, recorder) -> GroupSampler:
    return RayRollouts(config, rows_of, model, tokenizer)


SAMPLERS: dict[str, Callable[..., GroupSampler]] = {
    "local": local_sampler,
    "episodes": episodes_sampler,
    "server_ahead": server_ahead_sampler,
    "ray": ray_sampler,
}
"""name -> factory(config, model, tokenizer, dtype, rows_of, env_factory, longest_prompt, recorder); only the local
sampler records (`ForwardPlan.resolve` turns the replay off for the others, with the reason)."""

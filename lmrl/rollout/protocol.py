"""The sampler protocol: what every trainer samples through, with one weight-sync vocabulary.

Two levels, one contract for weights:

- an **engine** (`lmrl.rollout.engines.factory`: `HFEngine`, `VLLMEngine` colocated or behind `lmrl vllm-serve`) completes
  token-id prompts: ``generate(prompt_ids, params, n, generator) -> RolloutBatch``;
- a **group sampler** (`lmrl.rollout.samplers`: `LocalGroups` over an engine, `EpisodeGroups` of multi-turn episodes,
  `RayRollouts` over rollout-worker actors, `ServerAhead` over vLLM servers with async_steps) gives a step's G
  completions per prompt: ``sample(rows, step) -> RolloutBatch``.

Both have ``sync(model, version)``, ``metrics()`` and ``close()``. The trainer calls ``sync`` before it samples,
with the weights it trains and ``version``, the number of updates they have had: an engine that samples the
training model itself (HF) only follows ``model``; one that holds a copy (vLLM, Ray workers) pushes the weights
when ``version`` is new. There are no optimizer hooks and no probing of what an engine can do.
"""

from __future__ import annotations

from typing import Protocol

import torch

from lmrl.models.replay import SamplingRecorder
from lmrl.rollout.types import RolloutBatch, SamplingParams


class Engine(Protocol):
    """Completes prompts with a policy's current weights (`lmrl.rollout.engines.factory.make_engine` builds one)."""

    @property
    def device(self) -> torch.device: ...

    @property
    def pad_token_id(self) -> int: ...

    def generate(
        self,
        prompt_ids: list[list[int]],
        params: SamplingParams,
        n: int = 1,
        generator: torch.Generator | None = None,
        recorder: SamplingRecorder | None = None,
    ) -> RolloutBatch:
        """n completions of each prompt, prompt-major (N = len(prompt_ids) * n); deterministic given `generator`.
        ``recorder`` (a `ForwardPlan.recorder`, which only an engine whose forwards are the learner's gets): keep the
        sampling forwards' layer outputs in ``batch.linear_outputs`` for the update to replay."""

    def sync(self, model: torch.nn.Module, version: int) -> None:
        """Sample `model`'s weights after `version` updates from the next `generate` on."""

    def metrics(self) -> dict[str, float]:
        """The engine's own per-step metrics (e.g. ``time/weight_sync_s``); {} when it has none."""

    def close(self) -> None:
        """Free what the engine holds (processes, GPU memory); the engine is not used afterwards."""


class GroupSampler(Protocol):
    """A step's G completions per prompt (`lmrl.rollout.samplers.factory.make_sampler` picks one)."""

    def sample(self, rows: list[dict], step: int) -> RolloutBatch:
        """G completions of each of this rank's ``rows`` (the step's prompts), prompt-major."""

    def sync(self, model: torch.nn.Module, version: int) -> None:
        """As `Engine.sync`."""

    def metrics(self) -> dict[str, float]:
        """As `Engine.metrics` (placement=ray adds ``async/*`` and ``time/wait_rollout_s``)."""

    def close(self) -> None:
        """As `Engine.close`."""

    def state_dict(self) -> dict:
        """What exact resume needs beyond the weights (async_steps: the batches sampled ahead); {} when nothing."""

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict`'s output (a checkpoint's)."""

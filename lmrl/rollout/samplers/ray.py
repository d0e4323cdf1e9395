"""``placement=ray``: rollout workers as Ray actors, the learner in this process, bounded-staleness async RL.

Each of ``rollout_workers`` actors holds a copy of the policy and an engine (`lmrl.rollout.engines.factory.make_engine`)
and samples one shard (whole groups) of a step's prompts. After every update the learner puts its weights in Ray's
object store once (``ray.put``) and every worker loads them. With ``async_steps=k`` the requests for steps
s..s+k are in flight while step s trains, so a batch is sampled with weights at most k updates old
(``rollout/staleness`` = updates the learner made since those weights, per row; never above k). The learner's
update corrects for the gap with the importance weight π_learner/π_sampler against the sampler's log-probs
(``tis_cap``, ``is_level``, ``is_mode``: the same correction as for vLLM's numerics; `lmrl.algorithms.mismatch`).
A checkpoint holds the batches sampled ahead (`state_dict`): they were sampled with weights older than the
checkpoint's, so a resumed run trains on them instead of sampling them again, and continues exactly.

A worker that dies is replaced (a new actor gets the current weights and redoes its pending requests);
``worker_restarts`` replacements in a row without a successful batch stop the run with `WorkersFailed`, leaving
the last checkpoint intact. Ray actors, ``ray.put`` and ``ray.get`` are all that is used: a Ray cluster
(``ray start --head`` / ``--address``, or ``ray_address``) places the same workers on other machines.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from lmrl.config_base import ConfigError
from lmrl.parallel.shards import shard_generator
from lmrl.rollout.engines.factory import make_engine
from lmrl.rollout.samplers.groups import GroupOptions, sample_shard
from lmrl.rollout.types import RolloutBatch, concat_batches

Result = tuple[RolloutBatch, int]  # a worker's shard of a step and the weights version it was sampled with

INSTALL = "pip install 'lmrl[ray]' (or pip install ray)"


class WorkersFailed(RuntimeError):
    """Rollout workers kept failing; the run stopped before its next update (the last checkpoint is intact)."""


def require_ray():
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(
            f"placement=ray needs Ray, which is not installed. Install it: {INSTALL}. Or use placement=local."
        ) from exc
    return ray


class RolloutWorker:
    """One rollout worker (a Ray actor): a CPU/GPU copy of the policy and an engine; samples shards of steps."""

    def __init__(self, config):
        torch.set_num_threads(1)  # one CPU per actor (ray.remote(num_cpus=1))
        from lmrl.models.setup import ModelSetup

        self.options = GroupOptions.from_config(config)
        setup = ModelSetup.from_config(config)
        self.model, self.tokenizer = setup.policy()
        self.engine = make_engine(config, self.model, self.tokenizer, setup.dtype, sampling=self.options.params)
        self.version = 0

    def set_weights(self, state: dict[str, torch.Tensor], version: int) -> None:
        self.model.load_state_dict(state)
        self.version = version
        self.engine.sync(self.model, version)

    def sample(self, rows: list[dict], step: int, shard: int) -> tuple[RolloutBatch, int]:
        """Shard ``shard`` of step ``step`` and the weights version (learner updates) it was sampled with."""
        generator = shard_generator(self.options.seed, step, shard, self.engine.device)
        return sample_shard(self.engine, self.tokenizer, rows, self.options, generator), self.version


class RayRollouts:
    """The learner's view of the workers, a `lmrl.rollout.protocol.GroupSampler`: ``sample(rows, step)`` returns
    the step's batch (sampled ahead by up to ``async_steps``, from ``rows_of``); ``sync(model, version)`` puts new
    weights in the object store for every worker."""

    def __init__(
        self, config, rows_of: Callable[[int], list[dict]], model: torch.nn.Module, tokenizer, start_step: int = 0
    ):
        ray = require_ray()
        if not ray.is_initialized():
            ray.init(
                address=config.ray_address,
                num_cpus=None if config.ray_address else config.rollout_workers,
                include_dashboard=False,
                log_to_driver=False,
            )
        self.ray, self.config, self.rows_of, self.tokenizer = ray, config, rows_of, tokenizer
        self.actor = ray.remote(num_cpus=1)(RolloutWorker)
        self.version = start_step
        self.weights = ray.put(cpu_state(model))
        self.workers = [self.spawn() for _ in range(config.rollout_workers)]
        self.pending: dict[int, list[Any]] = {}  # step -> one request per worker (its shard)
        self.ready: dict[int, list[Result]] = {}  # step -> its shards, fetched (for a checkpoint, or restored)
        self.failures = 0  # replacements since the last good batch
        self.restarts = 0  # replacements in the whole run
        self.last_metrics: dict[str, float] = {}

    def metrics(self) -> dict[str, float]:
        """The last batch's staleness (updates since its rows' weights: max, mean over rows, share of rows older than
        the learner), waiting time and the workers replaced so far."""
        return self.last_metrics

    def spawn(self):
        worker = self.actor.remote(self.config)
        worker.set_weights.remote(self.weights, self.version)
        return worker

    def submit(self, step: int, worker: int | None = None) -> None:
        rows = self.rows_of(step)
        n = len(self.workers)
        size = len(rows) // n
        targets = range(n) if worker is None else [worker]
        refs = self.pending.setdefault(step, [None] * n)
        for i in targets:
            refs[i] = self.workers[i].sample.remote(rows[i * size : (i + 1) * size], step, i)

    def sample(self, rows: list[dict], step: int) -> RolloutBatch:
        """Step ``step``'s batch; requests up to ``step + async_steps`` are in flight afterwards. The workers sample
        ``rows_of(step)``, requested ahead; ``rows`` (the same prompts) is not re-sent."""
        for ahead in range(step, step + self.config.async_steps + 1):
            if ahead not in self.pending and ahead not in self.ready and ahead <= self.config.max_steps:
                self.submit(ahead)
        t0 = time.perf_counter()
        results = self.ready.pop(step) if step in self.ready else self.fetch(step)
        staleness = torch.cat([torch.full((len(batch),), float(self.version - version)) for batch, version in results])
        self.last_metrics = {
            "rollout/staleness": float(staleness.max()),
            "rollout/staleness_mean": float(staleness.mean()),
            "rollout/stale_rows_frac": float((staleness > 0).float().mean()),
            "time/wait_rollout_s": time.perf_counter() - t0,
            "rollout/worker_restarts": float(self.restarts),
        }
        return concat_batches([batch for batch, _ in results], self.tokenizer.pad_token_id)

    def fetch(self, step: int) -> list[Result]:
        results = [self.get(step, i) for i in range(len(self.workers))]
        del self.pending[step]
        return results

    def state_dict(self) -> dict[str, Any]:
        """The batches sampled ahead of the checkpoint (waited for), as plain data: {step: [(batch, version)]}."""
        for step in sorted(self.pending):
            self.ready[step] = self.fetch(step)
        return {
            "ready": {
                step: [(batch_state(batch), version) for batch, version in results]
                for step, results in self.ready.items()
            }
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A checkpoint's batches sampled ahead: the next steps train on them as the uninterrupted run did."""
        self.ready = {
            int(step): [(RolloutBatch(**batch), int(version)) for batch, version in results]
            for step, results in state.get("ready", {}).items()
        }

    def get(self, step: int, i: int) -> tuple[RolloutBatch, int]:
        """Worker i's shard of ``step``; a dead worker is replaced and its pending requests re-sent."""
        while True:
            try:
                result = self.ray.get(self.pending[step][i])
                self.failures = 0
                return result
            except self.ray.exceptions.RayActorError as exc:  # the actor died (killed, crashed, out of memory)
                self.failures += 1
                if self.failures > self.config.worker_restarts:
                    raise WorkersFailed(
                        f"rollout worker {i} failed {self.failures} times in a row (last: {type(exc).__name__}: "
                        f"{str(exc).splitlines()[0] if str(exc) else ''}). The run stopped before step {step}'s "
                        f"update; the last checkpoint is intact (resume=true continues). Check the workers' memory "
                        f"and logs (ray logs), or raise worker_restarts."
                    ) from exc
                self.workers[i] = self.spawn()
                self.restarts += 1
                for pending_step in sorted(self.pending):
                    self.submit(pending_step, i)

    def sync(self, model: torch.nn.Module, version: int) -> None:
        """The learner's weights after update ``version``, put once and loaded by every worker (in order, so
        requests sent before this keep the weights they were sent with); nothing when the workers have them."""
        if version == self.version:
            return
        self.version = version
        self.weights = self.ray.put(cpu_state(model))
        for worker in self.workers:
            worker.set_weights.remote(self.weights, version)

    def close(self) -> None:
        for worker in self.workers:
            self.ray.kill(worker)
        self.workers = []


def batch_state(batch: RolloutBatch) -> dict[str, Any]:
    """A worker's batch as tensors, strings and numbers (a checkpoint loads with weights_only=True)."""
    if batch.linear_outputs is not None:
        raise ValueError("a batch with recorded linear-layer outputs cannot be kept in a checkpoint")
    return {f: getattr(batch, f) for f in RolloutBatch.__dataclass_fields__ if f != "linear_outputs"}


def cpu_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}

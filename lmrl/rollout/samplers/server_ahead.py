"""``async_steps=k`` on vLLM servers: ``lmrl rl engine=vllm vllm_server(s)=... async_steps=k``.

The server(s) sample the next steps' groups while the learner trains this one. `ServerAhead` is the run's
`lmrl.rollout.protocol.GroupSampler`; one background thread sends its HTTP requests (the servers do the work) in
the order the learner queued them:

    sync(model, v)      weights after update v, serialized NOW (a snapshot: the learner trains on), then pushed
    sample(rows, s)     requests steps s..s+k that are not queued yet, waits for step s's batch

Because the queue is first in, first out, a step's batch is sampled with the last weights queued before its request,
whatever the timing: step s+k is requested after the push of update s-1, so in steady state every batch is k
updates old (``rollout/staleness`` = k; the first steps less). Requests queued before a push finish on the old
weights (the push waits behind them).

``async_abort_on_push=true``: a push cancels the queued requests that have not started yet (a request the server is
sampling runs to its end: vLLM's offline `LLM.generate` that the server runs cannot be interrupted from the HTTP
side, so this works at the level of this queue) and `sample` sends them again behind the push, with the new
version: they sample the new weights and their staleness drops. Every batch still carries the version its request
was sent with (``rollout/policy_version``), and its rows depend only on their seeds (drawn from the step) and those
weights; but which requests had started when a push came depends on timing, so two runs with the same seed can
train on different versions (the default, false, is exactly reproducible). ``rollout/resent_requests`` counts them. The learner's update corrects for the gap with the importance weight
pi_learner/pi_sampler against the sampler's log-probs (``tis_cap``, ``is_level``, ``is_mode``;
`lmrl.algorithms.mismatch`), as with placement=ray.

Exact resume: a checkpoint holds the batches sampled ahead (`state_dict`, waited for), with the policy version each
was sampled with; a resumed run trains on them and continues as the uninterrupted run would. A failed request (a
replica that died) stops the run at the step that needs it with the error naming the server; nothing queued after a
failed push samples (it would use old weights silently).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from lmrl.rollout.samplers.groups import GroupOptions, sample_groups
from lmrl.rollout.samplers.ray import batch_state
from lmrl.rollout.types import RolloutBatch


class ServerAhead:
    """Steps sampled up to ``async_steps`` ahead on a server-mode `VLLMEngine` (one server or `vllm_servers`)."""

    def __init__(
        self,
        engine,
        tokenizer,
        options: GroupOptions,
        rows_of: Callable[[int], list[dict]],
        async_steps: int,
        max_steps: int,
        abort_on_push: bool = False,
    ):
        """engine: a `VLLMEngine` whose driver is a server (`RemoteVLLM`, `Replicas`); rows_of(step): the step's
        prompts in the fixed data order (sampled ahead); abort_on_push: `async_abort_on_push` (module docstring)."""
        # the background thread tokenizes and decodes with a tokenizer of its own: a fast (Rust) tokenizer shared
        # with the learner's thread can fail with "Already borrowed" when one thread changes its padding settings
        self.tokenizer = engine.tokenizer = copy.deepcopy(tokenizer)
        self.engine, self.options, self.rows_of = engine, options, rows_of
        self.async_steps, self.max_steps, self.abort_on_push = async_steps, max_steps, abort_on_push
        self.resent = 0  # requests cancelled at the last push and sent again after it (abort_on_push)
        self.queue = ThreadPoolExecutor(1, thread_name_prefix="lmrl-rollout-ahead")  # one thread: FIFO
        self.pending: dict[int, Future] = {}  # step -> (batch, version), being sampled
        self.ready: dict[int, tuple[RolloutBatch, int]] = {}  # step -> (batch, version): fetched, or restored
        self.version: int | None = None  # the last weights queued (learner updates)
        self.error: BaseException | None = None  # a failed request: every later one fails with it
        self.snapshot_s = 0.0
        self.last_metrics: dict[str, float] = {}

    def run(self, fn: Callable, *args):
        """One queued request, in the background thread."""
        if self.error is not None:
            raise self.error
        try:
            return fn(*args)
        except BaseException as exc:
            self.error = exc
            raise

    def sync(self, model: torch.nn.Module, version: int) -> None:
        """Queue a push of `model`'s weights after `version` updates (serialized now); nothing if queued already."""
        if version == self.version:
            return
        t0 = time.perf_counter()
        parts = self.engine.snapshot(model)
        self.snapshot_s = time.perf_counter() - t0
        self.version = version
        self.resent = 0
        if self.abort_on_push:  # requests that have not started: cancelled, re-queued behind the push by `sample`
            for step in sorted(self.pending):
                if self.pending[step].cancel():
                    del self.pending[step]
                    self.resent += 1
        self.queue.submit(self.run, self.engine.push_snapshot, parts)

    def sample_now(self, rows: list[dict], step: int, version: int) -> tuple[RolloutBatch, int]:
        if self.engine.stale:  # never: a push is queued before the first request (sync comes before sample)
            raise RuntimeError("async_steps: a request was queued before any weights were pushed")
        return sample_groups(self.engine, self.tokenizer, rows, self.options, step), version

    def sample(self, rows: list[dict], step: int) -> RolloutBatch:
        """Step ``step``'s batch (``rows_of(step)``, requested ahead; ``rows`` is the same prompts); afterwards the
        requests up to ``step + async_steps`` are queued."""
        for ahead in range(step, min(step + self.async_steps, self.max_steps) + 1):
            if ahead not in self.pending and ahead not in self.ready:
                self.pending[ahead] = self.queue.submit(
                    self.run, self.sample_now, self.rows_of(ahead), ahead, self.version
                )
        t0 = time.perf_counter()
        batch, version = self.ready.pop(step) if step in self.ready else self.pending.pop(step).result()
        staleness = float(self.version - version)  # every row of a step: one request set after one push
        self.last_metrics = {
            "rollout/policy_version": float(version),
            "rollout/staleness_mean": staleness,
            "rollout/staleness": staleness,
            "rollout/stale_rows_frac": float(staleness > 0),
            "time/wait_rollout_s": time.perf_counter() - t0,
            "time/weight_snapshot_s": self.snapshot_s,
        }
        if self.abort_on_push:
            self.last_metrics["rollout/resent_requests"] = float(self.resent)
        return batch

    def metrics(self) -> dict[str, float]:
        """The last push's seconds (``time/weight_sync_s``, in the background), the last batch's policy version and
        staleness (updates the learner made since its weights), the wait for it and the snapshot's seconds."""
        return {**self.engine.metrics(), **self.last_metrics}

    def state_dict(self) -> dict[str, Any]:
        """The batches sampled ahead of the checkpoint (waited for): {"ready": {step: [batch, version]}}."""
        for step in sorted(self.pending):
            self.ready[step] = self.pending.pop(step).result()
        return {"ready": {step: [batch_state(batch), version] for step, (batch, version) in self.ready.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ready = {
            int(step): (RolloutBatch(**batch), int(version))
            for step, (batch, version) in state.get("ready", {}).items()
        }

    def close(self) -> None:
        """Queued requests dropped, the one in flight finished; then the engine's sessions end."""
        self.queue.shutdown(wait=True, cancel_futures=True)
        self.engine.close()

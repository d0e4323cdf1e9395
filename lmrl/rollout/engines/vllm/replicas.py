"""Several `lmrl vllm-serve` replicas behind one `VLLMEngine`: ``engine=vllm vllm_servers=[host:port, ...]``.

    driver = replica_driver(["127.0.0.1:8001", "127.0.0.1:8002"], timeout=600, model=policy, options=options)
    engine = VLLMEngine(policy, tokenizer, options, driver=driver)

`Replicas` has the methods of one server's `RemoteVLLM` (`load_weights`, `sample`, `close`), so the engine is the
same for one server or several:

- **Sampling**: the prompts of a `generate` are cut into contiguous, nearly equal spans in order (replica i gets
  span i, whatever answers first), sent concurrently, and the rows put back in prompt order. Each prompt's seed is
  drawn in the trainer (`VLLMEngine`), so a row does not depend on the replica that samples it: same seed and same
  weights give the rows one server gives (tests/rollout/test_vllm_replicas.py checks it on vLLM's CPU build).
- **Weights**: each push is serialized once and sent to every replica concurrently; each loads it in place when its
  last part arrives (`client.push_to_all`). Sampling starts after every replica has it.
- **Sessions**: every replica gets the trainer's /init and hands out its own session; a replica that samples for
  another trainer refuses it (ConfigError naming that replica), and the replicas this trainer had already taken
  are released, so a refused trainer holds none.
- **Failures**: a replica that is not there at start-up is a ConfigError naming it; one that dies or fails mid-run
  stops the run with `VLLMServerError` naming it (the last checkpoint is intact; restart it and resume=true).
- Several trainer processes (nproc=N): rank 0 connects to, starts and pushes to every replica; the other ranks
  sample through them with rank 0's sessions (as with one server).
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

import torch

from lmrl.config_base import ConfigError
from lmrl.parallel import runtime
from lmrl.rollout.engines.vllm.client import (
    RemoteVLLM,
    connect,
    each,
    push_snapshot,
    push_to_all,
    snapshot,
    spawn_all,
)


def spans(count: int, parts: int) -> list[tuple[int, int]]:
    """[lo, hi) of each of `parts` contiguous, nearly equal spans of range(count) (the first ones one longer)."""
    size, extra = divmod(count, parts)
    bounds = [0]
    for i in range(parts):
        bounds.append(bounds[-1] + size + (i < extra))
    return list(zip(bounds[:-1], bounds[1:]))


class Replicas:
    """Several `RemoteVLLM` servers sampling one policy: the driver of a `VLLMEngine` (see the module docstring)."""

    def __init__(self, remotes: list[RemoteVLLM], pushes: bool = True):
        self.remotes, self.pushes = remotes, pushes
        self.group = None  # vllm_weight_transport=gloo|nccl: one `group.WeightGroup` with every replica

    @property
    def url(self) -> str:
        return ", ".join(remote.url for remote in self.remotes)

    def use_transport(self, transport: str, trainer_device: str) -> None:
        """vllm_weight_transport=gloo|nccl|auto: one process group with every replica (`lmrl.rollout.engines.vllm.group`)."""
        from lmrl.rollout.engines.vllm.group import form_group

        timeout = self.remotes[0].timeout
        self.group = form_group(self.remotes, transport, trainer_device, timeout, self.pushes)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], tied: bool) -> None:
        push_to_all(self.remotes, weights, tied, self.pushes, self.group)

    def encode_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> list:
        """One push's parts, a snapshot of the weights (async_steps: the model trains on meanwhile)."""
        return snapshot(weights, self.group)

    def push_encoded(self, parts: list, tied: bool) -> None:
        push_snapshot(self.remotes, parts, tied, self.group)

    def sample(self, prompt_ids, n, temperature, max_tokens, stop_token_ids, seeds):
        """Replica i samples the i-th span of the prompts (with their seeds); rows come back in prompt order."""
        work = [
            (remote, lo, hi)
            for remote, (lo, hi) in zip(self.remotes, spans(len(prompt_ids), len(self.remotes)))
            if hi > lo
        ]
        results = each(
            work,
            lambda job: job[0].sample(
                prompt_ids[job[1] : job[2]], n, temperature, max_tokens, stop_token_ids, seeds[job[1] : job[2]]
            ),
        )
        tokens, logps, stopped = [], [], []
        for t, lp, s in results:
            tokens += t
            logps += lp
            stopped += s
        return tokens, logps, stopped

    def close(self) -> None:
        """Every replica's session ends (each is free for another trainer); replicas this run started stop."""
        if self.group is not None:
            self.group.close()
            self.group = None
        for remote in self.remotes:
            remote.close()


def start_all(servers: list[str], timeout: float, model, options) -> list[RemoteVLLM]:
    """Connect to every replica (a ConfigError names one that does not answer) and start each on `model`,
    concurrently; if one refuses (another trainer's) or fails, the ones already taken are released first."""
    from lmrl.rollout.engines.vllm.engine import model_spec

    if all(server == "auto" for server in servers):  # vllm_replicas=N: started here, stopped with the run
        remotes = spawn_all(len(servers), timeout)
    else:
        remotes = [connect(server, timeout) for server in servers]
    spec = model_spec(model)
    with ThreadPoolExecutor(len(remotes)) as pool:
        futures = [pool.submit(remote.start, *spec, options) for remote in remotes]
    errors = [f.exception() for f in futures]
    if any(e is not None for e in errors):
        for remote, error in zip(remotes, errors):
            if error is None or remote.process is not None:
                remote.close()  # this trainer holds no replica when it cannot hold them all (started ones stop)
        raise next(e for e in errors if e is not None)
    return remotes


def replica_driver(servers: list[str], timeout: float, model, options) -> Replicas:
    """`Replicas` over `servers`, started on `model`. Several processes: rank 0 starts them and pushes; the other
    ranks sample through them with rank 0's sessions."""
    if runtime.world() == 1:
        return Replicas(start_all(servers, timeout, model, options))
    remotes, error = None, None
    if runtime.rank() == 0:
        try:
            remotes = start_all(servers, timeout, model, options)
        except ConfigError as exc:  # the other ranks raise it too instead of waiting for rank 0 forever
            error = str(exc)
    shared = [(r.url, r.session) for r in remotes] if remotes else None
    shared, error = runtime.broadcast_object((shared, error))
    if error:
        raise ConfigError(error)
    if runtime.rank() == 0:
        return Replicas(remotes)
    return Replicas([RemoteVLLM(url, timeout, session=session, pushes=False) for url, session in shared], pushes=False)

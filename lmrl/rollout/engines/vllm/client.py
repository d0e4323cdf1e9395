"""The trainer's side of server mode: `RemoteVLLM` drives a `lmrl vllm-serve` process over HTTP with the same
methods as the in-process `VLLMDriver` (`load_weights`, `sample`), so `VLLMEngine` is the same in both modes: same
per-prompt seeds (drawn in the trainer), same log-prob semantics, same `RolloutBatch`. Needs no vLLM here.

    driver = server_driver("127.0.0.1:8000", timeout=600, model=policy, options=VLLMOptions(max_model_len=256))
    driver = server_driver("auto", ...)   # starts `python -m lmrl vllm-serve` as a child process first

Weights go as safetensors bodies of up to 256 MiB each (checkpoint names, the run's dtype), each part tagged with
its push's id. Every request has a timeout, so a server that died or hangs stops the run with `VLLMServerError`
(naming the server and how to restart) instead of hanging it; a server that is not there at start-up is a
`ConfigError` with the command that starts one.

One server, one trainer: /init returns a session token that every later request carries; a server that samples for
another trainer refuses this one at start-up (`ConfigError` naming the server and the fix). With several trainer
processes (nproc=N) they are one trainer: rank 0 starts (or spawns) the server and takes the session, every rank
samples its own prompts through it with that token, and rank 0 alone pushes the weights while the others wait at a
barrier (every rank gathers a sharded parameter, so FSDP and DDP push the same full weights).

Several servers (`vllm_servers`): `lmrl.rollout.engines.vllm.replicas.Replicas` drives one `RemoteVLLM` per replica with
the helpers here (`push_to_all`: each part serialized once and sent to every replica concurrently; `each`).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
import weakref
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

import torch

from lmrl.config_base import ConfigError
from lmrl.parallel import runtime
from lmrl.rollout.engines.vllm.wire import SESSION_HEADER, parse_server  # noqa: F401 - parse_server re-exported

CONNECT_TIMEOUT_S = 5.0  # /health: a live server answers at once
SPAWN_TIMEOUT_S = 300.0  # vllm_server=auto: `import vllm` and the server start
PUSH_PART_BYTES = 256 * 2**20  # one /weights request


class VLLMServerError(RuntimeError):
    """The vLLM server stopped answering or failed a request during the run."""


class RemoteVLLM:
    """A `lmrl vllm-serve` at `url`; `process`: the child that runs it (vllm_server=auto), ended with this object."""

    def __init__(
        self,
        url: str,
        timeout: float,
        process: subprocess.Popen | None = None,
        session: str | None = None,
        pushes: bool = True,
    ):
        """session: the token of a session rank 0 took (nproc > 1); pushes: False on the ranks that leave the push
        to rank 0."""
        self.url, self.timeout, self.process, self.session, self.pushes = url, timeout, process, session, pushes
        self.device = "cpu"  # where the server's vLLM runs (its /init says)
        self.group = None  # vllm_weight_transport=gloo|nccl: a `group.WeightGroup` with this server
        if process is not None:
            weakref.finalize(self, stop_process, process)

    def request(self, path: str, body: bytes | None = None, timeout: float | None = None, query: str = "") -> dict:
        """POST (GET without a body) `path`; the reply's JSON. A 400 is the trainer's bad input (ConfigError), a 409
        a refusal to mix trainers or pushes (ConfigError at /init, the run stops after it)."""
        req = urllib.request.Request(
            f"{self.url}{path}{query}",
            data=body,
            method="GET" if body is None else "POST",
            headers={SESSION_HEADER: self.session} if self.session else {},
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as reply:
                return json.loads(reply.read())
        except urllib.error.HTTPError as exc:
            message = json.loads(exc.read() or b"{}").get("error", str(exc))
            if exc.code == 400 or (exc.code == 409 and path == "/init"):
                raise ConfigError(message) from exc
            raise VLLMServerError(f"the vLLM server at {self.url} failed {path}: {message}") from exc
        except (OSError, TimeoutError) as exc:  # refused, reset, timed out
            died = self.process is not None and self.process.poll() is not None
            raise VLLMServerError(
                f"the vLLM server at {self.url} did not answer {path} ({type(exc).__name__}: {exc})"
                + (f"; its process exited with status {self.process.returncode}" if died else "")
                + ". Restart it (lmrl vllm-serve port=...) and continue the run with resume=true."
            ) from exc

    def request_json(self, path: str, payload: dict, timeout: float | None = None) -> dict:
        """POST `payload` as JSON; a ConfigError (the server refused bad input) names the server."""
        try:
            return self.request(path, json.dumps(payload).encode(), timeout)
        except ConfigError as exc:
            raise ConfigError(f"the vLLM server at {self.url}: {exc}") from exc

    def start(self, config: dict, architecture: str, options) -> bool:
        """Start vLLM on the server for this model (no weights); True if the server reused a running engine."""
        body = json.dumps(
            {
                "config": config,
                "architecture": architecture,
                "options": options.to_dict(),
                "trainer": f"pid {os.getpid()} on {socket.gethostname()}",
                "lease_s": self.timeout,
            }
        ).encode()
        reply = self.request("/init", body, timeout=max(self.timeout, SPAWN_TIMEOUT_S))
        self.session, self.device = reply["session"], reply.get("device", "cpu")
        return reply["reused"]

    def use_transport(self, transport: str, trainer_device: str) -> None:
        """Pushes go over HTTP, or (vllm_weight_transport=gloo|nccl|auto) through a process group with the server
        (`lmrl.rollout.engines.vllm.group`), formed now by the pushing process."""
        from lmrl.rollout.engines.vllm.group import form_group

        self.group = form_group([self], transport, trainer_device, self.timeout, self.pushes)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], tied: bool) -> None:
        """Push in parts of about PUSH_PART_BYTES; the server loads them all in one in-place reload when the last
        part arrives. Several processes: rank 0 pushes, every rank walks the weights (a sharded one is gathered by
        all) and waits until the push is in."""
        push_to_all([self], weights, tied, self.pushes, self.group)

    def encode_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> list:
        """The weights as the parts of one push, a snapshot (the model may change afterwards): async_steps."""
        return snapshot(weights, self.group)

    def push_encoded(self, parts: list, tied: bool) -> None:
        """`encode_weights`' parts, loaded by the server when the last arrives."""
        push_snapshot([self], parts, tied, self.group)

    def push_part(self, body: bytes, part: int, parts: int, tied: bool, push: str) -> None:
        self.request("/weights", body, query=f"?part={part}&parts={parts}&tied={int(tied)}&push={push}")

    def sample(self, prompt_ids, n, temperature, max_tokens, stop_token_ids, seeds):
        reply = self.request(
            "/sample",
            json.dumps(
                {
                    "prompt_ids": prompt_ids,
                    "n": n,
                    "temperature": temperature,
                    "max_tokens": max_tokens,
                    "stop_token_ids": list(stop_token_ids),
                    "seeds": list(seeds),
                }
            ).encode(),
        )
        return reply["tokens"], reply["logps"], reply["stopped"]

    def close(self) -> None:
        """The session ends (the server is free for another trainer); a server this run spawned is stopped."""
        if self.group is not None:
            self.group.close()
            self.group = None
        if self.session is not None and self.pushes:
            try:
                self.request("/release", b"{}", timeout=CONNECT_TIMEOUT_S)
            except (VLLMServerError, ConfigError):  # gone already, or the session lapsed: nothing to free
                pass
            self.session = None
        if self.process is not None:
            stop_process(self.process)


def encode(part: list[tuple[str, torch.Tensor]]) -> bytes:
    """One part of a push as a safetensors body (CPU copies)."""
    from safetensors.torch import save

    return save({name: t.detach().to("cpu").contiguous() for name, t in part})


def encode_push(weights: Iterable[tuple[str, torch.Tensor]]) -> list[bytes]:
    """Every part of one push, serialized now (async_steps: a snapshot while the learner trains on)."""
    return [encode(part) for part in split_bytes(weights, PUSH_PART_BYTES)]


def snapshot(weights: Iterable[tuple[str, torch.Tensor]], group=None) -> list:
    """The parts of one push of `weights`, serialized now (async_steps: the learner trains on meanwhile): safetensors
    bodies, or with a `group` (vllm_weight_transport=gloo|nccl) its packed buffers."""
    return group.snapshot(parts_of(weights)) if group else encode_push(weights)


def push_snapshot(remotes: list[RemoteVLLM], parts: list, tied: bool, group=None) -> None:
    """`snapshot`'s parts to every server of `remotes` (each loads the push when its last part arrives)."""
    if group:
        return group.push_snapshot(parts, tied)
    push = uuid.uuid4().hex[:12]
    for i, body in enumerate(parts):
        each(remotes, lambda remote: remote.push_part(body, i, len(parts), tied, push))  # noqa: B023


def push_to_all(
    remotes: list[RemoteVLLM], weights: Iterable[tuple[str, torch.Tensor]], tied: bool, pushes: bool, group=None
) -> None:
    """One push of `weights` to every server of `remotes`: each part serialized once (one part in memory at a time)
    and sent to the servers concurrently; each loads the whole push in place when its last part arrives. With a
    `group` (vllm_weight_transport=gloo|nccl) each part is announced over HTTP and broadcast over the group.
    pushes=False (ranks > 0 of several processes): walk the weights (FSDP: every rank takes part in gathering each
    sharded parameter) and wait at the barrier for rank 0's push."""
    error = None
    if not pushes:
        for _ in weights:
            pass
    else:
        try:
            if group is not None:
                group.push(parts_of(weights), tied)
            else:
                parts, push = list(split_bytes(weights, PUSH_PART_BYTES)), uuid.uuid4().hex[:12]
                for i, part in enumerate(parts):
                    body = encode(part)
                    each(remotes, lambda remote: remote.push_part(body, i, len(parts), tied, push))  # noqa: B023
        except Exception as exc:  # noqa: BLE001 - every rank learns of it below (none waits forever)
            error = exc
    # several processes: also the barrier that keeps every rank from sampling before the push is in
    if runtime.world() > 1 and runtime.any_rank(error is not None) and error is None:
        raise VLLMServerError(
            f"rank 0's weight push to the vLLM server(s) {', '.join(r.url for r in remotes)} failed "
            "(its error is in rank 0's output); restart the server and continue the run with "
            "resume=true."
        )
    if error is not None:
        raise error


def each(remotes: list[RemoteVLLM], call) -> list:
    """call(remote) for every server, concurrently when there are several (HTTP requests: the servers do the work);
    the results in the servers' order, or the first server's error in that order (it names its server)."""
    if len(remotes) == 1:
        return [call(remotes[0])]
    with ThreadPoolExecutor(len(remotes)) as pool:
        futures = [pool.submit(call, remote) for remote in remotes]
    errors = [f.exception() for f in futures if f.exception() is not None]
    if errors:
        raise errors[0]
    return [f.result() for f in futures]


def parts_of(weights: Iterable[tuple[str, torch.Tensor]]):
    """The parts of one push (`split_bytes` at `PUSH_PART_BYTES`, read at the call)."""
    return split_bytes(weights, PUSH_PART_BYTES)


def split_bytes(weights: Iterable[tuple[str, torch.Tensor]], limit: int):
    """Consecutive lists of (name, tensor) of at most `limit` bytes each (a larger tensor alone)."""
    part, size = [], 0
    for name, tensor in weights:
        nbytes = tensor.numel() * tensor.element_size()
        if part and size + nbytes > limit:
            yield part
            part, size = [], 0
        part.append((name, tensor))
        size += nbytes
    if part:
        yield part


def stop_process(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()


def connect(server: str, timeout: float) -> RemoteVLLM:
    """A running server at `server` (host:port), or a ConfigError that says how to start one."""
    remote = RemoteVLLM(parse_server(server), timeout)
    try:
        remote.request("/health", timeout=CONNECT_TIMEOUT_S)
    except VLLMServerError as exc:
        port = remote.url.rpartition(":")[2]
        raise ConfigError(
            f"engine=vllm: no vLLM server answers at {remote.url} ({getattr(exc.__cause__, 'reason', exc.__cause__)})"
            ". Start one in the environment "
            f"that has vLLM: lmrl vllm-serve port={port} (add host=0.0.0.0 to serve other machines); or set "
            "vllm_server=auto (lmrl starts it), or vllm_server=null (vLLM in this process)."
        ) from exc
    return remote


def spawn(timeout: float) -> RemoteVLLM:
    """`python -m lmrl vllm-serve` as a child of this process on a free local port, once it answers /health."""
    return spawn_all(1, timeout)[0]


def spawn_all(count: int, timeout: float) -> list[RemoteVLLM]:
    """`count` `lmrl vllm-serve` children on free local ports (vllm_server=auto, vllm_replicas=N), started together
    and each waited for on /health; if one does not start, all are stopped and the error names it. Each child ends
    with its `RemoteVLLM` (close, or when it is collected) and exits by itself when this process is gone."""
    remotes = [launch(timeout) for _ in range(count)]
    try:
        for i, remote in enumerate(remotes):
            wait_healthy(remote, "vllm_server=auto" if count == 1 else f"vllm_replicas={count}: replica {i + 1}")
    except BaseException:  # a replica that failed, or Ctrl-C while waiting: none is left running
        for remote in remotes:
            stop_process(remote.process)
        raise
    return remotes


def launch(timeout: float) -> RemoteVLLM:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "lmrl", "vllm-serve", "host=127.0.0.1", f"port={port}", f"parent_pid={os.getpid()}"]
    )
    return RemoteVLLM(f"http://127.0.0.1:{port}", timeout, process)


def wait_healthy(remote: RemoteVLLM, label: str) -> None:
    process, deadline = remote.process, time.monotonic() + SPAWN_TIMEOUT_S
    while True:
        try:
            remote.request("/health", timeout=CONNECT_TIMEOUT_S)
            return
        except VLLMServerError as exc:
            if process.poll() is not None or time.monotonic() > deadline:
                stop_process(process)
                raise ConfigError(
                    f"{label}: the vLLM server {remote.url} did not start (status {process.poll()}; "
                    f"{exc}). Its output is above; try `lmrl vllm-serve` by hand."
                ) from exc
            time.sleep(0.5)


def server_driver(server: str, timeout: float, model, options) -> RemoteVLLM:
    """The driver of `VLLMEngine` in server mode: connected (or spawned for 'auto') and started on `model`. Several
    processes share one server and one session: rank 0 connects, starts it and pushes; the others get its address
    and token."""
    from lmrl.rollout.engines.vllm.engine import model_spec

    if runtime.world() == 1:
        remote = spawn(timeout) if server == "auto" else connect(server, timeout)
        remote.start(*model_spec(model), options)
        return remote
    remote, error = None, None
    if runtime.rank() == 0:
        try:
            remote = spawn(timeout) if server == "auto" else connect(server, timeout)
            remote.start(*model_spec(model), options)
        except ConfigError as exc:  # the other ranks raise it too instead of waiting for rank 0 forever
            error = str(exc)
    url, session, error = runtime.broadcast_object(
        (remote.url, remote.session, None) if remote and not error else (None, None, error)
    )
    if error:
        raise ConfigError(error)
    return remote if runtime.rank() == 0 else RemoteVLLM(url, timeout, session=session, pushes=False)

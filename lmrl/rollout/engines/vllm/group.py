"""Weight pushes over a torch.distributed process group: ``vllm_weight_transport=gloo|nccl`` (server mode).

The HTTP path (`client.push_to_all`) sends each push as safetensors bodies; this one sends only a small JSON
announcement over HTTP and the tensors themselves through ``broadcast`` on a process group between the trainer and
the `lmrl vllm-serve` replicas (the shape of TRL's ``init_communicator`` + ``update_named_param``, verl's and
OpenRLHF's weight groups). Same names, same parts, same one in-place reload per push on the server (its
`Server.add_part`, shared with the HTTP path: MoE repack and tied-head re-pack included).

- **One group per trainer**: rank 0 is the trainer (rank 0 of its processes with nproc > 1), rank i the i-th
  replica; world size 1 + replicas. It forms at the session start: the trainer opens a `TCPStore` on a free port,
  tells every replica over HTTP (``POST /group``) to join at ``host:port`` (the address the trainer reaches the
  replica from), and joins itself. The group is made directly from the backend class (``ProcessGroupGloo`` /
  ``ProcessGroupNCCL``) on a prefixed store, never as torch.distributed's default group: torchrun's group in the
  trainer and vLLM's own in the server are left alone (what vLLM's ``StatelessProcessGroup`` is for).
- **A push** goes part by part (up to `PUSH_PART_BYTES` each, as over HTTP): the part's tensors are packed into one
  flat byte buffer (each tensor at a 16-byte aligned offset), ``POST /group_weights`` announces the names, dtypes,
  shapes and offsets to every replica, and one ``broadcast`` from rank 0 fills each replica's buffer, which it cuts
  back into tensors (views, no copy) and loads when the last part is in.
- **Backends**: ``gloo`` (CPU tensors: the CPU equivalent, tested on vLLM's CPU build) and ``nccl`` (CUDA tensors on
  each side's current GPU: the same code, not run here: no GPU).
- A group that does not form within `JOIN_TIMEOUT_S` (or the request timeout, if shorter) is a start-up
  `ConfigError` naming the replica(s) and the fix (``vllm_weight_transport=http``). A replica that refuses a push
  (another trainer's session, a push out of turn) answers its announcement at once with the error; the run stops.
"""

from __future__ import annotations

import datetime
import socket
import threading
import uuid
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

import torch

from lmrl.config_base import ConfigError

ALIGN = 16  # bytes: every tensor of a part starts at a multiple (a byte view can then be viewed as any dtype)
JOIN_TIMEOUT_S = 120.0
TRANSPORTS = ("http", "gloo", "nccl", "auto")


def layout(part: list[tuple[str, torch.Tensor]]) -> tuple[list[list], int]:
    """[[name, dtype, shape, offset], ...] of a part's tensors in one flat buffer, and the buffer's bytes."""
    entries, offset = [], 0
    for name, tensor in part:
        entries.append([name, str(tensor.dtype).removeprefix("torch."), list(tensor.shape), offset])
        offset += -(-tensor.numel() * tensor.element_size() // ALIGN) * ALIGN
    return entries, offset


def pack(part: list[tuple[str, torch.Tensor]], total: int, device) -> torch.Tensor:
    """The part's tensors, copied into one uint8 buffer on `device` at `layout`'s offsets."""
    buffer = torch.empty(total, dtype=torch.uint8, device=device)
    offset = 0
    for _, tensor in part:
        data = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
        buffer[offset : offset + data.numel()].copy_(data)
        offset += -(-data.numel() // ALIGN) * ALIGN
    return buffer


def unpack(buffer: torch.Tensor, entries: list[list]) -> dict[str, torch.Tensor]:
    """`pack`'s buffer cut back into named tensors (views of it)."""
    out = {}
    for name, dtype, shape, offset in entries:
        dtype = getattr(torch, dtype)
        nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        out[name] = buffer[offset : offset + nbytes].view(dtype).view(shape)
    return out


def new_group(backend: str, store, rank: int, size: int, timeout_s: float):
    """A process group of `size` ranks on `store` that is not torch.distributed's default group (the trainer's
    torchrun group and vLLM's own stay untouched). Blocks until every rank has joined, or raises after timeout_s."""
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, size, timeout)
    options = dist.ProcessGroupNCCL.Options()  # nccl: untested here (no GPU)
    options._timeout = timeout
    group = dist.ProcessGroupNCCL(store, rank, size, options)
    # NCCL makes its communicator at the first collective: one small one now, so a group that cannot form fails here
    group.broadcast([torch.zeros(1, device=f"cuda:{torch.cuda.current_device()}")], root_options(0)).wait()
    return group


def root_options(root: int):
    import torch.distributed as dist

    options = dist.BroadcastOptions()
    options.rootRank = root
    return options


def device_of(backend: str) -> torch.device:
    return torch.device("cpu") if backend == "gloo" else torch.device("cuda", torch.cuda.current_device())


def reachable_address(url: str) -> str:
    """This machine's address as the server at `url` sees it (the interface a connection to it leaves from)."""
    host, _, port = url.split("://", 1)[-1].rpartition(":")
    with socket.create_connection((host.strip("[]"), int(port)), timeout=5) as sock:
        return sock.getsockname()[0]


def resolve_transport(transport: str, trainer_device: str, server_devices: list[str], servers: str) -> str:
    """`vllm_weight_transport` as used: auto is nccl when the trainer and every server are on CUDA, else http;
    nccl anywhere else is a start-up error."""
    on_cuda = trainer_device == "cuda" and all(d == "cuda" for d in server_devices)
    if transport == "auto":
        return "nccl" if on_cuda else "http"
    if transport == "nccl" and not on_cuda:
        raise ConfigError(
            f"vllm_weight_transport=nccl needs CUDA on both sides, but the trainer is on {trainer_device} and the "
            f"vLLM server(s) {servers} on {', '.join(server_devices)}. Fix: vllm_weight_transport=gloo (CPU "
            "tensors over a process group) or http."
        )
    return transport


class WeightGroup:
    """The trainer's side: rank 0 of a group with every replica of `remotes` (`RemoteVLLM`s with a session)."""

    def __init__(self, remotes: list, backend: str, timeout: float):
        from torch.distributed import PrefixStore, TCPStore

        self.remotes, self.backend, self.timeout = remotes, backend, timeout
        self.device = device_of(backend)
        join_s = min(timeout, JOIN_TIMEOUT_S)
        host = reachable_address(remotes[0].url)
        store = TCPStore(
            "0.0.0.0", 0, len(remotes) + 1, True, timeout=datetime.timedelta(seconds=join_s), wait_for_workers=False
        )
        prefix = f"lmrl-weights-{uuid.uuid4().hex[:12]}"
        self.address = f"{host}:{store.port}"
        body = {"host": host, "port": store.port, "world_size": len(remotes) + 1, "backend": backend}
        body.update(prefix=prefix, timeout_s=timeout, join_s=join_s)
        formed: dict = {}

        def form() -> None:  # rank 0 joins in a thread of its own: each replica's /group returns once all joined
            try:
                formed["group"] = new_group(backend, PrefixStore(prefix, store), 0, len(remotes) + 1, join_s)
            except Exception as exc:  # noqa: BLE001 - reported below, with the replicas' own answers
                formed["error"] = exc

        thread = threading.Thread(target=form, daemon=True, name="lmrl-weight-group")
        thread.start()
        with ThreadPoolExecutor(len(remotes)) as pool:
            joins = [
                pool.submit(r.request_json, "/group", {**body, "rank": i + 1}, join_s + 30)
                for i, r in enumerate(remotes)
            ]
            failed = [(r, f.exception()) for r, f in zip(remotes, joins)]
        named = [f"{r.url} ({e})" for r, e in failed if e is not None]
        if not named:  # every replica joined: so has this rank (or it is about to)
            thread.join(join_s + 30)
        if named or "group" not in formed:
            error = formed.get("error")
            raise ConfigError(
                f"vllm_weight_transport={backend}: the weight group with the vLLM server(s) "
                f"{'; '.join(named) or ', '.join(r.url for r in remotes)} did not form within {join_s:.0f} s"
                + (f" ({type(error).__name__}: {str(error).splitlines()[0]})" if error else "")
                + f". The servers join this trainer at {self.address} (TCPStore): check that they can reach it. "
                "Fix: vllm_weight_transport=http (weights over the HTTP API, no process group)."
            )
        self.group = formed["group"]
        self.store = store

    def snapshot(self, parts: Iterable[list[tuple[str, torch.Tensor]]]) -> list[tuple[list[list], torch.Tensor]]:
        """Every part of one push (`client.parts_of`) packed now (async_steps: a copy; the learner trains on)."""
        return [(layout(part)[0], pack(part, layout(part)[1], self.device)) for part in parts]

    def push(self, parts: Iterable[list[tuple[str, torch.Tensor]]], tied: bool) -> None:
        """One push, part by part (`client.parts_of`; one part packed at a time)."""
        parts = list(parts)
        push = uuid.uuid4().hex[:12]
        for i, part in enumerate(parts):
            entries, total = layout(part)
            self.send(entries, pack(part, total, self.device), i, len(parts), tied, push)

    def push_snapshot(self, parts: list[tuple[list[list], torch.Tensor]], tied: bool) -> None:
        push = uuid.uuid4().hex[:12]
        for i, (entries, buffer) in enumerate(parts):
            self.send(entries, buffer, i, len(parts), tied, push)

    def send(self, entries: list[list], buffer: torch.Tensor, part: int, parts: int, tied: bool, push: str) -> None:
        """Announce the part to every replica (HTTP, concurrently) and broadcast its buffer. A replica that refuses
        answers at once: its error is raised (the broadcast it left is abandoned; the run stops)."""
        body = {"entries": entries, "nbytes": buffer.numel(), "part": part, "parts": parts, "tied": tied}
        body["push"] = push
        with ThreadPoolExecutor(len(self.remotes)) as pool:
            replies = [pool.submit(r.request_json, "/group_weights", body) for r in self.remotes]
            work = self.group.broadcast([buffer], root_options(0))
            for reply in replies:
                reply.result()  # raises the first replica's error (VLLMServerError naming it)
            work.wait()

    def close(self) -> None:
        self.group = self.store = None


# -- the server's side ---------------------------------------------------------------------------------------------


def join(request: dict):
    """A replica joins the trainer's group (blocks until every rank has joined; ConfigError after join_s)."""
    from torch.distributed import PrefixStore, TCPStore

    backend = request["backend"]
    if backend == "nccl" and not torch.cuda.is_available():
        raise ConfigError(
            "vllm_weight_transport=nccl: this vLLM server has no GPU. Fix: vllm_weight_transport=gloo or http."
        )
    join_s = float(request["join_s"])
    try:
        store = TCPStore(
            request["host"], int(request["port"]), int(request["world_size"]), False,
            timeout=datetime.timedelta(seconds=join_s),
        )  # fmt: skip
        group = new_group(
            backend, PrefixStore(request["prefix"], store), int(request["rank"]), int(request["world_size"]), join_s
        )
    except Exception as exc:  # noqa: BLE001 - the trainer reports it as a start-up error
        raise ConfigError(
            f"vllm_weight_transport={backend}: this server could not join the trainer's weight group at "
            f"{request['host']}:{request['port']} ({type(exc).__name__}: {exc}). Fix: vllm_weight_transport=http."
        ) from exc
    return {"group": group, "store": store, "rank": int(request["rank"]), "device": device_of(backend)}


def receive(group: dict, request: dict) -> dict[str, torch.Tensor]:
    """One announced part: its buffer filled by the trainer's broadcast, cut into the named tensors."""
    buffer = torch.empty(int(request["nbytes"]), dtype=torch.uint8, device=group["device"])
    group["group"].broadcast([buffer], root_options(0)).wait()
    return unpack(buffer, request["entries"])


def form_group(remotes: list, transport: str, trainer_device: str, timeout: float, pushes: bool):
    """The `WeightGroup` of `vllm_weight_transport` with `remotes` (None for http), formed by the pushing process
    (rank 0); with several trainer processes every rank raises rank 0's start-up error (none waits forever)."""
    from lmrl.parallel import runtime

    group, error = None, None
    if pushes:
        try:
            servers = ", ".join(r.url for r in remotes)
            backend = resolve_transport(transport, trainer_device, [r.device for r in remotes], servers)
            group = None if backend == "http" else WeightGroup(remotes, backend, timeout)
        except ConfigError as exc:
            error = str(exc)
    if runtime.world() > 1:
        error = runtime.broadcast_object(error)
    if error:
        raise ConfigError(error)
    return group

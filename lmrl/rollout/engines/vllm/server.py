"""`lmrl vllm-serve`: vLLM in a process of its own (server mode), sampling for a trainer elsewhere, with the
trainer's weights pushed to it after every optimizer step. The trainer talks to it with `RemoteVLLM`
(`lmrl.rollout.engines.vllm.client`, which needs no vLLM), through `engine=vllm vllm_server=host:port`.

    lmrl vllm-serve port=8000                       # in the environment that has vLLM (on GPUs: its own GPUs)
    lmrl rl engine=vllm vllm_server=127.0.0.1:8000  # the trainer, possibly in another environment

The server runs the same `VLLMDriver` as colocated mode, so both sample identically (same seeds, same log-probs).
It starts empty: the trainer's /init sends the model's config (no weights) and the engine options, and vLLM starts
on it with dummy weights; a trainer that comes back with the same model reuses the running engine, another model
replaces it. Shape follows TRL's `vllm-serve` (HTTP for generation, a separate weight channel):

    GET  /health   {"ok": true, "model": architecture or null, "owner": the owning trainer or null}
    POST /init     JSON {config, architecture, options, trainer, lease_s} -> starts (or reuses) the engine and
                   returns the trainer's session token, or 409 when another trainer owns the server
    POST /weights  safetensors bytes (checkpoint names); ?part=i&parts=N&push=ID: a push in N parts, loaded when the
                   last arrives (a part out of turn drops the push: 409); tied=1 re-packs a tied LM head
    POST /sample   JSON {prompt_ids, n, temperature, max_tokens, stop_token_ids, seeds} -> {tokens, logps, stopped}
    POST /release  the owner is done: the server is free for another trainer
    POST /group    vllm_weight_transport=gloo|nccl: join the owner's weight group {host, port, rank, world_size,
                   backend, prefix, join_s} (`lmrl.rollout.engines.vllm.group`)
    POST /group_weights  JSON {push, part, parts, tied, entries, nbytes}: a part's names, dtypes, shapes and offsets;
                   its bytes come through the group's broadcast; loaded as a /weights part is (`Server.add_part`)

One trainer at a time: every request after /init carries the owner's token (header X-LMRL-Session); another
trainer's /init is refused with a message naming the server and the fix, until the owner releases it (at the end of
its run) or sends nothing for longer than its lease (its `vllm_server_timeout`: a crashed run frees the server).

Weights come as safetensors bodies over HTTP (the default), or announced over HTTP and broadcast over a process group
with the trainer (gloo on CPU, NCCL on GPUs, as TRL/OpenRLHF do); both end in the same in-place reload. docs/vllm.md.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import threading
import time
import traceback
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from urllib.parse import parse_qs, urlparse

from lmrl.config_base import ConfigError, Section, check_at_least, field
from lmrl.rollout.engines.vllm.wire import SESSION_HEADER


@dataclasses.dataclass
class VLLMServeConfig(Section):
    """Keys of `lmrl vllm-serve`."""

    title = "vLLM server"
    host: str = field("127.0.0.1", "address to listen on (0.0.0.0: every interface; the API has no authentication)")
    port: int = field(8000, "port to listen on")
    parent_pid: int = field(0, "exit when this process ends (set by vllm_server=auto; 0: run until stopped)")

    def __post_init__(self) -> None:
        check_at_least(self, ("port",), 0)
        super().__post_init__()


class SessionError(Exception):
    """A request the server refuses to keep one trainer's weights and batches apart (HTTP 409): a second trainer,
    or parts of two weight pushes mixed."""


class Server:
    """The engine behind the HTTP handler: one `VLLMDriver` at a time, requests served one by one (a lock), for one
    trainer at a time (the owner of the session token that /init handed out)."""

    def __init__(self, address: str = "this server"):
        self.driver, self.spec, self.address = None, None, address
        self.owner: dict | None = None  # {session, trainer, since, last, lease_s}: the trainer this server samples for
        self.push: dict | None = None  # the weight push being received: {id, parts, chunks}
        self.group: dict | None = None  # the owner's weight group (vllm_weight_transport=gloo|nccl)
        self.lock = threading.Lock()

    # -- the owner ---------------------------------------------------------------------------------------------

    def claim(self, session: str | None, trainer: str, lease_s: float) -> str:
        """The session of the trainer that calls /init: its own again, or a new one when the server is free (never
        claimed, released, or its owner silent for longer than its lease). Another trainer's: SessionError."""
        now = time.time()
        if self.owner is not None and session != self.owner["session"] and not self.lapsed(now):
            raise SessionError(self.refusal(now))
        if self.owner is None or session != self.owner["session"]:
            self.owner = {
                "session": session or uuid.uuid4().hex,
                "trainer": trainer,
                "since": now,
                "last": now,
                "lease_s": lease_s,
            }
            self.push, self.group = None, None
        self.owner.update(last=now, trainer=trainer, lease_s=lease_s)
        return self.owner["session"]

    def check(self, session: str | None) -> None:
        """A /weights, /sample or /release request comes from the owner (renewing its lease), or is refused."""
        if self.owner is None or session != self.owner["session"]:
            raise SessionError(
                self.refusal(time.time())
                if self.owner is not None
                else f"the vLLM server at {self.address} has no trainer session (restarted, or released by "
                "the run that used it): a trainer's /init takes one. Restart the run (resume=true)."
            )
        self.owner["last"] = time.time()

    def lapsed(self, now: float) -> bool:
        return now - self.owner["last"] > self.owner["lease_s"]

    def refusal(self, now: float) -> str:
        owner = self.owner
        return (
            f"the vLLM server at {self.address} samples for another trainer ({owner['trainer']}, session taken "
            f"{now - owner['since']:.0f} s ago, last request {now - owner['last']:.0f} s ago): two trainers on "
            "one server would sample each other's weights. Fix: give this run a server of its own (lmrl "
            "vllm-serve port=<another port>, or vllm_server=auto), or wait until the other run ends (its "
            f"session ends with it, or {owner['lease_s']:.0f} s after its last request), or restart the server."
        )

    def release(self, session: str | None) -> dict:
        self.check(session)
        self.owner, self.push, self.group = None, None, None
        return {"released": True}

    # -- the engine --------------------------------------------------------------------------------------------

    def init(self, request: dict, session: str | None = None) -> dict:
        """The trainer's session (taken or renewed) and its engine, started or reused."""
        session = session or request.get("session")
        new = self.owner is None or session != self.owner["session"]
        session = self.claim(session, request.get("trainer", "a trainer"), float(request.get("lease_s", 600.0)))
        try:
            return {"reused": self.start_engine(request), "session": session, "device": device()}
        except BaseException:  # e.g. an architecture this vLLM cannot run: the failed trainer holds no session
            if new:
                self.owner = None
            raise

    def start_engine(self, request: dict) -> bool:
        """vLLM on the request's model (no weights); True when the running engine is that model's already."""
        import torch

        from lmrl.rollout.engines.factory import check_architecture, cpu_head_sizes, supported_architectures
        from lmrl.rollout.engines.vllm.driver import VLLMDriver, VLLMOptions

        spec = (request["config"], request["architecture"], request["options"])
        if spec == self.spec:
            return True
        device = "cuda" if torch.cuda.is_available() else "cpu"
        config = SimpleNamespace(**{**request["config"], "architectures": [request["architecture"]]})
        check_architecture(config, supported_architectures(), device, cpu_head_sizes())
        if self.driver is not None:  # another model: replace the engine
            self.driver, self.spec = None, None
            gc.collect()
        self.driver = VLLMDriver(
            request["config"], request["architecture"], VLLMOptions.from_dict(request["options"]), device
        )
        self.spec, self.push = spec, None
        return False

    def weights(
        self, body: bytes, part: int, parts: int, tied: bool, push: str = "", session: str | None = None
    ) -> dict:
        """Part `part` of `parts` of push `push` as a safetensors body; the last one loads them all in one in-place
        reload. A part that does not continue the push in progress (another push's, out of order) drops both:
        nothing mixed is loaded."""
        from safetensors.torch import load

        self.turn(part, parts, push, session)
        return self.add_part(load(body), part, parts, tied)

    def join_group(self, request: dict, session: str | None = None) -> dict:
        """vllm_weight_transport=gloo|nccl: join the owner's weight group (`lmrl.rollout.engines.vllm.group`); later pushes
        come as `group_weights` announcements plus a broadcast."""
        from lmrl.rollout.engines.vllm.group import join

        self.check(session)
        self._require_driver()
        self.group = None  # a trainer that joins again (its start) replaces its old group
        self.group = join(request)
        return {"joined": True, "rank": self.group["rank"]}

    def group_weights(self, request: dict, session: str | None = None) -> dict:
        """One part announced over HTTP, its bytes received through the group's broadcast; then as `weights`."""
        from lmrl.rollout.engines.vllm.group import receive

        part, parts = int(request["part"]), int(request["parts"])
        self.turn(part, parts, request["push"], session)
        if self.group is None:
            self.push = None
            raise SessionError(
                "a weight push over a process group, but this server has not joined the trainer's group "
                "(restarted, or the session was taken anew). Restart the run (resume=true)."
            )
        return self.add_part(receive(self.group, request), part, parts, bool(request["tied"]))

    def turn(self, part: int, parts: int, push: str, session: str | None) -> None:
        """A part from the owner that continues the push in progress (part 0 starts one), or SessionError."""
        self.check(session)
        self._require_driver()
        if part == 0:
            self.push = {"id": push, "parts": parts, "chunks": []}
        elif self.push is None or (self.push["id"], self.push["parts"], len(self.push["chunks"])) != (
            push,
            parts,
            part,
        ):
            now = (
                f"push {self.push['id']!r} had {len(self.push['chunks'])} of {self.push['parts']} parts"
                if self.push
                else "no push was in progress"
            )
            self.push = None
            raise SessionError(
                f"weight push {push!r}: part {part + 1} of {parts} arrived out of turn ({now}); "
                "parts of two pushes must not mix, so neither is loaded. Every push of one trainer "
                "goes part by part from one process; push again (the next sync sends every part)."
            )

    def add_part(self, chunk: dict, part: int, parts: int, tied: bool) -> dict:
        """The part's tensors (by checkpoint name) kept; the last part loads the whole push in one in-place reload
        (`VLLMDriver.load_weights`: tied-head and MoE re-packs), whichever transport brought it."""
        self.push["chunks"].append(chunk)
        if part < parts - 1:
            return {"parts": len(self.push["chunks"])}
        weights = [item for chunk in self.push["chunks"] for item in chunk.items()]
        self.push = None
        self.driver.load_weights(weights, tied)
        return {"tensors": len(weights)}

    def sample(self, request: dict, session: str | None = None) -> dict:
        self.check(session)
        self._require_driver()
        if self.push is not None:
            raise SessionError(
                f"sampling while a weight push is incomplete ({len(self.push['chunks'])} of "
                f"{self.push['parts']} parts of push {self.push['id']!r}) would mix old and new "
                "weights; a trainer samples after its push has finished."
            )
        tokens, logps, stopped = self.driver.sample(
            request["prompt_ids"],
            request["n"],
            request["temperature"],
            request["max_tokens"],
            request["stop_token_ids"],
            request["seeds"],
        )
        return {"tokens": tokens, "logps": logps, "stopped": stopped}

    def _require_driver(self) -> None:
        if self.driver is None:
            raise ConfigError("the vLLM server has no model yet: the trainer's /init sends it first")


def device() -> str:
    """Where this server's vLLM runs (the trainer's vllm_weight_transport=auto picks nccl for cuda)."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def handler(server: Server):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # quiet: one line per request would drown the server's output
            pass

        def reply(self, status: int, payload: dict) -> None:
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if urlparse(self.path).path != "/health":
                return self.reply(404, {"error": f"unknown path {self.path}"})
            owner = server.owner["trainer"] if server.owner and not server.lapsed(time.time()) else None
            self.reply(
                200, {"ok": True, "model": server.spec[1] if server.spec else None, "owner": owner, "pid": os.getpid()}
            )

        def do_POST(self) -> None:  # noqa: N802
            url = urlparse(self.path)
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            session = self.headers.get(SESSION_HEADER)
            try:
                with server.lock:
                    if url.path == "/init":
                        result = server.init(json.loads(body), session)
                    elif url.path == "/weights":
                        query = {k: v[0] for k, v in parse_qs(url.query).items()}
                        result = server.weights(
                            body,
                            int(query.get("part", 0)),
                            int(query.get("parts", 1)),
                            bool(int(query.get("tied", 0))),
                            query.get("push", ""),
                            session,
                        )
                    elif url.path == "/group":
                        result = server.join_group(json.loads(body), session)
                    elif url.path == "/group_weights":
                        result = server.group_weights(json.loads(body), session)
                    elif url.path == "/sample":
                        result = server.sample(json.loads(body), session)
                    elif url.path == "/release":
                        result = server.release(session)
                    else:
                        return self.reply(404, {"error": f"unknown path {url.path}"})
            except SessionError as exc:  # another trainer's request, or mixed pushes: refused, nothing changed
                return self.reply(409, {"error": str(exc)})
            except ConfigError as exc:  # bad input from the trainer: it raises it as a start-up error
                return self.reply(400, {"error": str(exc)})
            except Exception as exc:  # noqa: BLE001 - reported to the trainer, the server keeps running
                traceback.print_exc()
                return self.reply(500, {"error": f"{type(exc).__name__}: {exc}"})
            self.reply(200, result)

    return Handler


def watch_parent(pid: int, httpd: ThreadingHTTPServer) -> None:
    """Stop serving once process `pid` (the trainer that started this server) is gone."""
    while True:
        time.sleep(1.0)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            httpd.shutdown()
            return


def run(config: VLLMServeConfig) -> None:
    """Serve until interrupted (or until `parent_pid` ends)."""
    from lmrl.rollout.engines.factory import require_vllm

    require_vllm()
    server = Server()
    httpd = ThreadingHTTPServer((config.host, config.port), handler(server))
    if config.parent_pid:
        threading.Thread(target=watch_parent, args=(config.parent_pid, httpd), daemon=True).start()
    host, port = httpd.server_address[:2]
    server.address = f"{host}:{port}"
    print(f"lmrl vllm-serve: listening on {host}:{port} (trainer: engine=vllm vllm_server={host}:{port})", flush=True)
    try:
        httpd.serve_forever()
    finally:
        httpd.server_close()

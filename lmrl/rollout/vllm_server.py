"""`lmrl vllm-serve`: vLLM in a process of its own (server mode), sampling for a trainer elsewhere, with the
trainer's weights pushed to it after every optimizer step. The trainer talks to it with `RemoteVLLM`
(`lmrl.rollout.vllm_client`, which needs no vLLM), through `engine=vllm vllm_server=host:port`.

    lmrl vllm-serve port=8000                       # in the environment that has vLLM (on GPUs: its own GPUs)
    lmrl rl engine=vllm vllm_server=127.0.0.1:8000  # the trainer, possibly in another environment

The server runs the same `VLLMDriver` as colocated mode, so both sample identically (same seeds, same log-probs).
It starts empty: the trainer's /init sends the model's config (no weights) and the engine options, and vLLM starts
on it with dummy weights; a trainer that comes back with the same model reuses the running engine, another model
replaces it. Shape follows TRL's `vllm-serve` (HTTP for generation, a separate weight channel):

    GET  /health   {"ok": true, "model": architecture or null}
    POST /init     JSON {config, architecture, options}       -> starts (or reuses) the engine
    POST /weights  safetensors bytes (checkpoint names); ?part=i&parts=N: a push in N parts, loaded when the last
                   arrives; tied=1 re-packs a tied LM head
    POST /sample   JSON {prompt_ids, n, temperature, max_tokens, stop_token_ids, seeds} -> {tokens, logps, stopped}

The weight channel here is the safetensors body over HTTP (CPU: no NCCL; ~tens of ms per 10M parameters on one
host). On GPUs TRL/OpenRLHF broadcast over NCCL from the trainer to the server's workers instead; see docs/vllm.md.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import os
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from urllib.parse import parse_qs, urlparse

from lmrl.config_base import ConfigError, Section, check_at_least, field


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


class Server:
    """The engine behind the HTTP handler: one `VLLMDriver` at a time, requests served one by one (a lock)."""

    def __init__(self):
        self.driver, self.spec = None, None
        self.pending: list[dict] = []  # the parts of a weight push received so far
        self.lock = threading.Lock()

    def init(self, request: dict) -> dict:
        import torch

        from lmrl.rollout.engines import check_architecture, cpu_head_sizes, supported_architectures
        from lmrl.rollout.vllm_driver import VLLMDriver, VLLMOptions

        spec = (request["config"], request["architecture"], request["options"])
        if spec == self.spec:
            return {"reused": True}
        device = "cuda" if torch.cuda.is_available() else "cpu"
        config = SimpleNamespace(**{**request["config"], "architectures": [request["architecture"]]})
        check_architecture(config, supported_architectures(), device, cpu_head_sizes())
        if self.driver is not None:  # another model: replace the engine
            self.driver, self.spec = None, None
            gc.collect()
        self.driver = VLLMDriver(request["config"], request["architecture"], VLLMOptions.from_dict(request["options"]),
                                 device)
        self.spec = spec
        return {"reused": False}

    def weights(self, body: bytes, part: int, parts: int, tied: bool) -> dict:
        """Part `part` of `parts` of a push; the last one loads them all in one in-place reload."""
        from safetensors.torch import load

        self._require_driver()
        if part == 0:
            self.pending = []
        elif len(self.pending) != part:
            raise ConfigError(f"weight push: part {part} of {parts} arrived after {len(self.pending)} parts")
        self.pending.append(load(body))
        if part < parts - 1:
            return {"parts": len(self.pending)}
        weights = [item for chunk in self.pending for item in chunk.items()]
        self.pending = []
        self.driver.load_weights(weights, tied)
        return {"tensors": len(weights)}

    def sample(self, request: dict) -> dict:
        self._require_driver()
        tokens, logps, stopped = self.driver.sample(
            request["prompt_ids"], request["n"], request["temperature"], request["max_tokens"],
            request["stop_token_ids"], request["seeds"])
        return {"tokens": tokens, "logps": logps, "stopped": stopped}

    def _require_driver(self) -> None:
        if self.driver is None:
            raise ConfigError("the vLLM server has no model yet: the trainer's /init sends it first")


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
            self.reply(200, {"ok": True, "model": server.spec[1] if server.spec else None, "pid": os.getpid()})

        def do_POST(self) -> None:  # noqa: N802
            url = urlparse(self.path)
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            try:
                with server.lock:
                    if url.path == "/init":
                        result = server.init(json.loads(body))
                    elif url.path == "/weights":
                        query = {k: int(v[0]) for k, v in parse_qs(url.query).items()}
                        result = server.weights(body, query.get("part", 0), query.get("parts", 1),
                                                bool(query.get("tied", 0)))
                    elif url.path == "/sample":
                        result = server.sample(json.loads(body))
                    else:
                        return self.reply(404, {"error": f"unknown path {url.path}"})
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
    from lmrl.rollout.engines import require_vllm

    require_vllm()
    httpd = ThreadingHTTPServer((config.host, config.port), handler(Server()))
    if config.parent_pid:
        threading.Thread(target=watch_parent, args=(config.parent_pid, httpd), daemon=True).start()
    host, port = httpd.server_address[:2]
    print(f"lmrl vllm-serve: listening on {host}:{port} (trainer: engine=vllm vllm_server={host}:{port})", flush=True)
    try:
        httpd.serve_forever()
    finally:
        httpd.server_close()

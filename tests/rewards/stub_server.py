"""A local JSON stub server for the remote-reward tests: 127.0.0.1 only, an ephemeral port, one thread."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Reply = tuple[int, Any]  # (HTTP status, JSON body or raw bytes); a handler may also sleep first


class StubServer:
    """`with StubServer(handler) as server:` serves POSTs at `server.url(path)`; `handler(path, payload, i)`
    returns (status, body) for the i-th request (0-based); `server.requests` records (path, payload)."""

    def __init__(self, handler: Callable[[str, Any, int], Reply]) -> None:
        self.handler, self.requests = handler, []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.requests.append((self.path, payload, dict(self.headers)))
                status, body = stub.handler(self.path, payload, len(stub.requests) - 1)
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.block_on_close = False
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)

    def url(self, path: str = "/score") -> str:
        return f"http://127.0.0.1:{self.server.server_port}{path}"

    def __enter__(self) -> StubServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


def slow(seconds: float, reply: Reply) -> Reply:
    time.sleep(seconds)
    return reply

"""``lmrl dashboard RUNS_DIR``: a local web server (127.0.0.1 only) that shows every run under a directory, live.

    lmrl dashboard runs                  # http://127.0.0.1:8765, Ctrl-C stops it
    lmrl dashboard runs port=9000

The page polls the server every ``poll_ms``: a table of every run (newest values of the key metrics), and for the
run picked in it, in the report's order: the interactive plots (the same plotly figures as `lmrl report`, the
curves first), reward versus KL, the internal counters (collapsed), the newest training and held-out samples apart,
the checkpoints, and for a swarm simulation its nodes (rounds, own rewards, peers' payloads accepted and rejected).
Like the report, it fits a 1400 px wide window.
Each run's state is shown (`run_state`): running, finished (``final/`` exists) or stopped (no ``final/`` and
metrics.jsonl not written for ``stale_s`` seconds: crashed, killed, or waiting very long between logs).
Zoom and hidden legend entries survive the polls (plotly's ``uirevision``); the plot controls (EMA smoothing, step or
time x-axis, log y-axis) are ``templates/plots.html``, shared with `lmrl report`.
metrics.jsonl files are read incrementally (only the bytes appended since the last poll); a corrupt line is
skipped and counted, a half-written last line waits for its newline. Standard library HTTP server, plotly.js
served from the installed plotly package: nothing is fetched from the network.
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from plotly.offline import get_plotlyjs

from lmrl.config import ConfigError, field
from lmrl.report import figures
from lmrl.report.runs import RunData, list_checkpoints, read_config, read_jsonl, read_metrics, read_nodes, swarm_table
from lmrl.report.samples import sample_tables
from lmrl.tracking import KEY_METRICS, console

HOST = "127.0.0.1"
PAGE = Path(__file__).parent / "templates" / "dashboard.html"
PLOTS_JS = Path(__file__).parent / "templates" / "plots.html"


@dataclasses.dataclass
class DashboardConfig:
    runs_dir: str = field("runs", "directory whose runs (every folder with a metrics.jsonl) are shown")
    port: int = field(8765, "port on 127.0.0.1 (0: any free port)")
    poll_ms: int = field(2000, "how often the page asks for new metrics, in milliseconds")
    samples: int = field(12, "newest samples of each kind (training, held-out) shown for the selected run")
    stale_s: float = field(120.0, "a run without final/ whose metrics.jsonl is older than this is shown as stopped")

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"'port' must be in 0..65535, got {self.port}.")
        if self.poll_ms < 100:
            raise ConfigError(f"'poll_ms' must be >= 100, got {self.poll_ms}.")


class LiveRun:
    """One run directory, its metrics.jsonl and samples.jsonl read on from where the last poll stopped."""

    def __init__(self, path: Path, name: str):
        self.path, self.name = path, name
        self.metrics: list[dict[str, Any]] = []
        self.samples: list[dict[str, Any]] = []
        self.skipped = 0
        self._offsets = {"metrics": 0, "samples": 0}
        self._lock = threading.Lock()

    def refresh(self) -> None:
        with self._lock:
            for kind in ("metrics", "samples"):
                path = self.path / f"{kind}.jsonl"
                size = path.stat().st_size if path.is_file() else 0
                if size < self._offsets[kind]:  # rewritten (overwrite=true, or a resume truncated it): start over
                    self._offsets[kind] = 0
                    setattr(self, kind, [])
                chunk = (read_metrics if kind == "metrics" else read_jsonl)(path, self._offsets[kind])
                getattr(self, kind).extend(chunk.records)
                self._offsets[kind] = chunk.offset
                self.skipped += chunk.skipped
            self.samples = self.samples[-500:]

    def data(self) -> RunData:
        return RunData(
            self.path,
            self.name,
            read_config(self.path),
            list(self.metrics),
            self.skipped,
            list(self.samples),
            [],
            list_checkpoints(self.path),
            read_nodes(self.path),
        )

    def summary(self, stale_s: float = 120.0) -> dict[str, Any]:
        last: dict[str, Any] = {}
        for r in self.metrics:
            last.update(r)
        config = read_config(self.path)
        return {
            "name": self.name,
            "state": run_state(self.path, time.time(), stale_s),
            "steps_logged": len(self.metrics),
            "step": last.get("step"),
            "max_steps": config.get("max_steps"),
            "skipped_lines": self.skipped,
            "swarm": (self.path / "nodes").is_dir(),
            "method": RunData(self.path, self.name, config, [], 0, [], [], [], {}).method,
            **{k: shown(last[k]) for k in KEY_METRICS if k in last},
        }


def run_state(path: Path, now: float, stale_s: float) -> str:
    """``finished`` (final/ exists), ``running`` (metrics.jsonl written in the last ``stale_s`` seconds) or
    ``stopped`` (neither: crashed, killed, or stalled). A swarm's nodes write their own metrics, so the newest of
    them counts too."""
    if (path / "final").is_dir():
        return "finished"
    files = [path / "metrics.jsonl", *path.glob("nodes/*/metrics.jsonl")]
    newest = max((f.stat().st_mtime for f in files if f.is_file()), default=0.0)
    return "running" if now - newest <= stale_s else "stopped"


class Runs:
    """The runs under a directory (rediscovered on every poll, so new runs appear)."""

    def __init__(self, root: Path):
        self.root = root
        self.runs: dict[str, LiveRun] = {}

    def discover(self) -> list[LiveRun]:
        found = []
        for metrics in sorted(self.root.glob("**/metrics.jsonl")):
            run_dir = metrics.parent
            rel = run_dir.relative_to(self.root)
            if "nodes" in rel.parts or len(rel.parts) > 3:  # a swarm's nodes are shown inside their swarm
                continue
            name = str(rel) if rel.parts else self.root.name
            if name not in self.runs:
                self.runs[name] = LiveRun(run_dir, name)
            found.append(self.runs[name])
        for run in found:
            run.refresh()
        return found


def run_payload(run: LiveRun, samples: int) -> dict[str, Any]:
    """Everything the page draws for one run: plotly figures as JSON (``main``: the curves, reward versus KL and a
    swarm's nodes, in this order; ``internal``: the collapsed counters), training and held-out samples, swarm nodes,
    checkpoints."""
    data = run.data()
    figs = figures.metric_figures([data])
    internal = [name for name in figs if figures.is_internal(name)]
    kl = figures.reward_vs_kl([data])
    if kl is not None:
        figs["reward vs KL"] = kl
    figs.update(figures.swarm_figures(data))
    tables = sample_tables(data.samples, samples)
    return {
        "name": run.name,
        "figures": {k: json.loads(f.to_json()) for k, f in figs.items()},
        "ids": figures.plot_ids(list(figs)),
        "main": [name for name in figs if name not in internal],
        "internal": internal,
        "samples": tables["training"]["rows"],
        "sample_cols": tables["training"]["cols"],
        "held_out_samples": tables["held_out"]["rows"],
        "held_out_cols": tables["held_out"]["cols"],
        "nodes": swarm_table(data.nodes),
        "checkpoints": data.checkpoints,
        "skipped_lines": run.skipped,
        "steps_logged": len(data.metrics),
    }


def make_handler(runs: Runs, config: DashboardConfig) -> type[BaseHTTPRequestHandler]:
    page = (
        PAGE.read_text(encoding="utf-8")
        .replace("{{POLL_MS}}", str(config.poll_ms))
        .replace("{{PLOTS_JS}}", PLOTS_JS.read_text(encoding="utf-8"))
    )
    plotly_js = get_plotlyjs().encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if not host_allowed(self.headers.get("Host"), self.server.server_address[1]):
                # DNS rebinding: a web page whose name resolves to 127.0.0.1 must not read the runs
                self._json({"error": "forbidden Host header; open http://127.0.0.1:PORT"}, status=403)
                return
            url = urlparse(self.path)
            if url.path == "/":
                self._send(page.encode(), "text/html; charset=utf-8")
            elif url.path == "/plotly.min.js":
                self._send(plotly_js, "application/javascript")
            elif url.path == "/api/runs":
                found = runs.discover()
                self._json({"root": str(runs.root), "runs": [r.summary(config.stale_s) for r in found]})
            elif url.path == "/api/run":
                name = parse_qs(url.query).get("name", [""])[0]
                found = {r.name: r for r in runs.discover()}
                if name not in found:
                    self._json({"error": f"no run named {name!r}"}, status=404)
                else:
                    self._json(run_payload(found[name], config.samples))
            elif url.path == "/favicon.ico":
                self._send(b"", "image/x-icon")
            else:
                self._json({"error": "not found"}, status=404)

        def _json(self, data: Any, status: int = 200) -> None:
            self._send(to_json(data).encode(), "application/json", status)

        def _send(self, body: bytes, kind: str, status: int = 200) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:  # quiet: polling would fill the terminal
            pass

    return Handler


def host_allowed(host: str | None, port: int) -> bool:
    """Whether a request's Host header names this server: 127.0.0.1, localhost or [::1], with its port."""
    return host in {f"{name}:{port}" for name in (HOST, "localhost", "[::1]")}


def _jsonable(value: Any) -> Any:
    return str(value)


def finite_json(value: Any) -> Any:
    """``value`` with every NaN/inf float as None: bare ``NaN`` is not JSON, and a browser that cannot parse a
    poll's answer showed "server unreachable" for as long as any run had a NaN metric."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value


def to_json(data: Any) -> str:
    return json.dumps(finite_json(data), default=_jsonable, allow_nan=False)


def shown(value: Any) -> Any:
    """A run-table cell: a NaN/inf metric as its name ("nan"), so a diverged run shows it rather than a blank."""
    return str(value) if isinstance(value, float) and not math.isfinite(value) else value


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):  # a closed tab is no error
            super().handle_error(request, client_address)


def serve(config: DashboardConfig) -> ThreadingHTTPServer:
    """A started server (in a daemon thread) on 127.0.0.1; ``server.server_address[1]`` is its port."""
    root = Path(config.runs_dir)
    if not root.is_dir():
        raise ConfigError(
            f"runs_dir '{root}' is not a directory; give the folder your runs write to "
            "(the parent of their output_dir), e.g. lmrl dashboard runs."
        )
    try:
        server = _Server((HOST, config.port), make_handler(Runs(root), config))
    except OSError as err:
        raise ConfigError(
            f"cannot listen on {HOST}:{config.port} ({err.strerror}); choose another port=... "
            "(port=0 picks a free one)."
        ) from None
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def run(config: DashboardConfig) -> None:
    """Serve until Ctrl-C."""
    server = serve(config)
    found = Runs(Path(config.runs_dir)).discover()
    console.print(
        f"lmrl dashboard: http://{HOST}:{server.server_address[1]}  ({len(found)} runs under "
        f"{config.runs_dir}; new runs appear as they start). Ctrl-C stops it."
    )
    try:
        threading.Event().wait()
    finally:
        server.shutdown()

"""Reading run directories for reports and the dashboard: config, metrics, samples, evals, checkpoints, nodes.

A corrupt line of metrics.jsonl or samples.jsonl (a half-written last line of a live run, an edit gone wrong, a
record whose step is not an integer) is skipped and counted, never fatal; a directory without metrics.jsonl is an
error that says what a run directory holds. Metrics of runs written before the names of docs/metrics.md are read
under their current names (`lmrl.report.metric_names`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lmrl.report.metric_names import upgrade


class RunError(ValueError):
    """A path that is not a run directory."""


@dataclass
class Jsonl:
    records: list[dict[str, Any]] = field(default_factory=list)
    skipped: int = 0  # corrupt lines
    offset: int = 0  # bytes consumed (complete lines only), to read on from


def read_jsonl(path: Path, offset: int = 0) -> Jsonl:
    """Records of complete lines from byte ``offset``; a corrupt line, or one that is not an object with an integer
    ``step`` (a float such as 3.0 counts as 3), is skipped and counted. A last line without its newline (still being
    written) is left for the next read."""
    out = Jsonl(offset=offset)
    if not path.is_file():
        return out
    with path.open("rb") as f:
        f.seek(offset)
        data = f.read()
    end = data.rfind(b"\n") + 1
    for line in data[:end].splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            out.skipped += 1
            continue
        step = record.get("step") if isinstance(record, dict) else None
        if isinstance(step, float) and step.is_integer():
            record["step"] = step = int(step)
        if isinstance(step, int) and not isinstance(step, bool):
            out.records.append({k: _number(v) for k, v in record.items()})
        else:  # not an object, or no integer step (every plot, table and merge keys on it)
            out.skipped += 1
    out.offset = offset + end
    return out


def read_metrics(path: Path, offset: int = 0) -> Jsonl:
    """`read_jsonl` of a metrics.jsonl, its records under the current metric names (an old run's too)."""
    out = read_jsonl(path, offset)
    out.records = [upgrade(r) for r in out.records]
    return out


def _number(value: Any) -> Any:
    """metrics.jsonl keeps NaN/inf as strings ("nan"); read them back as floats."""
    if isinstance(value, str) and value in ("nan", "inf", "-inf"):
        return float(value)
    return value


def numeric_keys(records: list[dict[str, Any]]) -> list[str]:
    """Keys with a finite number in some record, in first-seen order (``step`` and ``time_s`` left out)."""
    keys: dict[str, None] = {}
    for r in records:
        for k, v in r.items():
            if (
                k not in ("step", "time_s")
                and isinstance(v, (int, float))
                and not isinstance(v, bool)
                and math.isfinite(v)
            ):
                keys.setdefault(k)
    return list(keys)


@dataclass
class RunData:
    path: Path
    name: str
    config: dict[str, Any]
    metrics: list[dict[str, Any]]
    skipped_lines: int
    samples: list[dict[str, Any]]
    evals: list[dict[str, Any]]  # evals/*.json of `lmrl eval`
    checkpoints: list[dict[str, Any]]  # name, step, size_mb
    nodes: dict[str, list[dict[str, Any]]]  # swarm: node name -> its metrics records

    @property
    def method(self) -> str:
        c = self.config
        return str(c.get("algorithm") or c.get("loss") or c.get("objective") or c.get("variant") or c.get("mode") or "")

    @property
    def is_rl(self) -> bool:
        return any("kl" in r and "reward/mean" in r for r in self.metrics)

    def last(self, key: str) -> Any:
        for r in reversed(self.metrics):
            if key in r:
                return r[key]
        return None


def load_run(path: str | Path, max_samples: int = 200) -> RunData:
    """Everything a report shows of the run at ``path``."""
    run = Path(path)
    if not run.is_dir():
        raise RunError(f"'{run}' is not a directory; give a run's output_dir (it holds metrics.jsonl).")
    metrics_file = run / "metrics.jsonl"
    if not metrics_file.is_file():
        raise RunError(
            f"'{run}' has no metrics.jsonl, so it is not a run directory (or the run has not logged yet). "
            "Give a run's output_dir, e.g. runs/sft-tiny-arithmetic."
        )
    metrics = read_metrics(metrics_file)
    samples = read_jsonl(run / "samples.jsonl")
    cut = int(metrics_file.stat().st_size > metrics.offset)  # a last line without its newline: counted here
    return RunData(
        run,
        run.name,
        read_config(run),
        metrics.records,
        metrics.skipped + samples.skipped + cut,
        samples.records[-max_samples:],
        read_evals(run),
        list_checkpoints(run),
        read_nodes(run),
    )


def read_config(run: Path) -> dict[str, Any]:
    path = run / "config.yaml"
    if not path.is_file():
        return {}
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError:
        return {"(config.yaml)": "unreadable YAML"}
    return data if isinstance(data, dict) else {}


def read_evals(run: Path) -> list[dict[str, Any]]:
    out = []
    for path in sorted((run / "evals").glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (json.JSONDecodeError, OSError):
            continue
        if isinstance(data, dict) and isinstance(data.get("metrics"), dict):
            out.append({"file": path.name, **data})
    return out


def list_checkpoints(run: Path) -> list[dict[str, Any]]:
    dirs = sorted(
        (run / "checkpoints").glob("step-*"),
        key=lambda p: int(p.name.split("-")[1]) if p.name.split("-")[1].isdigit() else -1,
    )
    if (run / "final").is_dir():
        dirs.append(run / "final")
    out = []
    for d in dirs:
        size = sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
        step = int(d.name.split("-")[1]) if d.name.startswith("step-") and d.name.split("-")[1].isdigit() else None
        out.append({"name": d.name, "step": step, "size_mb": round(size / 1e6, 2), "path": str(d)})
    return out


def read_nodes(run: Path) -> dict[str, list[dict[str, Any]]]:
    """Per-node metrics of a swarm simulation (``nodes/<name>/metrics.jsonl``)."""
    return {
        d.name: read_metrics(d / "metrics.jsonl").records
        for d in sorted((run / "nodes").glob("*"))
        if (d / "metrics.jsonl").is_file()
    }


def config_diff(configs: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """(keys whose values differ between the configs, keys equal in all), over the union of keys."""
    keys = list(dict.fromkeys(k for c in configs for k in c))
    differ = [k for k in keys if len({json.dumps(c.get(k), sort_keys=True, default=str) for c in configs}) > 1]
    return differ, [k for k in keys if k not in differ]


SWARM_KEYS = (
    "reward/mean",
    "reward/cumulative",
    "swarm/accepted",
    "swarm/skipped",
    "swarm/groups/local",
    "swarm/groups/external",
    "eval/accuracy",
)


def swarm_table(nodes: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per node: rounds done and the last value of each `SWARM_KEYS` key (accepted = peers' payloads
    trained on, skipped = rejected ones)."""
    rows = []
    for name, records in nodes.items():
        row: dict[str, Any] = {"node": name, "rounds": max((r.get("step", 0) for r in records), default=0)}
        for key in SWARM_KEYS:
            values = [r[key] for r in records if isinstance(r.get(key), (int, float))]
            row[key] = values[-1] if values else None
        rows.append(row)
    return rows

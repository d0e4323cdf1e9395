"""Interactive plotly figures of one or more runs: metric groups over steps, reward versus KL, swarm nodes.

Figures are plotly objects; `lmrl.report.html` writes them into one page with plotly.js inlined, the dashboard
sends their JSON to the browser. Metric groups follow `lmrl.tracking.PLOT_GROUPS` (the PNG plots of a run);
keys in no group are grouped by their first path part (``time/...``, ``rollout/...``); throughputs (``*_per_s``) get
their own panel, so ``tokens_per_s`` (thousands) never squashes 0-1 metrics on a shared axis.

Every trace has a fixed colour, a ``uid`` and its points' ``time_s`` as ``customdata``: the page's controls
(``templates/plots.html``: EMA smoothing, a time x-axis, a log y-axis) redraw from these, and when runs are compared
a run keeps one colour in every panel (its keys differ by dash).
"""

from __future__ import annotations

import math
import re
from typing import Any

import plotly.graph_objects as go

from lmrl.report.runs import RunData, numeric_keys
from lmrl.tracking import NAMESPACES, PLOT_GROUPS

MAX_LINES = 10
"""Keys per figure; a larger leftover group is split."""

THROUGHPUT = "throughput"
"""The panel of ``*_per_s`` keys (tokens_per_s, samples_per_s)."""

COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
"""Plotly's default palette, assigned explicitly so that a run (or a key) keeps its colour across panels."""
DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")

FIRST = ("reward", "accuracy", "loss", "kl", "completion_len")
"""The panels a page opens on, in this order: the curves a TensorBoard or wandb user looks for first. `PLOT_GROUPS`'
other groups follow, then the namespaces."""

INTERNAL = ("policy", "update", "memory", "time")
"""Namespaces of counters of how an update ran (clip fractions, ratios, fused calls, peak memory, seconds): their
panels go in a collapsed section below the curves (`is_internal`). A method's headline ``policy/`` metrics (DPO's
``policy/accuracy``, margins, log-probs) are in `PLOT_GROUPS` and stay with the curves."""

EVAL_VS_KL = re.compile(r"^eval/(metrics/)?(accuracy|reward|gold_score|pass@\d+|maj@\d+|avg@\d+|win_rate|lc_win_rate)$")
"""Held-out numbers (``eval_metrics``' too: eval/metrics/...) drawn against KL next to the training reward (RLHF
book §14: the over-optimization picture)."""


def metric_groups(keys: list[str]) -> dict[str, list[str]]:
    """Group name -> present keys: `PLOT_GROUPS` first (`FIRST` leading), the rest by their first path part (the
    namespace), in the order of `NAMESPACES`, then a method's own namespaces as they appear."""
    groups: dict[str, list[str]] = {}
    used: set[str] = set()
    first = {name: i for i, name in enumerate(FIRST)}
    for name, members in sorted(PLOT_GROUPS.items(), key=lambda item: first.get(item[0], len(first))):
        present = [k for k in members if k in keys]
        if present:
            groups[name] = present
            used.update(present)
    rest: dict[str, list[str]] = {}
    for key in keys:
        if key.endswith("_per_s") and key not in used:
            rest.setdefault(THROUGHPUT, []).append(key)
        elif key not in used and not key.startswith("node/"):
            rest.setdefault(key.split("/")[0] if "/" in key else "other", []).append(key)
    order = {name: i for i, name in enumerate(NAMESPACES)}
    order[THROUGHPUT] = order["time"]
    for name, members in sorted(rest.items(), key=lambda item: order.get(item[0], len(order))):
        base = name if name not in groups else f"{name}: other"  # reward/std next to PLOT_GROUPS' "reward"
        for i in range(0, len(members), MAX_LINES):
            label = base if i == 0 else f"{base} ({i // MAX_LINES + 1})"
            while label in groups:
                label += "+"
            groups[label] = members[i : i + MAX_LINES]
    return groups


def is_internal(group: str) -> bool:
    """Whether a `metric_groups` panel holds internal counters (`INTERNAL`): ``policy``, ``update (2)``, ``memory``,
    ``memory: other``, ``time``."""
    return re.match(r"\w*", group).group() in INTERNAL


def slug(name: str) -> str:
    return "-".join("".join(c if c.isalnum() else " " for c in name).split())


def plot_ids(names: list[str]) -> dict[str, str]:
    """A distinct HTML id per figure name (``plot-<slug>``): two figures under one id draw into one element."""
    ids: dict[str, str] = {}
    for name in names:
        base = f"plot-{slug(name) or 'figure'}"
        candidate, n = base, 1
        while candidate in ids.values():
            n += 1
            candidate = f"{base}-{n}"
        ids[name] = candidate
    return ids


def series(records: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    steps, values, _ = timed_series(records, key)
    return steps, values


def timed_series(records: list[dict[str, Any]], key: str) -> tuple[list[int], list[float], list[float | None]]:
    """(steps, values, time_s of each point or None): metrics.jsonl's ``time_s`` is seconds since the run started."""
    points = [
        (r["step"], r[key], r.get("time_s") if isinstance(r.get("time_s"), (int, float)) else None)
        for r in records
        if "step" in r and isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)
    ]
    return [p[0] for p in points], [p[1] for p in points], [p[2] for p in points]


def ema(values: list[float | None], weight: float) -> list[float | None]:
    """TensorBoard's smoothing: an exponential moving average with the zero start debiased, so the first point is
    the first value; a missing or non-finite value is passed through and leaves the average as it was. The page's
    ``lmrlEma`` (templates/plots.html) is the same computation."""
    out: list[float | None] = []
    last, n = 0.0, 0
    for v in values:
        if v is None or not math.isfinite(v):
            out.append(v)
            continue
        last, n = last * weight + (1 - weight) * v, n + 1
        out.append(last / (1 - weight**n) if weight > 0 else v)
    return out


def line_style(run_index: int, key_index: int, compare: bool) -> dict[str, Any]:
    """One run: a colour per key. Several runs: a colour per run (the same in every panel), a dash per key."""
    if not compare:
        return {"color": COLORS[key_index % len(COLORS)]}
    return {"color": COLORS[run_index % len(COLORS)], "dash": DASHES[key_index % len(DASHES)]}


def _layout(fig: go.Figure, title: str, x: str = "step", y: str = "") -> go.Figure:
    fig.update_layout(
        title=title,
        xaxis_title=x,
        yaxis_title=y,
        height=340,
        margin=dict(l=50, r=20, t=50, b=40),
        template="plotly_white",
        legend=dict(font=dict(size=10)),
        showlegend=True,
        uirevision="keep",
    )
    ys = [v for trace in fig.data for v in (trace.y or ()) if isinstance(v, (int, float)) and math.isfinite(v)]
    if ys and min(ys) == max(ys) != 0:  # plotly spans a flat line +-1: a constant lr of 1e-4 would sit on "0"
        fig.update_yaxes(range=[ys[0] - abs(ys[0]) / 2, ys[0] + abs(ys[0]) / 2])
    if ys and 0 < max(abs(v) for v in ys) < 1e-2:
        fig.update_yaxes(exponentformat="e")  # 1e-4, not 100µ
    return fig


def metric_figures(runs: list[RunData]) -> dict[str, go.Figure]:
    """One figure per metric group present in any run; each run's key is a line (``run: key`` when comparing)."""
    keys = list(dict.fromkeys(k for run in runs for k in numeric_keys(run.metrics)))
    compare = len(runs) > 1
    figures = {}
    for group, members in metric_groups(keys).items():
        fig = go.Figure()
        for i, run in enumerate(runs):
            for j, key in enumerate(members):
                steps, values, times = timed_series(run.metrics, key)
                if steps:
                    name = f"{run.name}: {key}" if compare else key
                    fig.add_trace(
                        go.Scatter(
                            x=steps,
                            y=values,
                            customdata=times,
                            name=name,
                            uid=name,
                            line=line_style(i, j, compare),
                            marker=dict(size=5),
                            mode="lines+markers" if len(steps) < 40 else "lines",
                        )
                    )
        if fig.data:
            figures[group] = _layout(fig, group, y=members[0] if len(members) == 1 else "")
    return figures


def by_step(records: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Records merged per step (a step's training and evaluation lines are separate records)."""
    merged: dict[int, dict[str, Any]] = {}
    for r in records:
        if "step" in r:
            merged.setdefault(r["step"], {}).update(r)
    return merged


SYMBOLS = ("circle", "diamond", "square", "triangle-up", "x", "cross")


def reward_vs_kl(runs: list[RunData]) -> go.Figure | None:
    """Training reward and held-out scores against KL(π‖π_ref) of the same step, for the runs that log ``kl``: a
    scatter coloured by step (one colour scale, a marker shape per key and run), which reads where a line in step
    order is a scribble."""
    fig = go.Figure()
    last = max((s for run in runs for s in by_step(run.metrics)), default=0)
    for i, run in enumerate(runs):
        steps = by_step(run.metrics)
        points = sorted((s, r) for s, r in steps.items() if isinstance(r.get("kl"), (int, float)))
        prefix = "" if len(runs) == 1 else f"{run.name}: "
        keys = ["reward/mean"] + sorted({k for _, r in points for k in r if EVAL_VS_KL.match(k)})
        for j, key in enumerate(keys):
            xs = [(r["kl"], r[key], s) for s, r in points if isinstance(r.get(key), (int, float))]
            if xs:
                fig.add_trace(
                    go.Scatter(
                        x=[p[0] for p in xs],
                        y=[p[1] for p in xs],
                        text=[f"step {p[2]}" for p in xs],
                        name=prefix + key,
                        uid=prefix + key,
                        mode="markers",
                        marker=dict(
                            size=7,
                            symbol=SYMBOLS[(i * len(keys) + j) % len(SYMBOLS)],
                            color=[p[2] for p in xs],
                            colorscale="Viridis",
                            cmin=0,
                            cmax=max(last, 1),
                            showscale=not fig.data,  # one colour bar: the step
                            colorbar=dict(title="step", thickness=12),
                            line=dict(width=0.5, color="#333"),
                        ),
                    )
                )
    if not fig.data:
        return None
    fig = _layout(fig, "reward and held-out scores vs KL(π‖π_ref), coloured by step", x="kl", y="score")
    return fig.update_layout(legend=dict(orientation="h", y=-0.25, font=dict(size=10)), height=380)


def swarm_figures(run: RunData) -> dict[str, go.Figure]:
    """Per node over rounds: own reward, cumulative reward, peers' payloads accepted and rejected."""
    figures = {}
    for key, title in (
        ("reward/mean", "node reward (own rollouts)"),
        ("reward/cumulative", "node cumulative reward"),
        ("swarm/accepted", "peers' payloads accepted"),
        ("swarm/skipped", "peers' payloads rejected"),
    ):
        fig = go.Figure()
        for name, records in run.nodes.items():
            steps, values = series(records, key)
            if steps:
                fig.add_trace(go.Scatter(x=steps, y=values, name=name, mode="lines+markers", marker=dict(size=5)))
        if fig.data:
            figures[f"swarm {key}"] = _layout(fig, title, x="round")
    return figures

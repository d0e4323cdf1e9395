"""``lmrl report RUN [RUN...]``: one self-contained HTML page (plotly.js inlined, no network) of a run or a comparison.

    lmrl report runs/sft-tiny-arithmetic                           # -> runs/sft-tiny-arithmetic/report.html
    lmrl report runs/grpo-a runs/grpo-b output_file=compare.html   # config diff, metrics side by side

The plots have the dashboard's controls (``templates/plots.html``): EMA smoothing, step or time x-axis, log y-axis.
The page opens on the curves and holds, in this order: the runs; interactive metric plots (reward, accuracy, loss,
KL and completion length first: `figures.FIRST`); reward and held-out scores versus KL for RL runs (the
over-optimization picture, a scatter coloured by step); the internal counters (`figures.INTERNAL`), collapsed;
initial/final evaluation tables and `lmrl eval` results (``evals/*.json``); for swarm runs a table and plots per
node; the newest training samples and held-out samples, apart (`samples`); the config, folded (several runs: the
keys that differ, the rest folded); the checkpoints. It fits a 1400 px wide window.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
from pathlib import Path
from typing import Any

import jinja2
from plotly.offline import get_plotlyjs

from lmrl.config import ConfigError, field
from lmrl.report import figures
from lmrl.report.runs import RunData, RunError, config_diff, load_run, swarm_table
from lmrl.report.samples import sample_tables
from lmrl.tracking import console

TEMPLATES = Path(__file__).parent / "templates"
EVAL_PREFIXES = ("eval/",)
SAMPLE_ROWS = 30


@dataclasses.dataclass
class ReportConfig:
    runs: list[str] = field([], "run directories (output_dir of any lmrl run); several give a comparison")
    output_file: str | None = field(None, "the HTML file; default <run>/report.html (one run) or report.html")
    samples: int = field(SAMPLE_ROWS, "sample rows shown per run, the newest of each kind (training, held-out)")

    def __post_init__(self) -> None:
        if not self.runs:
            raise ConfigError("lmrl report needs at least one run directory: lmrl report runs/my-run [runs/other ...]")


def fmt(value: Any) -> str:
    """A table cell: 4 significant digits; text as it is (`samples.sample_table` has shown a sample's newlines)."""
    if value is None:
        return ""
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.4g}" if abs(value) < 1e5 else f"{value:.4e}"
    return str(value)


def script_safe(js: str) -> str:
    """JSON to inline in a <script>: ``<``, ``>``, ``&`` and ``/`` escaped (they occur only inside its strings), so
    a metric or run named ``</script>`` cannot end the script."""
    return js.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026").replace("/", "\\u002f")


def _eval_views(run: RunData) -> tuple[dict[str, Any], dict[str, Any]]:
    """(initial, final) held-out numbers: the step-0 record's and the newest value of each eval key."""
    initial = {k: v for r in run.metrics if r.get("step") == 0 for k, v in r.items() if k.startswith(EVAL_PREFIXES)}
    final: dict[str, Any] = {}
    for r in run.metrics:
        final.update({k: v for k, v in r.items() if k.startswith(EVAL_PREFIXES)})
    return initial, final


def _view(run: RunData, samples: int) -> dict[str, Any]:
    initial, final = _eval_views(run)
    return {
        "name": run.name,
        "path": str(run.path),
        "method": run.method,
        "config": run.config,
        "metrics": run.metrics,
        "last_step": max((r.get("step", 0) for r in run.metrics), default=0),
        "skipped_lines": run.skipped_lines,
        "initial": initial,
        "final": final,
        "evals": run.evals,
        "checkpoints": run.checkpoints,
        "samples": sample_tables(run.samples, samples),
        "swarm_rows": swarm_table(run.nodes),
    }


def _unique_names(runs: list[RunData]) -> None:
    """Runs with the same directory name (a/final, b/final) get their parent's name too."""
    names = [r.name for r in runs]
    for r in runs:
        if names.count(r.name) > 1:
            r.name = f"{r.path.parent.name}/{r.name}"


def render(runs: list[RunData], samples: int = SAMPLE_ROWS) -> str:
    """The report page as one HTML string."""
    _unique_names(runs)
    views = [_view(r, samples) for r in runs]
    differ, same = config_diff([r.config for r in runs])
    if len(runs) == 1:
        differ, same = same, []  # one run: every key in the main table
    metric = figures.metric_figures(runs)
    swarm_figs = [
        (name if len(runs) == 1 else f"{run.name} {name}", fig)
        for run in runs
        for name, fig in figures.swarm_figures(run).items()
    ]
    ids = figures.plot_ids(["reward vs kl", *metric, *(name for name, _ in swarm_figs)])  # one id per figure
    kl = figures.reward_vs_kl(runs)
    drawn = [*metric.items(), *swarm_figs, *([("reward vs kl", kl)] if kl else [])]
    figures_json = "{" + ",".join(f"{json.dumps(ids[name])}:{fig.to_json()}" for name, fig in drawn) + "}"
    plots = [{"id": ids[name]} for name in metric if not figures.is_internal(name)]
    internal = [{"id": ids[name]} for name in metric if figures.is_internal(name)]
    swarm = [{"id": ids[name]} for name, _ in swarm_figs]
    eval_keys = list(dict.fromkeys(k for v in views for k in [*v["initial"], *v["final"]]))
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True)
    title = f"lmrl report: {runs[0].name}" if len(runs) == 1 else f"lmrl report: {len(runs)} runs"
    return env.get_template("report.html").render(
        title=title,
        created=datetime.datetime.now().strftime("%Y-%m-%d %H:%M"),
        plotly_js=get_plotlyjs(),
        plots_js=(TEMPLATES / "plots.html").read_text(encoding="utf-8"),
        figures_json=script_safe(figures_json),
        runs=views,
        config_differ=differ,
        compare=len(runs) > 1,
        config_same=same,
        plots=plots,
        internal=internal,
        kl_plot={"id": ids["reward vs kl"]} if kl else None,
        eval_keys=eval_keys,
        swarm=swarm,
        fmt=fmt,
    )


def run(config: ReportConfig) -> Path:
    """Write the report; returns its path."""
    try:
        runs = [load_run(path) for path in config.runs]
    except RunError as err:
        raise ConfigError(str(err)) from None
    path = (
        Path(config.output_file)
        if config.output_file
        else (runs[0].path / "report.html" if len(runs) == 1 else Path("report.html"))
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(runs, config.samples), encoding="utf-8")
    skipped = sum(r.skipped_lines for r in runs)
    note = f" ({skipped} corrupt line(s) skipped)" if skipped else ""
    console.print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB, self-contained){note}")
    return path

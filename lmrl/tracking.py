"""What a run shows and leaves behind: metrics.jsonl, samples.jsonl, a rich progress bar, plots.

Optional trackers (tensorboard, wandb, trackio) receive the same metrics when
installed and named in ``report_to``.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from lmrl.report.metric_names import upgrade  # imports nothing of lmrl

console = Console(highlight=False)

# Shown in the progress bar, in this order, when present (names: docs/metrics.md).
KEY_METRICS = ("loss", "reward/mean", "policy/accuracy", "eval/accuracy", "kl", "entropy", "lr", "tokens_per_s")
# The console's line for a logged training step, in this order, when present (as transformers prints loss,
# grad_norm and learning_rate); an evaluation's line has every eval/ metric, `EVAL_FIRST` first.
LINE_METRICS = (
    "loss",
    "reward/mean",
    "policy/accuracy",
    "kl",
    "entropy",
    "completion_len/mean",
    "optim/grad_norm",
    "lr",
    "tokens_per_s",
)
EVAL_FIRST = ("eval/accuracy", "eval/reward", "eval/loss")
# Plotted at the end: one figure per group, each present key a line; the reward first (the report's panels follow
# this order, then every other namespace, `NAMESPACES`).
PLOT_GROUPS = {
    "reward": ("reward/mean", "eval/reward"),
    "loss": ("loss", "eval/loss", "loss/policy", "loss/value"),
    "accuracy": (
        "policy/accuracy",
        "eval/accuracy",
        "policy/reward_accuracy",
        "eval/reward_accuracy",
        "eval/answer_prob",
    ),
    "kl": ("kl", "eval/kl", "challenger/kl"),
    "entropy": ("entropy",),
    "margin": ("policy/margin", "eval/margin"),
    "logps": ("policy/logp_chosen", "policy/logp_rejected"),
    "implicit_rewards": ("policy/reward_chosen", "policy/reward_rejected", "policy/reward_margin"),
    "completion_len": ("completion_len/mean",),
    "lr": ("lr",),
    "gold": ("eval/gold_score", "eval/gold_score_greedy"),
    "challenger": (
        "challenger/pass_rate",
        "challenger/malformed_frac",
        "challenger/distinct_frac",
        "challenger/distinct_3gram_frac",
    ),
    "challenger_difficulty": ("challenger/operands_mean", "challenger/max_digits_mean", "challenger/query_len"),
    "self_reward": ("reward/self_reward/mean", "reward/self_reward/parse_fail_frac"),
    "rejection": ("rs/reward_all", "rs/reward_selected", "rs/reward_max"),
    "label": ("label/chosen_score", "label/rejected_score"),
    "ties": ("label/tie_frac", "label/skipped_frac"),
    "swarm": ("swarm/accepted", "swarm/skipped"),
    "swarm_reward": ("swarm/cumulative_reward",),
    "groups": ("swarm/groups/trained", "swarm/groups/local", "swarm/groups/external"),
    "val": ("eval/ce", "eval/entropy", "loss/ce"),
    "avatarl": ("avatarl/expected_reward", "avatarl/reward_mean"),
    "memory": ("memory/peak_rss_mib", "memory/peak_gpu_mib"),
}
NAMESPACES = ("reward", "loss", "policy", "value", "update", "rollout", "optim", "time", "memory", "eval")
"""The namespaces of docs/metrics.md in the order the report shows their remaining metrics (a method's own after)."""


def _clean(value: Any) -> Any:
    """JSON-safe scalars: tensors to floats, NaN/inf kept as strings JSON can carry."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def plain(text: object) -> Text:
    """A table cell shown as it is: model output such as ``[calculator(x=1)]`` is not read as rich markup."""
    return Text(str(text))


def _fmt(value: Any) -> str:
    if isinstance(value, str):
        return value.replace("\n", "\\n")  # one table row per sample, newlines visible
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e4 else f"{value:.3e}"
    return str(value)


def console_line(step: int, record: dict[str, Any], total: int | None = None) -> str:
    """The line a logged record leaves in the console's history: ``step 20/200  loss=1.23  lr=0.001 ...`` for a
    training step, ``step 25/200  eval/accuracy=0.4  eval/loss=1.9 ...`` for an evaluation (every eval/ metric:
    DPO's margins, pretrain's eval/ce, a file's eval/loss), and a record with neither (a rejection round's rs/
    statistics) with its own metrics."""

    def shown(value: Any) -> bool:
        return isinstance(value, (int, float, str)) and not isinstance(value, bool)

    keys = [k for k in LINE_METRICS if shown(record.get(k))]
    evals = sorted((k for k in record if k.startswith("eval/") and shown(record[k])), key=_eval_order)
    keys += evals
    if not keys:  # nor training nor evaluation metrics: what the record has, but timings and memory
        keys = [k for k in record if k not in ("step", "time_s") and not k.startswith(("time/", "memory/"))]
        keys = [k for k in keys if shown(record[k])]
    where = f"step {step}/{total}" if total else f"step {step}"
    return "  ".join([where, *(f"{k}={_fmt(record[k])}" for k in keys)])


def _eval_order(key: str) -> tuple[int, str]:
    return (EVAL_FIRST.index(key) if key in EVAL_FIRST else len(EVAL_FIRST), key)


def truncate_jsonl(path: Path, max_step: int) -> None:
    """Drop records logged after ``max_step`` (a resumed run re-logs the steps after its checkpoint), and lines
    that are not JSON records (a line cut by a full disk or a power loss), with a warning."""
    if not path.exists():
        return
    kept, bad = [], 0
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line) if line.strip() else None
        except ValueError:
            record = None
        step = record.get("step") if isinstance(record, dict) else None
        if isinstance(step, int) and not isinstance(step, bool):
            if step <= max_step:
                kept.append(line)
        elif line.strip():  # not JSON, not a record, or a record without an integer step ({"step": null})
            bad += 1
    if bad:
        console.print(
            f"[yellow]warning: dropped {bad} unreadable line(s) of {path} (not JSON records with an integer "
            "step: cut by a crash or a full disk, or edited)."
        )
    path.write_text("".join(line + "\n" for line in kept))


class Tracker:
    """Writes metrics and samples of one run, shows progress, and plots at the end."""

    def __init__(
        self,
        output_dir: str | Path,
        total_steps: int,
        config: dict | None = None,
        report_to: tuple[str, ...] | list[str] = (),
        description: str = "train",
        start_step: int = 0,
    ):
        self.dir = Path(output_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.dir / "metrics.jsonl"
        self.samples_path = self.dir / "samples.jsonl"
        truncate_jsonl(self.metrics_path, start_step)
        truncate_jsonl(self.samples_path, start_step)
        self.start_time = time.time()
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[metrics]}"),
            console=console,
            transient=False,
        )
        self.total = total_steps
        self.task = self.progress.add_task(description, total=total_steps, completed=start_step, metrics="")
        self.progress.start()
        self.backends = [b for b in (_open_backend(name, self.dir, config) for name in report_to) if b is not None]
        self.on_close: list = []  # called once by `close`, e.g. the run directory's lock release

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        record = {
            "step": step,
            **{k: _clean(v) for k, v in metrics.items()},
            "time_s": round(time.time() - self.start_time, 3),
        }
        with self.metrics_path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        shown = "  ".join(f"{k}={_fmt(record[k])}" for k in KEY_METRICS if k in record)
        self.progress.update(self.task, completed=step, metrics=shown)
        # the history: one plain line per logged step and evaluation, above the live bar
        self.progress.console.print(
            console_line(step, record, self.total), markup=False, highlight=False, soft_wrap=True
        )
        for backend in self.backends:
            backend.log(step, {k: v for k, v in record.items() if isinstance(v, (int, float))})

    def advance(self, step: int) -> None:
        self.progress.update(self.task, completed=step)

    def log_samples(
        self, step: int, rows: list[dict[str, Any]], title: str = "samples", held_out: bool = False
    ) -> None:
        """Append rows (prompt, completion, reward components...) to samples.jsonl and print them as a table;
        ``held_out``: an evaluation's rows, marked ``"held_out": true`` in the file (the report shows them apart)."""
        if not rows:
            return
        mark = {"held_out": True} if held_out else {}
        with self.samples_path.open("a") as f:
            for row in rows:
                f.write(json.dumps({"step": step, **mark, **{k: _clean(v) for k, v in row.items()}}) + "\n")
        table = Table(title=f"{title} at step {step}", show_lines=True)
        columns = [c for c, v in rows[0].items() if not isinstance(v, (list, dict))]  # messages etc.: file only
        for column in columns:
            table.add_column(column, overflow="fold", max_width=60)
        for row in rows:
            table.add_row(*(plain(_fmt(_clean(row.get(c, "")))) for c in columns))
        self.print(table)

    def print(self, *objects: Any) -> None:
        self.progress.console.print(*objects)

    def close(self) -> list[Path]:
        """Stop the progress bar, close backends and write plots; returns the plot paths. Then the `on_close`
        callbacks run (the run is over: its directory's lock is released), whatever happened before."""
        try:
            self.progress.stop()
            for backend in self.backends:
                backend.close()
            return plot_metrics(self.metrics_path, self.dir / "plots")
        finally:
            while self.on_close:
                self.on_close.pop()()


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_metrics(metrics_path: str | Path, out_dir: str | Path) -> list[Path]:
    """One PNG per metric group present in ``metrics.jsonl`` (loss, reward, accuracy, kl, ...); a run resumed from
    one written under the old metric names is plotted under the current ones."""
    records = [upgrade(r) for r in read_jsonl(metrics_path)]
    if not records:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for group, keys in PLOT_GROUPS.items():
        series = {}
        for key in keys:
            points = [
                (r["step"], r[key])
                for r in records
                if isinstance(r.get(key), (int, float)) and isinstance(r.get("step"), (int, float))
            ]
            if points:
                series[key] = points
        if not series:
            continue
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for key, points in series.items():
            steps, values = zip(*points)
            ax.plot(steps, values, marker="o" if len(points) < 30 else None, markersize=3, label=key)
        ax.set_xlabel("step")
        ax.set_title(group)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = out_dir / f"{group.replace('/', '_')}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


class _TensorBoard:
    def __init__(self, run_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(run_dir / "tensorboard"))

    def log(self, step: int, metrics: dict) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        self.writer.close()


class _WandbLike:
    """wandb and trackio share ``init``/``log``/``finish``."""

    def __init__(self, module_name: str, run_dir: Path, config: dict | None):
        import importlib

        self.module = importlib.import_module(module_name)
        self.run = self.module.init(project="lmrl", name=run_dir.name, config=config or {})

    def log(self, step: int, metrics: dict) -> None:
        self.module.log(metrics, step=step)

    def close(self) -> None:
        self.module.finish()


def _open_backend(name: str, run_dir: Path, config: dict | None):
    try:
        if name == "tensorboard":
            return _TensorBoard(run_dir)
        return _WandbLike(name, run_dir, config)
    except ImportError:
        console.print(
            f"[yellow]report_to: '{name}' is not installed ({escape(install_hint(name))}); logging to metrics.jsonl only."
        )
        return None


TRACKER_EXTRAS = {"tensorboard": "tracking", "wandb": "tracking"}
"""The lmrl extra that installs each tracker (pyproject.toml's optional dependencies); trackio has none."""


def install_hint(name: str) -> str:
    """How to install the tracker ``name``: ``pip install 'lmrl[tracking]'`` (tensorboard, wandb) or by its name."""
    extra = TRACKER_EXTRAS.get(name)
    return f"pip install 'lmrl[{extra}]', or pip install {name}" if extra else f"pip install {name}"

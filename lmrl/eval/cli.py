"""``lmrl eval``: score a model or checkpoint on a dataset; a table on the terminal and a JSON file.

    lmrl eval model=runs/sft/final dataset=task:arithmetic metrics=[accuracy,pass@8,maj@8,avg@8]
    lmrl eval model=runs/dpo/final dataset=prompts.jsonl metrics=[win_rate,reward] \\
        judge=Qwen/Qwen2.5-7B-Instruct baseline=runs/sft/final reward_model=runs/reward/final
    lmrl eval model=runs/sft/final dataset=mc.jsonl metrics=[loglik]      # rows: prompt, choices, answer
    lmrl eval model=runs/grpo-tiny-calculator/final dataset=task:tool_arithmetic task_args='{digits: 2}' \
        tools=[calculator] tool_parser=pythonic max_turns=3 metrics=[accuracy,pass@4,pass^4]   # tool episodes
    lmrl decontaminate train=data/train.jsonl eval=data/test.jsonl        # 8-gram overlap report

Metric names and formulas: `lmrl.eval.spec`, `lmrl.eval.metrics`; docs/eval.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from lmrl.config import ChatSection, ConfigError, ModelSection, field, section_view
from lmrl.data.loading import is_generated, load_rows
from lmrl.eval.decontam import overlap
from lmrl.rollout.engines.section import EngineSection
from lmrl.rollout.tools.section import ToolSection, build_env_factory, start_servers
from lmrl.tracking import console, plain

if TYPE_CHECKING:  # (torch and transformers: `lmrl.cli` checks these configs without them)
    from lmrl.eval.runner import EvalOptions, Evaluator


@dataclasses.dataclass
class EvalDataSection(ChatSection):
    """The rows to evaluate and how to sample and score completions: shared by `lmrl eval` and `lmrl filter`."""

    title = "data and sampling"
    dataset: str = field(
        "task:arithmetic", "task:<name> (built-in), rg:<name>, a .jsonl/.json/.parquet/.csv file, or an HF dataset id"
    )
    split: str = field("test", "dataset split")
    rows: int | None = field(200, "rows to evaluate (null: all)")
    task_args: dict = field({}, "arguments of a built-in task (e.g. digits: 2)")
    temperature: float = field(1.0, "sampling temperature of sampled completions (greedy ones ignore it)")
    top_p: float = field(1.0, "nucleus sampling of sampled completions")
    max_new_tokens: int = field(32, "tokens generated per completion")
    batch_size: int = field(64, "rows x samples per generate call")
    verifier: str = field("auto", "auto (a row's task, else exact match) | exact | math | task")
    answer_column: str = field("answer", "column with the gold answers")

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ConfigError(f"'max_new_tokens' must be >= 1, got {self.max_new_tokens}.")
        if not self.temperature > 0:
            raise ConfigError(f"'temperature' must be > 0 (greedy completions ignore it), got {self.temperature}.")
        super().__post_init__()

    @property
    def eval_data(self) -> EvalDataSection:
        return section_view(self, EvalDataSection)

    def options(self) -> EvalOptions:
        """The `Evaluator`'s options: every key of this config that `EvalOptions` has."""
        from lmrl.eval.runner import EvalOptions

        names = {f.name for f in dataclasses.fields(EvalOptions)}
        return EvalOptions(**{k: v for k, v in dataclasses.asdict(self).items() if k in names})


@dataclasses.dataclass
class EvalConfig(EvalDataSection, ToolSection, EngineSection, ModelSection):
    metrics: list[str] = field(["accuracy"], "accuracy, pass@K, pass^K, maj@K, avg@K, reward, win_rate, loglik")
    samples: int = field(0, "samples per prompt for pass@K/maj@K/avg@K/pass^K (0: the largest K)")
    reward_model: str | None = field(None, "metric reward: the reward model (a run's final/ of `lmrl reward`)")
    judge: str | None = field(None, "metric win_rate: the judge model (any causal LM)")
    baseline: str | None = field(None, "metric win_rate: the model the evaluated one is compared with")
    judge_max_new_tokens: int = field(256, "tokens of each judgement")
    train_dataset: str | None = field(None, "training data to check for 8-gram overlap with the eval rows (warning)")
    harness_tasks: list[str] = field(
        [], "also run these lm-evaluation-harness tasks on the model (a local HF model dir; needs the eval extra)"
    )
    harness_include: str | None = field(None, "directory of local harness task YAMLs")
    harness_limit: int | None = field(None, "first N documents per harness task (null: all)")
    num_samples: int = field(4, "sample rows shown and saved")
    output_file: str | None = field(
        None, "JSON results; default <run>/evals/<dataset>.json for a run's model, else evals/<dataset>.json"
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        from lmrl.eval.spec import parse_metrics

        try:
            if self.metrics or not self.harness_tasks:
                parse_metrics(self.metrics)
        except ValueError as err:
            raise ConfigError(str(err)) from None
        if self.samples < 0:
            raise ConfigError(f"'samples' must be >= 0 (0: the largest K of the metrics), got {self.samples}.")
        if self.multi_turn and "win_rate" in [str(m).strip().lower() for m in self.metrics]:
            raise ConfigError(
                "metrics: win_rate compares single-turn answers with a baseline's; it does not run with "
                "tools, mcp_servers or env (evaluate accuracy, pass@K, pass^K, maj@K, avg@K instead)."
            )
        if self.multi_turn and not self.chat:
            raise ConfigError(
                "chat=false: tool episodes are rendered with the chat template (its tools and tool "
                "messages); drop chat=false or the tools/mcp_servers/env keys."
            )


def default_output(config: EvalConfig) -> Path:
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", config.dataset).strip("_") or "eval"
    model = Path(config.model)
    run_dir = None
    if model.name == "final" or model.parent.name == "checkpoints":
        run_dir = model.parent if model.name == "final" else model.parent.parent
    suffix = f"-{model.name}" if model.parent.name == "checkpoints" else ""  # evals of step-N checkpoints side by side
    return (run_dir / "evals" if run_dir and run_dir.is_dir() else Path("evals")) / f"{slug}{suffix}.json"


def warn_contamination(
    train_source: str, eval_rows: list[dict], eval_source: str, n: int = 8, **task_args: Any
) -> dict | None:
    """Print a warning when eval rows share n-grams with the training data; returns the report's dict."""
    train_rows = load_rows(train_source, split="train", **(task_args if is_generated(train_source) else {}))
    report = overlap(train_rows, eval_rows, n=n)
    if report.contaminated:
        console.print(
            f"[bold yellow]warning:[/] {len(report.contaminated)} of {report.eval_rows} eval rows of "
            f"{eval_source} share >= {report.threshold:.0%} of their {n}-grams with {train_source} "
            f"(rows {report.contaminated[:10]}{' ...' if len(report.contaminated) > 10 else ''}): "
            "scores on them may measure memorisation. `lmrl decontaminate` lists them."
        )
    return report.to_dict()


@contextlib.contextmanager
def progress_bars() -> Iterator[Callable[[str, int, int], None]]:
    """A ``progress(stage, done, total)`` callback drawing one bar per stage on the terminal (transient)."""
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bars:
        tasks: dict[str, Any] = {}

        def progress(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bars.add_task(stage, total=total)
            bars.update(tasks[stage], completed=done)

        yield progress


def run(config: EvalConfig) -> dict[str, float]:
    """Evaluate, print a table, write the JSON file; returns the metrics."""
    from lmrl.eval.runner import Evaluator
    from lmrl.models.setup import ModelSetup

    if config.harness_tasks:
        from lmrl.eval.harness import check_model_dir

        check_model_dir(config.model)
    rows = load_rows(config.dataset, split=config.split, limit=config.rows, **config.task_args)
    turns = config.turn_options() if config.multi_turn else None  # tools/env: every completion is an episode
    evaluator = (
        Evaluator(config.metrics, rows, config.options(), config.dataset, turns=turns) if config.metrics else None
    )
    contamination = None
    if config.train_dataset:
        contamination = warn_contamination(config.train_dataset, rows, config.dataset, **config.task_args)
    start_servers(config)  # MCP servers: one that does not start stops here, before the model loads
    setup = ModelSetup.from_config(config)
    model, tokenizer = setup.policy()
    env_factory = build_env_factory(config, tokenizer)  # the training loop's: same tools, parser, template
    start = time.perf_counter()
    engine = eval_engine(config, evaluator, model, tokenizer, setup.dtype)
    with progress_bars() as progress:
        metrics, samples = (
            evaluator(model, tokenizer, setup.dtype, progress, engine, env_factory)
            if evaluator
            else ({"rows": 0.0}, [])
        )
    if config.harness_tasks:
        from lmrl.eval.harness import flat_metrics, run_harness

        metrics.update(
            flat_metrics(run_harness(config.model, config.harness_tasks, config.harness_include, config.harness_limit))
        )
    metrics["time_s"] = round(time.perf_counter() - start, 3)
    show(config, metrics, samples)
    path = Path(config.output_file) if config.output_file else default_output(config)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "model": config.model,
                "dataset": config.dataset,
                "split": config.split,
                "metrics": _json_safe(metrics),
                "samples": _json_safe(samples),
                "contamination": contamination,
                "config": dataclasses.asdict(config),
            },
            indent=1,
        )
    )
    console.print(f"wrote {path}")
    return metrics


def eval_engine(config: EvalConfig, evaluator: Evaluator | None, model, tokenizer, dtype):
    """engine=vllm: a vLLM engine on the evaluated model, checked at start-up against the longest prompt and the
    sampling settings (None: the evaluator's own HF engine)."""
    if config.engine == "hf" or evaluator is None or not (evaluator.spec.needs_greedy_text or evaluator.spec.sampled):
        return None  # nothing to generate (e.g. loglik only): no engine to start
    from lmrl.data.chat import encode_prompt
    from lmrl.rollout import SamplingParams
    from lmrl.rollout.engines.factory import make_engine

    opts = evaluator.options
    longest = max(len(encode_prompt(tokenizer, r["prompt"], opts.chat)) for r in evaluator.rows)
    sampling = SamplingParams(max_new_tokens=opts.max_new_tokens, temperature=opts.temperature, top_p=opts.top_p)
    return make_engine(config, model, tokenizer, dtype, sampling=sampling, longest_prompt=longest)


def show(config: EvalConfig, metrics: dict[str, float], samples: list[dict]) -> None:
    table = Table(title=f"{config.model} on {config.dataset} ({config.split}, {int(metrics['rows'])} rows)")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in metrics.items():
        if key.endswith("/std") or key == "rows":
            continue
        std = metrics.get(f"{key}/std")
        text = f"{value:.4f}" if isinstance(value, float) and not value.is_integer() else f"{value:g}"
        table.add_row(key, text + (f" ± {std:.4f}" if std is not None else ""))
    console.print(table)
    if samples:
        sample_table = Table(title="samples", show_lines=True)
        columns = list(dict.fromkeys(k for s in samples for k in s))
        for column in columns:
            sample_table.add_column(column, overflow="fold", max_width=50)
        for s in samples:
            sample_table.add_row(*(plain(str(s.get(c, "")).replace("\n", "\\n")) for c in columns))
        console.print(sample_table)


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


@dataclasses.dataclass
class DecontamConfig:
    train: str = field("task:arithmetic", "training data: task:<name>, a file or an HF dataset id")
    eval: str = field("task:arithmetic", "evaluation data, same forms")
    train_split: str = field("train", "split of the training data")
    eval_split: str = field("test", "split of the evaluation data")
    train_rows: int | None = field(None, "first N training rows (null: all; built-in tasks: 1000)")
    eval_rows: int | None = field(None, "first N eval rows (null: all)")
    n: int = field(8, "n-gram size (Tulu 3: 8)")
    threshold: float = field(0.5, "an eval row is contaminated when this share of its n-grams is in the training data")
    output_file: str | None = field(None, "also write the report (and the contaminated rows) as JSON")


def decontaminate(config: DecontamConfig) -> dict[str, Any]:
    """``lmrl decontaminate``: the eval rows whose n-grams appear in the training data."""
    train = load_rows(config.train, split=config.train_split, limit=config.train_rows)
    evals = load_rows(config.eval, split=config.eval_split, limit=config.eval_rows)
    try:
        report = overlap(train, evals, n=config.n, threshold=config.threshold)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    table = Table(title=f"{config.n}-gram overlap: {config.eval} vs {config.train}")
    for column in ("eval row", "overlap", "prompt"):
        table.add_column(column, overflow="fold", max_width=70)
    for i in report.contaminated[:20]:
        table.add_row(str(i), f"{report.shares[i]:.0%}", plain(str(evals[i].get("prompt", evals[i]))[:200]))
    console.print(table)
    console.print(
        f"{len(report.contaminated)} of {report.eval_rows} eval rows ({report.fraction:.1%}) share >= "
        f"{config.threshold:.0%} of their {config.n}-grams with {len(train)} training rows."
    )
    out = report.to_dict()
    if config.output_file:
        Path(config.output_file).parent.mkdir(parents=True, exist_ok=True)
        Path(config.output_file).write_text(
            json.dumps({**out, "rows": [evals[i] for i in report.contaminated]}, indent=1, default=str)
        )
        console.print(f"wrote {config.output_file}")
    return out

"""``lmrl filter``: the offline difficulty filter of RLVR — keep the prompts a model sometimes, but not always, solves.

RLHF book §7.2.3 (practice 1): sample N completions per prompt (N = 16), score them with the verifier, and keep
the prompts whose pass rate lies in [lo, hi] (0.2, 0.8): a prompt solved by every sample or by none gives every
sample the same reward, so group-relative advantages are all 0 and the prompt teaches nothing.

    lmrl filter model=runs/sft/final dataset=task:arithmetic rows=2000 samples=16 min_pass=0.2 max_pass=0.8 \\
        output_file=data/arith_mid.jsonl
    lmrl rl --config rl/tiny_arithmetic_grpo dataset=data/arith_mid.jsonl

The output is JSONL: the kept rows with every column they had (a built-in task's ``task``/``answer``/``meta``,
so its verifier still scores them) plus ``pass_rate``; the terminal shows how the pass rates spread.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from pathlib import Path

from rich.table import Table

from lmrl.config import ConfigError, ModelSection, field
from lmrl.data.loading import load_rows
from lmrl.eval.cli import EvalDataSection, progress_bars
from lmrl.tracking import console


@dataclasses.dataclass
class FilterConfig(EvalDataSection, ModelSection):
    split: str = field("train", "dataset split")
    rows: int | None = field(2000, "rows to measure (null: all)")
    samples: int = field(16, "completions sampled per prompt (N); sample with the temperature RL will use")
    min_pass: float = field(0.2, "keep prompts whose pass rate is >= this")
    max_pass: float = field(0.8, "... and <= this")
    output_file: str | None = field(None, "JSONL of the kept rows; default filtered/<dataset>_pass<min>-<max>.jsonl")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.min_pass <= self.max_pass <= 1:
            raise ConfigError(
                f"need 0 <= min_pass <= max_pass <= 1, got min_pass={self.min_pass}, max_pass={self.max_pass}."
            )
        if self.samples < 1:
            raise ConfigError(f"'samples' must be >= 1, got {self.samples}.")

    def output_path(self) -> Path:
        if self.output_file:
            return Path(self.output_file)
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", self.dataset).strip("_") or "data"
        return Path("filtered") / f"{slug}_pass{self.min_pass:g}-{self.max_pass:g}.jsonl"


def spread(rates: list[float], lo: float, hi: float) -> dict[str, int]:
    """How many prompts were never solved, below ``lo``, kept in [lo, hi], above ``hi``, always solved."""
    bins = {"0 (never)": 0, f"(0, {lo:g})": 0, f"[{lo:g}, {hi:g}] kept": 0, f"({hi:g}, 1)": 0, "1 (always)": 0}
    names = list(bins)
    for r in rates:
        kept = lo <= r <= hi
        name = names[2] if kept else names[0] if r == 0 else names[4] if r == 1 else names[1] if r < lo else names[3]
        bins[name] += 1
    return bins


def empty_message(rates: list[float], lo: float, hi: float, rated: Path) -> str:
    """Why no row was kept: which side of [lo, hi] the pass rates fell on, and what to change."""
    below, above, n = sum(r < lo for r in rates), sum(r > hi for r in rates), len(rates)
    side = (
        f"min_pass={lo:g} emptied it (all {n} rows are below)"
        if not above
        else f"max_pass={hi:g} emptied it (all {n} rows are above)"
        if not below
        else f"the range [{lo:g}, {hi:g}] falls between the rates ({below} rows below min_pass, {above} above max_pass)"
    )
    spread_text = ", ".join(f"{name}: {count}" for name, count in spread(rates, lo, hi).items())
    return (
        f"No row has a pass rate in [min_pass={lo:g}, max_pass={hi:g}]: {side}. Pass rates: {spread_text}. "
        f"Widen min_pass/max_pass, or use a stronger or weaker model. Every row's measured rate is in {rated}."
    )


def run(config: FilterConfig) -> dict[str, float]:
    """Measure every row's pass rate, write the kept rows, print the spread; returns the counts."""
    from lmrl.eval.runner import Evaluator  # here: the config checks without torch (lmrl.cli)
    from lmrl.models.setup import ModelSetup

    rows = load_rows(config.dataset, split=config.split, limit=config.rows, **config.task_args)
    evaluator = Evaluator([f"avg@{config.samples}"], rows, config.options(), config.dataset, key="samples")
    path = config.output_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    setup = ModelSetup.from_config(config)
    model, tokenizer = setup.policy()
    start = time.perf_counter()
    with progress_bars() as progress:
        rates, tokens = evaluator.pass_rates(model, tokenizer, setup.dtype, progress)
    kept = [{**row, "pass_rate": rate} for row, rate in zip(rows, rates) if config.min_pass <= rate <= config.max_pass]
    if not kept:  # keep the measured rates (the costly part) and say which bounds emptied the result
        rated = path.with_name(path.stem + ".all_rates.jsonl")
        rated.write_text("".join(json.dumps({**row, "pass_rate": rate}) + "\n" for row, rate in zip(rows, rates)))
        raise ValueError(empty_message(rates, config.min_pass, config.max_pass, rated))
    path.write_text("".join(json.dumps(row) + "\n" for row in kept))
    counts = spread(rates, config.min_pass, config.max_pass)
    table = Table(
        title=f"pass rates of {config.model} on {len(rows)} rows of {config.dataset} ({config.samples} samples each)"
    )
    table.add_column("pass rate")
    table.add_column("prompts", justify="right")
    for name, count in counts.items():
        table.add_row(name, f"{count} ({count / len(rows):.0%})")
    console.print(table)
    console.print(
        f"kept {len(kept)} of {len(rows)} rows -> {path} ({time.perf_counter() - start:.0f} s, "
        f"{tokens['tokens/generated']:.0f} tokens generated)"
    )
    return {
        "rows": float(len(rows)),
        "kept": float(len(kept)),
        "mean_pass_rate": sum(rates) / len(rates),
        **{f"count/{name}": float(n) for name, n in counts.items()},
    }

"""``lmrl demo``: the whole pipeline on a built-in tiny model and task, on CPU, in minutes.

Stage 1 is SFT of a random built-in model on the built-in arithmetic task; the
demo prints held-out accuracy before and after and where the run directory,
plots and samples are.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rich.table import Table

from lmrl.config import field, load_config
from lmrl.tracking import console
from lmrl.trainers import sft


@dataclasses.dataclass
class DemoConfig:
    output_dir: str = field("runs/demo", "where the demo's runs go (one sub-directory per stage)")
    sft_recipe: str = field("sft/tiny_arithmetic", "recipe of the SFT stage")
    sft_steps: int | None = field(None, "override the SFT recipe's max_steps (shorter demo)")
    seed: int = field(0, "seed of every stage")
    overwrite: bool = field(True, "replace an earlier demo in output_dir")


def run(config: DemoConfig) -> dict[str, float]:
    root = Path(config.output_dir)
    overrides = [f"output_dir={root / 'sft'}", f"seed={config.seed}", f"overwrite={config.overwrite}"]
    if config.sft_steps:
        overrides.append(f"max_steps={config.sft_steps}")
    sft_config = load_config(sft.SFTConfig, config.sft_recipe, overrides)
    console.rule("[bold]lmrl demo, stage 1: SFT")
    result = sft.train(sft_config)
    table = Table(title="lmrl demo: held-out accuracy (greedy, built-in arithmetic task)")
    table.add_column("model")
    table.add_column("accuracy", justify="right")
    table.add_row("random init (before SFT)", f"{result['initial/eval/accuracy']:.1%}")
    table.add_row("after SFT", f"{result['eval/accuracy']:.1%}")
    console.print(table)
    run_dir = Path(sft_config.output_dir)
    console.print(
        f"run directory: {run_dir}\n  metrics: {run_dir / 'metrics.jsonl'}\n  samples: {run_dir / 'samples.jsonl'}\n"
        f"  plots:   {run_dir / 'plots'}\n  model:   {run_dir / 'final'} "
        f"(try: lmrl generate model={run_dir / 'final'} prompts='[\"23+45=\"]')"
    )
    return result

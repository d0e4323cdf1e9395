"""``lmrl demo``: the whole pipeline on a built-in tiny model and task, on CPU, in minutes.

Stage 1 fine-tunes a random built-in model with SFT on the built-in arithmetic
task; stage 2 continues from it with GRPO (reward: the task's verifier). The demo
prints held-out accuracy (greedy) after each stage, and where the run
directories, plots and samples are.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path

from rich.table import Table

from lmrl.config import field, load_config
from lmrl.data.loading import load_rows
from lmrl.tracking import console


@dataclasses.dataclass
class DemoConfig:
    output_dir: str = field("runs/demo", "where the demo's runs go (one sub-directory per stage)")
    sft_recipe: str = field("sft/demo_arithmetic", "recipe of the SFT stage")
    rl_recipe: str = field("rl/demo_arithmetic_grpo", "recipe of the RL stage (its model is the SFT result)")
    sft_steps: int | None = field(None, "override the SFT recipe's max_steps")
    rl_steps: int | None = field(None, "override the RL recipe's max_steps (0: skip the RL stage)")
    seed: int = field(0, "seed of every stage")
    overwrite: bool = field(True, "replace an earlier demo in output_dir")


def _stage_overrides(config: DemoConfig, out: Path, steps: int | None) -> list[str]:
    overrides = [f"output_dir={out}", f"seed={config.seed}", f"overwrite={str(config.overwrite).lower()}"]
    return overrides + ([f"max_steps={steps}"] if steps else [])


def next_command(final: Path, sft_config, n: int = 3) -> str:
    """The `lmrl generate` line the demo suggests: the trained model, greedy, on the first `n` held-out prompts of the
    SFT stage's data (2-digit additions for the shipped recipes: what the model was trained and measured on)."""
    rows = load_rows(
        sft_config.eval_dataset or sft_config.dataset, split=sft_config.eval_split, limit=n, **sft_config.task_args
    )
    prompts = json.dumps([row["prompt"] for row in rows])
    return f"lmrl generate model={final} prompts={shlex.quote(prompts)} temperature=0"


def run(config: DemoConfig) -> dict[str, float]:
    # here: `lmrl demo`'s config checks without torch (lmrl.cli)
    from lmrl.trainers.rl import trainer as online
    from lmrl.trainers.sft import trainer as sft

    root = Path(config.output_dir)
    sft_config = load_config(sft.SFTConfig, config.sft_recipe, _stage_overrides(config, root / "sft", config.sft_steps))
    rl_config = None
    if config.rl_steps != 0:
        rl_config = load_config(
            online.RLConfig,
            config.rl_recipe,
            _stage_overrides(config, root / "rl", config.rl_steps) + [f"model={root / 'sft' / 'final'}"],
        )
    console.rule("[bold]lmrl demo, stage 1: SFT")
    sft_result = sft.train(sft_config)
    results = {"random init": sft_result["initial/eval/accuracy"], "after SFT": sft_result["eval/accuracy"]}
    runs = [Path(sft_config.output_dir)]
    if rl_config is not None:
        console.rule(f"[bold]lmrl demo, stage 2: {rl_config.algorithm.upper()}")
        rl_result = online.train(rl_config)
        results[f"after SFT + {rl_config.algorithm.upper()}"] = rl_result["eval/accuracy"]
        runs.append(Path(rl_config.output_dir))
    table = Table(title=f"lmrl demo: held-out accuracy (greedy, {sft_config.dataset}, {sft_config.task_args})")
    table.add_column("model")
    table.add_column("accuracy", justify="right")
    for name, accuracy in results.items():
        table.add_row(name, f"{accuracy:.1%}")
    console.print(table)
    for run_dir in runs:
        console.print(f"{run_dir}: metrics.jsonl, samples.jsonl, plots/, final/")
    final = runs[-1] / "final"
    console.print(f"Try: {next_command(final, sft_config)}", soft_wrap=True, markup=False)  # one line to copy
    return results

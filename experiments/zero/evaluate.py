"""Greedy held-out accuracy of the zero-RL recipe's start model and of each seed's final model, with the run's prompt
format and stop strings, and the seeds' mean and spread (experiments/zero/seed<N>.json, summary.json).

    .venv/bin/lmrl rl --config rl/smollm2_zero_grpo seed=N output_dir=runs/zero/seedN     # N = 0, 1, 2
    .venv/bin/python experiments/zero/evaluate.py 0 1 2
"""

import json
import statistics
import sys
from pathlib import Path

import torch

from lmrl.config import load_config
from lmrl.data.prompt_format import PromptFormat
from lmrl.eval.generation import task_accuracy
from lmrl.models.loading import load_model_and_tokenizer
from lmrl.tracking import read_jsonl
from lmrl.trainers.rl import trainer as online
from lmrl.trainers.rl.prompts import load_prompts

HERE = Path(__file__).parent
MEASURED_BY = "experiments/zero/evaluate.py: task_accuracy, greedy, with the recipe's prompt format and stop strings"


def accuracy(config, eval_rows, path: str) -> float:
    model, tok = load_model_and_tokenizer(path, chat=False)
    acc, samples = task_accuracy(
        model.eval(),
        tok,
        eval_rows,
        config.max_new_tokens,
        torch.bfloat16,
        num_samples=3,
        prompt_format=PromptFormat.from_config(config),
        stop_strings=tuple(config.stop),
    )
    print(path, acc, [s["completion"] for s in samples], flush=True)
    return acc["accuracy"]


def main(seeds: list[int]) -> None:
    config = load_config(online.RLConfig, "rl/smollm2_zero_grpo", ["output_dir=/tmp/zero_eval_unused"])
    _, eval_rows = load_prompts(config)
    start = accuracy(config, eval_rows, config.model)  # greedy: the same for every seed
    finals = {}
    for seed in seeds:
        run = Path(f"runs/zero/seed{seed}")
        finals[seed] = accuracy(config, eval_rows, str(run / "final"))
        rows = read_jsonl(run / "metrics.jsonl")
        curve = [{"step": r["step"], "reward/mean": r["reward/mean"]} for r in rows if "reward/mean" in r]
        record = {
            "recipe": "rl/smollm2_zero_grpo",
            "seed": seed,
            "steps": config.max_steps,
            "held_out_greedy_accuracy": {
                "start": start,
                "final": finals[seed],
                "rows": len(eval_rows),
                "measured_by": MEASURED_BY,
            },
            "train_reward_curve": curve,
        }
        (HERE / f"seed{seed}.json").write_text(json.dumps(record, indent=1) + "\n")
    values = list(finals.values())
    summary = {
        "recipe": "rl/smollm2_zero_grpo",
        "seeds": seeds,
        "start": start,
        "final": finals,
        "final_mean": statistics.mean(values),
        "final_stdev": statistics.stdev(values) if len(values) > 1 else 0.0,
        "final_min": min(values),
        "final_max": max(values),
        "rows": len(eval_rows),
        "measured_by": MEASURED_BY,
    }
    (HERE / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary))


if __name__ == "__main__":
    main([int(s) for s in sys.argv[1:]] or [0, 1, 2])

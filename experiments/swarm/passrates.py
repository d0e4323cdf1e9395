"""Per-family pass rates of a model, sampled as a swarm node samples (its temperature, top_p, max_new_tokens).

    python experiments/swarm/passrates.py runs/swarm-learnable/warm_start/<hash>/sft/final --recipe swarm/tiny_sim_learnable

For every task family of the recipe's mix: `questions` training-split questions (drawn with the
recipe's ``task_args``, as the nodes draw theirs) and `samples` completions each, scored by the task's
verifier; the pass rate is the mean score (``avg@samples`` of `lmrl eval`). Used by ``run.py`` on the
warm start (is every family learnable?) and on the nodes' final models (which families were learned).
"""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path

SEED = 1
"""Seed of the measured questions (the warm start's SFT data uses `warm_start_seed`, 0)."""


def family_pass_rates(
    model: str, config, questions: int = 48, samples: int = 16, log: Path | None = None
) -> dict[str, float]:
    """{task: mean 0/1 score of `samples` sampled completions on each of `questions` questions} for `model`
    under the swarm config's sampling settings; `lmrl eval`'s console output goes to `log` (or is dropped)."""
    from lmrl.eval.cli import EvalConfig, run

    rates = {}
    with open(log or "/dev/null", "a") as f, contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
        for name in dict.fromkeys(config.tasks):
            dataset = name if name.startswith("rg:") else f"task:{name}"
            metrics = run(
                EvalConfig(
                    model=model,
                    dataset=dataset,
                    split="train",
                    rows=questions,
                    task_args={**config.task_args.get(name, {}), "seed": SEED},
                    metrics=[f"avg@{samples}"],
                    samples=samples,
                    temperature=config.temperature,
                    top_p=config.top_p,
                    max_new_tokens=config.max_new_tokens,
                    precision=config.precision,
                    seed=SEED,
                    output_file="/dev/null",
                    num_samples=0,
                )
            )
            rates[name] = round(metrics[f"avg@{samples}"], 4)
    return rates


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", help="model directory (e.g. a warm start's sft/final or a node's final)")
    parser.add_argument("--recipe", default="swarm/tiny_sim_learnable", help="swarm recipe with the task mix")
    parser.add_argument("--questions", type=int, default=48)
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="overrides of the recipe")
    args = parser.parse_args()
    from lmrl.config import load_config
    from lmrl.swarm.config import SwarmConfig

    config = load_config(SwarmConfig, args.recipe, args.set)
    print(json.dumps(family_pass_rates(args.model, config, args.questions, args.samples), indent=1))


if __name__ == "__main__":
    main()

"""Swarm sharing at equal samples per round: 8/0, 6/2, 4/4, 2/6 (local/external) x seeds (results: docs/swarm.md).

    python experiments/swarm/run.py                         # warm start + 4 configs x 5 seeds + plot (one core)
    python experiments/swarm/run.py --seeds 0 --workers 2   # one seed, two processes
    python experiments/swarm/run.py --plot-only             # re-make plot and results from the run dirs
    python experiments/swarm/run.py --set max_steps=5       # smoke test
    python experiments/swarm/run.py --recipe swarm/tiny_sim_learnable --seeds 0 1 2 --out runs/swarm-learnable \
        --results experiments/swarm/learnable                # the mix where every family is learnable

Every simulation is a shipped swarm recipe (``--recipe``, default ``swarm/tiny_sim``) run
in-process (``lmrl swarm --config <recipe> local=I external=J seed=S``): 8 nodes, each
round every node samples I questions (2 completions each) from the recipe's task mix,
publishes them, and trains on its I groups plus J groups from its peers (I+J = 8
question groups per node and round in every configuration, as in the paper).
All runs share one warm start (an SFT of the tiny model on the task mix, cached in
``<out>/warm_start``), like the paper's nodes share one instruct model. The seed
changes the nodes' questions, sampling and peer selection. Simulations whose
``swarm_summary.json`` exists are skipped (``--force`` re-runs them), so more seeds
can be added later. Before the simulations, the warm start's pass rate on each task
family is measured (sampled with the training settings, ``passrates.py``); after them,
that of every node's final model (``<run>/pass_rates.json``). Workers use one torch
thread each (two threads per process are far slower on the shared CPU); the default is
one worker, to leave a core free.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from passrates import family_pass_rates  # noqa: E402

CONFIGS = [(8, 0), (6, 2), (4, 4), (2, 6)]


def _one_thread() -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)


def run_sim(recipe: str, name: str, overrides: list[str], out: str) -> tuple[str, float]:
    """One simulation of the recipe with overrides; console output goes to ``<out>/<name>.log``."""
    _one_thread()
    from lmrl.config import load_config
    from lmrl.swarm.cli import run
    from lmrl.swarm.config import SwarmConfig

    start = time.time()
    with open(Path(out) / f"{name}.log", "w") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        run(
            load_config(
                SwarmConfig,
                recipe,
                [
                    f"output_dir={Path(out) / name}",
                    "overwrite=true",
                    f"warm_start_dir={Path(out) / 'warm_start'}",
                    *overrides,
                ],
            )
        )
    return name, time.time() - start


def load(recipe: str, overrides: list[str]):
    from lmrl.config import load_config
    from lmrl.swarm.config import SwarmConfig

    return load_config(SwarmConfig, recipe, overrides)


def warm_start(recipe: str, out: Path, overrides: list[str]) -> dict[str, float]:
    """The recipe's warm-started model (SFT on the task mix, cached in ``<out>/warm_start``) and its pass rate
    per task family (``<out>/warm_start_pass_rates.json``)."""
    from lmrl.swarm.sim import warm_start_model

    config = load(recipe, [f"warm_start_dir={out / 'warm_start'}", *overrides])
    with open(out / "warm_start.log", "a") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        model = warm_start_model(config, config.model, config.model_args, out / "warm_start")
    rates = {"model": model, "pass_rates": family_pass_rates(model, config, log=out / "warm_start.log")}
    (out / "warm_start_pass_rates.json").write_text(json.dumps(rates, indent=1))
    return rates["pass_rates"]


def final_pass_rates(recipe: str, run_dir: Path, overrides: list[str]) -> dict[str, dict[str, float]]:
    """Pass rate per task family of every node's final model of one simulation (cached in the run dir)."""
    path = run_dir / "pass_rates.json"
    if not path.exists() or path.stat().st_mtime < (run_dir / "swarm_summary.json").stat().st_mtime:
        config = load(recipe, overrides)
        rates = {
            node.name: family_pass_rates(str(node / "final"), config, log=run_dir / "pass_rates.log")
            for node in sorted((run_dir / "nodes").iterdir())
        }
        path.write_text(json.dumps(rates, indent=1))
    return json.loads(path.read_text())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", default="swarm/tiny_sim", help="the swarm recipe every simulation runs")
    parser.add_argument("--results", default=str(HERE), help="where results.json and the plot go")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="simulation seeds")
    parser.add_argument("--workers", type=int, default=1, help="parallel single-thread simulation processes")
    parser.add_argument("--out", default="runs/swarm-experiment", help="directory of the run directories")
    parser.add_argument("--force", action="store_true", help="re-run simulations that already have a summary")
    parser.add_argument("--plot-only", action="store_true", help="skip training; summarise existing runs")
    parser.add_argument(
        "--configs",
        nargs="+",
        default=[f"{i}/{j}" for i, j in CONFIGS],
        metavar="I/J",
        help="local/external splits to run (default: all four)",
    )
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="overrides for every simulation")
    args = parser.parse_args(argv)
    _one_thread()
    from plot import write_results

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    configs = [tuple(int(x) for x in c.split("/")) for c in args.configs]
    runs = [
        (f"{i}-{j}-s{s}", [f"local={i}", f"external={j}", f"seed={s}", *args.set])
        for s in args.seeds
        for i, j in configs
    ]
    start = time.time()
    if not args.plot_only:
        rates = warm_start(args.recipe, out, args.set)  # shared by every simulation: done once, then cached
        print(f"warm start: {time.time() - start:.0f} s; pass rates {rates}", flush=True)
        todo = [(n, o) for n, o in runs if args.force or not (out / n / "swarm_summary.json").exists()]
        with ProcessPoolExecutor(max_workers=args.workers) as pool:
            for name, seconds in pool.map(
                run_sim, [args.recipe] * len(todo), [n for n, _ in todo], [o for _, o in todo], [str(out)] * len(todo)
            ):
                print(f"{name}: {seconds:.0f} s", flush=True)
        for name, overrides in runs:
            if (out / name / "swarm_summary.json").exists():
                final_pass_rates(args.recipe, out / name, overrides)
    elapsed = time.time() - start
    command = "python experiments/swarm/run.py " + " ".join(argv if argv is not None else sys.argv[1:])
    write_results(
        out,
        args.seeds,
        configs,
        Path(args.results),
        command.strip(),
        elapsed if not args.plot_only else None,
        args.recipe,
    )


if __name__ == "__main__":
    main()

"""CE vs avatarl at equal model size and equal tokens on the built-in corpus (results: docs/avatarl.md).

    python experiments/avatarl/run.py                       # critic + 3 seeds of each student + plot
    python experiments/avatarl/run.py --seeds 0 --workers 1 # one seed, one core
    python experiments/avatarl/run.py --ablations           # + avatarl without entropy bonus / with threshold=mean
    python experiments/avatarl/run.py --plot-only           # re-make plot and results from the run dirs

Stages whose ``final/`` model exists are skipped (``--force`` retrains), so an interrupted
experiment continues where it stopped and ``--ablations`` adds to an existing one.

Every stage is a shipped recipe run in-process (``lmrl pretrain --config <recipe> ...``):
1. critic   pretrain/ce_tiny_pydoc          CE, builtin:tiny, 819k tokens of the training split
2. students pretrain/ce_student_tiny_pydoc  CE baseline, 410k tokens      } seed s: same init and
            pretrain/avatarl_tiny_pydoc     avatarl + the critic, 410k    } same data order
3. experiments/avatarl/plot.py: avatarl_vs_ce.png and results.json next to this file.
The CE students do not need the critic, so they run next to it; workers use one torch thread
each (two threads per process are ~4x slower on the shared 2-core machine).
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

CRITIC = "pretrain/ce_tiny_pydoc"
STUDENTS = {"ce": "pretrain/ce_student_tiny_pydoc", "avatarl": "pretrain/avatarl_tiny_pydoc"}


def _one_thread() -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)


def run_stage(name: str, recipe: str, overrides: list[str], out: str) -> tuple[str, float]:
    """Train one recipe with overrides; the console output goes to ``<out>/<name>.log``. Returns (name, seconds)."""
    from lmrl.config import load_config
    from lmrl.trainers.pretrain.trainer import PretrainConfig, train

    start = time.time()
    Path(out).mkdir(parents=True, exist_ok=True)
    with open(Path(out) / f"{name}.log", "w") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        train(load_config(PretrainConfig, recipe, [f"output_dir={Path(out) / name}", "overwrite=true", *overrides]))
    return name, time.time() - start


ABLATIONS = {"avatarl-noentropy": ["entropy_coef=0"], "avatarl-meanthreshold": ["threshold=mean"]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="student seeds (init and data order)")
    parser.add_argument("--workers", type=int, default=2, help="parallel single-thread training processes")
    parser.add_argument("--out", default="runs/avatarl-experiment", help="directory of the run directories")
    parser.add_argument(
        "--ablations",
        action="store_true",
        help="also run avatarl with entropy_coef=0 and with threshold=mean (every seed)",
    )
    parser.add_argument("--force", action="store_true", help="retrain stages whose final/ model already exists")
    parser.add_argument("--plot-only", action="store_true", help="skip training; summarise existing runs")
    parser.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="overrides for every stage, e.g. a smoke test: --set max_steps=20 eval_every=10",
    )
    args = parser.parse_args(argv)
    _one_thread()  # the final evaluation in plot.py runs in this process
    from plot import write_results

    out = Path(args.out)
    critic_dir = out / "critic" / "final"
    students = [(f"ce-s{s}", STUDENTS["ce"], [f"seed={s}"]) for s in args.seeds]
    avatarl = [(f"avatarl-s{s}", STUDENTS["avatarl"], [f"seed={s}"]) for s in args.seeds]
    if args.ablations:
        avatarl += [
            (f"{name}-s{s}", STUDENTS["avatarl"], [f"seed={s}", *extra])
            for s in args.seeds
            for name, extra in ABLATIONS.items()
        ]
    todo = (
        []
        if args.plot_only
        else [
            job
            for job in [("critic", CRITIC, []), *students, *avatarl]
            if args.force or not (out / job[0] / "final").exists()
        ]
    )
    started = time.time()
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(args.workers, mp_context=ctx, initializer=_one_thread) as pool:
        submit = lambda name, recipe, extra: pool.submit(run_stage, name, recipe, [*extra, *args.set], str(out))  # noqa: E731
        # CE runs first: the critic and the CE students need nothing; the avatarl students need the critic.
        first = [job for job in todo if not job[0].startswith("avatarl")]
        futures = [submit(*job) for job in first]
        for future, job in zip(futures, first):
            if job[0] == "critic":
                print(f"critic done in {future.result()[1]:.0f} s", flush=True)
        futures += [
            submit(name, recipe, [*extra, f"critic={critic_dir}"])
            for name, recipe, extra in todo
            if name.startswith("avatarl")
        ]
        for future in futures:
            name, seconds = future.result()
            print(f"{name} done in {seconds:.0f} s", flush=True)
    if todo:
        print(f"{len(todo)} runs done in {time.time() - started:.0f} s wall-clock", flush=True)
    results = write_results(out, args.seeds, HERE)
    print(f"wrote {HERE / 'avatarl_vs_ce.png'} and {HERE / 'results.json'}")
    for objective in ("ce", "avatarl"):
        s = results["summary"][objective]
        print(f"{objective:8s} final val/ce {s['mean']:.4f} +- {s['std']:.4f} over seeds {args.seeds}")
    for name, value in results["ablations"].items():
        print(f"{name:24s} final val/ce {value['mean']:.4f} +- {value['std']:.4f} over seeds {value['seeds']}")
    print(f"critic   final val/ce {results['critic']['val_ce']:.4f}")


if __name__ == "__main__":
    main()

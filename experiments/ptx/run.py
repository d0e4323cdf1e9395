"""PPO-ptx against forgetting: GRPO with and without the pretraining term, from a model that knows the text.

    python experiments/ptx/run.py                               # pretrain, SFT, GRPO x {0, 1} x seeds 0 1 2
    python experiments/ptx/run.py --pretrained runs/avatarl-experiment/critic/final   # reuse a pydoc CE model
    python experiments/ptx/run.py --summary-only                # re-make results.json and the plot

Stages (each a shipped recipe, run in a single-thread process; a stage whose ``final/`` exists is skipped):
1. pretrain  pretrain/ce_tiny_pydoc: builtin:tiny learns the built-in pydoc text (CE, 819k tokens).
2. sft       sft/demo_arithmetic from 1: 2-digit addition until held-out accuracy >= 25% (seed 0, fp32).
3. grpo      rl/demo_arithmetic_grpo from 2 (400 steps), ``ptx_dataset=builtin:pydoc``, ``ptx_coef`` in
             ``--coefs``; the seed changes prompts and sampling, the start (2) is shared, so each seed is paired.
Forgetting is ``eval/ptx_ce``: cross-entropy (nats/char) of held-out pydoc windows, logged at every evaluation of
every run, ``ptx_coef=0`` included. Results: results.json and ptx_forgetting.png next to this file (docs/guide.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

HERE = Path(__file__).resolve().parent
PTX = ["ptx_dataset=builtin:pydoc", "eval_every=50", "precision=fp32"]


def _one_thread() -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)


def train_verb(verb: str, recipe: str, overrides: list[str], run_dir: Path) -> float:
    """``lmrl <verb> --config <recipe> <overrides>`` in this process, console to ``<run_dir>.log``; seconds taken."""
    from lmrl.config import load_config

    if verb == "pretrain":
        from lmrl.trainers.pretrain.trainer import PretrainConfig as Config
        from lmrl.trainers.pretrain.trainer import train
    elif verb == "sft":
        from lmrl.trainers.sft.trainer import SFTConfig as Config
        from lmrl.trainers.sft.trainer import train
    else:
        from lmrl.trainers.rl.trainer import RLConfig as Config
        from lmrl.trainers.rl.trainer import train
    start = time.time()
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{run_dir}.log", "w") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        train(load_config(Config, recipe, [f"output_dir={run_dir}", "overwrite=true", *overrides]))
    return time.time() - start


def pretraining_ce(model_dir: Path) -> float:
    """eval/ptx_ce of a saved model: the same held-out windows the GRPO runs evaluate."""
    from types import SimpleNamespace

    from lmrl.data.tokenizers import load_tokenizer
    from lmrl.models import load_model
    from lmrl.trainers.rl.ptx import PretrainingMix
    from lmrl.trainers.rl.sections import PtxSection

    defaults = {name: PtxSection.__dataclass_fields__[name].default for name in ("ptx_batch_size", "ptx_block_size")}
    config = SimpleNamespace(ptx_dataset="builtin:pydoc", ptx_coef=0.0, seed=0, **defaults)
    mix = PretrainingMix(config, load_tokenizer(str(model_dir)))
    return mix.forgetting(load_model(str(model_dir)), None, 128)["eval/ptx_ce"]


def run_name(coef: float, seed: int) -> str:
    return f"grpo-ptx{coef:g}-s{seed}"


def curves(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from lmrl.tracking import read_jsonl

    rows = read_jsonl(run_dir / "metrics.jsonl")
    return {key: [(r["step"], r[key]) for r in rows if key in r] for key in ("eval/ptx_ce", "eval/accuracy")}


def summarize(out: Path, coefs: list[float], seeds: list[int], pretrained: Path) -> dict:
    """Per-run start/end of eval/ptx_ce and eval/accuracy, and per-coef mean +- sample std over seeds."""
    runs = {run_name(c, s): curves(out / run_name(c, s)) for c in coefs for s in seeds}
    per_coef = {}
    for c in coefs:
        names = [run_name(c, s) for s in seeds]
        ends = {key: [runs[n][key][-1][1] for n in names] for key in ("eval/ptx_ce", "eval/accuracy")}
        per_coef[f"{c:g}"] = {
            key: {"values": v, "mean": statistics.fmean(v), "std": statistics.stdev(v) if len(v) > 1 else 0.0}
            for key, v in ends.items()
        }
    start = runs[run_name(coefs[0], seeds[0])]
    return {
        "command": "python experiments/ptx/run.py --coefs "
        + " ".join(f"{c:g}" for c in coefs)
        + " --seeds "
        + " ".join(map(str, seeds)),
        "ptx_ce_pretrained": pretraining_ce(pretrained),
        "ptx_ce_after_sft": start["eval/ptx_ce"][0][1],
        "accuracy_after_sft": start["eval/accuracy"][0][1],
        "final": per_coef,
        "curves": runs,
        "seeds": seeds,
    }


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, coef in enumerate(results["final"]):
        for name, run in results["curves"].items():
            if name.startswith(f"grpo-ptx{coef}-"):
                for ax, key in zip(axes, ("eval/ptx_ce", "eval/accuracy")):
                    ax.plot(
                        *zip(*run[key]),
                        color=colors[i],
                        alpha=0.7,
                        label=f"ptx_coef={coef}" if name.endswith(f"-s{results['seeds'][0]}") else None,
                    )
    axes[0].axhline(results["ptx_ce_pretrained"], color="gray", ls="--", label="pretrained model (before SFT)")
    axes[0].set(title="forgetting: held-out pydoc CE (nats/char)", xlabel="GRPO step")
    axes[1].set(title="held-out greedy accuracy (2-digit addition)", xlabel="GRPO step")
    for ax in axes:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--coefs", type=float, nargs="+", default=[0.0, 1.0], help="ptx_coef values (gamma)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="GRPO seeds")
    parser.add_argument("--workers", type=int, default=1, help="parallel single-thread GRPO processes")
    parser.add_argument("--out", default="runs/ptx-experiment", help="directory of the run directories")
    parser.add_argument("--pretrained", help="a CE model of builtin:pydoc to start from (default: train stage 1)")
    parser.add_argument("--summary-only", action="store_true", help="skip training; summarise existing runs")
    parser.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="overrides for every stage, e.g. a smoke test: --set max_steps=4 eval_every=2",
    )
    args = parser.parse_args(argv)
    _one_thread()
    out = Path(args.out)
    pretrained = Path(args.pretrained) if args.pretrained else out / "pretrain" / "final"
    sft = out / "sft"
    with ProcessPoolExecutor(args.workers, mp_context=get_context("spawn"), initializer=_one_thread) as pool:
        if not args.summary_only:
            if not pretrained.exists():
                seconds = pool.submit(
                    train_verb, "pretrain", "pretrain/ce_tiny_pydoc", args.set, pretrained.parent
                ).result()
                print(f"pretrain: {seconds:.0f} s", flush=True)
            if not (sft / "final").exists():
                seconds = pool.submit(
                    train_verb,
                    "sft",
                    "sft/demo_arithmetic",
                    [f"model={pretrained}", "precision=fp32", "seed=0", *args.set],
                    sft,
                ).result()
                print(f"sft: {seconds:.0f} s", flush=True)
            jobs = {
                run_name(c, s): pool.submit(
                    train_verb,
                    "rl",
                    "rl/demo_arithmetic_grpo",
                    [f"model={sft / 'final'}", f"ptx_coef={c}", f"seed={s}", *PTX, *args.set],
                    out / run_name(c, s),
                )
                for s in args.seeds
                for c in args.coefs
                if not (out / run_name(c, s) / "final").exists()
            }
            for name, job in jobs.items():
                print(f"{name}: {job.result():.0f} s", flush=True)
    results = summarize(out, args.coefs, args.seeds, pretrained)
    (HERE / "results.json").write_text(json.dumps(results, indent=1))
    plot(results, HERE / "ptx_forgetting.png")
    print(
        f"pydoc CE: pretrained {results['ptx_ce_pretrained']:.3f}, after SFT {results['ptx_ce_after_sft']:.3f}; "
        f"accuracy after SFT {results['accuracy_after_sft']:.3f}"
    )
    for coef, final in results["final"].items():
        ce, acc = final["eval/ptx_ce"], final["eval/accuracy"]
        print(
            f"ptx_coef={coef}: after GRPO pydoc CE {ce['mean']:.3f} +- {ce['std']:.3f}, "
            f"accuracy {acc['mean']:.3f} +- {acc['std']:.3f}"
        )


if __name__ == "__main__":
    sys.exit(main())

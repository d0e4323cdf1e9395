"""Does a calculator help the tiny model, and does GRPO learn to use it? `tool_arithmetic` with and without tools.

Per condition (with the calculator / without tools: the same problems answered directly), the shipped recipes
with the same steps, batch and learning rates:
  1. SFT stage 1 (`sft/tiny_calculator`, 400 steps) and stage 2 (`sft/tiny_calculator_more`, 400 more steps with a
     checkpoint every 50), seed 0; the warm start is stage 2's checkpoint at `--warm-step` (a partial SFT model).
  2. GRPO (`rl/tiny_calculator_grpo`) from that warm start, one run per seed: multi-turn with the calculator,
     single-turn without.
  3. Held-out greedy accuracy (100 test problems) of the warm start, after GRPO and after all 800 SFT steps;
     pass@k and pass^k (k = 1, 2, 4) from `--n` samples (temperature 0.5, as in GRPO) on `--passk-rows` test problems,
     measured by `lmrl eval` with the tool keys (`pass_k`).
Stages whose output exists are reused. Results: docs/img/tools_results.json and docs/img/tools.png.

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/tool_use.py     # the run in docs/tools.md (~30 min, 1 core)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def lmrl(verb: str, args: list[str], out: Path, done: Path) -> None:
    if done.exists():
        return
    with open(f"{out}.log", "w") as f:
        subprocess.run(
            [sys.executable, "-m", "lmrl", verb, *args, f"output_dir={out}", "overwrite=true"],
            check=True,
            stdout=f,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )


def condition(tools: bool) -> list[str]:
    return [] if tools else ["tools=[]", "task_args={digits: 2, tools: false}"]


def evals(path: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return {r["step"]: r["eval/accuracy"] for r in rows if "eval/accuracy" in r}


def run_condition(tools: bool, out: Path, a) -> list[dict]:
    tag = "tools" if tools else "notools"
    sft1, sft2 = out / f"sft1-{tag}", out / f"sft2-{tag}"
    lmrl("sft", ["--config", "sft/tiny_calculator", *condition(tools), "seed=0"], sft1, sft1 / "final")
    lmrl(
        "sft",
        ["--config", "sft/tiny_calculator_more", *condition(tools), "seed=0", f"model={sft1}/final"],
        sft2,
        sft2 / "final",
    )
    warm = sft2 / "checkpoints" / f"step-{a.warm_step}"
    sft_curve = evals(sft2 / "metrics.jsonl")
    results = []
    for seed in a.seeds:
        rl = out / f"rl-{tag}-s{seed}"
        lmrl(
            "rl",
            [
                "--config",
                "rl/tiny_calculator_grpo",
                *condition(tools),
                f"seed={seed}",
                f"model={warm}",
                f"max_steps={a.rl_steps}",
                f"eval_every={a.rl_steps // 3}",
                "save_every=0",
            ],
            rl,
            rl / "final",
        )
        rows = [json.loads(line) for line in (rl / "metrics.jsonl").read_text().splitlines()]
        curve = evals(rl / "metrics.jsonl")
        result = {
            "seed": seed,
            "tools": tools,
            "sft_stage2_accuracy": sft_curve,
            "warm_accuracy": curve[0],
            "rl_accuracy": curve[a.rl_steps],
            "rl_eval_curve": sorted(curve.items()),
            "rl_reward_curve": [(r["step"], r["reward/mean"]) for r in rows if "reward/mean" in r],
            "warm": pass_k(warm, tools, seed, a),
            "rl": pass_k(rl / "final", tools, seed, a),
        }
        print(
            json.dumps({k: v for k, v in result.items() if "curve" not in k and k != "sft_stage2_accuracy"}), flush=True
        )
        results.append(result)
    return results


def pass_k(model_dir: Path, tools: bool, seed: int, a) -> dict:
    """pass@k and pass^k of a model from a.n samples (temperature a.temperature) per held-out problem: `lmrl eval`,
    with the calculator as in GRPO (multi-turn, pythonic calls) or without tools (single-turn)."""
    out = model_dir.parent / f"passk-{model_dir.name}-s{seed}.json"
    tool_keys = ["tools=[calculator]", "tool_parser=pythonic", "max_turns=3", "max_total_tokens=160"] if tools else []
    subprocess.run(
        [sys.executable, "-m", "lmrl", "eval", *eval_args(model_dir, seed, a), *tool_keys, f"output_file={out}"],
        check=True,
        stdout=subprocess.DEVNULL,
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    metrics = json.loads(out.read_text())["metrics"]
    return {k: v for k, v in metrics.items() if k.startswith("pass")}


def eval_args(model_dir: Path, seed: int, a) -> list[str]:
    """`lmrl eval`'s keys of the pass@k table (docs/tools.md), less the tool keys."""
    return [
        f"model={model_dir}",
        "dataset=task:tool_arithmetic",
        "task_args={digits: 2}",
        f"rows={a.passk_rows}",
        "metrics=[pass@1,pass@2,pass@4,pass^1,pass^2,pass^4]",
        f"samples={a.n}",
        f"temperature={a.temperature}",
        "max_new_tokens=48",
        f"seed={seed}",
    ]


def summary(results: list[dict]) -> dict:
    """Mean and sample standard deviation over seeds of each number, per condition."""
    out = {}
    for tools in (True, False):
        rs = [r for r in results if r["tools"] == tools]
        values = {"warm_accuracy": [r["warm_accuracy"] for r in rs], "rl_accuracy": [r["rl_accuracy"] for r in rs]}
        for phase in ("warm", "rl"):
            for k in rs[0][phase]:
                values[f"{phase}/{k}"] = [r[phase][k] for r in rs]
        out["tools" if tools else "notools"] = {
            k: (statistics.mean(v), statistics.stdev(v) if len(v) > 1 else 0.0) for k, v in values.items()
        }
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--warm-step", type=int, default=150, help="stage-2 SFT checkpoint GRPO starts from")
    p.add_argument("--rl-steps", type=int, default=30)
    p.add_argument("--passk-rows", type=int, default=50)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--temperature", type=float, default=0.5)
    p.add_argument("--out", default="runs/tool_use")
    p.add_argument("--plot-only", action="store_true", help="redraw the plot from docs/img/tools_results.json")
    a = p.parse_args()
    if a.plot_only:
        results = json.loads((ROOT / "docs" / "img" / "tools_results.json").read_text())["results"]
        return plot(results, ROOT / "docs" / "img" / "tools.png")
    out = ROOT / a.out
    out.mkdir(parents=True, exist_ok=True)
    results = run_condition(True, out, a) + run_condition(False, out, a)
    report = {"args": vars(a), "summary": summary(results), "results": results}
    (ROOT / "docs" / "img" / "tools_results.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report["summary"], indent=1))
    plot(results, ROOT / "docs" / "img" / "tools.png")


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for r in results:
        color, label = ("tab:blue", "with calculator") if r["tools"] else ("tab:orange", "without tools")
        steps, acc = zip(*r["rl_eval_curve"])
        ax1.plot(steps, acc, "o-", color=color, alpha=0.7, label=label if r["seed"] == results[0]["seed"] else None)
    ax1.set(
        xlabel="GRPO step",
        ylabel="held-out greedy accuracy (100 problems)",
        ylim=(-0.02, 1.0),
        title="GRPO from the partial SFT warm start, one line per seed",
    )
    ax1.legend()
    ks = (1, 2, 4)
    for tools, color in ((True, "tab:blue"), (False, "tab:orange")):
        rs = [r for r in results if r["tools"] == tools]
        name = "calculator" if tools else "no tools"
        for kind, style in (("pass@", "-"), ("pass^", "--")):
            for phase, alpha, when in (("warm", 0.35, "SFT warm start"), ("rl", 1.0, "after GRPO")):
                if phase == "warm" and not tools:
                    continue
                mean = [statistics.mean(r[phase][f"{kind}{k}"] for r in rs) for k in ks]
                ax2.plot(ks, mean, style, marker="o", color=color, alpha=alpha, label=f"{name}, {kind}k, {when}")
    ax2.set(
        xlabel="k", ylabel="mean over seeds", xticks=ks, ylim=(-0.02, 1.0), title="pass@k (any of k) and pass^k (all k)"
    )
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()

"""Does a calculator help the tiny model? SFT warm start then GRPO on `tool_arithmetic`, with and without tools.

For each seed: (1) SFT on tool-use traces (tools=[calculator]) and, as the baseline, SFT on the same problems
answered directly, with the same steps, batch and learning rate; (2) GRPO from each SFT model with the same
prompts x samples and steps (multi-turn with the calculator, single-turn without); (3) held-out greedy
accuracy after each phase and pass@k / pass^k from n samples per held-out problem. Results go to
docs/img/tools_results.json and docs/img/tools.png.

    OMP_NUM_THREADS=1 PYTHONPATH=. python benchmarks/tool_use.py          # the run in docs/tools.md (~1 h on 2 shared cores)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ["tools=[calculator]", "tool_parser=pythonic", "max_turns=3", "max_total_tokens=160"]


def lmrl(verb: str, args: list[str], log: Path) -> None:
    cmd = [sys.executable, "-m", "lmrl", verb, *args]
    with open(log, "w") as f:
        subprocess.run(cmd, check=True, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})


def last(path: Path, key: str) -> float | None:
    value = None
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if key in row:
            value = row[key]
    return value


def run_seed(seed: int, tools: bool, out: Path, a) -> dict:
    tag = f"{'tools' if tools else 'notools'}-s{seed}"
    sft_dir, rl_dir = out / f"sft-{tag}", out / f"rl-{tag}"
    task = ["dataset=task:tool_arithmetic", f"task_args={{digits: {a.digits}, tools: {str(tools).lower()}}}",
            *(TOOLS if tools else [])]
    sft = [*task, "model=builtin:tiny", f"seed={seed}", "train_rows=4000", f"eval_rows={a.eval_rows}",
           "max_length=160", "batch_size=32", "lr=3e-3", "warmup_steps=20", "lr_schedule=cosine",
           f"max_steps={a.sft_steps}", "log_every=25", f"eval_every={a.sft_steps}", "save_every=0",
           "eval_max_new_tokens=48", f"output_dir={sft_dir}"]
    lmrl("sft", sft, out / f"sft-{tag}.log")
    rl = [*task, f"model={sft_dir}/final", f"seed={seed}", "train_rows=4000", f"eval_rows={a.eval_rows}",
          "algorithm=grpo", f"prompts_per_step={a.prompts}", f"samples_per_prompt={a.samples}", "max_new_tokens=48",
          "temperature=1.0", "rewards=[task]", f"lr={a.rl_lr}", f"max_steps={a.rl_steps}", "log_every=5",
          f"eval_every={a.rl_steps}", "save_every=0", "sample_every=20", f"output_dir={rl_dir}"]
    lmrl("rl", rl, out / f"rl-{tag}.log")
    result = {"seed": seed, "tools": tools,
              "sft_accuracy": last(sft_dir / "metrics.jsonl", "eval/accuracy"),
              "rl_accuracy": last(rl_dir / "metrics.jsonl", "eval/accuracy"),
              "rl_reward_curve": [(json.loads(l)["step"], json.loads(l)["reward/mean"])
                                  for l in (rl_dir / "metrics.jsonl").read_text().splitlines()
                                  if "reward/mean" in json.loads(l)]}
    result.update(pass_k(rl_dir / "final", tools, seed, a))
    print(json.dumps({k: v for k, v in result.items() if k != "rl_reward_curve"}), flush=True)
    return result


def pass_k(model_dir: Path, tools: bool, seed: int, a) -> dict:
    """pass@k and pass^k of a final model from a.n samples per held-out problem (temperature 1)."""
    import torch

    from lmrl.data.loading import load_rows
    from lmrl.data.tool_chat import ensure_tool_template
    from lmrl.eval.tools import tool_eval
    from lmrl.models import load_model_and_tokenizer
    from lmrl.rollout.env import tool_env_factory
    from lmrl.rollout.hf import HFEngine
    from lmrl.rollout.multiturn import MultiTurnOptions
    from lmrl.rollout.tool_parsers import get_parser
    from lmrl.rollout.tools import ToolBox, calculator

    torch.set_num_threads(1)
    model, tok = load_model_and_tokenizer(str(model_dir), None, seed)
    ensure_tool_template(tok)
    rows = load_rows("task:tool_arithmetic", split="test", limit=a.passk_rows, digits=a.digits)
    parser = get_parser("pythonic")
    box = ToolBox([calculator()] if tools else [])
    options = MultiTurnOptions(max_turns=3 if tools else 1, max_total_tokens=160, parser=parser)
    metrics, _ = tool_eval(HFEngine(model, tok), tok, rows, tool_env_factory(box, parser), options, 48, n=a.n,
                           ks=(1, 2, 4, 8), seed=seed)
    return {k: v for k, v in metrics.items() if k.startswith("pass")}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--digits", type=int, default=2)
    p.add_argument("--sft-steps", type=int, default=250)
    p.add_argument("--rl-steps", type=int, default=20)
    p.add_argument("--rl-lr", type=float, default=2e-4)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--eval-rows", type=int, default=100)
    p.add_argument("--passk-rows", type=int, default=50)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--parallel", type=int, default=2)
    p.add_argument("--out", default="runs/tool_use")
    p.add_argument("--collect", metavar="LOG", help="only gather the finished runs under --out (pass@k from the "
                   "JSON lines of this log of an earlier run) into the results and the plot")
    a = p.parse_args()
    out = ROOT / a.out
    out.mkdir(parents=True, exist_ok=True)
    if a.collect:
        return collect(out, Path(a.collect), a)
    jobs = [(s, t) for s in a.seeds for t in (True, False)]
    with ThreadPoolExecutor(a.parallel) as pool:
        results = list(pool.map(lambda job: run_seed(job[0], job[1], out, a), jobs))
    results.sort(key=lambda r: (r["seed"], not r["tools"]))
    (ROOT / "docs" / "img" / "tools_results.json").write_text(json.dumps({"args": vars(a), "results": results}, indent=1))
    plot(results, ROOT / "docs" / "img" / "tools.png")


def collect(out: Path, log: Path, a) -> None:
    """Results of the runs that finished (SFT and/or GRPO), for runs cut short by a deadline."""
    printed = [json.loads(line) for line in log.read_text().splitlines() if line.startswith('{"seed"')]
    results = []
    for seed in a.seeds:
        for tools in (True, False):
            tag = f"{'tools' if tools else 'notools'}-s{seed}"
            sft_m, rl_m = out / f"sft-{tag}" / "metrics.jsonl", out / f"rl-{tag}" / "metrics.jsonl"
            sft_rows = [json.loads(line) for line in sft_m.read_text().splitlines()] if sft_m.exists() else []
            if not any(r.get("step") == a.sft_steps and "eval/accuracy" in r for r in sft_rows):
                continue  # SFT did not finish
            rl_rows = [json.loads(line) for line in rl_m.read_text().splitlines()] if rl_m.exists() else []
            finished_rl = any(r.get("step") == a.rl_steps and "eval/accuracy" in r for r in rl_rows)
            result = {"seed": seed, "tools": tools, "sft_accuracy": last(sft_m, "eval/accuracy"),
                      "rl_accuracy": last(rl_m, "eval/accuracy") if finished_rl else None,
                      "rl_steps_done": max([r["step"] for r in rl_rows if "reward/mean" in r], default=0),
                      "rl_reward_curve": [(r["step"], r["reward/mean"]) for r in rl_rows if "reward/mean" in r]}
            result.update(next(({k: v for k, v in r.items() if k.startswith("pass")} for r in printed
                                if r["seed"] == seed and r["tools"] == tools), {}))
            results.append(result)
    (ROOT / "docs" / "img" / "tools_results.json").write_text(json.dumps({"args": vars(a), "results": results},
                                                                         indent=1))
    plot(results, ROOT / "docs" / "img" / "tools.png")


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for r in results:
        steps, rewards = zip(*r["rl_reward_curve"]) if r["rl_reward_curve"] else ((), ())
        ax1.plot(steps, rewards, color="tab:blue" if r["tools"] else "tab:orange", alpha=0.7,
                 label=("with calculator" if r["tools"] else "without tools") if r["seed"] == results[0]["seed"] else None)
    ax1.set(xlabel="GRPO step", ylabel="training reward (accuracy)", title="GRPO on tool_arithmetic")
    ax1.legend()
    for tools, color, dx in ((True, "tab:blue", -0.15), (False, "tab:orange", 0.15)):
        rs = [r for r in results if r["tools"] == tools]
        for i, key in enumerate(("sft_accuracy", "rl_accuracy")):
            vals = [r[key] for r in rs if r.get(key) is not None]
            ax2.scatter([i + dx] * len(vals), vals, color=color, label=("with calculator" if tools else "without tools")
                        if i == 0 else None)
    ax2.set_xticks([0, 1], ["after SFT", "after GRPO"])
    ax2.set(ylabel="held-out greedy accuracy", title="each dot: one seed", ylim=(-0.05, 1.05))
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()

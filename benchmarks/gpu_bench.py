"""GPU benchmark: lmrl vs TRL GRPO on random Qwen2.5-0.5B- and 1.5B-shaped models, one CUDA GPU, bf16.

    make gpu-bench                                    # = PYTHONPATH=. python3 benchmarks/gpu_bench.py
    make gpu-bench GPU_BENCH_ARGS="--out /tmp/gpu_bench.json --models 0.5b --steps 2"
    make gpu-bench GPU_BENCH_ARGS="--device cpu --small"   # the dry run on a CPU: a tiny Qwen2 model, both sides
    python3 benchmarks/gpu_bench.py --check-imports   # only: is every module both sides import there (seconds)

For each model of ``--models`` (0.5b: hidden 896, 24 layers, 14 heads, 2 KV heads, intermediate 4,864; 1.5b: hidden
1,536, 28 layers, 12 heads, 2 KV heads, intermediate 8,960; both a 151,936-entry vocabulary and tied embeddings, as
Qwen2.5-0.5B and -1.5B publish them; ``--small``: hidden 64, 2 layers, vocabulary 4,096) the parent builds a random
model from `transformers.Qwen2Config` (seed 0; nothing is downloaded) with the ``builtin:char`` tokenizer extended
to the vocabulary (`grpo_vs_trl.extended_char_tokenizer`: every sampled id decodes to text), saves it in fp32 with
the prompt rows (`grpo_vs_trl.prepare`), then runs each side in its own subprocess, one after the other, so that each
GPU peak is that side's own. Both sides get the settings of `benchmarks/grpo_vs_trl.py` (its `lmrl_config` and
`trl_setup` build them): the same prompt rows (plain arithmetic questions), ``--prompts`` B x ``--samples`` G
completions of at most ``--max-new-tokens`` per optimizer step (64 x 8 x 256), temperature 1, no top-k/top-p,
PPO-clip 0.2, token-mean loss, no KL (beta 0: no reference model), AdamW lr 1e-5, grad clip 1.0, bf16 autocast over
fp32 master weights, HF generation (lmrl ``engine=hf``; TRL without vLLM), and the reward ``hash``: a pseudo-random
number in [0, 1) fixed by each completion's text (`grpo_vs_trl.text_hash`), so a random model's groups have non-zero
advantages in both. Memory settings, the same on both sides: gradient checkpointing (TRL's default; lmrl
``gradient_checkpointing=true``; ``--no-grad-ckpt`` turns it off on both) and micro-batches of ``--micro-batch`` rows
with gradient accumulation to B*G (lmrl ``grad_accum``, TRL ``per_device_train_batch_size`` +
``gradient_accumulation_steps``; one generation of B*G completions and one optimizer step per step either way).

Each side runs ``--warmup`` step(s) (CUDA start-up, allocator, kernel selection), then up to ``--steps`` timed steps;
each step's end is stamped after `torch.cuda.synchronize` (lmrl: when ``rl_step`` returns; TRL: ``on_step_end``).
lmrl stops after its last step without the final evaluation and save (an exception from the wrapped ``rl_step``);
TRL has ``save_strategy="no"``. Reported per side:

- s/step, steps/s: (end of the last step - end of the last warm-up step) / timed steps;
- gen s/step: sampling seconds (lmrl ``time/rollout_s``; TRL ``_generate_single_turn``), the rest is training;
- tokens/s: completion tokens sampled in the timed steps per second;
- TFLOP/s and MFU: model FLOPs per second, 6*N per trained token (prompt + completion of each of the B*G rows:
  forward and backward) + 2*N per sampled token (completion tokens), N = all parameters (the tied embedding once: the
  LM head's matmul), attention's quadratic term and gradient checkpointing's recompute not counted; MFU divides by
  ``--peak-tflops`` (default 989: the H100/H200 SXM bf16 dense peak; n/a on a CPU unless given);
- peak GiB: `torch.cuda.max_memory_allocated` at the last step, in a fresh process per side (n/a on a CPU).

Time budget: ``--time-budget`` seconds (450) for the whole run. Each side gets a deadline (its share of the
remaining time, in proportion to the square root of its model's parameter count) after which it adds no more timed
steps (it always runs one); a side whose share is shorter than the longest start-up seen so far (child start to the
end of its warm-up) is skipped; a side still running at the end of the budget is killed and keeps its finished steps
(each child writes its results after every step). The table and ``--out`` JSON come out either way.

Needs, where it runs: torch, transformers (lmrl's minimum, pyproject.toml), trl and datasets (with dill,
multiprocess), accelerate, and lmrl's own imports (those of `make gpu-check`); ``--check-imports`` lists what is
missing and the run itself checks first. `make gpu-bench` installs wheels/*.whl (--no-index --no-deps) into
$(GPU_BENCH_SITE) first; docs/gpu.md ("GPU benchmark") lists the wheels a bare CUDA image needs.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gpu_check  # benchmarks/ is the script's folder, so on sys.path
import grpo_vs_trl

SIDES = ("lmrl", "trl")
SHAPES = {
    "0.5b": gpu_check.FULL,
    "1.5b": {
        **gpu_check.FULL,
        "hidden_size": 1536,
        "num_hidden_layers": 28,
        "num_attention_heads": 12,
        "num_key_value_heads": 2,
        "intermediate_size": 8960,
    },
    "small": gpu_check.SMALL,
}
"""Qwen2.5-0.5B's and -1.5B's architectures (their config.json; both tie the embeddings), and --small's."""
H100_H200_BF16_TFLOPS = 989.0
"""Dense bf16 peak of an H100 SXM and of an H200 (the same tensor cores): 989.4 TFLOP/s, without sparsity."""
REQUIRED = {
    "lmrl": ("torch", "transformers", "accelerate", "lmrl.trainers.rl.trainer"),
    "trl": ("torch", "transformers", "accelerate", "datasets", "dill", "multiprocess", "trl"),
}
"""The modules each side imports (`check_imports`); trl.GRPOTrainer is imported too, its own imports with it."""


class Finished(Exception):
    """Raised from the wrapped ``rl_step`` after lmrl's last step: the run ends without its final evaluation/save."""


# ----------------------------------------------------------------------------- imports


def lmrl_transformers_spec() -> str:
    """lmrl's transformers requirement, from pyproject.toml (lmrl is not installed on a GPU machine)."""
    import tomllib

    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    return next(d.split(";")[0].strip() for d in deps if d.startswith("transformers"))


def check_imports(sides: list[str], device: str) -> list[str]:
    """Import every module ``sides`` need and print one line each (version, or the error); returns the problems:
    missing modules, a transformers older than lmrl's minimum, no CUDA for --device cuda."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.requirements import Requirement

    problems = []
    modules = dict.fromkeys(m for side in sides for m in REQUIRED[side])
    for name in modules:
        try:
            importlib.import_module(name)
            if name == "trl":
                from trl import GRPOConfig, GRPOTrainer  # noqa: F401 - trl imports lazily: the real import is here
        except Exception as exc:  # noqa: BLE001 - an import can fail in any way; each is reported
            problems.append(f"{name}: {gpu_check.one_line(exc)}")
            print(f"  {name:28s} MISSING  {gpu_check.one_line(exc)}")
            continue
        try:
            found = version(name.split(".")[0])
        except PackageNotFoundError:
            found = "(not installed: from PYTHONPATH)"
        print(f"  {name:28s} {found}")
    with contextlib.suppress(PackageNotFoundError):
        spec = Requirement(lmrl_transformers_spec())
        if version("transformers") not in spec.specifier:
            problems.append(f"transformers {version('transformers')} does not satisfy lmrl's {spec}")
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            problems.append(f"torch {torch.__version__} sees no CUDA GPU (--device {device})")
    return problems


# ----------------------------------------------------------------------------- the model (parent)


def harness_args(args: argparse.Namespace, shape: dict) -> SimpleNamespace:
    """The options `grpo_vs_trl`'s `prepare`, `lmrl_config` and `trl_setup` read."""
    return SimpleNamespace(
        prompts=args.prompts,
        samples=args.samples,
        steps=args.warmup + args.steps,
        max_new_tokens=args.max_new_tokens,
        precision="bf16",
        device="cpu" if args.device == "cpu" else "cuda",
        reward="hash",
        trl_micro_batch=args.micro_batch,
        trl_gradient_checkpointing=not args.no_grad_ckpt,
        lmrl_set=[
            f"grad_accum={args.prompts * args.samples // args.micro_batch}",
            f"gradient_checkpointing={str(not args.no_grad_ckpt).lower()}",
            "engine=hf",
            *args.lmrl_set,
        ],
        task_style="plain",
        qwen2_vocab=shape["vocab_size"],
        hidden=shape["hidden_size"],
        layers=shape["num_hidden_layers"],
        gpt2=False,
        model="",
    )


def parameters(shape: dict) -> int:
    """A Qwen2 model's parameter count from its shape (tied embeddings; q/k/v biases): 494.0M for 0.5b."""
    h, i, layers = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    kv = h // shape["num_attention_heads"] * shape["num_key_value_heads"]
    layer = (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * i + 2 * h
    return shape["vocab_size"] * h + layers * layer + h


def build(shape: dict, device: str):
    """A random Qwen2 model (fp32, seed 0; initialised on ``device``, quicker on a GPU) and its tokenizer."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = grpo_vs_trl.extended_char_tokenizer(shape["vocab_size"])
    config = Qwen2Config(
        **shape,
        tie_word_embeddings=True,
        use_sliding_window=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    return model, tokenizer


# ----------------------------------------------------------------------------- children


class Steps:
    """A side's step ends (after `torch.cuda.synchronize`), completion tokens, sampling seconds, rewards and losses,
    and its GPU peak; written to ``path`` after every step, so a child killed at the time budget keeps its steps."""

    def __init__(self, path: Path, total: int, deadline: float, device: str):
        import torch

        self.torch, self.cuda = torch, device.startswith("cuda")
        self.path, self.total, self.deadline = path, total, deadline
        self.started = time.perf_counter()
        self.data: dict[str, Any] = {"ends": [], "tokens": [], "gen_s": [], "rewards": [], "losses": [], "peak": None}
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()

    def end(self) -> bool:
        """Stamp a step's end; True: add no more steps (all done, or the next would end after the deadline)."""
        if self.cuda:
            self.torch.cuda.synchronize()
            self.data["peak"] = self.torch.cuda.max_memory_allocated() / 2**30
        ends = self.data["ends"]
        ends.append(time.perf_counter())
        if len(ends) == 1:
            self.data["startup_s"] = ends[0] - self.started
        last = ends[-1] - (ends[-2] if len(ends) > 1 else self.started)
        return len(ends) >= self.total or (len(ends) >= 2 and time.time() + last > self.deadline)

    def log(self, tokens: float, gen_s: float, reward: float, loss: float) -> None:
        for key, value in zip(("tokens", "gen_s", "rewards", "losses"), (tokens, gen_s, reward, loss)):
            self.data[key].append(value)
        self.write()

    def write(self, **extra) -> None:
        self.data.update(extra)
        partial = self.path.with_suffix(".partial")
        partial.write_text(json.dumps(self.data))
        partial.replace(self.path)  # whole or not at all, were the child killed while writing


def run_lmrl(args: argparse.Namespace, harness: SimpleNamespace, workdir: Path, steps: Steps) -> None:
    from lmrl.trainers.rl import trainer as online

    config = grpo_vs_trl.lmrl_config(harness, workdir, workdir / "lmrl-run")
    rows = args.prompts * args.samples
    original = online.rl_step

    def timed_step(*a, **kw):  # read-only wrapper: the step's end, its numbers; then stop after the last step
        metrics = original(*a, **kw)
        stop = steps.end()
        nan = float("nan")  # a step a failing reward function skipped has none of these
        steps.log(
            metrics.get("completion_len/mean", nan) * rows,
            metrics.get("time/rollout_s", nan),
            metrics.get("reward/mean", nan),
            metrics.get("loss", nan),
        )
        if stop:
            raise Finished
        return metrics

    online.rl_step = timed_step
    with contextlib.suppress(Finished):
        online.train(config)


def run_trl(args: argparse.Namespace, harness: SimpleNamespace, workdir: Path, steps: Steps) -> None:
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    setup = grpo_vs_trl.trl_setup(harness, workdir)
    setup.pop("calls")
    rows = args.prompts * args.samples
    gen_s: list[float] = []

    class Timer(TrainerCallback):
        def on_step_end(self, args_, state, control, **kwargs):
            if steps.end():
                control.should_training_stop = True

        def on_log(self, args_, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:  # the step's training log (logging_steps=1), after its on_step_end
                steps.log(logs["completions/mean_length"] * rows, sum(gen_s), logs["reward"], logs["loss"])
                gen_s.clear()

    trainer = GRPOTrainer(**setup, callbacks=[Timer()])
    grpo_vs_trl.time_generation(trainer, gen_s)
    trainer.train()


def child(args: argparse.Namespace) -> int:
    workdir = Path(args.workdir)
    harness = harness_args(args, SHAPES[args.model_key])
    steps = Steps(workdir / f"{args.child}.json", args.warmup + args.steps, args.deadline, args.device)
    try:
        (run_lmrl if args.child == "lmrl" else run_trl)(args, harness, workdir, steps)
    except Exception as exc:  # noqa: BLE001 - the parent reports it in the table
        traceback.print_exc()
        steps.write(error=gpu_check.one_line(exc))
        return 1
    return 0


# ----------------------------------------------------------------------------- parent


def run_side(args: argparse.Namespace, side: str, key: str, workdir: Path, deadline: float, kill_at: float) -> dict:
    """Run one side in a subprocess; its results (``ends`` ... of `Steps`, ``error``, ``log``, ``wall_s``)."""
    out, log = workdir / f"{side}.json", workdir / f"{side}.log"
    out.unlink(missing_ok=True)
    cmd = [sys.executable, __file__, *args.argv, "--child", side, "--model-key", key]
    cmd += ["--workdir", str(workdir), "--deadline", repr(deadline)]
    env = {**os.environ, "TQDM_DISABLE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)
        try:
            code = proc.wait(timeout=max(1.0, kill_at - time.time()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            code = "killed at the time budget"
    result = json.loads(out.read_text()) if out.exists() else {}
    result.update(wall_s=time.perf_counter() - start, log=str(log))
    if code != 0 and "error" not in result:
        result["error"] = f"exit {code}" if isinstance(code, int) else code
    if code != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-20:]
        print(f"--- {key} {side}: {result['error']}; the last lines of its log:", *("    " + t for t in tail), sep="\n")
    return result


def summarize(result: dict, args: argparse.Namespace, params: int, prompt_len: float) -> dict:
    """The table's numbers of one side (see the module docstring); ``status`` ok, FAIL or skipped."""
    row: dict[str, Any] = {"status": "FAIL" if result.get("error") else "ok", "error": result.get("error", "")}
    ends, tokens = result.get("ends", []), result.get("tokens", [])
    n = min(len(ends), len(tokens))
    row["steps"] = max(0, n - args.warmup)
    row["peak_gib"] = result.get("peak")
    row["startup_s"] = result.get("startup_s")
    row["wall_s"] = result.get("wall_s")
    if row["steps"] < 1:
        if row["status"] == "ok":
            row.update(status="FAIL", error="no timed step finished")
        return row
    rate = grpo_vs_trl.steady_state(ends[:n], tokens[:n], args.warmup)
    timed = slice(args.warmup, n)
    rows = args.prompts * args.samples
    sampled = sum(tokens[timed])
    flops = 2 * params * sampled + 6 * params * (row["steps"] * rows * prompt_len + sampled)
    seconds = ends[n - 1] - ends[args.warmup - 1]
    row.update(
        s_per_step=rate["s_per_step"],
        steps_per_s=rate["steps_per_s"],
        gen_s_per_step=sum(result["gen_s"][timed]) / row["steps"],
        tokens_per_s=rate["tokens_per_s"],
        completion_len=sampled / (row["steps"] * rows),
        tflops=flops / seconds / 1e12,
        reward=sum(result["rewards"][timed]) / row["steps"],
        loss_finite=all(math.isfinite(x) for x in result["losses"][:n]),
    )
    row["mfu"] = row["tflops"] / args.peak_tflops if args.peak_tflops else None
    return row


def fmt(value, spec: str) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def print_table(rows: list[dict]) -> None:
    head = (
        f"{'model':6s} {'side':5s} {'status':7s} {'steps':>5s} {'s/step':>7s} {'gen s':>7s} {'steps/s':>8s} "
        f"{'tok/s':>8s} {'TFLOP/s':>8s} {'MFU':>6s} {'peak GiB':>8s} {'reward':>6s}  error"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['model']:6s} {r['side']:5s} {r['status']:7s} {r.get('steps', 0):5d} {fmt(r.get('s_per_step'), '.2f'):>7s} "
            f"{fmt(r.get('gen_s_per_step'), '.2f'):>7s} {fmt(r.get('steps_per_s'), '.4f'):>8s} "
            f"{fmt(r.get('tokens_per_s'), ',.0f'):>8s} {fmt(r.get('tflops'), '.2f'):>8s} "
            f"{fmt(r.get('mfu'), '.2%'):>6s} {fmt(r.get('peak_gib'), '.2f'):>8s} {fmt(r.get('reward'), '.3f'):>6s}  "
            f"{r.get('error', '')}".rstrip()
        )
    for model in dict.fromkeys(r["model"] for r in rows):
        pair = {r["side"]: r for r in rows if r["model"] == model and r["status"] == "ok"}
        if {"lmrl", "trl"} <= set(pair):
            a, b = pair["lmrl"], pair["trl"]
            memory = f", GPU peak {a['peak_gib'] / b['peak_gib']:.2f}x" if a["peak_gib"] and b["peak_gib"] else ""
            print(f"{model} lmrl/TRL: steps/s {a['steps_per_s'] / b['steps_per_s']:.2f}x{memory}")


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("torch", "transformers", "trl", "accelerate", "datasets"):
        with contextlib.suppress(PackageNotFoundError):
            found[name] = version(name)
    return found


def parent(args: argparse.Namespace) -> int:
    import torch

    t0, started = time.perf_counter(), time.time()
    end_of_budget = started + args.time_budget
    problems = check_imports(args.sides, args.device)
    if problems:
        print("gpu-bench: missing or wrong, nothing run:", *problems, sep="\n  ")
        return 1
    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    meta = {
        "device": where,
        "versions": versions(),
        "python": sys.version.split()[0],
        "settings": {k: v for k, v in vars(args).items() if k not in ("argv", "child", "workdir", "deadline")},
        "flops": "6*N per trained token (prompt + completion, B*G rows) + 2*N per sampled token; N = all parameters",
    }
    print(f"gpu-bench on {args.device} ({where}); {', '.join(f'{k} {v}' for k, v in meta['versions'].items())}")
    print(
        f"{args.prompts} prompts x {args.samples} samples x {args.max_new_tokens} tokens, micro-batch "
        f"{args.micro_batch}, gradient checkpointing {'off' if args.no_grad_ckpt else 'on'}, {args.warmup} warm-up + "
        f"{args.steps} timed steps, time budget {args.time_budget:.0f} s, MFU peak "
        f"{fmt(args.peak_tflops, '.0f')} TFLOP/s"
    )
    root = Path(tempfile.mkdtemp(prefix="lmrl-gpu-bench-"))
    keys = args.models
    cases = [(key, side) for key in keys for side in args.sides]
    weight = {key: math.sqrt(parameters(SHAPES[key])) for key in keys}
    rows: list[dict] = []
    startups: list[float] = []
    try:
        for key in keys:
            workdir = root / key
            workdir.mkdir()
            built = time.perf_counter()
            harness = harness_args(args, SHAPES[key])
            model, tokenizer = build(SHAPES[key], args.device)
            params = sum(p.numel() for p in model.parameters())
            info = grpo_vs_trl.prepare(harness, workdir, (model, tokenizer))
            del model
            gc.collect()
            if args.device.startswith("cuda"):
                torch.cuda.empty_cache()
            prompt_len = sum(info["prompt_tokens"]) / len(info["prompt_tokens"])
            print(
                f"{key}: random Qwen2, {params / 1e6:.1f}M parameters, vocabulary {SHAPES[key]['vocab_size']}, "
                f"prompts of ~{prompt_len:.0f} tokens; built and saved in {time.perf_counter() - built:.1f} s",
                flush=True,
            )
            for side in args.sides:
                left = [c for c in cases if c not in {(r["model"], r["side"]) for r in rows}]
                share = (end_of_budget - time.time()) * weight[key] / sum(weight[k] for k, _ in left)
                base = {"model": key, "side": side, "params": params, "prompt_len": prompt_len}
                if share < max(startups, default=1.0):
                    rows.append(
                        {**base, "status": "skipped", "error": f"time budget: {max(0.0, share):.0f} s left for it"}
                    )
                    print(f"{key} {side}: skipped ({rows[-1]['error']})")
                    continue
                result = run_side(args, side, key, workdir, time.time() + share, end_of_budget)
                row = {**base, **summarize(result, args, params, prompt_len)}
                rows.append(row)
                if row.get("startup_s"):
                    startups.append(row["startup_s"])
                if args.logs:
                    Path(args.logs).mkdir(parents=True, exist_ok=True)
                    shutil.copy(result["log"], Path(args.logs) / f"{key}_{side}.log")
                print(
                    f"{key} {side}: {row['status']}, {row['steps']} timed steps, {fmt(row.get('s_per_step'), '.2f')} "
                    f"s/step, child {row['wall_s']:.0f} s (start-up to the end of warm-up "
                    f"{fmt(row.get('startup_s'), '.0f')} s)",
                    flush=True,
                )
            shutil.rmtree(workdir, ignore_errors=True)  # 6 GB of fp32 weights for 1.5b
    finally:
        shutil.rmtree(root, ignore_errors=True)
    meta["total_s"] = time.perf_counter() - t0
    print(f"\ntotal {meta['total_s']:.0f} s\n")
    print_table(rows)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"meta": meta, "results": rows}, indent=1))
        print(f"results: {args.out}")
    ok = sum(r["status"] == "ok" for r in rows)
    print(f"gpu-bench: {ok}/{len(cases)} sides ran")
    return 0 if ok == len(cases) else 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--small", action="store_true", help="a tiny Qwen2 model, 4 x 4 x 16 (for --device cpu)")
    parser.add_argument("--models", default="0.5b,1.5b", help="comma-separated: 0.5b, 1.5b (default both)")
    parser.add_argument("--frameworks", default="lmrl,trl", help="comma-separated sides, run in this order")
    parser.add_argument("--prompts", type=int, help="prompts per step B (64; --small 4)")
    parser.add_argument("--samples", type=int, help="completions per prompt G (8; --small 4)")
    parser.add_argument("--max-new-tokens", type=int, help="completion length cap (256; --small 16)")
    parser.add_argument("--micro-batch", type=int, help="rows per forward/backward, both sides (64; --small 8)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per side (3)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first (1)")
    parser.add_argument("--no-grad-ckpt", action="store_true", help="gradient checkpointing off on both sides")
    parser.add_argument("--peak-tflops", type=float, help="MFU's peak (cuda: 989, H100/H200 bf16 dense; cpu: n/a)")
    parser.add_argument("--time-budget", type=float, default=450.0, help="seconds for the whole run (450)")
    parser.add_argument("--lmrl-set", action="append", default=[], metavar="KEY=VALUE", help="extra lmrl override")
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--logs", help="copy each side's log into this folder")
    parser.add_argument("--check-imports", action="store_true", help="only check the imports, then exit")
    parser.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    parser.add_argument("--model-key", choices=tuple(SHAPES), help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    small = dict(prompts=4, samples=4, max_new_tokens=16, micro_batch=8)
    full = dict(prompts=64, samples=8, max_new_tokens=256, micro_batch=64)
    for name, value in (small if args.small else full).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.peak_tflops is None and args.device.startswith("cuda"):
        args.peak_tflops = H100_H200_BF16_TFLOPS
    args.models = ["small"] if args.small else args.models.split(",")
    args.sides = args.frameworks.split(",")
    if unknown := [m for m in args.models if m not in SHAPES or (m == "small") != args.small]:
        parser.error(f"--models: unknown {unknown}; choose from 0.5b, 1.5b")
    if unknown := [s for s in args.sides if s not in SIDES]:
        parser.error(f"--frameworks: unknown {unknown}; choose from {', '.join(SIDES)}")
    if args.steps < 1 or args.warmup < 1:
        parser.error("--steps and --warmup must be at least 1 (steady state starts at the end of the warm-up)")
    if args.samples < 2 or (args.prompts * args.samples) % args.micro_batch:
        parser.error("--samples must be >= 2, and --prompts x --samples a multiple of --micro-batch")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return child(args)
    if args.check_imports:
        problems = check_imports(args.sides, args.device)
        print("gpu-bench imports: " + ("ok" if not problems else "missing or wrong: " + "; ".join(problems)))
        return 1 if problems else 0
    return parent(args)


if __name__ == "__main__":
    sys.exit(main())

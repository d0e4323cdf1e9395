"""GRPO throughput and memory: lmrl's online trainer vs TRL's GRPOTrainer, same model, data and settings.

    python benchmarks/grpo_vs_trl.py                                   # builtin:medium (~14M), 8x8x32, 12 steps, bf16
    python benchmarks/grpo_vs_trl.py --precision fp32 --steps 20 --warmup 4
    python benchmarks/grpo_vs_trl.py --trl-gradient-checkpointing      # TRL's own default (recomputes activations)
    python benchmarks/grpo_vs_trl.py --qwen2-vocab 151936 --prompts 16 --samples 8 --max-new-tokens 256 \
        --trl-micro-batch 8 --lmrl-set gradient_checkpointing=true    # Qwen2 architecture, Qwen2.5's vocabulary size

``--qwen2-vocab V`` builds a Qwen2-architecture model locally (random init, seed 0; ``--hidden``, ``--layers``) whose
vocabulary has V entries, with the ``builtin:char`` tokenizer extended by added tokens ``<x0>``, ``<x1>``, ... to V
entries (so every sampled id has text, and the digit reward varies): what costs memory in a big-vocabulary model is
the LM head and its logits, which this reproduces at a size that runs on a CPU.

The parent process builds the model once (``lmrl.models.load_model(model, char tokenizer, seed=0)``) and saves it
with the ``builtin:char`` tokenizer to a temporary directory, writes the prompt rows (built-in arithmetic task, train
split) to a JSONL file, then runs each framework in its own subprocess, one after the other, so that each one's peak
memory is its own. Both load the saved directory in fp32 (master weights) and train with:

- B prompts x G samples per prompt = B*G completions per optimizer step, one optimizer step per generation batch
  (lmrl ``ppo_epochs=1 minibatches=1 grad_accum=1``; TRL ``per_device_train_batch_size=B*G``, ``num_generations=G``,
  ``gradient_accumulation_steps=1`` so ``steps_per_generation=1``, ``num_iterations=1``);
- sampling at temperature 1.0, no top-k/top-p, at most ``--max-new-tokens`` completion tokens, stop at ``<|im_end|>``;
- reward: the task's own verifier (``get_task(row["task"]).score``); group-std-scaled GRPO advantages;
- PPO-clip loss with eps 0.2, token-mean aggregation (TRL ``loss_type="dapo"``), no KL (``kl_coef=0``/``beta=0``, so
  neither builds a reference model), no importance-sampling correction (lmrl ``tis_cap=null``; TRL has none without
  vLLM);
- AdamW lr 1e-5, betas (0.9, 0.99), no weight decay, constant schedule, no warmup, grad-norm clip 1.0;
- bf16 autocast (``--precision bf16``; lmrl ``precision=bf16``, TRL ``bf16=True use_cpu=True``) or fp32;
- no evaluation, no checkpoints during the steps; metrics logged every step (lmrl ``log_every=1``, TRL
  ``logging_steps=1``, ``report_to="none"``).

What is timed, identically for both: a timestamp (``time.perf_counter``) when each optimizer step has finished (lmrl:
when ``rl_step`` returns, i.e. after rollout, scoring, update and optimizer step; TRL: the ``on_step_end`` callback,
right after its optimizer step). A step's time is the wall time between consecutive step ends, so it includes
everything the framework does per step (generation, rewards, forward/backward, optimizer, its per-step logging).
Steady state drops the first ``--warmup`` steps: steps/s = (steps - warmup) / (end of last step - end of step
``warmup``). Completion tokens/s counts the sampled tokens of those steps (up to and including the stop token).
Peak memory: the process's peak RSS (``VmHWM``) read at the end of the last training step, and that peak minus the RSS
just before the model is loaded (after every import); the peak at process exit (``ru_maxrss``) is printed too.
Generation time per step: lmrl's ``time/rollout_s``; TRL's ``_generate_single_turn`` (wrapped with a timer).

This is a benchmark, not a test: results depend on the machine and its load (the load average is printed).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

FRAMEWORKS = ("lmrl", "trl")
LR = 1e-5
ADAM_BETAS = (0.9, 0.99)
MAX_GRAD_NORM = 1.0


# ----------------------------------------------------------------------------- measurement helpers


def _status_mb(key: str) -> float:
    """A memory line of /proc/self/status (VmRSS, VmHWM) in MB; ru_maxrss where /proc is missing."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024  # kB -> MB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mb() -> float:
    return _status_mb("VmRSS")


def peak_rss_mb() -> float:
    return _status_mb("VmHWM")


def digit_share(completion: str) -> float:
    """The dense benchmark reward: the share of digit characters in a completion (0 for an empty one)."""
    return sum(c.isdigit() for c in completion) / max(1, len(completion))


class DtypeProbe:
    """Records the output dtype of the first nn.Linear call with grad off (generation) and on (training).

    A global module forward hook that removes itself once both phases are seen, so it costs only the first step.
    """

    def __init__(self) -> None:
        import torch

        self.seen: dict[str, str] = {}
        self._torch = torch
        self._handle = torch.nn.modules.module.register_module_forward_hook(self)

    def __call__(self, module, inputs, output) -> None:
        torch = self._torch
        if isinstance(module, torch.nn.Linear) and isinstance(output, torch.Tensor):
            phase = "train" if torch.is_grad_enabled() else "generate"
            self.seen.setdefault(phase, str(output.dtype).removeprefix("torch."))
            if len(self.seen) == 2:
                self._handle.remove()


def steady_state(step_ends: list[float], tokens: list[float], warmup: int) -> dict[str, float]:
    """steps/s and completion tokens/s over steps warmup+1..S: (S - warmup) / (end_S - end_warmup); warmup=0: a
    memory-only run (no rate: NaN)."""
    if warmup == 0:
        return {"steps_per_s": float("nan"), "s_per_step": float("nan"), "tokens_per_s": float("nan")}
    if len(step_ends) <= warmup or warmup < 1:
        raise ValueError(f"need more than warmup={warmup} >= 1 step ends, got {len(step_ends)}")
    seconds = step_ends[-1] - step_ends[warmup - 1]
    steps = len(step_ends) - warmup
    return {"steps_per_s": steps / seconds, "s_per_step": seconds / steps, "tokens_per_s": sum(tokens[warmup:]) / seconds}


# ----------------------------------------------------------------------------- setup (parent)


def prepare(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Save the shared model + tokenizer and the prompt rows; check both frameworks' prompts tokenize the same."""
    from lmrl.data.chat import render_prompt
    from lmrl.data.tasks import get_task, make_rows
    from lmrl.data.tokenizers import build_char_tokenizer, load_tokenizer
    from lmrl.models import count_parameters, is_builtin, load_model
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    model_dir = workdir / "model"
    if args.qwen2_vocab:
        import torch
        from transformers import Qwen2Config, Qwen2ForCausalLM

        tokenizer = build_char_tokenizer()  # + added tokens <x0>, <x1>, ... up to the vocabulary size
        tokenizer.add_tokens([f"<x{i}>" for i in range(args.qwen2_vocab - len(tokenizer))])
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(Qwen2Config(
            vocab_size=args.qwen2_vocab, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
            num_hidden_layers=args.layers, num_attention_heads=max(1, args.hidden // 64), num_key_value_heads=1,
            tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
            bos_token_id=tokenizer.bos_token_id, max_position_embeddings=4096))
    elif is_builtin(args.model):
        tokenizer = build_char_tokenizer()
        model = load_model(args.model, tokenizer, seed=0)
    else:  # an existing checkpoint (e.g. an SFT run's final/), so that rewards are not all zero
        tokenizer = load_tokenizer(args.model)
        model = load_model(args.model, tokenizer)
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    rows = make_rows(get_task("arithmetic"), args.prompts * args.steps, split="train", seed=0)
    rows_path = workdir / "prompts.jsonl"
    rows_path.write_text("".join(json.dumps({k: r[k] for k in ("prompt", "answer", "task", "meta")}) + "\n" for r in rows))
    for row in rows[:4]:
        ours = tokenizer(render_prompt(tokenizer, row["prompt"]), add_special_tokens=False)["input_ids"]
        theirs = tokenizer.apply_chat_template([{"role": "user", "content": row["prompt"]}], add_generation_prompt=True,
                                               tokenize=True, return_dict=True)["input_ids"]
        if list(ours) != list(theirs):
            raise RuntimeError(f"prompt token ids differ between lmrl and the chat template: {ours} vs {theirs}")
    return {"model_dir": str(model_dir), "rows": str(rows_path), "params_m": count_parameters(model) / 1e6}


# ----------------------------------------------------------------------------- children


def run_lmrl(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    import torch

    from lmrl.config import load_config
    from lmrl.tracking import read_jsonl
    from lmrl.trainers import online

    out = workdir / "lmrl-run"
    overrides = [
        f"model={workdir / 'model'}", f"dataset={workdir / 'prompts.jsonl'}", f"train_rows={args.prompts * args.steps}",
        "algorithm=grpo", f"prompts_per_step={args.prompts}", f"samples_per_prompt={args.samples}",
        f"max_new_tokens={args.max_new_tokens}", "temperature=1.0", "top_p=1.0", "top_k=0",
        "ppo_epochs=1", "minibatches=1", "grad_accum=1", "kl_coef=0", "tis_cap=null", "adv_scale=group",
        "clip_low=0.2", "clip_high=0.2", "loss_agg=token_mean",
        f"lr={LR}", f"adam_betas=[{ADAM_BETAS[0]},{ADAM_BETAS[1]}]", "weight_decay=0", "lr_schedule=constant",
        "warmup_steps=0", f"max_grad_norm={MAX_GRAD_NORM}", f"precision={args.precision}", "seed=0",
        f"max_steps={args.steps}", "log_every=1", "eval_every=0", "save_every=0", f"sample_every={args.steps + 1}",
        f"output_dir={out}", "overwrite=true", *args.lmrl_set,
    ]
    if args.reward == "digits":
        from lmrl.rewards import REWARDS, register_reward

        if "digit_share" not in REWARDS:
            register_reward("digit_share")(lambda **_: lambda prompts, completions, **kw: [digit_share(c) for c in completions])
        overrides.append("rewards=[digit_share]")
    config = load_config(online.RLConfig, None, overrides)
    step_ends: list[float] = []
    peak_at_last_step: list[float] = []
    original_step = online.rl_step

    def timed_step(*a, **kw):  # read-only wrapper: the step's end time and peak RSS so far
        metrics = original_step(*a, **kw)
        step_ends.append(time.perf_counter())
        peak_at_last_step[:] = [peak_rss_mb()]
        return metrics

    online.rl_step = timed_step
    probe = DtypeProbe()
    baseline = rss_mb()
    online.train(config)
    records = [r for r in read_jsonl(out / "metrics.jsonl") if "reward/mean" in r]
    n = args.prompts * args.samples
    return {
        "step_ends": step_ends,
        "tokens": [r["completion_len/mean"] * n for r in records],
        "generate_s": [r["time/rollout_s"] for r in records],
        "rewards": [r["reward/mean"] for r in records],
        "losses": [r["loss"] for r in records],
        "skipped_rows": sum(r.get("train/skipped_rows_frac", 0.0) for r in records) / len(records),
        "baseline_mb": baseline, "peak_mb": peak_at_last_step[0], "exit_peak_mb": peak_rss_mb(),
        "dtypes": probe.seen, "threads": torch.get_num_threads(),
    }


def run_trl(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from lmrl.data.tasks import get_task

    rows = [json.loads(line) for line in (workdir / "prompts.jsonl").read_text().splitlines()]
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"],
                                  "task": r["task"], "meta": json.dumps(r["meta"])} for r in rows])
    tokenizer = AutoTokenizer.from_pretrained(workdir / "model")
    calls = {"reward": 0}

    def task_reward(completions, answer, task, meta, **kwargs) -> list[float]:
        """The same verifier as lmrl's `task` reward: get_task(task).score(completion, answer, meta)."""
        calls["reward"] += 1
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [get_task(t).score(x, a, json.loads(m)) for x, a, t, m in zip(texts, answer, task, meta)]

    # the reward function must score a right answer 1 and a wrong one 0, or the comparison means nothing
    first = rows[0]
    check = task_reward([[{"content": f"<answer>{first['answer']}</answer>"}], [{"content": "x"}]], [first["answer"]] * 2,
                        [first["task"]] * 2, [json.dumps(first["meta"])] * 2)
    if check != [1.0, 0.0]:
        raise RuntimeError(f"TRL reward function scores a right/wrong answer as {check}, expected [1.0, 0.0]")
    calls["reward"] = 0

    def digits_reward(completions, **kwargs) -> list[float]:
        calls["reward"] += 1
        return [digit_share(c[-1]["content"] if isinstance(c, list) else c) for c in completions]

    micro = args.trl_micro_batch or args.prompts * args.samples  # one optimizer step per B*G completions either way
    config = GRPOConfig(
        output_dir=str(workdir / "trl-run"), use_cpu=True, bf16=args.precision == "bf16", fp16=False,
        per_device_train_batch_size=micro, num_generations=args.samples,
        gradient_accumulation_steps=args.prompts * args.samples // micro, num_iterations=1, max_completion_length=args.max_new_tokens,
        temperature=1.0, top_p=1.0, top_k=0, beta=0.0, epsilon=0.2, loss_type="dapo", scale_rewards="group",
        learning_rate=LR, adam_beta1=ADAM_BETAS[0], adam_beta2=ADAM_BETAS[1], weight_decay=0.0,
        lr_scheduler_type="constant", warmup_steps=0, max_grad_norm=MAX_GRAD_NORM, max_steps=args.steps,
        gradient_checkpointing=args.trl_gradient_checkpointing, logging_steps=1, report_to="none",
        save_strategy="no", eval_strategy="no", seed=0, disable_tqdm=True,
    )
    step_ends: list[float] = []
    peak_at_last_step: list[float] = []
    step_logs: dict[int, dict] = {}

    class Timer(TrainerCallback):
        def on_step_end(self, args_, state, control, **kwargs):
            step_ends.append(time.perf_counter())
            peak_at_last_step[:] = [peak_rss_mb()]

        def on_log(self, args_, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:  # the per-step training log (logging_steps=1)
                step_logs[state.global_step] = dict(logs)

    probe = DtypeProbe()
    baseline = rss_mb()
    trainer = GRPOTrainer(model=str(workdir / "model"), reward_funcs=task_reward if args.reward == "task" else digits_reward,
                          args=config, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[Timer()])
    generate_s: list[float] = []
    original_generate = trainer._generate_single_turn

    def timed_generate(*a, **kw):  # read-only wrapper: time of TRL's generation call
        start = time.perf_counter()
        result = original_generate(*a, **kw)
        generate_s.append(time.perf_counter() - start)
        return result

    trainer._generate_single_turn = timed_generate
    trainer.train()
    records = [step_logs[s] for s in sorted(step_logs)]
    n = args.prompts * args.samples
    return {
        "step_ends": step_ends,
        "tokens": [r["completions/mean_length"] * n for r in records],
        "generate_s": generate_s,
        "rewards": [r["reward"] for r in records],
        "losses": [r["loss"] for r in records],
        "reward_calls": calls["reward"],
        "baseline_mb": baseline, "peak_mb": peak_at_last_step[0], "exit_peak_mb": peak_rss_mb(),
        "dtypes": probe.seen, "threads": torch.get_num_threads(),
    }


def child(args: argparse.Namespace) -> None:
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    workdir = Path(args.workdir)
    result = (run_lmrl if args.child == "lmrl" else run_trl)(args, workdir)
    (workdir / f"{args.child}.json").write_text(json.dumps(result))


# ----------------------------------------------------------------------------- parent


def machine() -> str:
    model = platform.processor() or "?"
    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    bf16 = [f for f in ("avx512_bf16", "amx_bf16", "amx_tile") if f in flags] or ["no bf16 flags"]
    return f"{model}, {os.cpu_count()} CPUs, {'/'.join(bf16)}"


def run_child(name: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", name, "--workdir", str(workdir), "--model", args.model,
           "--prompts", str(args.prompts), "--samples", str(args.samples), "--max-new-tokens", str(args.max_new_tokens),
           "--steps", str(args.steps), "--warmup", str(args.warmup), "--precision", args.precision,
           "--threads", str(args.threads), "--reward", args.reward, "--qwen2-vocab", str(args.qwen2_vocab),
           "--hidden", str(args.hidden), "--layers", str(args.layers), "--trl-micro-batch", str(args.trl_micro_batch)]
    cmd += [f"--lmrl-set={kv}" for kv in args.lmrl_set]
    if args.trl_gradient_checkpointing:
        cmd.append("--trl-gradient-checkpointing")
    log = workdir / f"{name}.log"
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    with open(log, "w") as fh:
        code = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, "TQDM_DISABLE": "1"}).returncode
    if code != 0:
        tail = "\n".join(log.read_text().splitlines()[-40:])
        raise RuntimeError(f"{name} run failed (exit {code}); last lines of {log}:\n{tail}")
    result = json.loads((workdir / f"{name}.json").read_text())
    result.update(wall_s=time.perf_counter() - start, load=(load_before, os.getloadavg()[0]))
    result.update(steady_state(result["step_ends"], result["tokens"], args.warmup))
    return result


def report(results: dict[str, dict], args: argparse.Namespace, info: dict) -> None:
    print(f"\nmachine: {machine()}; torch threads {next(iter(results.values()))['threads']}")
    name = f"Qwen2 vocab {args.qwen2_vocab} hidden {args.hidden} x{args.layers}" if args.qwen2_vocab else args.model
    print(f"lmrl overrides: {' '.join(args.lmrl_set) or 'none'}; TRL micro-batch {args.trl_micro_batch or 'B*G'}")
    print(f"model {name} ({info['params_m']:.1f}M params), {args.prompts} prompts x {args.samples} samples x "
          f"{args.max_new_tokens} new tokens, {args.steps} steps ({args.warmup} warm-up), {args.precision}, "
          f"reward {args.reward}, fastest of {args.rounds} round(s)"
          + (", TRL gradient checkpointing on" if args.trl_gradient_checkpointing else ""))
    head = f"{'framework':10s} {'steps/s':>8s} {'s/step':>7s} {'gen s/step':>10s} {'tok/s':>7s} " \
           f"{'peak RSS MB':>11s} {'peak-base MB':>12s} {'exit MB':>8s} {'reward':>7s} {'loss':>9s}  dtypes (gen/train), load"
    print(head)
    print("-" * len(head))
    for name, r in results.items():
        gen = sum(r["generate_s"][args.warmup:]) / max(1, len(r["generate_s"][args.warmup:]))
        dtypes = f"{r['dtypes'].get('generate', '?')}/{r['dtypes'].get('train', '?')}"
        print(f"{name:10s} {r['steps_per_s']:8.3f} {r['s_per_step']:7.2f} {gen:10.2f} {r['tokens_per_s']:7.0f} "
              f"{r['peak_mb']:11.0f} {r['peak_mb'] - r['baseline_mb']:12.0f} {r['exit_peak_mb']:8.0f} "
              f"{sum(r['rewards']) / len(r['rewards']):7.3f} {sum(r['losses']) / len(r['losses']):9.2e}  "
              f"{dtypes}, {r['load'][0]:.1f}->{r['load'][1]:.1f}")
    if {"lmrl", "trl"} <= set(results):
        a, b = results["lmrl"], results["trl"]
        print(f"{'lmrl/TRL':10s} {a['steps_per_s'] / b['steps_per_s']:7.2f}x {'':7s} {'':10s} "
              f"{a['tokens_per_s'] / b['tokens_per_s']:6.2f}x {a['peak_mb'] / b['peak_mb']:10.2f}x "
              f"{(a['peak_mb'] - a['baseline_mb']) / (b['peak_mb'] - b['baseline_mb']):11.2f}x "
              f"{a['exit_peak_mb'] / b['exit_peak_mb']:7.2f}x")
    for name, r in results.items():
        finite = all(x == x and abs(x) != float("inf") for x in r["losses"])
        extra = f", reward function called {r['reward_calls']} times" if "reward_calls" in r else ""
        if "skipped_rows" in r:  # zero-advantage rows lmrl did not forward (their gradient is exactly 0)
            extra += f", rows skipped as zero-advantage {100 * r['skipped_rows']:.0f}%"
        print(f"{name}: {len(r['step_ends'])} steps, losses finite: {finite}{extra}, child wall time {r['wall_s']:.0f} s")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="builtin:medium", help="built-in model (random init, seed 0) or a checkpoint dir")
    parser.add_argument("--prompts", type=int, default=8, help="distinct prompts per step (B)")
    parser.add_argument("--samples", type=int, default=8, help="completions per prompt (G); a step trains on B*G")
    parser.add_argument("--max-new-tokens", type=int, default=32, help="completion length cap")
    parser.add_argument("--steps", type=int, default=12, help="optimizer steps per framework")
    parser.add_argument("--warmup", type=int, default=2,
                        help="first steps left out of the steady-state rate (>= 1); 0: peak memory only (--steps 1)")
    parser.add_argument("--precision", choices=("bf16", "fp32"), default="bf16", help="bf16 autocast or plain fp32")
    parser.add_argument("--reward", choices=("digits", "task"), default="digits",
                        help="digits: share of digit characters (dense: every group has reward variance, so both "
                             "frameworks train on every row); task: the arithmetic verifier (0 for a random model)")
    parser.add_argument("--frameworks", default="lmrl,trl", help="comma-separated, run in this order")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run the frameworks this many times, alternating; report each one's fastest round")
    parser.add_argument("--threads", type=int, default=0, help="torch threads in each run (0: torch's default)")
    parser.add_argument("--trl-gradient-checkpointing", action="store_true",
                        help="TRL's default; off by default so that both do the same forward/backward work")
    parser.add_argument("--qwen2-vocab", type=int, default=0, help="build a Qwen2-architecture model with this vocabulary")
    parser.add_argument("--hidden", type=int, default=128, help="--qwen2-vocab: hidden size")
    parser.add_argument("--layers", type=int, default=2, help="--qwen2-vocab: decoder layers")
    parser.add_argument("--trl-micro-batch", type=int, default=0,
                        help="TRL per_device_train_batch_size (with gradient accumulation to B*G; 0: B*G at once)")
    parser.add_argument("--lmrl-set", action="append", default=[], metavar="KEY=VALUE",
                        help="extra lmrl config override, e.g. gradient_checkpointing=true (repeatable)")
    parser.add_argument("--workdir", help="keep the model, prompts, logs and run dirs here (default: a temp dir)")
    parser.add_argument("--child", choices=FRAMEWORKS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not (args.warmup == 0 or 1 <= args.warmup < args.steps):
        parser.error(f"--warmup must be at least 1 and less than --steps ({args.steps}), or 0 for peak memory only; "
                     f"got {args.warmup}. Steady state is measured from the end of the last warm-up step.")
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}.")
    if args.samples < 2:
        parser.error("--samples must be >= 2: GRPO advantages need at least 2 completions per prompt.")
    unknown = set(args.frameworks.split(",")) - set(FRAMEWORKS)
    if unknown:
        parser.error(f"--frameworks: unknown {sorted(unknown)}; choose from {FRAMEWORKS}.")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        child(args)
        return
    with tempfile.TemporaryDirectory(prefix="grpo_vs_trl-") as tmp:
        workdir = Path(args.workdir or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        info = prepare(args, workdir)
        results: dict[str, dict] = {}
        per_round: dict[str, list[float]] = {}
        for round_ in range(1, args.rounds + 1):
            for name in args.frameworks.split(","):
                result = run_child(name, args, workdir)
                print(f"round {round_} {name}: {result['steps_per_s']:.3f} steps/s, peak {result['peak_mb']:.0f} MB, "
                      f"load {result['load'][0]:.1f}", flush=True)
                per_round.setdefault(name, []).append(result["steps_per_s"])
                if name not in results or result["steps_per_s"] > results[name]["steps_per_s"]:
                    results[name] = result
        report(results, args, info)
        report_rounds(per_round)


def report_rounds(per_round: dict[str, list[float]]) -> None:
    """lmrl/TRL steps/s of each round (the two runs closest in time, so the least affected by the machine's drift)
    and their median, when there are several rounds of both."""
    lmrl, trl = per_round.get("lmrl", []), per_round.get("trl", [])
    if min(len(lmrl), len(trl)) < 2:
        return
    ratios = sorted(a / b for a, b in zip(lmrl, trl))
    print(f"lmrl/TRL steps/s per round (same round = adjacent runs): {', '.join(f'{r:.2f}x' for r in ratios)}; "
          f"median {statistics.median(ratios):.2f}x")


if __name__ == "__main__":
    main()

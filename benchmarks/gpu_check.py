"""GPU check: lmrl's trainers (every verb but selfplay, distill, swarm), 3 steps each, on a random 0.5B model on a GPU.

    make gpu-check                                          # = PYTHONPATH=. python3 benchmarks/gpu_check.py
    PYTHONPATH=. python3 benchmarks/gpu_check.py --device cpu --small     # the same cases on a CPU, a tiny model

Cases, each through the Python API of the trainer that `lmrl <verb>` runs (`sft.train`, `online.train`,
`preference.train`, `rejection.train`, `reward.train`, `pretrain.train`), precision=bf16 (fp32 master weights, bf16 autocast), device=cuda, `--steps` steps (3):

    sft         SFT on task:arithmetic with the full logits (one LM-head chunk): finite losses of about ln(vocab)
                (a random model), a non-zero gradient, final/ loads and its weights moved away from the start
    grpo        GRPO with the HF engine (sampling from the training model); the reward is a fixed pseudo-random
                number per completion, so the advantages are non-zero whatever a random model writes: finite
                policy loss, non-zero gradient, final/ loads and moved
    lora_grpo   GRPO with LoRA r=16 on every linear layer, kl_coef=0.05, merge_lora=true: only lora_ parameters
                train, KL at step 1 is 0 (the reference is the base with adapters off), final/ is the merged model
                (moved) and final/adapter/ exists
    dpo         DPO on builtin:prefs: the first loss is log 2 (policy == reference), final/ loads and moved
    grad_ckpt   the sft case with gradient_checkpointing=true: each decoder layer runs twice per training forward
                (forward + recompute), and the step-1 loss equals the sft case's
    chunked_head  the sft case with logprob_chunk_mb=8 (13 positions of fp32 logits; --small: 1, 64 positions): the
                fused chunked LM head's backward ran in many chunks (the sft case's in none), and the step-1 loss
                equals the sft case's
    unfused     the sft case with fused_layers=false: no fused RMSNorm/SwiGLU forward ran (the sft case's ran, counted
                by `lmrl.models.usage`), the step-1 loss equals the sft case's; its peak memory and
                tokens/s beside the sft case's are what the fused layers save on a GPU
    grpo_unfused  the grpo case with fused_layers=false: no fused forward ran (the grpo case's did), and its
                training step's time and peak beside grpo's
    ppo         PPO (algorithm=ppo: a value model from the policy, GAE, kl_coef=0.05 in the reward): finite policy and
                value losses, non-zero gradient, final/ loads and moved
    online_dpo  online DPO: pairs sampled by the policy, ranked by the pseudo-random reward; finite losses, gradient
    rejection   rejection sampling, 4 samples per prompt, the best kept, one SFT round: the round's SFT trains
    reward      a Bradley-Terry reward model on builtin:prefs: finite losses, gradient, final/ written
    avatarl     avatarl pretraining on builtin:pydoc with the random model as its own frozen critic

The model (--small: hidden 64, 2 layers, 4 heads, 2 KV heads, vocab 4096) is built from `transformers.Qwen2Config`
with random weights and saved in bf16 to a temporary folder; nothing is downloaded. Qwen2.5-0.5B's shapes: hidden
896, 24 layers, 14 heads, 2 KV heads, intermediate 4864, vocabulary 151,936, tied embeddings (494M parameters). The
tokenizer is lmrl's `builtin:char` (102 ids, all below the vocabulary size; the trainers get `tokenizer=builtin:char`,
because transformers 5 reloads a tokenizer saved next to a qwen2 config.json as a Qwen2Tokenizer, which re-tokenizes
differently). --small's vocabulary is 4096 rather than ~102 so that the smallest chunk logprob_chunk_mb allows (1 MB:
64 positions of 4096 fp32 logits) still splits a batch into many chunks.

Table: per case pass/FAIL (with the one-line error), seconds (the trainer call: model loading, the initial and final
evaluations, the steps, the last checkpoint and final/), tokens/s (the median over the steps of the trainer's own
`tokens_per_s`: SFT, DPO: tokens trained per second of the step; GRPO: completion tokens sampled per second of the
rollout) and the peak GPU memory of the trainer call (`torch.cuda.max_memory_allocated`, reset per case; n/a on a CPU).
The last line is `gpu-check: P/T pass`; the exit code is 1 when a case fails.

What it needs: torch (CUDA build), transformers, tokenizers, safetensors, numpy, pyyaml, rich, jinja2 (chat
templates), matplotlib (each run's plots) and peft (lora_grpo); accelerate is used when present. A standard CUDA
torch image holds all of them (this workplace's GPU image does: /work/.library/device/KINDS.md), so no wheels need
carrying. lmrl's other dependencies (datasets, math-verify, plotly, msgpack, ...) are not imported by these cases:
tests/test_gpu_check.py runs the CPU version with them made unimportable. If an image lacks one, `pip download` its
wheel into wheels/ here; `make gpu-check` installs wheels/*.whl (--no-index --no-deps) first.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import math
import random
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch

FULL = dict(
    hidden_size=896,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    intermediate_size=4864,
    vocab_size=151936,
    max_position_embeddings=32768,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
)
"""Qwen2.5-0.5B's architecture (config.json of Qwen/Qwen2.5-0.5B), with random weights."""
SMALL = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    vocab_size=4096,
    max_position_embeddings=2048,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
)
CASES = (
    "sft",
    "grpo",
    "lora_grpo",
    "dpo",
    "grad_ckpt",
    "chunked_head",
    "unfused",
    "ppo",
    "online_dpo",
    "rejection",
    "reward",
    "avatarl",
    "grpo_unfused",
)
TOKENIZER = "builtin:char"
NOISE_REWARD = "gpu_check_noise"
PROBE_WEIGHT = "model.layers.0.self_attn.q_proj.weight"  # compared between the start and final/


class CheckFailed(AssertionError):
    pass


def check(condition: bool, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


@dataclass
class Result:
    case: str
    ok: bool = False
    error: str = ""
    seconds: float = float("nan")
    tokens_per_s: float = float("nan")
    peak_gib: float | None = None
    info: dict = field(default_factory=dict)  # what later cases compare with (step-1 loss, counts)
    info_start: str = ""  # CUDA: memory still allocated when the case started (left over from earlier ones)


@dataclass
class Context:
    args: argparse.Namespace
    device: str
    root: Path
    model_dir: Path
    arch: dict
    results: dict[str, Result] = field(default_factory=dict)

    @property
    def small(self) -> bool:
        return self.args.small


# ----------------------------------------------------------------------------- the model


def build_model(ctx: Context) -> int:
    """A random Qwen2 model with ``ctx.arch`` and the builtin:char tokenizer, saved (bf16) in ``ctx.model_dir``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from lmrl.data.tokenizers import load_tokenizer
    from lmrl.models.loading import save_model

    tokenizer = load_tokenizer(TOKENIZER)
    check(
        len(tokenizer) <= ctx.arch["vocab_size"], f"tokenizer of {len(tokenizer)} ids > vocab {ctx.arch['vocab_size']}"
    )
    config = Qwen2Config(
        **ctx.arch,
        tie_word_embeddings=True,
        use_sliding_window=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    with torch.device(ctx.device):  # initialising 494M weights is quicker on the GPU
        model = Qwen2ForCausalLM(config)
    params = sum(p.numel() for p in model.parameters())
    save_model(model.to(torch.bfloat16), tokenizer, ctx.model_dir)  # bf16, as Qwen2.5-0.5B is published
    del model
    return params


# ----------------------------------------------------------------------------- instruments


@contextlib.contextmanager
def patched(obj, name: str, value):
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


@contextlib.contextmanager
def instruments():
    """Counts for the checks: the trained policy (as `ModelSetup.policy` returned it), the training forwards of its
    first decoder layer's attention (grad enabled: the forward and, with gradient checkpointing, the backward's
    recompute), and the chunks the fused LM head computed logits for in its backward (`lmrl.models.head._logits`):
    training, not evaluation; `fused_calls(seen)` is the fused RMSNorm/SwiGLU forwards run since the case began."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    from lmrl.models import head, usage
    from lmrl.models.setup import ModelSetup

    seen = {
        "policy": None,
        "layer_calls": 0,
        "head_chunks": 0,
        "in_backward": False,
        "usage": usage.Usage(),
    }
    real_policy, real_logits, real_backward = ModelSetup.policy, head._logits, head.FusedHeadLogprobs.backward

    def policy(self, *args, **kwargs):
        model, tokenizer = real_policy(self, *args, **kwargs)
        if seen["policy"] is None:
            seen["policy"] = model
            layer = next(m for m in model.modules() if isinstance(m, GradientCheckpointingLayer))

            def count(module, inputs, output):
                seen["layer_calls"] += torch.is_grad_enabled()

            # a child of the layer (its attention): transformers checkpoints the layer's forward, not its __call__,
            # so the layer's own hooks run once, while its children run again in the recompute
            next(layer.children()).register_forward_hook(count)
        return model, tokenizer

    def logits(*args, **kwargs):
        seen["head_chunks"] += seen["in_backward"]  # training chunks only (evaluations use the default chunk size)
        return real_logits(*args, **kwargs)

    def backward(ctx, *grads):
        seen["in_backward"] = True
        try:
            return real_backward(ctx, *grads)
        finally:
            seen["in_backward"] = False

    with (
        usage.counting(seen["usage"]),
        patched(ModelSetup, "policy", policy),
        patched(head, "_logits", logits),
        patched(head.FusedHeadLogprobs, "backward", staticmethod(backward)),
    ):
        yield seen


def fused_calls(seen: dict) -> int:
    return seen["usage"].total_of("fused_")


def register_noise_reward() -> None:
    """`gpu_check_noise`: a pseudo-random reward in [0, 1) per completion (seeded per call), so that GRPO's group
    advantages are non-zero for a random model (whose task reward is 0 everywhere)."""
    from lmrl.rewards import REWARDS, register_reward

    if NOISE_REWARD in REWARDS:
        return

    def factory(**_):
        calls = [0]

        def noise(prompts, completions, **columns):
            calls[0] += 1
            rng = random.Random(calls[0])
            return [rng.random() for _ in completions]

        noise.__name__ = NOISE_REWARD
        return noise

    register_reward(NOISE_REWARD)(factory)


# ----------------------------------------------------------------------------- shared checks


def train_records(run_dir: Path, steps: int) -> list[dict]:
    """The training steps' rows of metrics.jsonl (steps 1..steps, each once), checked to be all there."""
    from lmrl.tracking import read_jsonl

    rows = [r for r in read_jsonl(run_dir / "metrics.jsonl") if r.get("step", 0) >= 1 and "optim/grad_norm" in r]
    check(
        [r["step"] for r in rows] == list(range(1, steps + 1)),
        f"metrics.jsonl has training steps {[r['step'] for r in rows]}, expected 1..{steps}",
    )
    return rows


def finite(rows: list[dict], key: str) -> list[float]:
    values = [r.get(key) for r in rows]
    check(all(isinstance(v, (int, float)) and math.isfinite(v) for v in values), f"{key} not finite: {values}")
    return values


def check_gradients(rows: list[dict]) -> None:
    norms = finite(rows, "optim/grad_norm")
    check(all(n > 0 for n in norms), f"grad_norm is 0 at a step: {norms}")


def check_final(ctx: Context, run_dir: Path) -> None:
    """final/ loads as an HF causal LM, gives finite logits of the vocabulary's size, and its probe weight moved."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    final = run_dir / "final"
    check((final / "config.json").is_file(), f"{final}/config.json missing")
    model = AutoModelForCausalLM.from_pretrained(final, dtype=torch.float32)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[7, 24, 18, 25, 38]])).logits
    check(logits.shape[-1] == ctx.arch["vocab_size"], f"final/ logits have {logits.shape[-1]} entries")
    check(bool(torch.isfinite(logits).all()), "final/ gives non-finite logits")
    start = None
    for path in ctx.model_dir.glob("*.safetensors"):
        with safe_open(path, "pt") as f:
            if PROBE_WEIGHT in f.keys():
                start = f.get_tensor(PROBE_WEIGHT).float()
    check(start is not None, f"{PROBE_WEIGHT} not in the start model")
    moved = (model.state_dict()[PROBE_WEIGHT] - start).abs().max().item()
    check(moved > 0, f"final/ {PROBE_WEIGHT} equals the start model's: training did not reach final/")


def train_seconds(rows: list[dict]) -> float:
    """The median of the trainer's own `time/train_s` (the update: forward, backward, optimizer) over the steps."""
    return statistics.median(finite(rows, "time/train_s"))


def median_tokens_per_s(rows: list[dict]) -> float:
    values = [r["tokens_per_s"] for r in rows if isinstance(r.get("tokens_per_s"), (int, float))]
    return statistics.median(values) if values else float("nan")


def step1_loss_matches(ctx: Context, rows: list[dict], what: str) -> str:
    """The step-1 loss equals the sft case's (same model, seed and batch; bf16: 2% relative)."""
    base = ctx.results.get("sft")
    if base is None or not base.ok:
        return "step-1 loss not compared (the sft case did not pass)"
    ours, theirs = rows[0]["loss"], base.info["loss1"]
    check(abs(ours - theirs) <= 0.02 * abs(theirs), f"{what}: step-1 loss {ours:.5f} != sft's {theirs:.5f}")
    return f"step-1 loss {ours:.4f} = sft's {theirs:.4f}"


# ----------------------------------------------------------------------------- cases


def common_overrides(ctx: Context, run_dir: Path) -> list[str]:
    return [
        f"model={ctx.model_dir}",
        f"tokenizer={TOKENIZER}",
        f"output_dir={run_dir}",
        f"device={ctx.device}",
        f"precision={ctx.args.precision}",
        f"max_steps={ctx.args.steps}",
        "seed=0",
        "log_every=1",
        "eval_every=0",
        "save_every=0",
        "keep_checkpoints=1",
        "warmup_steps=0",
        "lr_schedule=constant",
    ]


def sft_overrides(ctx: Context) -> list[str]:
    batch = 8 if ctx.small else 16
    return [
        "dataset=task:arithmetic",
        "task_args.digits=3",
        f"train_rows={4 * batch}",
        "eval_rows=8",
        "eval_max_new_tokens=8",
        f"batch_size={batch}",
        "max_length=128",
        "lr=1e-5",
    ]


ONE_CHUNK_MB = 1_000_000  # logprob_chunk_mb that holds any batch's logits: the plain full-logits head


def sft_config(ctx: Context, run_dir: Path, *extra: str):
    """The sft case's config (the full-logits head unless ``extra`` sets logprob_chunk_mb), with ``extra`` overrides."""
    from lmrl.config import load_config
    from lmrl.trainers.sft import trainer as sft

    overrides = [*common_overrides(ctx, run_dir), *sft_overrides(ctx), f"logprob_chunk_mb={ONE_CHUNK_MB}", *extra]
    return load_config(sft.SFTConfig, None, overrides)


def case_sft(ctx: Context, run_dir: Path):
    from lmrl.trainers.sft import trainer as sft

    config = sft_config(ctx, run_dir)

    def verify(seen):
        rows = train_records(run_dir, ctx.args.steps)
        losses = finite(rows, "loss")
        check_gradients(rows)
        expected = math.log(ctx.arch["vocab_size"])  # a random model's cross-entropy: about ln(vocab)
        check(
            abs(losses[0] - expected) < 0.25 * expected, f"step-1 loss {losses[0]:.3f}, expected ~ln V = {expected:.3f}"
        )
        check_final(ctx, run_dir)
        calls = fused_calls(seen)
        check(calls > 0, "no fused RMSNorm/SwiGLU forward ran (fused_layers is on by default; Qwen2 has both)")
        return rows, {
            "loss1": losses[0],
            "layer_calls": seen["layer_calls"],
            "head_chunks": seen["head_chunks"],
            "fused_calls": calls,
            "train_s": train_seconds(rows),
            "note": f"step-1 loss {losses[0]:.4f} (ln V = {expected:.4f}); {calls} fused RMSNorm/SwiGLU forwards",
        }

    return lambda: sft.train(config), verify


def case_grad_ckpt(ctx: Context, run_dir: Path):
    from lmrl.models.memory import is_checkpointing
    from lmrl.trainers.sft import trainer as sft

    config = sft_config(ctx, run_dir, "gradient_checkpointing=true")

    def verify(seen):
        rows = train_records(run_dir, ctx.args.steps)
        finite(rows, "loss")
        check_gradients(rows)
        check(is_checkpointing(seen["policy"]), "the policy's layers do not checkpoint")
        # one training forward per step (grad_accum=1): the layer runs in it and again in the backward's recompute
        base = ctx.results.get("sft")
        plain = base.info["layer_calls"] if base is not None and base.ok else ctx.args.steps
        calls = seen["layer_calls"]
        check(
            calls >= 2 * plain,
            f"layer 0 ran {calls} times with grad in {ctx.args.steps} steps ({plain} without "
            "checkpointing): no recompute in the backward",
        )
        note = step1_loss_matches(ctx, rows, "grad_ckpt")
        return rows, {"note": f"layer 0 ran {calls} times with grad ({plain} without checkpointing); {note}"}

    return lambda: sft.train(config), verify


def case_chunked_head(ctx: Context, run_dir: Path):
    from lmrl.trainers.sft import trainer as sft

    # 8 MB (13 positions of 151,936 fp32 logits), or for small vocabularies the logits of 64 positions (at least 1 MB)
    chunk_mb = int(min(8, max(1, ctx.arch["vocab_size"] * 4 * 64 // 2**20)))
    config = sft_config(ctx, run_dir, f"logprob_chunk_mb={chunk_mb}")

    def verify(seen):
        rows = train_records(run_dir, ctx.args.steps)
        finite(rows, "loss")
        check_gradients(rows)
        chunks = seen["head_chunks"]
        check(
            chunks >= 4 * ctx.args.steps,
            f"the fused LM head's backward ran {chunks} chunks in {ctx.args.steps} steps, expected several per step",
        )
        base = ctx.results.get("sft")
        if base is not None and base.ok:
            check(base.info["head_chunks"] == 0, f"the sft case's backward ran {base.info['head_chunks']} head chunks")
        note = step1_loss_matches(ctx, rows, "chunked_head")
        return rows, {"note": f"{chunks} LM-head chunks in the backward (logprob_chunk_mb={chunk_mb}, sft: 0); {note}"}

    return lambda: sft.train(config), verify


def compared_with(ctx: Context, base_name: str, rows: list[dict]) -> str:
    """This case's peak GPU memory, tokens/s and training-step seconds beside ``base_name``'s (the fused run)."""
    base = ctx.results.get(base_name)
    if base is None or not base.ok:
        return f"not compared ({base_name} did not pass)"
    parts = [f"training {train_seconds(rows):.2f} s/step vs {base.info['train_s']:.2f} s fused"]
    peak = torch.cuda.max_memory_allocated(ctx.device) / 2**30 if ctx.device.startswith("cuda") else None
    if peak is not None and base.peak_gib is not None:
        parts.append(f"peak {peak:.2f} GiB vs {base.peak_gib:.2f} GiB fused")
    return ", ".join(parts)


def case_unfused(ctx: Context, run_dir: Path):
    from lmrl.trainers.sft import trainer as sft

    config = sft_config(ctx, run_dir, "fused_layers=false")

    def verify(seen):
        rows = train_records(run_dir, ctx.args.steps)
        finite(rows, "loss")
        check_gradients(rows)
        calls = fused_calls(seen)
        check(calls == 0, f"fused_layers=false, yet {calls} fused forwards ran")
        note = step1_loss_matches(ctx, rows, "unfused")
        return rows, {"note": f"0 fused forwards; {note}; {compared_with(ctx, 'sft', rows)}"}

    return lambda: sft.train(config), verify


def rl_overrides(ctx: Context) -> list[str]:
    prompts, samples, tokens = (4, 4, 16) if ctx.small else (8, 8, 64)
    return [
        "algorithm=grpo",
        "engine=hf",
        "dataset=task:arithmetic",
        "task_args.digits=3",
        "train_rows=64",
        "eval_rows=8",
        f"prompts_per_step={prompts}",
        f"samples_per_prompt={samples}",
        f"max_new_tokens={tokens}",
        f"rewards=[{NOISE_REWARD}]",
        "sample_every=100",
        "temperature=1.0",
    ]


def rl_verify(ctx: Context, run_dir: Path, rows_check=None):
    def verify(seen):
        rows = train_records(run_dir, ctx.args.steps)
        finite(rows, "loss/policy")
        check_gradients(rows)
        stds = finite(rows, "reward/std")
        check(all(s > 0 for s in stds), f"reward/std is 0 at a step: {stds}")
        info = rows_check(rows, seen) if rows_check else {}
        check_final(ctx, run_dir)
        return rows, info

    return verify


def case_grpo(ctx: Context, run_dir: Path):
    from lmrl.config import load_config
    from lmrl.trainers.rl import trainer as online

    register_noise_reward()
    config = load_config(online.RLConfig, None, [*common_overrides(ctx, run_dir), *rl_overrides(ctx), "lr=1e-5"])

    def rows_check(rows, seen):
        calls = fused_calls(seen)
        check(calls > 0, "no fused RMSNorm/SwiGLU forward ran (fused_layers is on by default; Qwen2 has both)")
        return {
            "train_s": train_seconds(rows),
            "note": f"policy loss {rows[0]['loss/policy']:+.4f}, grad norm {rows[0]['optim/grad_norm']:.3f} at step 1; "
            f"{calls} fused forwards",
        }

    return lambda: online.train(config), rl_verify(ctx, run_dir, rows_check)


def case_grpo_unfused(ctx: Context, run_dir: Path):
    from lmrl.config import load_config
    from lmrl.trainers.rl import trainer as online

    register_noise_reward()
    config = load_config(
        online.RLConfig, None, [*common_overrides(ctx, run_dir), *rl_overrides(ctx), "lr=1e-5", "fused_layers=false"]
    )

    def rows_check(rows, seen):
        calls = fused_calls(seen)
        check(calls == 0, f"fused_layers=false, yet {calls} fused forwards ran")
        return {"note": f"0 fused forwards; {compared_with(ctx, 'grpo', rows)}"}

    return lambda: online.train(config), rl_verify(ctx, run_dir, rows_check)


def case_lora_grpo(ctx: Context, run_dir: Path):
    from lmrl.config import load_config
    from lmrl.trainers.rl import trainer as online

    register_noise_reward()
    config = load_config(
        online.RLConfig,
        None,
        [
            *common_overrides(ctx, run_dir),
            *rl_overrides(ctx),
            "lr=1e-4",
            "lora_r=16",
            "lora_alpha=32",
            "lora_target_modules=[all-linear]",
            "merge_lora=true",
            "kl_coef=0.05",
        ],
    )

    def rows_check(rows, seen):
        kl = finite(rows, "kl")
        check(abs(kl[0]) < 1e-3, f"KL at step 1 is {kl[0]:.2e}, expected 0 (reference = base with adapters off)")
        trained = [n for n, p in seen["policy"].named_parameters() if p.requires_grad]
        check(
            trained and all("lora_" in n for n in trained),
            f"trainable parameters other than LoRA's: {[n for n in trained if 'lora_' not in n][:3]}",
        )
        check((run_dir / "final" / "adapter").is_dir(), "final/adapter/ missing")
        total = sum(p.numel() for p in seen["policy"].parameters())
        share = sum(p.numel() for p in seen["policy"].parameters() if p.requires_grad) / total
        return {"note": f"{share:.2%} of parameters trained; KL at step 1 {kl[0]:.1e}"}

    return lambda: online.train(config), rl_verify(ctx, run_dir, rows_check)


def case_dpo(ctx: Context, run_dir: Path):
    from lmrl.config import load_config
    from lmrl.trainers.dpo import trainer as preference

    batch = 8 if ctx.small else 16
    config = load_config(
        preference.DPOConfig,
        None,
        [
            *common_overrides(ctx, run_dir),
            "loss=dpo",
            "beta=0.1",
            "dataset=builtin:prefs",
            "data_args.digits=2",
            f"train_rows={4 * batch}",
            "eval_rows=8",
            "eval_samples=2",
            "eval_max_new_tokens=8",
            f"batch_size={batch}",
            "max_length=128",
            "lr=1e-5",
        ],
    )

    def verify(seen):
        rows = train_records(run_dir, ctx.args.steps)
        losses = finite(rows, "loss")
        finite(rows, "policy/reward_margin")
        check_gradients(rows)
        check(abs(losses[0] - math.log(2)) < 0.02, f"step-1 DPO loss {losses[0]:.4f}, expected log 2 = 0.6931")
        check_final(ctx, run_dir)
        return rows, {"note": f"step-1 loss {losses[0]:.4f} (log 2 = 0.6931)"}

    return lambda: preference.train(config), verify


def case_ppo(ctx: Context, run_dir: Path):
    from lmrl.config import load_config
    from lmrl.trainers.rl import trainer as online

    register_noise_reward()
    overrides = [o for o in rl_overrides(ctx) if not o.startswith("algorithm=")]
    config = load_config(
        online.RLConfig, None, [*common_overrides(ctx, run_dir), *overrides, "algorithm=ppo", "kl_coef=0.05", "lr=1e-5"]
    )

    def rows_check(rows, seen):
        values = finite(rows, "loss/value")
        return {"note": f"value loss {values[0]:.4f} at step 1 (GAE on a value model from the policy)"}

    return lambda: online.train(config), rl_verify(ctx, run_dir, rows_check)


def loss_verify(ctx: Context, run_dir: Path, note: str, records: Path | None = None):
    """The common checks of a trainer's run: its steps logged finite losses and non-zero gradients (in
    ``records``, default the run directory), and ``final/`` loads and moved; ``note`` formats the step-1 loss."""

    def verify(seen):
        rows = train_records(records or run_dir, ctx.args.steps)
        losses = finite(rows, "loss")
        check_gradients(rows)
        check_final(ctx, run_dir)
        return rows, {"note": note.format(loss=losses[0])}

    return verify


def case_online_dpo(ctx: Context, run_dir: Path):
    from lmrl.config import load_config
    from lmrl.trainers.dpo import trainer as preference

    register_noise_reward()
    batch = 4 if ctx.small else 8
    config = load_config(
        preference.DPOConfig,
        None,
        [
            *common_overrides(ctx, run_dir),
            "online=true",
            f"rewards=[{NOISE_REWARD}]",
            "samples_per_prompt=4",
            "max_new_tokens=16",
            "temperature=1.0",
            "loss=dpo",
            "beta=0.1",
            "dataset=builtin:prefs",
            "data_args.digits=2",
            f"train_rows={4 * batch}",
            "eval_rows=8",
            "eval_samples=2",
            f"batch_size={batch}",
            "lr=1e-5",
        ],
    )

    verify = loss_verify(ctx, run_dir, "step-1 loss {loss:.4f} on pairs sampled by the policy")
    return lambda: preference.train(config), verify


def case_rejection(ctx: Context, run_dir: Path):
    from lmrl.config import load_config
    from lmrl.trainers.rejection import trainer as rejection

    register_noise_reward()
    config = load_config(
        rejection.RejectionConfig,
        None,
        [
            *common_overrides(ctx, run_dir),
            "dataset=task:arithmetic",
            "task_args.digits=3",
            "train_rows=16",
            "eval_rows=4",
            "eval_samples=2",
            f"rewards=[{NOISE_REWARD}]",
            "samples_per_prompt=4",
            "max_new_tokens=16",
            "drop_truncated=false",
            "select=best",
            "rounds=1",
            "batch_size=8",
            "max_length=128",
            "lr=1e-5",
        ],
    )

    verify = loss_verify(
        ctx,
        run_dir,
        "SFT on the best of 4 samples per prompt, step-1 loss {loss:.4f}",
        records=run_dir / "round-1" / "sft",
    )  # the round's SFT run
    return lambda: rejection.train(config), verify


def case_reward(ctx: Context, run_dir: Path):
    from lmrl.config import load_config
    from lmrl.trainers.reward import trainer as reward

    batch = 8 if ctx.small else 16
    config = load_config(
        reward.RewardConfig,
        None,
        [
            *common_overrides(ctx, run_dir),
            "loss=bt",
            "dataset=builtin:prefs",
            "data_args.digits=2",
            f"train_rows={4 * batch}",
            "eval_rows=16",
            f"batch_size={batch}",
            "max_length=64",
            "lr=1e-5",
        ],
    )

    def verify(seen):
        rows = train_records(run_dir, ctx.args.steps)
        losses = finite(rows, "loss")
        check_gradients(rows)
        check((run_dir / "final" / "config.json").is_file(), "final/config.json missing")
        return rows, {"note": f"Bradley-Terry loss {losses[0]:.4f} at step 1"}

    return lambda: reward.train(config), verify


def case_avatarl(ctx: Context, run_dir: Path):
    from lmrl.config import load_config
    from lmrl.trainers.pretrain import trainer as pretrain

    batch = 4 if ctx.small else 8
    # the random model is both the student and its frozen critic: the reward path runs whatever the critic knows
    config = load_config(
        pretrain.PretrainConfig,
        None,
        [
            *common_overrides(ctx, run_dir),
            "objective=avatarl",
            f"critic={ctx.model_dir}",
            "data=builtin:pydoc",
            "block_size=128",
            f"batch_size={batch}",
            "eval_batches=1",
            "num_samples=1",
            "sample_tokens=16",
            "lr=1e-5",
        ],
    )

    return lambda: pretrain.train(config), loss_verify(ctx, run_dir, "avatarl loss {loss:+.4f} at step 1")


CASE_FUNCTIONS = {
    "sft": case_sft,
    "grpo": case_grpo,
    "lora_grpo": case_lora_grpo,
    "dpo": case_dpo,
    "grad_ckpt": case_grad_ckpt,
    "chunked_head": case_chunked_head,
    "unfused": case_unfused,
    "ppo": case_ppo,
    "online_dpo": case_online_dpo,
    "rejection": case_rejection,
    "reward": case_reward,
    "avatarl": case_avatarl,
    "grpo_unfused": case_grpo_unfused,
}


# ----------------------------------------------------------------------------- running


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:200]


def run_case(ctx: Context, name: str) -> Result:
    result = Result(name)
    run_dir = ctx.root / "runs" / name
    log_path = ctx.root / f"{name}.log"
    cuda = ctx.device.startswith("cuda")
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(ctx.device)
        result.info_start = f"{torch.cuda.memory_allocated(ctx.device) / 2**30:.2f} GiB allocated before it"
    quiet = not ctx.args.verbose
    with open(log_path, "w") as log, instruments() as seen:
        sink = contextlib.ExitStack()
        if quiet:  # the trainers' progress and notices go to <case>.log, shown when the case fails
            sink.enter_context(contextlib.redirect_stdout(log))
            sink.enter_context(contextlib.redirect_stderr(log))
        with sink:
            try:
                train, verify = CASE_FUNCTIONS[name](ctx, run_dir)
                if cuda:
                    torch.cuda.synchronize(ctx.device)
                t0 = time.perf_counter()
                train()
                if cuda:
                    torch.cuda.synchronize(ctx.device)
                    result.peak_gib = torch.cuda.max_memory_allocated(ctx.device) / 2**30
                result.seconds = time.perf_counter() - t0
                rows, result.info = verify(seen)
                result.tokens_per_s = median_tokens_per_s(rows)
                result.ok = True
            except Exception as exc:  # noqa: BLE001 - every failure is reported in the table, then the next case
                result.error = one_line(exc)
                traceback.print_exc(file=log if quiet else sys.stderr)
                if cuda and result.peak_gib is None:  # e.g. out of memory: the peak it reached
                    result.peak_gib = torch.cuda.max_memory_allocated(ctx.device) / 2**30
        seen.clear()
    if not result.ok and quiet:
        tail = log_path.read_text().strip().splitlines()[-15:]
        print(
            f"--- {name} failed; the last lines of its log ({log_path}, kept with --keep):",
            *("    " + t for t in tail),
            sep="\n",
        )
    elif result.ok:
        notes = "; ".join(n for n in (result.info.get("note", ""), result.info_start) if n)
        print(f"{name}: pass in {result.seconds:.1f} s" + (f"  ({notes})" if notes else ""))
    shutil.rmtree(run_dir, ignore_errors=True)  # checkpoints of a 0.5B model are several GB each
    return result


def fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def print_table(results: list[Result]) -> None:
    header = f"{'case':<13} {'status':<6} {'seconds':>8} {'tokens/s':>10} {'peak GiB':>9}  error"
    print(header)
    print("-" * len(header))
    for r in results:
        print(
            f"{r.case:<13} {'pass' if r.ok else 'FAIL':<6} {fmt(r.seconds, '.1f'):>8} "
            f"{fmt(r.tokens_per_s, ',.0f'):>10} {fmt(r.peak_gib, '.2f'):>9}  {r.error}".rstrip()
        )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    parser.add_argument("--small", action="store_true", help="a tiny Qwen2 model (for --device cpu: a minute or two)")
    parser.add_argument("--vocab", type=int, help="vocabulary size instead of the shapes' (151936; --small: 4096)")
    parser.add_argument("--steps", type=int, default=3, help="training steps per case (default 3)")
    parser.add_argument("--precision", default="bf16", choices=["bf16", "fp32"], help="default bf16")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated subset of {','.join(CASES)}")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (model, logs)")
    parser.add_argument("--verbose", action="store_true", help="show the trainers' output instead of logging it")
    args = parser.parse_args(argv)
    unknown = [c for c in args.cases.split(",") if c not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {unknown}; the cases are {', '.join(CASES)}")
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    if args.vocab is not None and args.vocab < 128:
        parser.error("--vocab must be at least 128 (the builtin:char tokenizer has 102 ids)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = args.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        print(f"gpu-check: torch {torch.__version__} sees no CUDA GPU; use --device cpu --small on a CPU")
        print("gpu-check: 0/0 pass")
        return 1
    import transformers

    root = Path(tempfile.mkdtemp(prefix="lmrl-gpu-check-"))
    arch = {**(SMALL if args.small else FULL), **({"vocab_size": args.vocab} if args.vocab else {})}
    ctx = Context(args, device, root, root / "model", arch)
    where = torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else "CPU"
    versions = f"torch {torch.__version__}, transformers {transformers.__version__}"
    with contextlib.suppress(ImportError):
        import peft

        versions += f", peft {peft.__version__}"
    print(f"gpu-check on {device} ({where}); Python {sys.version.split()[0]}, {versions}")
    names = [c for c in CASES if c in args.cases.split(",")]
    results: list[Result] = []
    t0 = time.perf_counter()
    try:
        try:
            params = build_model(ctx)
        except Exception as exc:  # noqa: BLE001 - no model, no case can run
            traceback.print_exc()
            results = [Result(name, error=f"model not built: {one_line(exc)}") for name in names]
        else:
            print(
                f"random Qwen2 model, {params / 1e6:.1f}M parameters ({'small' if args.small else 'Qwen2.5-0.5B'} "
                f"shapes, vocabulary {arch['vocab_size']}), built and saved in {time.perf_counter() - t0:.1f} s; "
                f"precision={args.precision}, {args.steps} steps per case"
            )
            for name in names:
                result = run_case(ctx, name)
                ctx.results[name] = result
                results.append(result)
    finally:
        if args.keep:
            print(f"kept: {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    print(f"total {time.perf_counter() - t0:.0f} s\n")
    print_table(results)
    passed = sum(r.ok for r in results)
    print(f"gpu-check: {passed}/{len(results)} pass")
    return 0 if results and passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Pretraining from scratch: next-token cross-entropy (``objective=ce``) or avatarl (``objective=avatarl``).

avatarl (tokenbender 2025; ``spec/avatarl.md``, ``docs/avatarl.md``) replaces the
cross-entropy loss by REINFORCE over an active token set A_t = {gold} ∪ top-k of the
student ∪ top-k of a frozen CE-trained critic, with a dense "expert consensus" reward
(reality p_r^0.7 times critic p_m^0.3, renormalised on A_t, above-threshold, clamped):
``lmrl.algorithms.avatarl_rewards`` / ``avatarl_loss``. Both objectives share the
data, the model, the optimizer and the metric that compares them: ``val/ce``, the
student's full-vocabulary cross-entropy on held-out windows (nats/token).

Deviations from the avataRL code, on purpose:
1. Fixed windows of ``block_size + 1`` tokens with stride ``block_size`` (every token
   is a target once per epoch), shuffled per epoch by ``seed``; the reference draws
   random offsets into a memmap. Here the data position is the step, so resume is exact.
2. AdamW (``TrainConfig``), not the inline Muon+Adam of the blog-time run.
3. The critic is any HF causal-LM checkpoint sharing the student's tokenizer, in the
   student's autocast dtype; no 4-bit loading.
4. The avatarl defaults are those of ``AvatarlOptions`` (k=16, entropy *bonus* 0.01,
   the code's sum/|A| threshold, clamp 1.5); every option is a config field.
As in every avataRL version there is no sampling (teacher forcing), no PPO clip, no GAE.

Launch::

    lmrl pretrain --config pretrain/ce_tiny_pydoc                    # CE: a critic (CPU)
    lmrl pretrain --config pretrain/avatarl_tiny_pydoc               # avatarl student of that critic
    lmrl pretrain objective=ce model=./gpt2-config from_scratch=true tokenizer=gpt2 data=text.txt
    python experiments/avatarl/run.py                                # CE vs avatarl, plot + results
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F

from lmrl.algorithms import AvatarlOptions, avatarl_loss, avatarl_rewards
from lmrl.config import ConfigError, TrainConfig, field
from lmrl.data.corpus import corpus_splits, load_text_source, pack_tokens
from lmrl.data.tokenizers import load_tokenizer
from lmrl.models import autocast, autocast_dtype, count_parameters, is_builtin, load_model
from lmrl.models.attention import use_fp32_cpu_attention
from lmrl.models.loading import default_tokenizer_name
from lmrl.rollout.hf import HFEngine, SamplingParams
from lmrl.trainers import common

_DEFAULT = AvatarlOptions()


@dataclasses.dataclass
class PretrainConfig(TrainConfig):
    objective: Literal["ce", "avatarl"] = field("ce", "ce: next-token cross-entropy; avatarl: REINFORCE on the critic+reality reward")
    from_scratch: bool = field(False, "HF model: build it from its config.json (+ model_args) with random init instead of loading weights")
    # data
    data: str = field("builtin:pydoc", "builtin:pydoc, a .txt/.md file, or an HF dataset / .jsonl file with a text column")
    text_column: str = field("text", "column holding the text of a dataset")
    data_split: str = field("train", "split of an HF dataset; its text is then cut into train/val by val_fraction")
    val_fraction: float = field(0.05, "last fraction of the text (cut at a line start) held out for val/ce")
    block_size: int = field(128, "tokens per training window (context length)")
    batch_size: int = field(32, "windows per optimizer step (split into grad_accum micro-batches)")
    eval_batches: int | None = field(8, "validation batches of batch_size windows per evaluation (null: every window)")
    sample_tokens: int = field(96, "tokens sampled (T=1) after a validation prefix for each of num_samples samples")
    # avatarl
    critic: str | None = field(None, "avatarl: frozen CE-trained critic (HF dir, e.g. runs/pretrain-ce-tiny-pydoc/final) sharing the student's tokenizer")
    top_k: int = field(_DEFAULT.top_k, "k of the student and critic top-k in the active set (write-up/blog run 16, HEAD 4)")
    epsilon: float = field(_DEFAULT.epsilon, "reality smoothing: gold gets 1-eps, the rest of the active set shares eps")
    reality_weight: float = field(_DEFAULT.reality_weight, "w_r, exponent of the reality expert (0.7)")
    mentor_weight: float = field(_DEFAULT.mentor_weight, "w_m, exponent of the critic expert (0.3)")
    threshold: Literal["sum_over_size", "mean"] = field(_DEFAULT.threshold, "sum_over_size: the code's bar s/|A| (dense); mean: the write-up's 1/|A|")
    reward_scale: float = field(_DEFAULT.reward_scale, "multiplier of kept rewards (x100; cancelled by the clamp when |A| < 66)")
    reward_clamp: float | None = field(_DEFAULT.reward_clamp, "per-position proportional rescale so that max reward <= this (code 1.5; null: off, as the blog charts)")
    critic_topk: bool = field(_DEFAULT.critic_topk, "include the critic's top-k in the active set (avataRL yes; pretrain-zero-rl fork no)")
    entropy_mode: Literal["bonus", "temperature"] = field(_DEFAULT.entropy_mode, "bonus: loss -= coef*H (write-up, blog-time code); temperature: log-probs of softmax(S/(1+coef)) (HEAD)")
    entropy_coef: float = field(_DEFAULT.entropy_coef, "beta of the entropy bonus, or the temperature offset (0.01)")
    chunk_size: int | None = field(_DEFAULT.chunk_size, "positions per chunk in the avatarl reward/loss (memory only; results identical)")
    output_dir: str = field("runs/pretrain", "run directory")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.batch_size % self.grad_accum:
            raise ConfigError(f"batch_size ({self.batch_size}) must be divisible by grad_accum ({self.grad_accum}); "
                              "each micro-batch has batch_size/grad_accum windows.")
        for name in ("block_size", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"'{name}' must be >= 1, got {getattr(self, name)}.")
        if self.eval_batches is not None and self.eval_batches < 1:
            raise ConfigError(f"'eval_batches' must be >= 1 or null (every validation window), got {self.eval_batches}.")
        if not 0.0 < self.val_fraction < 1.0:
            raise ConfigError(f"'val_fraction' must be in (0, 1), got {self.val_fraction}.")
        if self.objective == "avatarl" and not self.critic:
            raise ConfigError("objective=avatarl needs a critic: critic=<dir of a CE-trained model>, e.g. the final/ "
                              "of a run of `lmrl pretrain --config pretrain/ce_tiny_pydoc`.")
        if self.objective == "ce" and self.critic:
            raise ConfigError(f"critic={self.critic!r} is only used by objective=avatarl; remove it (critic=null) "
                              "or set objective=avatarl.")
        try:
            self.avatarl_options()
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc

    def avatarl_options(self) -> AvatarlOptions:
        """The avatarl fields of this config as an ``AvatarlOptions`` (ignore_index unused: windows have no padding)."""
        names = [f.name for f in dataclasses.fields(AvatarlOptions) if f.name != "ignore_index"]
        return AvatarlOptions(**{name: getattr(self, name) for name in names})


# --------------------------------------------------------------------------- data


@dataclasses.dataclass(frozen=True)
class Windows:
    """Token windows of the training and validation text; inputs w[:, :-1], targets w[:, 1:]."""

    train: torch.Tensor  # (n_train, block_size + 1) long
    val: torch.Tensor  # (n_val, block_size + 1) long
    summary: str


def load_windows(config: PretrainConfig, tokenizer) -> Windows:
    """Text of ``config.data``, split by ``val_fraction``, tokenized and packed into windows."""
    text = load_text_source(config.data, config.data_split, config.text_column)
    train_text, val_text = corpus_splits(config.val_fraction, text)
    parts = []
    for name, part in (("train", train_text), ("validation", val_text)):
        ids = tokenizer(part, add_special_tokens=False, verbose=False)["input_ids"]
        if len(ids) < config.block_size + 1:
            raise ValueError(f"the {name} text of {config.data} has {len(ids)} tokens, too few for one window of "
                             f"block_size + 1 = {config.block_size + 1}; lower block_size, change val_fraction "
                             f"({config.val_fraction}) or give more text.")
        parts.append((ids, pack_tokens(ids, config.block_size)))
    unk = tokenizer.unk_token_id
    n_unk = sum(ids.count(unk) for ids, _ in parts) if unk is not None else 0
    n_tokens = sum(len(ids) for ids, _ in parts)
    summary = (f"{config.data}: {n_tokens} tokens ({n_unk / n_tokens:.2%} unknown), {len(parts[0][1])} train / "
               f"{len(parts[1][1])} val windows of {config.block_size}")
    return Windows(train=parts[0][1], val=parts[1][1], summary=summary)


# --------------------------------------------------------------------------- models


def build_student(config: PretrainConfig):
    """(model, tokenizer): a built-in model, an HF checkpoint, or an HF config with fresh weights."""
    tokenizer = load_tokenizer(config.tokenizer or default_tokenizer_name(config.model))
    if config.from_scratch and not is_builtin(config.model):
        from transformers import AutoConfig, AutoModelForCausalLM

        hf_config = AutoConfig.from_pretrained(config.model)
        unknown = sorted(set(config.model_args) - set(hf_config.to_dict()))
        if unknown:
            raise ValueError(f"model_args {unknown} are not fields of {config.model}'s {type(hf_config).__name__}; "
                             f"valid ones include {sorted(hf_config.to_dict())[:12]}... Check the spelling.")
        hf_config.update(config.model_args)
        with torch.random.fork_rng():
            torch.manual_seed(config.seed)
            model = AutoModelForCausalLM.from_config(hf_config)
        use_fp32_cpu_attention(model)
    else:
        model = load_model(config.model, tokenizer, seed=config.seed, model_args=config.model_args)
    if model.config.vocab_size < len(tokenizer):
        raise ValueError(f"the tokenizer has {len(tokenizer)} tokens but model {config.model!r} only "
                         f"{model.config.vocab_size} embeddings; set vocab_size >= {len(tokenizer)} or change tokenizer.")
    return model, tokenizer


def load_critic(path: str, student, tokenizer):
    """A frozen critic that shares the student's vocabulary, checked before any training step."""
    if is_builtin(path):
        raise ValueError(f"critic={path!r} is a randomly initialised built-in model, not a trained critic. Train one "
                         "with `lmrl pretrain objective=ce` and pass its final/ directory.")
    critic = load_model(path, tokenizer)
    critic_vocab, student_vocab = critic.config.vocab_size, student.config.vocab_size
    if critic_vocab != student_vocab:
        raise ValueError(f"critic {path!r} has a vocabulary of {critic_vocab} tokens but the student has "
                         f"{student_vocab}. The avatarl reward compares token ids, so the critic must use the "
                         "student's tokenizer and vocabulary size: train the critic with `lmrl pretrain objective=ce` "
                         "and the same tokenizer/model vocabulary.")
    if any((Path(path) / name).exists() for name in ("tokenizer.json", "tokenizer_config.json")):
        critic_tokens, student_tokens = load_tokenizer(path).get_vocab(), tokenizer.get_vocab()
        if critic_tokens != student_tokens:
            differ = sorted(set(critic_tokens.items()) ^ set(student_tokens.items()))[:3]
            raise ValueError(f"critic {path!r} was trained with another tokenizer than the student's (e.g. "
                             f"token/id pairs {differ} are in only one of them). The reward compares token ids; "
                             "use the critic's tokenizer for the student (tokenizer=...) or retrain the critic.")
    critic.eval().requires_grad_(False)
    return critic


def check_models(config: PretrainConfig, student, critic) -> None:
    """Start-up checks that would otherwise fail (or silently mislead) during training."""
    for name, model in (("model", student), ("critic", critic)):
        limit = getattr(model.config, "max_position_embeddings", None) if model is not None else None
        if limit is not None and config.block_size > limit:
            raise ValueError(f"block_size={config.block_size} is longer than the {name}'s context "
                             f"(max_position_embeddings={limit}); use block_size <= {limit}.")
    vocab = student.config.vocab_size
    if config.objective == "avatarl" and config.top_k > vocab:
        raise ValueError(f"top_k={config.top_k} is larger than the vocabulary of {vocab} tokens; the active set "
                         f"takes the top-k of it. Use top_k <= {vocab}.")


# --------------------------------------------------------------------------- objectives


def ce_objective(logits, targets, critic_logits, options) -> tuple[torch.Tensor, dict[str, float]]:
    """Mean next-token cross-entropy -log π(y_t|s_t) over all positions (the standard pretraining loss)."""
    loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())  # (B·T, V) vs (B·T,)
    return loss, {}


@torch.no_grad()
def expected_reward(logits: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor,
                    chunk_size: int | None) -> float:
    """E_{a~π}[r(a)] = Σ_{a∈A_t} softmax(S_t)(a)·r_t(a), mean over positions: the return REINFORCE ascends.

    logits (B, T, V); actions, rewards (B, T, A) from ``avatarl_rewards`` (repeated slots have r = 0,
    so nothing is counted twice). Chunked over positions like the loss, to bound memory.
    """
    vocab, width = logits.shape[-1], actions.shape[-1]
    flat, acts, r = logits.reshape(-1, vocab), actions.reshape(-1, width), rewards.reshape(-1, width)
    step = chunk_size or flat.shape[0]
    total = 0.0
    for start in range(0, flat.shape[0], step):
        rows = slice(start, start + step)
        log_pi = flat[rows].float().log_softmax(-1).gather(-1, acts[rows])  # (n, A)
        total += float((log_pi.exp() * r[rows]).sum())
    return total / max(1, flat.shape[0])


def avatarl_objective(logits, targets, critic_logits, options) -> tuple[torch.Tensor, dict[str, float]]:
    """avatarl loss on the active set with the consensus reward (``lmrl.algorithms.avatarl``)."""
    out = avatarl_rewards(logits, critic_logits, targets, options)
    loss, stats = avatarl_loss(logits, out.actions, out.mask, out.rewards, options)
    stats["avatarl/expected_reward"] = expected_reward(logits, out.actions, out.rewards, options.chunk_size)
    return loss, stats


OBJECTIVES = {"ce": ce_objective, "avatarl": avatarl_objective}


def train_step(model, critic, windows: torch.Tensor, objective: str, options: AvatarlOptions, grad_accum: int,
               dtype, step: int) -> dict[str, float]:
    """Forward/backward of one optimizer batch of windows (B, L+1) in ``grad_accum`` equal micro-batches.

    Every window has L targets and both objectives average over positions, so the mean of
    the micro-batch losses is the batch loss: accumulation is exact. Stats are micro-batch
    means (``avatarl/reward_max``: the max); ``train/ce`` is the CE of the same logits.
    """
    totals: dict[str, float] = {}
    for micro in windows.chunk(grad_accum):
        inputs, targets = micro[:, :-1], micro[:, 1:]  # (b, L) each
        with autocast("cpu", dtype):
            logits = model(input_ids=inputs).logits  # (b, L, V)
            critic_logits = None
            if critic is not None:
                with torch.no_grad():
                    critic_logits = critic(input_ids=inputs).logits  # (b, L, V)
        loss, stats = OBJECTIVES[objective](logits, targets, critic_logits, options)
        common.check_finite(loss, step)
        (loss / grad_accum).backward()
        with torch.no_grad():
            ce = F.cross_entropy(logits.detach().float().flatten(0, 1), targets.flatten())
        for key, value in {"loss": loss.item(), "train/ce": ce.item(), **stats}.items():
            if key == "avatarl/reward_max":
                totals[key] = max(totals.get(key, value), value)
            else:
                totals[key] = totals.get(key, 0.0) + value / grad_accum
    return totals


# --------------------------------------------------------------------------- evaluation


@torch.no_grad()
def validation_stats(model, windows: torch.Tensor, batch_size: int, dtype) -> dict[str, float]:
    """Over every target of ``windows`` (n, L+1), in nats/token: ``val/ce`` = mean -log π(y_t|s_t) (full
    vocabulary) and ``val/entropy`` = mean H[π(·|s_t)]; entropy > CE means over-dispersed predictions."""
    was_training = model.training
    model.eval()
    ce, entropy, count = 0.0, 0.0, 0
    for batch in windows.split(batch_size):
        with autocast("cpu", dtype):
            logits = model(input_ids=batch[:, :-1]).logits  # (b, L, V)
        log_p = logits.float().log_softmax(-1)  # (b, L, V)
        targets = batch[:, 1:]  # (b, L)
        ce -= log_p.gather(-1, targets.unsqueeze(-1)).sum().item()
        entropy -= (log_p.exp() * log_p).sum().item()
        count += targets.numel()
    model.train(was_training)
    return {"val/ce": ce / count, "val/entropy": entropy / count}


def sample_continuations(model, tokenizer, windows: torch.Tensor, config: PretrainConfig, dtype,
                         step: int) -> list[dict[str, str]]:
    """``num_samples`` continuations (T=1, no stop) of the first half of evenly spaced validation windows."""
    if config.num_samples == 0:
        return []
    picks = torch.linspace(0, len(windows) - 1, config.num_samples).long().tolist()
    prompts = [windows[i, : max(1, config.block_size // 2)].tolist() for i in picks]
    engine = HFEngine(model, tokenizer, autocast_dtype=dtype)
    params = SamplingParams(max_new_tokens=config.sample_tokens, stop_token_ids=())
    generator = torch.Generator().manual_seed(config.seed * 1_000_003 + step)
    batch = engine.generate(prompts, params, n=1, generator=generator)
    return [{"prompt": tokenizer.decode(p), "continuation": c} for p, c in zip(prompts, batch.completions)]


def evaluate(model, tokenizer, val: torch.Tensor, config: PretrainConfig, dtype, step: int):
    """val/ce, val/entropy and val/ppl = exp(val/ce) on the first eval_batches·batch_size windows, and samples."""
    metrics = validation_stats(model, val, config.batch_size, dtype)
    samples = sample_continuations(model, tokenizer, val, config, dtype, step)
    return {**metrics, "val/ppl": math.exp(metrics["val/ce"])}, samples


# --------------------------------------------------------------------------- the loop


def _setup(config: PretrainConfig):
    """Models, data and start-up checks: everything that can fail does so before the run directory is touched."""
    model, tokenizer = build_student(config)
    critic = load_critic(config.critic, model, tokenizer) if config.objective == "avatarl" else None
    check_models(config, model, critic)
    windows = load_windows(config, tokenizer)
    limit = None if config.eval_batches is None else config.eval_batches * config.batch_size
    return model, tokenizer, critic, windows.train, windows.val[:limit], windows.summary


def train(config: PretrainConfig) -> dict[str, float]:
    """Pretrain end to end; returns the final val/ce and val/ppl (plus ``initial/...`` and the critic's val/ce)."""
    model, tokenizer, critic, train_windows, val, summary = _setup(config)
    run = common.start_run(config, f"pretrain {config.objective}")
    tracker, dtype, options = run.tracker, autocast_dtype(config.precision), config.avatarl_options()
    optimizer = common.build_optimizer(model, config)
    scheduler = common.build_scheduler(optimizer, config)
    tokens_per_step = config.batch_size * config.block_size
    tracker.print(f"pretrain objective={config.objective}: {count_parameters(model) / 1e6:.2f}M params, {summary}, "
                  f"{tokens_per_step} tokens/step, precision={'bf16 autocast' if dtype else 'fp32'}, run dir {run.dir}")
    if run.checkpoint:
        initial = common.restore_checkpoint(run.checkpoint, model, optimizer, scheduler).get("initial", {})
    else:
        metrics, samples = evaluate(model, tokenizer, val, config, dtype, 0)
        if critic is not None:
            metrics["critic/val_ce"] = validation_stats(critic, val, config.batch_size, dtype)["val/ce"]
        initial = {f"initial/{k}": v for k, v in metrics.items()}
        tracker.log(0, metrics)
        tracker.log_samples(0, samples, "validation continuations")
    model.train()
    try:
        for step in range(run.start_step + 1, config.max_steps + 1):
            t0 = time.perf_counter()
            rows = common.epoch_batch_indices(len(train_windows), config.batch_size, step, config.seed)
            stats = train_step(model, critic, train_windows[rows], config.objective, options, config.grad_accum,
                               dtype, step=step)
            grad_norm = common.optimizer_step(model, optimizer, scheduler, config.max_grad_norm, step)
            elapsed = time.perf_counter() - t0
            if step % config.log_every == 0 or step == config.max_steps:
                tracker.log(step, {**stats, "grad_norm": grad_norm, "lr": scheduler.get_last_lr()[0],
                                   "tokens": step * tokens_per_step, "tokens_per_s": tokens_per_step / elapsed,
                                   "time/train_s": elapsed})
            else:
                tracker.advance(step)
            if step == config.max_steps:
                break
            if config.eval_every and step % config.eval_every == 0:
                metrics, samples = evaluate(model, tokenizer, val, config, dtype, step)
                tracker.log(step, {**metrics, "tokens": step * tokens_per_step})
                tracker.log_samples(step, samples, "validation continuations")
            if config.save_every and step % config.save_every == 0:
                common.save_checkpoint(run, step, model, tokenizer, optimizer, scheduler, {"initial": initial},
                                       config.keep_checkpoints)
    except BaseException:  # divergence, Ctrl-C, crash: stop the progress bar, keep the last good checkpoint
        tracker.close()
        raise
    final, samples = evaluate(model, tokenizer, val, config, dtype, config.max_steps)
    tracker.log(config.max_steps, {**final, "tokens": config.max_steps * tokens_per_step})
    tracker.log_samples(config.max_steps, samples, "validation continuations")
    common.save_checkpoint(run, config.max_steps, model, tokenizer, optimizer, scheduler, {"initial": initial},
                           config.keep_checkpoints)
    final_dir = common.save_final(run, model, tokenizer)
    plots = tracker.close()
    tracker.print(f"val/ce {final['val/ce']:.4f} (initial {initial['initial/val/ce']:.4f}). Final model: {final_dir}  "
                  f"plots: {run.dir / 'plots'} ({len(plots)} files)")
    return {**initial, **final}

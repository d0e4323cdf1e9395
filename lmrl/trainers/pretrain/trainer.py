"""Pretraining from scratch: next-token cross-entropy (``objective=ce``) or avatarl (``objective=avatarl``).

avatarl (tokenbender 2025; ``spec/avatarl.md``, ``docs/avatarl.md``) replaces the
cross-entropy loss by REINFORCE over an active token set A_t = {gold} ∪ top-k of the
student ∪ top-k of a frozen CE-trained critic, with a dense "expert consensus" reward
(reality p_r^0.7 times critic p_m^0.3, renormalised on A_t, above-threshold, clamped):
``lmrl.algorithms.avatarl_rewards`` / ``avatarl_loss``. Both objectives share the
data, the model, the optimizer and the metric that compares them: ``eval/ce``, the
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

Layout: this module is the method (models, objectives, the step, evaluation); its keys are in ``config.py`` and
the text windows, the cross-entropy and ``eval/ce`` in `lmrl.trainers.lm_windows` (shared with PPO-ptx).

Launch::

    lmrl pretrain --config pretrain/ce_tiny_pydoc                    # CE: a critic (CPU)
    lmrl pretrain --config pretrain/avatarl_tiny_pydoc               # avatarl student of that critic
    lmrl pretrain objective=ce model=./gpt2-config from_scratch=true tokenizer=gpt2 data=text.txt
    python experiments/avatarl/run.py                                # CE vs avatarl, plot + results
"""

from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F

from lmrl.algorithms import AvatarlOptions, avatarl_loss, avatarl_rewards
from lmrl.algorithms.avatarl_head import avatarl_head_loss
from lmrl.data.tokenizers import load_tokenizer
from lmrl.models import autocast, describe_parameters, is_builtin
from lmrl.models.attention import use_fp32_cpu_attention
from lmrl.models.head import DEFAULT_CHUNK_MB, chunk_tokens, chunked_head, decoder_and_head, fusable
from lmrl.models.hf_compat import no_cache
from lmrl.models.loading import default_tokenizer_name, load_hf_config
from lmrl.models.placement import model_device
from lmrl.models.setup import ModelSetup
from lmrl.parallel import runtime
from lmrl.rollout.engines.hf import HFEngine, SamplingParams
from lmrl.tracking import console
from lmrl.trainers import common, loop
from lmrl.trainers.lm_windows import load_windows, mean_ce, validation_stats
from lmrl.trainers.pretrain.config import PretrainConfig

# --------------------------------------------------------------------------- models


def build_student(config: PretrainConfig, setup: ModelSetup):
    """(model, tokenizer): a built-in model or an HF checkpoint (the setup's policy), or an HF config with fresh
    weights (``from_scratch``)."""
    if not config.from_scratch or is_builtin(config.model):
        return setup.policy()
    from transformers import AutoModelForCausalLM

    tokenizer = load_tokenizer(config.tokenizer or default_tokenizer_name(config.model))
    hf_config = load_hf_config(config.model)  # an HF model's config.json, or a GGUF file's metadata
    unknown = sorted(set(config.model_args) - set(hf_config.to_dict()))
    if unknown:
        raise ValueError(
            f"model_args {unknown} are not fields of {config.model}'s {type(hf_config).__name__}; "
            f"valid ones include {sorted(hf_config.to_dict())[:12]}... Check the spelling."
        )
    hf_config.update(config.model_args)
    with torch.random.fork_rng():
        torch.manual_seed(config.seed)
        model = AutoModelForCausalLM.from_config(hf_config)
    use_fp32_cpu_attention(model)
    if model.config.vocab_size < len(tokenizer):
        raise ValueError(
            f"the tokenizer has {len(tokenizer)} tokens but model {config.model!r} only "
            f"{model.config.vocab_size} embeddings; set vocab_size >= {len(tokenizer)} or change tokenizer."
        )
    return model.to(setup.device), tokenizer


def load_critic(path: str, student, tokenizer, setup: ModelSetup):
    """The frozen critic (`ModelSetup.frozen`), checked to share the student's vocabulary before any training step."""
    if is_builtin(path):
        raise ValueError(
            f"critic={path!r} is a randomly initialised built-in model, not a trained critic. Train one "
            "with `lmrl pretrain objective=ce` and pass its final/ directory."
        )
    return setup.frozen_partner(
        path,
        student,
        tokenizer,
        "critic",
        "The avatarl reward compares token ids (train the critic with `lmrl pretrain "
        "objective=ce` and the student's tokenizer)",
    )


def check_models(config: PretrainConfig, student, critic) -> None:
    """Start-up checks that would otherwise fail (or silently mislead) during training."""
    for name, model in (("model", student), ("critic", critic)):
        limit = getattr(model.config, "max_position_embeddings", None) if model is not None else None
        if limit is not None and config.block_size > limit:
            raise ValueError(
                f"block_size={config.block_size} is longer than the {name}'s context "
                f"(max_position_embeddings={limit}); use block_size <= {limit}."
            )
    vocab = student.config.vocab_size
    if config.objective == "avatarl" and config.top_k > vocab:
        raise ValueError(
            f"top_k={config.top_k} is larger than the vocabulary of {vocab} tokens; the active set "
            f"takes the top-k of it. Use top_k <= {vocab}."
        )


# --------------------------------------------------------------------------- objectives


@torch.no_grad()
def expected_reward(
    logits: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor, chunk_size: int | None
) -> float:
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


def chunked_avatarl(
    model, critic, inputs: torch.Tensor, targets: torch.Tensor, options: AvatarlOptions, chunk_mb: float
) -> tuple[torch.Tensor, dict[str, float]] | None:
    """The avatarl loss and stats from the student's and critic's hidden states through their LM heads in chunks
    of positions (`lmrl.algorithms.avatarl_head`: about ``chunk_mb`` of fp32 logits at once, forward and backward);
    None when the logits fit in one chunk or a head is not a plain bias-free linear layer (then full logits)."""
    parts = chunked_head(model, targets.numel(), chunk_mb)
    critic_parts = decoder_and_head(critic) if critic is not None else None
    if parts is None or critic_parts is None or not all(p.plain and fusable(p.head) for p in (parts, critic_parts)):
        return None
    hidden = parts.decoder(input_ids=inputs, use_cache=False).last_hidden_state  # (b, L, H)
    with torch.no_grad():
        critic_hidden = critic_parts.decoder(input_ids=inputs, use_cache=False).last_hidden_state  # (b, L, H_c)
    # a chunk holds student and critic logits, log-probs and the gradient: four (m, V) fp32 tensors
    rows = chunk_tokens(parts.head.weight.shape[0], chunk_mb) // 4
    return avatarl_head_loss(hidden, parts.head.weight, critic_hidden, critic_parts.head.weight, targets, options, rows)


def avatarl_micro_batch(
    model, critic, windows: torch.Tensor, options: AvatarlOptions, dtype, chunk_mb: float
) -> tuple[torch.Tensor, dict[str, float], torch.Tensor]:
    """The avatarl loss of ``windows`` (b, L+1) on the model's device, its stats and the CE of the same logits:
    student and critic logits chunk by chunk (`chunked_avatarl`) when both heads allow it, else full logits."""
    inputs, targets = windows[:, :-1], windows[:, 1:]  # (b, L) each
    with autocast(model_device(model).type, dtype):
        fused = chunked_avatarl(model, critic, inputs, targets, options, chunk_mb)
        if fused is None:
            logits = model(input_ids=inputs, **no_cache(model)).logits  # (b, L, V)
            critic_logits = None
            if critic is not None:
                with torch.no_grad():
                    critic_logits = critic(input_ids=inputs, **no_cache(critic)).logits  # (b, L, V)
    if fused is not None:
        loss, stats = fused
        return loss, stats, torch.tensor(stats.pop("loss/ce"))
    loss, stats = avatarl_objective(logits, targets, critic_logits, options)
    with torch.no_grad():
        ce = F.cross_entropy(logits.detach().float().flatten(0, 1), targets.flatten())
    return loss, stats, ce


def train_step(
    model,
    critic,
    windows: torch.Tensor,
    objective: str,
    options: AvatarlOptions,
    grad_accum: int,
    dtype,
    step: int,
    chunk_mb: float = DEFAULT_CHUNK_MB,
    ranks: int = 1,
) -> dict[str, float]:
    """Forward/backward of one optimizer batch of windows (B, L+1) in ``grad_accum`` equal micro-batches.

    Every window has L targets and both objectives average over positions, so the mean of
    the micro-batch losses is the batch loss: accumulation is exact. Stats are micro-batch
    means (``avatarl/reward_max``: the max); ``loss/ce`` is the CE of the same logits. The CE objective never
    builds more than ``chunk_mb`` of fp32 logits (`lmrl.trainers.lm_windows.mean_ce`), nor does avatarl when both
    heads are plain linear layers (`chunked_avatarl`: student and critic logits chunk by chunk); otherwise avatarl
    takes full logits. ``ranks``: processes that each hold an equal share of the batch (the backward loss is this
    share's part of the batch mean).
    """
    totals: dict[str, float] = {}
    for micro in windows.to(model_device(model)).chunk(grad_accum):
        if objective == "ce":
            loss, stats = mean_ce(model, micro, dtype, chunk_mb), {}
            ce = loss.detach()
        else:
            loss, stats, ce = avatarl_micro_batch(model, critic, micro, options, dtype, chunk_mb)
        common.check_finite(loss, step)
        (loss * (1.0 / (grad_accum * ranks))).backward()
        for key, value in {"loss": loss.item(), "loss/ce": ce.item(), **stats}.items():
            if key == "avatarl/reward_max":
                totals[key] = max(totals.get(key, value), value)
            else:
                totals[key] = totals.get(key, 0.0) + value / grad_accum
    return totals


# --------------------------------------------------------------------------- evaluation


def sample_continuations(
    model, tokenizer, windows: torch.Tensor, config: PretrainConfig, dtype, step: int
) -> list[dict[str, str]]:
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
    """eval/ce, eval/entropy and eval/ppl = exp(eval/ce) on the first eval_batches·batch_size windows, and samples."""
    metrics = validation_stats(model, val, config.batch_size, dtype, config.logprob_chunk_mb)
    samples = sample_continuations(model, tokenizer, val, config, dtype, step)
    return {**metrics, "eval/ppl": math.exp(metrics["eval/ce"])}, samples


# --------------------------------------------------------------------------- the method


class Pretrain(loop.MethodDefaults):
    """The pretraining method for `loop.run`: one step is one optimizer step on ``batch_size`` windows (several
    processes: an equal share each)."""

    data_parallel = True

    samples_title = "validation continuations"

    def describe(self, run: common.Run) -> str:
        return (
            f"pretrain objective={self.config.objective}: {describe_parameters(self.model)}, "
            f"{self.data_summary}, {self.tokens_per_step} tokens/step, precision={self.setup.precision_name}, "
            f"run dir {run.dir}"
        )

    def __init__(self, config: PretrainConfig, setup: ModelSetup):
        """Models, data and start-up checks: everything that can fail does so before the run directory is touched."""
        self.config, self.setup = config, setup
        self.model, self.tokenizer = build_student(config, setup)
        self.critic = None
        if config.objective == "avatarl":
            self.critic = load_critic(config.critic, self.model, self.tokenizer, setup)
        check_models(config, self.model, self.critic)
        windows = load_windows(config, self.tokenizer)
        limit = None if config.eval_batches is None else config.eval_batches * config.batch_size
        self.train_windows, self.val, self.data_summary = windows.train, windows.val[:limit], windows.summary
        self.options, self.tokens_per_step = config.avatarl_options(), config.batch_size * config.block_size
        self.model.train()
        self.optimizer = common.build_optimizer(self.model, config)
        self.scheduler = common.build_scheduler(self.optimizer, config)

    def step(self, step: int) -> dict[str, float]:
        config, t0 = self.config, time.perf_counter()
        rows = runtime.shard(common.epoch_batch_indices(len(self.train_windows), config.batch_size, step, config.seed))
        stats = train_step(
            self.model,
            self.critic,
            self.train_windows[rows],
            config.objective,
            self.options,
            config.grad_accum,
            self.setup.dtype,
            step=step,
            chunk_mb=config.logprob_chunk_mb,
            ranks=runtime.world(),
        )
        return {
            **stats,
            **common.finish_step(self, step, t0, self.tokens_per_step / runtime.world()),
            "time/tokens": step * self.tokens_per_step,
        }

    def evaluate(self, step: int) -> tuple[dict[str, float], list[dict]]:
        """`evaluate`, plus the critic's eval/ce at the initial evaluation (step 0) and the tokens seen after it."""
        config, dtype = self.config, self.setup.dtype
        metrics, samples = evaluate(self.model, self.tokenizer, self.val, config, dtype, step)
        if step > 0:
            metrics["time/tokens"] = step * self.tokens_per_step
        elif self.critic is not None:
            metrics["eval/critic_ce"] = validation_stats(
                self.critic, self.val, config.batch_size, dtype, config.logprob_chunk_mb
            )["eval/ce"]
        return metrics, samples


def train(config: PretrainConfig) -> dict[str, float]:
    """Pretrain end to end; returns the final eval/ce and eval/ppl (plus ``initial/...``: the critic's
    eval/critic_ce)."""
    result = loop.train(Pretrain, config, f"pretrain {config.objective}")
    console.print(f"eval/ce {result['eval/ce']:.4f} (initial {result['initial/eval/ce']:.4f})")
    return result

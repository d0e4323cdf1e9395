"""Supervised fine-tuning (instruction tuning): next-token cross-entropy on completion tokens only.

RLHF book ch. 4: prompt tokens are masked out of the loss (labels -100); with
multi-turn chats either every assistant turn or only the last is trained
(``train_on``). The loss is the mean over all completion tokens of the optimizer
batch, whatever the micro-batching (``grad_accum``), so accumulation is exact.

Launch::

    lmrl sft --config sft/tiny_arithmetic                       # built-in task, CPU
    lmrl sft model=Qwen/Qwen2.5-0.5B dataset=data.jsonl max_length=1024 batch_size=64 grad_accum=8
"""

from __future__ import annotations

import time
from typing import Any

import torch

from lmrl.data import packing
from lmrl.data.loading import is_generated, load_rows
from lmrl.data.prompt_format import PromptFormat
from lmrl.data.sft import SFTExample, build_sft_examples, collate_sft
from lmrl.eval.generation import task_accuracy
from lmrl.models import describe_parameters
from lmrl.models.head import DEFAULT_CHUNK_MB
from lmrl.models.logprobs import labelled_logprobs
from lmrl.models.placement import model_device, to_device
from lmrl.models.setup import ModelSetup
from lmrl.parallel import runtime
from lmrl.rollout.tools.section import build_env_factory
from lmrl.trainers import agentic, common, loop
from lmrl.trainers.sft.config import SFTConfig  # also `lmrl sft`'s config (lmrl/cli.py)


def token_cross_entropy(
    model, batch: dict[str, torch.Tensor], dtype: torch.dtype | None, chunk_mb: float = DEFAULT_CHUNK_MB
) -> tuple[torch.Tensor, int]:
    """Summed next-token CE over labelled tokens of ``batch`` (padded rows, or packed ones: `lmrl.data.packing`) and
    the number of labelled tokens. Logits beyond ``chunk_mb`` of fp32 go through the LM head in chunks."""
    logp, labelled = labelled_logprobs(model, to_device(batch, model_device(model)), dtype, chunk_mb)
    return -logp.sum(), int(labelled.sum())


def labelled_tokens(examples: list[SFTExample]) -> int:
    return sum(sum(1 for y in ex.labels[1:] if y != -100) for ex in examples)


def padded_micro_batches(examples: list[SFTExample], pad_id: int, grad_accum: int) -> list[tuple[dict, float]]:
    """``grad_accum`` right-padded micro-batches of equal row counts, each with loss weight 1."""
    micro = len(examples) // grad_accum
    return [(collate_sft(examples[i * micro : (i + 1) * micro], pad_id), 1.0) for i in range(grad_accum)]


def packed_micro_batches(examples: list[SFTExample], max_tokens: int) -> list[tuple[dict, float]]:
    """The whole batch packed first-fit-decreasing into sequences of <= ``max_tokens`` tokens, dealt to the ranks by
    token count (`lmrl.data.packing`); this rank's share. A rank with one bin fewer than the others repeats one at
    loss weight 0, so every rank runs the same number of backward passes (each reduces gradients)."""
    lengths = [len(ex.input_ids) for ex in examples]
    bins = packing.first_fit_decreasing(lengths, max_tokens)
    shares = packing.balance(bins, lengths, runtime.world())
    mine = shares[runtime.rank()]
    batches = [(packing.pack([examples[i].input_ids for i in b], [examples[i].labels for i in b]), 1.0) for b in mine]
    while len(batches) < max(len(share) for share in shares):
        spare = mine[0] if mine else bins[0]
        batches.append((packing.pack([examples[i].input_ids for i in spare], [examples[i].labels for i in spare]), 0.0))
    return batches


def train_step(
    model,
    micro_batches: list[tuple[dict, float]],
    dtype,
    step: int,
    total_tokens: int,
    chunk_mb: float = DEFAULT_CHUNK_MB,
) -> dict[str, float]:
    """Forward/backward over ``micro_batches`` (batch, loss weight); the loss is the token mean over the whole
    optimizer batch, whose labelled tokens (over every rank) are ``total_tokens``."""
    loss_sum = 0.0
    for batch, weight in micro_batches:
        loss, _ = token_cross_entropy(model, batch, dtype, chunk_mb)
        common.check_finite(loss, step)
        (loss * (weight / total_tokens)).backward()
        loss_sum += weight * loss.item()
    return {"loss": loss_sum / total_tokens, "tokens": float(total_tokens)}


@torch.no_grad()
def eval_loss(model, examples: list[SFTExample], pad_id: int, dtype, batch_size: int = 64) -> float:
    total, tokens = 0.0, 0
    for start in range(0, len(examples), batch_size):
        loss, n = token_cross_entropy(model, collate_sft(examples[start : start + batch_size], pad_id), dtype)
        total, tokens = total + loss.item(), tokens + n
    return total / max(1, tokens)


def load_data(
    config: SFTConfig, tokenizer, tool_context=None
) -> tuple[list[SFTExample], list[SFTExample], list[dict[str, Any]]]:
    """Training examples, held-out examples and held-out rows (for task accuracy), validated at start-up."""
    rows = load_rows(config.dataset, split=config.split, limit=config.train_rows, **config.task_args)
    examples, stats = build_sft_examples(
        rows,
        tokenizer,
        config.max_length,
        config.overlong,
        config.train_on,
        config.chat,
        where=config.dataset,
        tool_context=tool_context,
    )
    if not examples:
        raise ValueError(f"No usable training examples in {config.dataset} ({stats}).")
    eval_source = config.eval_dataset or (config.dataset if is_generated(config.dataset) else None)
    eval_rows: list[dict[str, Any]] = []
    eval_examples: list[SFTExample] = []
    if eval_source:
        eval_rows = load_rows(eval_source, split=config.eval_split, limit=config.eval_rows, **config.task_args)
        eval_examples, _ = build_sft_examples(
            eval_rows,
            tokenizer,
            config.max_length,
            "truncate",
            config.train_on,
            config.chat,
            where=eval_source,
            tool_context=tool_context,
        )
    return examples, eval_examples, eval_rows, stats


def evaluate(
    model, tokenizer, config: SFTConfig, eval_examples, eval_rows, dtype, env_factory=None
) -> tuple[dict, list]:
    metrics: dict[str, float] = {}
    samples: list[dict] = []
    was_training = model.training
    model.eval()
    if eval_examples:
        metrics["eval/loss"] = eval_loss(model, eval_examples, tokenizer.pad_token_id, dtype)
    if eval_rows and "task" in eval_rows[0] and env_factory is not None:  # tool episodes
        episode_metrics, samples = agentic.evaluate_episodes(
            model, tokenizer, eval_rows, config, dtype, env_factory, config.eval_max_new_tokens
        )
        metrics.update(episode_metrics)
    elif eval_rows and "task" in eval_rows[0]:
        acc, samples = task_accuracy(
            model,
            tokenizer,
            eval_rows,
            config.eval_max_new_tokens,
            dtype,
            num_samples=config.num_samples,
            prompt_format=PromptFormat(config.chat),  # as the rows were trained
        )
        metrics["eval/accuracy"] = acc["accuracy"]
    model.train(was_training)
    return metrics, samples


def accuracy_reached(target: float | None, metrics: dict[str, float]) -> str | None:
    """The reason to stop early (``stop_at_accuracy``) once held-out accuracy reaches ``target``, else None."""
    if target is not None and metrics.get("eval/accuracy", 0.0) >= target:
        return f"Held-out accuracy {metrics['eval/accuracy']:.1%} >= stop_at_accuracy {target:.1%}"
    return None


class SFT(loop.MethodDefaults):
    """The SFT method for `loop.run`: one step is one optimizer step on ``batch_size`` examples (with several
    processes, each rank forwards an equal share; the loss is normalised by the whole batch's tokens)."""

    data_parallel = True

    def __init__(self, config: SFTConfig, setup: ModelSetup):
        self.config, self.setup = config, setup
        model, self.tokenizer = setup.policy(distribute=False)
        if config.max_tokens_per_microbatch:  # on the plain model, before FSDP/DDP wrap it
            packing.check_packable(model, len(self.tokenizer))
        self.model = setup.distribute(model)
        self.model.train()
        self.env_factory = build_env_factory(config, self.tokenizer)  # tools: tool template, tool-episode eval
        tool_context = None
        if config.multi_turn:
            from lmrl.data.tool_chat import ToolContext
            from lmrl.rollout.tools.toolbox import ToolBox, build_tools

            schemas = ToolBox(build_tools(config.tools, config.tool_kwargs)).schemas() if config.tools else []
            tool_context = ToolContext(schemas, config.turn_options().parser, config.train_tool_calls)
        self.examples, self.eval_examples, self.eval_rows, self.data_stats = load_data(
            config, self.tokenizer, tool_context
        )
        self.optimizer = common.build_optimizer(self.model, config)
        self.scheduler = common.build_scheduler(self.optimizer, config)

    def step(self, step: int) -> dict[str, float]:
        config, t0 = self.config, time.perf_counter()
        batch = [
            self.examples[i]
            for i in common.epoch_batch_indices(len(self.examples), config.batch_size, step, config.seed)
        ]
        if config.max_tokens_per_microbatch:
            micro_batches = packed_micro_batches(batch, config.max_tokens_per_microbatch)
        else:
            micro_batches = padded_micro_batches(runtime.shard(batch), self.tokenizer.pad_token_id, config.grad_accum)
        stats = train_step(
            self.model, micro_batches, self.setup.dtype, step, labelled_tokens(batch), config.logprob_chunk_mb
        )
        grad_norm = common.optimizer_step(self.model, self.optimizer, self.scheduler, config.max_grad_norm, step)
        elapsed = time.perf_counter() - t0
        # each rank's loss is its share of the batch's token mean: world x share, averaged over ranks, is the mean
        return {
            "loss": stats["loss"] * runtime.world(),
            "optim/grad_norm": grad_norm,
            "lr": self.scheduler.get_last_lr()[0],
            "tokens_per_s": stats["tokens"] / elapsed,
            "time/train_s": elapsed,
        }

    def evaluate(self, step: int) -> tuple[dict[str, float], list[dict]]:
        return evaluate(
            self.model,
            self.tokenizer,
            self.config,
            self.eval_examples,
            self.eval_rows,
            self.setup.dtype,
            self.env_factory,
        )

    def stop(self, metrics: dict[str, float]) -> str | None:
        return accuracy_reached(self.config.stop_at_accuracy, metrics)

    def describe(self, run: common.Run) -> str:
        return (
            f"SFT: {describe_parameters(self.model)}, {len(self.examples)} examples ({self.data_stats}), "
            f"precision={self.setup.precision_name}, run dir {run.dir}"
        )


def train(config: SFTConfig) -> dict[str, float]:
    """Run SFT end to end; returns the final evaluation metrics (plus ``initial/...`` ones)."""
    return loop.train(SFT, config, "sft")

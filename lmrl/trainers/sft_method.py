"""SFT as a `loop` method: its data, held-out evaluation, early stop and optimizer step (`lmrl.trainers.sft_step`).

`lmrl sft` runs it (`lmrl.trainers.sft.trainer`, which describes the method), rejection sampling runs it on each
round's selection, and distillation shares its data, evaluation and early stop.
"""

from __future__ import annotations

import time
from typing import Any

from lmrl.data.loading import is_generated, load_rows
from lmrl.data.prompt_format import PromptFormat
from lmrl.data.sft import SFTExample, build_sft_examples
from lmrl.eval.generation import task_accuracy
from lmrl.models import describe_parameters
from lmrl.models.setup import ModelSetup
from lmrl.parallel import runtime
from lmrl.rollout.tools.section import build_env_factory
from lmrl.trainers import agentic, common, loop, sft_step
from lmrl.trainers.sft.config import SFTConfig


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
        metrics["eval/loss"] = sft_step.eval_loss(model, eval_examples, tokenizer.pad_token_id, dtype)
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
        self.model, self.tokenizer = common.training_policy(setup, packed=bool(config.max_tokens_per_microbatch))
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
            micro_batches = sft_step.packed_micro_batches(batch, config.max_tokens_per_microbatch)
        else:
            micro_batches = sft_step.padded_micro_batches(
                runtime.shard(batch), self.tokenizer.pad_token_id, config.grad_accum
            )
        stats = sft_step.train_step(
            self.model, micro_batches, self.setup.dtype, step, sft_step.labelled_tokens(batch), config.logprob_chunk_mb
        )
        # each rank's loss is its share of the batch's token mean: world x share, averaged over ranks, is the mean
        return {"loss": stats["loss"] * runtime.world(), **common.finish_step(self, step, t0, stats["tokens"])}

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

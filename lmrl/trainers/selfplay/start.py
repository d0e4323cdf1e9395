"""What Language Self-Play starts from: the warm start and the reference model (`lmrl.trainers.selfplay.trainer`).

A built-in model writes garbage at first, so ``warm_start_steps`` > 0 first fine-tunes it on both roles' formats
from built-in task rows (Challenger: <cp> -> a problem; Solver: problem -> answer). The reference model pi_Ref (KL
term, self-reward judge) is the policy at the start of self-play, after the warm start; a warm-started run saves it
in ``output_dir/reference`` so that a resumed run reloads it.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

from lmrl.data.loading import load_rows
from lmrl.data.sft import SFTExample, build_sft_examples
from lmrl.models.lora import is_peft, merged_copy
from lmrl.models.setup import ModelSetup
from lmrl.parallel import runtime
from lmrl.trainers import common, sft_step
from lmrl.trainers.selfplay.config import SelfPlayConfig
from lmrl.trainers.selfplay.env import challenger_text


def warm_start_examples(config: SelfPlayConfig, tokenizer) -> list[SFTExample]:
    """Both roles' formats as SFT pairs: (<cp> -> problem) and (problem -> answer), from built-in task train rows."""
    rows = [
        r
        for args in config.warm_start_task_args
        for r in load_rows(config.warm_start_dataset, split="train", limit=config.warm_start_rows, **args)
    ]
    cp = challenger_text(config)
    pairs = [{"prompt": cp, "completion": r["prompt"]} for r in rows] + [
        {"prompt": r["prompt"], "completion": r["completion"]} for r in rows
    ]
    examples, _ = build_sft_examples(pairs, tokenizer, max_length=1024, overlong="drop", where="warm start")
    return examples


def warm_start(
    model, tokenizer, examples: list[SFTExample], config: SelfPlayConfig, dtype, tracker
) -> dict[str, float]:
    """SFT on ``examples`` (`warm_start_examples`) with its own optimizer and cosine schedule."""
    wconfig = dataclasses.replace(
        config,
        lr=config.warm_start_lr,
        max_steps=config.warm_start_steps,
        warmup_steps=min(10, config.warm_start_steps // 10),
        lr_schedule="cosine",
    )
    optimizer = common.build_optimizer(model, wconfig)
    scheduler = common.build_scheduler(optimizer, wconfig)
    model.train()
    for step in range(1, config.warm_start_steps + 1):
        indices = common.epoch_batch_indices(len(examples), config.warm_start_batch_size, step, config.seed)
        batch = [examples[i] for i in indices]
        micro_batches = sft_step.padded_micro_batches(batch, tokenizer.pad_token_id, 1)
        stats = sft_step.train_step(model, micro_batches, dtype, step, sft_step.labelled_tokens(batch))
        common.optimizer_step(model, optimizer, scheduler, config.max_grad_norm, step)
        if step % 50 == 0 or step == config.warm_start_steps:
            tracker.print(f"warm start {step}/{config.warm_start_steps}: loss {stats['loss']:.4f}")
    return {"warm_start/loss": stats["loss"], "warm_start/examples": float(len(examples))}


def reference_model(setup: ModelSetup, model, tokenizer, run: common.Run, config: SelfPlayConfig):
    """The frozen pi_Ref: the policy at the start of self-play (saved in output_dir/reference after a warm start)."""
    path = Path(run.dir) / "reference"
    if run.checkpoint and config.warm_start_steps:
        if not path.is_dir():
            raise FileNotFoundError(
                f"Resuming {run.dir} needs its reference model in {path}, which is missing. "
                "Start a fresh run (overwrite=true)."
            )
        return setup.frozen(str(path), tokenizer)
    if run.checkpoint or (setup.lora is not None and not config.warm_start_steps) or runtime.world() > 1:
        # with LoRA: the base with adapters disabled, no copy; several processes (no warm start): sharded like it
        return setup.frozen(config.model, tokenizer)
    ref = merged_copy(model) if is_peft(model) else copy.deepcopy(model)  # after a LoRA warm start: base + adapters
    if config.warm_start_steps:  # a loadable model dir: model=<run>/reference starts a run from the warm start
        ref.save_pretrained(path)
        tokenizer.save_pretrained(path)
    return ref.eval().requires_grad_(False)

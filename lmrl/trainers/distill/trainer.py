"""Distillation: a student learns a frozen teacher's next-token distributions, offline (KD) or on-policy.

Each optimizer step takes ``batch_size`` rows of the dataset. A fraction ``on_policy_frac`` (lambda, GKD's mixing
coefficient) of them is completed by the student itself (sampled with ``temperature``/``top_p``/``top_k``, at most
``max_new_tokens``); the others keep the dataset's completion. Both models then score every completion token, and
the loss is the mean over all completion tokens of the batch of a per-token divergence (`lmrl.algorithms.distill`):

    dataset rows   forward KL(p_T || p_S) with kd_temperature tau (times tau^2)   knowledge distillation, book eq. 146
    student rows   reverse KL(p_S || p_T) at tau = 1                                on-policy distillation (GKD)

(``divergence=auto``; ``forward`` or ``reverse`` use one divergence for every row.) ``on_policy_frac=0`` is offline
KD, 1 is purely on-policy distillation. The teacher must share the student's tokenizer (checked at start-up).

Launch::

    lmrl sft --config sft/demo_arithmetic output_dir=runs/teacher             # a teacher (any trained model)
    lmrl distill --config distill/tiny_arithmetic teacher=runs/teacher/final  # offline KD (the recipe's mode)
    lmrl distill --config distill/tiny_arithmetic teacher=runs/teacher/final on_policy_frac=1 \
        model=runs/distill-tiny-arithmetic/final output_dir=runs/distill-on-policy   # then on-policy, reverse KL
    lmrl distill --config distill/tiny_arithmetic teacher=runs/teacher/final nproc=2    # two processes

With several processes each rank distils its share of the batch (the teacher sharded or replicated like a
reference model); the student samples in seeded shards (``sampling_shards``: the first ``on_policy_frac`` of each
shard), and the loss is the mean over every rank's completion tokens.
"""

from __future__ import annotations

import time

import torch

from lmrl.algorithms.distill import DIRECTIONS, token_kl
from lmrl.data.sft import SFTExample, collate_sft
from lmrl.eval.generation import task_accuracy
from lmrl.models import autocast, describe_parameters
from lmrl.models.hf_compat import no_cache
from lmrl.models.loading import check_model_path
from lmrl.models.placement import model_device, to_device
from lmrl.models.setup import ModelSetup
from lmrl.parallel import runtime
from lmrl.rollout.engines.factory import make_engine
from lmrl.rollout.samplers.groups import sampling_params, seeded_shards
from lmrl.trainers import common, loop, sft_method
from lmrl.trainers.distill.config import DistillConfig  # also `lmrl distill`'s config (lmrl/cli.py)
from lmrl.trainers.sft_step import labelled_tokens

IGNORE = -100


def check_teacher(path: str) -> None:
    """A teacher that is not there, named as the `teacher` key with how to make one (the model loader's own message
    names no key: a missing teacher read as a missing student)."""
    try:
        check_model_path(path)
    except FileNotFoundError as exc:
        raise FileNotFoundError(
            f"'teacher' (the trained model the student learns from): {exc} To make one: `lmrl demo output_dir=runs/demo` "
            "writes runs/demo/rl/final, the teacher of distill/tiny_arithmetic; the final/ of any `lmrl sft` or `lmrl rl` "
            "run that used the student's tokenizer will do (teacher=runs/<run>/final)."
        ) from None


def prompt_length(example: SFTExample) -> int:
    """Tokens before the first learned one (the prompt and its generation prompt)."""
    return next((i for i, y in enumerate(example.labels) if y != IGNORE), len(example.labels))


def paired_logits(student, teacher, examples: list[SFTExample], pad_id: int, dtype):
    """Student logits (with gradient), teacher logits (without) and the learned-token mask, each at the positions
    that predict tokens 1..L-1 of the right-padded batch: (B, L-1, V), (B, L-1, V), (B, L-1) bool."""
    device = model_device(student)
    batch = to_device(collate_sft(examples, pad_id), device)
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    with autocast(device.type, dtype):
        logits = student(**inputs, **no_cache(student)).logits[:, :-1]
        with torch.no_grad():
            teacher_logits = teacher(**inputs, **no_cache(teacher)).logits[:, :-1]
    return logits, teacher_logits, batch["labels"][:, 1:] != IGNORE


def kl_loss(
    student, teacher, examples: list[SFTExample], directions: list[str], pad_id: int, dtype, temperature: float
) -> tuple[torch.Tensor, dict[str, tuple[float, int]]]:
    """Summed per-token divergence over the learned tokens of ``examples`` (row i with ``directions[i]``), and per
    direction (sum of KL, token count) for logging. tau applies to forward rows; reverse rows use tau = 1."""
    logits, teacher_logits, learned = paired_logits(student, teacher, examples, pad_id, dtype)
    total, stats = logits.new_zeros((), dtype=torch.float32), {}
    for direction in sorted(set(directions)):
        rows = torch.tensor([d == direction for d in directions], device=logits.device)  # (B,)
        tau = temperature if direction == "forward" else 1.0
        summed = (token_kl(logits[rows], teacher_logits[rows], direction, tau) * learned[rows]).sum()
        total = total + summed
        stats[direction] = (summed.item(), int(learned[rows].sum()))
    return total, stats


@torch.no_grad()
def eval_divergences(student, teacher, examples: list[SFTExample], pad_id: int, dtype, batch_size: int = 64) -> dict:
    """Mean per-token forward and reverse KL (tau = 1) between teacher and student on held-out completions."""
    sums, count = {"forward": 0.0, "reverse": 0.0}, 0
    for start in range(0, len(examples), batch_size):
        logits, teacher_logits, learned = paired_logits(
            student, teacher, examples[start : start + batch_size], pad_id, dtype
        )
        for direction in sums:
            sums[direction] += (token_kl(logits, teacher_logits, direction) * learned).sum().item()
        count += int(learned.sum())
    return {f"eval/kl_{d}": s / max(1, count) for d, s in sums.items()}


class Distill(loop.MethodDefaults):
    """The distillation method for `loop.run`: one step is one optimizer step on ``batch_size`` rows. SFT's data,
    evaluation (plus both divergences to the teacher) and early stop, through `lmrl.trainers.sft_method`'s functions."""

    samples_title = "held-out samples (student)"
    data_parallel = True

    def __init__(self, config: DistillConfig, setup: ModelSetup):
        self.config, self.setup = config, setup
        check_teacher(config.teacher)  # before the student loads
        self.model, self.tokenizer = setup.policy()
        self.teacher = setup.frozen_partner(
            config.teacher,
            self.model,
            self.tokenizer,
            "teacher",
            "Distillation compares the two models' distributions token by token",
        )
        self.examples, self.eval_examples, self.eval_rows, self.data_stats = sft_method.load_data(
            config, self.tokenizer
        )
        self.params = sampling_params(config)
        longest = max((prompt_length(ex) for ex in self.examples), default=1)
        self.engine = make_engine(
            config, self.model, self.tokenizer, setup.dtype, sampling=self.params, longest_prompt=longest
        )
        self.model.train()
        self.optimizer = common.build_optimizer(self.model, config)
        self.scheduler = common.build_scheduler(self.optimizer, config)
        self.initial_metrics = self.teacher_metrics()

    def teacher_metrics(self) -> dict[str, float]:
        """The teacher's held-out accuracy: the level the student is distilled towards (rank 0 measures it)."""
        if not (self.eval_rows and "task" in self.eval_rows[0]):
            return {}
        acc = None
        with runtime.full_params(self.teacher):  # FSDP: generation runs no collective
            if runtime.is_main():
                acc, _ = task_accuracy(
                    self.teacher,
                    self.tokenizer,
                    self.eval_rows,
                    self.config.eval_max_new_tokens,
                    self.setup.dtype,
                    num_samples=0,
                )
        return {"eval/teacher_accuracy": runtime.broadcast_object(acc)["accuracy"]}

    def sample(self, examples: list[SFTExample], generator: torch.Generator) -> tuple[list[SFTExample], float]:
        """The student's own completions of these examples' prompts, as examples (prompt unlearned), with the
        generator of their sampling shard (`lmrl.rollout.samplers.groups.seeded_shards`); and their summed length."""
        if not examples:
            return [], 0.0
        prompts = [ex.input_ids[: prompt_length(ex)] for ex in examples]
        was_training = self.model.training
        self.model.eval()
        with runtime.full_params(self.model):  # FSDP: each rank samples with the whole student, no lockstep
            batch = self.engine.generate(prompts, self.params, n=1, generator=generator)
        self.model.train(was_training)
        lengths = batch.completion_lengths.tolist()
        sampled = [
            SFTExample(p + c[:n], [IGNORE] * len(p) + c[:n])
            for p, c, n in zip(prompts, batch.completion_ids.tolist(), lengths)
        ]
        return sampled, float(sum(lengths))

    def batch(self, rows: list[SFTExample], step: int) -> tuple[list[SFTExample], list[str], int, float]:
        """This rank's rows, the first ``on_policy_frac`` of each sampling shard completed by the student; their
        divergence directions, the number of on-policy rows and their summed length."""
        batch, directions, n_on, length = [], [], 0, 0.0
        self.engine.sync(self.model, step - 1)  # the weights after step - 1 updates (resumed: the restored ones)
        config, device = self.config, model_device(self.model)
        for _, part, generator in seeded_shards(rows, config.sampling_shards, config.seed, step, device):
            k = round(config.on_policy_frac * len(part))  # the batch is a random draw: its first rows are too
            sampled, summed = self.sample(part[:k], generator)
            batch += sampled + part[k:]
            directions += [self.direction(i < k) for i in range(len(part))]
            n_on, length = n_on + k, length + summed
        return batch, directions, n_on, length

    def direction(self, on_policy: bool) -> str:
        if self.config.divergence != "auto":
            return self.config.divergence
        return "reverse" if on_policy else "forward"

    def close(self) -> None:
        self.engine.close()

    def stop(self, metrics: dict[str, float]) -> str | None:
        return sft_method.accuracy_reached(self.config.stop_at_accuracy, metrics)

    def describe(self, run: common.Run) -> str:
        config = self.config
        return (
            f"Distill: student {describe_parameters(self.model)}, teacher {config.teacher} "
            f"({describe_parameters(self.teacher)}), {len(self.examples)} examples, on_policy_frac="
            f"{config.on_policy_frac}, divergence={config.divergence}, precision={self.setup.precision_name}, "
            f"run dir {run.dir}"
        )

    def step(self, step: int) -> dict[str, float]:
        config, t0 = self.config, time.perf_counter()
        rows = [
            self.examples[i]
            for i in common.epoch_batch_indices(len(self.examples), config.batch_size, step, config.seed)
        ]
        batch, directions, n_on, length = self.batch(runtime.shard(rows), step)  # this rank's share
        t_sample = time.perf_counter() - t0
        tokens = labelled_tokens(batch)
        total_tokens = runtime.all_sum(tokens)  # the loss is the mean over every rank's learned tokens
        micro = len(batch) // config.grad_accum
        sums = torch.zeros(len(DIRECTIONS), 2, dtype=torch.float64)  # (direction, [KL sum, tokens])
        for i in range(config.grad_accum):
            part = slice(i * micro, (i + 1) * micro)
            loss, stats = kl_loss(
                self.model,
                self.teacher,
                batch[part],
                directions[part],
                self.tokenizer.pad_token_id,
                self.setup.dtype,
                config.kd_temperature,
            )
            common.check_finite(loss, step)
            (loss / max(1, total_tokens)).backward()
            for direction, (kl_sum, n) in stats.items():
                sums[DIRECTIONS.index(direction)] += torch.tensor([kl_sum, n], dtype=torch.float64)
        metrics = common.finish_step(self, step, t0, tokens)
        metrics["time/train_s"] -= t_sample  # the student's sampling is time/rollout_s
        sums = runtime.all_sum(sums)  # every rank's: the logged means are over the whole batch
        metrics["loss"] = sums[:, 0].sum().item() / max(1, total_tokens)
        metrics["rollout/on_policy_rows"] = float(n_on * runtime.world())
        metrics.update({f"loss/kl_{d}": s / n for d, (s, n) in zip(DIRECTIONS, sums.tolist()) if n})
        if n_on:  # every rank samples the same number of rows
            metrics.update({"time/rollout_s": t_sample, "completion_len/mean": length / n_on})
        return metrics

    def evaluate(self, step: int) -> tuple[dict[str, float], list[dict]]:
        metrics, samples = sft_method.evaluate(  # no tool episodes (refused by the config)
            self.model, self.tokenizer, self.config, self.eval_examples, self.eval_rows, self.setup.dtype
        )
        if self.eval_examples:
            metrics.update(
                eval_divergences(
                    self.model, self.teacher, self.eval_examples, self.tokenizer.pad_token_id, self.setup.dtype
                )
            )
        return metrics, samples


def train(config: DistillConfig) -> dict[str, float]:
    """Distil ``config.teacher`` into ``config.model``; returns the final evaluation metrics (plus ``initial/...``)."""
    return loop.train(Distill, config, "distill")

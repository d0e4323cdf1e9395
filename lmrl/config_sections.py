"""The config sections every verb composes: model, optimizer, run directory, evaluation, sampling, rewards, data.

A section declares a group of keys once, with their help and their checks (`lmrl.config_base.Section`); a verb's
config composes the ones it uses (``class SFTConfig(ToolSection, DataSection, TrainConfig)``) and changes a default by
declaring the key again with its own default and help. Each section gives the configs that compose it a typed view of
its keys (``config.optim`` is an `OptimSection`); where a section's name is a key (``model``, ``engine``,
``rewards``, ``tools``), the view is named ``<name>_setup``. `lmrl.config` re-exports every name here.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Literal

from lmrl.config_base import ConfigError, Section, check_at_least, check_output_dir, field, section_view, suggest
from lmrl.parallel.config import ParallelSection


@dataclasses.dataclass
class ModelSection(Section):
    title = "model"
    model: str = field("builtin:tiny", "HF model path or hub id, a checkpoint dir, or builtin:tiny|small|medium")
    tokenizer: str | None = field(None, "tokenizer path/hub id; default: the model's (builtin models use builtin:char)")
    chat_template: str | None = field(
        None,
        "the model's chat template: a Jinja string, a file holding one, or chatml (lmrl's ChatML, adding <|im_start|> and <|im_end|> when the vocabulary lacks them); null: the tokenizer's own, else ChatML with a one-line notice when its tokens are new",
    )
    model_args: dict = field({}, "overrides of the built-in model's architecture (hidden_size, num_hidden_layers, ...)")
    precision: Literal["auto", "bf16", "fp32"] = field(
        "auto", "auto: bf16 autocast where the CPU/GPU supports it; weights stay fp32"
    )
    seed: int = field(0, "seed for data order, init of built-in models and sampling")
    huge_pages: bool = field(
        True,
        "CPU: tensors of 2 MiB or more on transparent huge pages (PyTorch's THP_MEM_ALLOC_ENABLE, set before the "
        "model loads): fewer page faults and TLB misses, faster sampling and training (memory/huge_pages_mib)",
    )
    keep_freed_memory: bool = field(
        True, "CPU: keep freed memory in the process instead of page-faulting it in again every step (glibc mallopt)"
    )
    release_memory: bool = field(
        True,
        "CPU: hand malloc's free memory back to the system (glibc malloc_trim) every 10 decoder layers of the "
        "training forward and backward, and in RL before each training forward and after each optimizer step, "
        "whenever the resident memory grew by 256 MiB since: a lower peak RSS for a few % of the step time "
        "(update/memory_releases)",
    )
    device: str = field(
        "auto", "auto (CUDA when available, else CPU) | cpu | cuda | cuda:N: every model of the run goes there"
    )
    gradient_checkpointing: bool = field(
        False, "recompute each layer's activations in the backward (less memory, ~30% more compute)"
    )
    fused_layers: bool = field(
        True,
        "RMSNorm and SwiGLU MLPs as one autograd op each (lmrl.models.fused): same values, ~1/3 fewer saved activations",
    )
    logprob_chunk_mb: float = field(
        128,
        "most memory one chunk of fp32 logits may take: the LM head, log-softmax and entropy run chunk by chunk in forward and backward",
    )
    lora_r: int = field(
        0, "LoRA rank (0: train every weight); with r > 0 only the adapters (and value/reward heads) train"
    )
    lora_alpha: float = field(32.0, "LoRA scale numerator: the update is (lora_alpha / lora_r) B A x")
    lora_dropout: float = field(
        0.0, "dropout on the LoRA input (0 keeps the sampler's and learner's forward identical)"
    )
    lora_target_modules: list[str] = field(
        ["all-linear"], "linear layers that get adapters (all-linear: every one but the LM head)"
    )
    merge_lora: bool = field(
        False, "final/ holds the merged HF model (the adapter in final/adapter/) instead of the adapter"
    )
    load_in_4bit: bool = field(False, "QLoRA: load the base in 4-bit NF4 (CUDA + bitsandbytes; needs lora_r > 0)")

    def __post_init__(self) -> None:
        if not DEVICE_PATTERN.fullmatch(self.device):
            raise ConfigError(f"'device' must be auto, cpu, cuda or cuda:N, got {self.device!r}.")
        check_at_least(self, ("lora_r",), 0)
        check_at_least(self, ("logprob_chunk_mb",), 0, inclusive=False)
        if not 0 <= self.lora_dropout < 1:
            raise ConfigError(f"'lora_dropout' must be in [0, 1), got {self.lora_dropout}.")
        if not self.lora_target_modules:
            raise ConfigError(
                "'lora_target_modules' is empty. Fix: lora_target_modules=[all-linear] or name layers, "
                "e.g. [q_proj,v_proj]."
            )
        super().__post_init__()

    @property
    def model_setup(self) -> ModelSection:
        return section_view(self, ModelSection)


DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?")


@dataclasses.dataclass
class OptimSection(Section):
    title = "optimizer and schedule"
    lr: float = field(1e-3, "peak learning rate (AdamW)")
    weight_decay: float = field(0.0, "AdamW weight decay")
    adam_betas: list[float] = field([0.9, 0.99], "AdamW betas")
    adam_eps: float = field(1e-8, "AdamW epsilon: the update is lr * m / (sqrt(v) + adam_eps)")
    lr_schedule: Literal["cosine", "linear", "constant"] = field("cosine", "decay after warmup")
    warmup_steps: int = field(10, "linear warmup steps from 0 to lr")
    min_lr_ratio: float = field(0.1, "final lr as a fraction of lr (cosine/linear)")
    max_steps: int = field(200, "optimizer steps to train")
    max_grad_norm: float | None = field(1.0, "clip the global gradient norm (null: no clipping)")
    grad_accum: int = field(1, "micro-batches per optimizer step; the batch is split evenly")

    def __post_init__(self) -> None:
        check_at_least(self, ("lr", "max_steps", "grad_accum", "adam_eps"), 0, inclusive=False)
        check_at_least(self, ("warmup_steps",), 0)
        if len(self.adam_betas) != 2:
            raise ConfigError(f"'adam_betas' must be two numbers, got {self.adam_betas}.")
        super().__post_init__()

    @property
    def optim(self) -> OptimSection:
        return section_view(self, OptimSection)


TRACKERS = ("tensorboard", "wandb", "trackio")


@dataclasses.dataclass
class RunSection(Section):
    title = "run directory, logging and checkpoints"
    output_dir: str = field(
        "runs/default", "run directory: config.yaml, metrics.jsonl, samples.jsonl, checkpoints/, plots/"
    )
    resume: bool = field(False, "continue from the newest checkpoint in output_dir")
    overwrite: bool = field(False, "allow starting a fresh run in a non-empty output_dir")
    log_every: int = field(10, "log metrics every N steps (and always at the first and last step)")
    eval_every: int = field(100, "evaluate every N steps (0: only at the start and end)")
    save_every: int = field(100, "save a checkpoint every N steps (0: only at the end)")
    keep_checkpoints: int = field(2, "how many step-N checkpoints to keep")
    keep_best: str | None = field(
        None,
        "also keep best/: the model (HF format) at the evaluation with the best value of this metric, e.g. eval/accuracy (null: off)",
    )
    keep_best_mode: Literal["auto", "max", "min"] = field(
        "auto",
        "keep_best: higher is better, or with auto lower for a metric named loss* or *ce (eval/loss, eval/ptx_ce)",
    )
    num_samples: int = field(4, "completions written to samples.jsonl at each evaluation")
    report_to: list[str] = field([], "extra trackers: tensorboard, wandb, trackio (when installed)")

    def __post_init__(self) -> None:
        check_output_dir(self.output_dir)
        if self.report_to == ["none"]:  # TRL's and transformers' way to say no tracker
            self.report_to = []
        if "all" in self.report_to:
            raise ConfigError(f"'report_to' names its trackers in lmrl: report_to=[{','.join(TRACKERS)}] (or some).")
        check_at_least(self, ("log_every", "keep_checkpoints"), 0, inclusive=False)
        check_at_least(self, ("eval_every", "save_every", "num_samples"), 0)
        for name in self.report_to:
            if name not in TRACKERS:
                raise ConfigError(
                    f"'report_to' entry '{name}' is unknown.{suggest(name, TRACKERS)} Known: {list(TRACKERS)}."
                )
        super().__post_init__()

    @property
    def run(self) -> RunSection:
        return section_view(self, RunSection)


@dataclasses.dataclass
class EvalSection(Section):
    title = "evaluation metrics (lmrl eval's, inside training)"
    eval_metrics: list[str] = field(
        [],
        "metrics of `lmrl eval` computed at every evaluation and logged as eval/metrics/<name>: "
        "accuracy, pass@K, pass^K, maj@K, avg@K, reward, win_rate, loglik",
    )
    eval_metrics_dataset: str | None = field(
        None, "their rows (default: the task dataset's test split, or eval_dataset)"
    )
    eval_metrics_rows: int = field(100, "rows evaluated by eval_metrics")
    eval_metrics_args: dict = field(
        {},
        "options as in `lmrl eval`: samples, temperature, max_new_tokens, verifier, reward_model, judge, baseline, ...",
    )
    check_contamination: bool = field(True, "at start-up, warn when eval rows share 8-grams with the training data")

    def __post_init__(self) -> None:
        check_at_least(self, ("eval_metrics_rows",), 1)
        from lmrl.eval.spec import parse_metrics  # pure, imports nothing of lmrl

        try:
            _ = self.eval_metrics and parse_metrics(self.eval_metrics, "eval_metrics")
        except ValueError as err:
            raise ConfigError(str(err)) from None
        super().__post_init__()

    def held_out_dataset(self) -> str | None:
        """The verb's held-out dataset, which eval_metrics fall back on: `DataSection`'s eval_dataset (a verb that
        declares the key itself says so, as self-play does)."""
        return self.eval_dataset if isinstance(self, DataSection) else None

    @property
    def evaluation(self) -> EvalSection:
        return section_view(self, EvalSection)


@dataclasses.dataclass
class TrainConfig(ParallelSection, EvalSection, RunSection, OptimSection, ModelSection):
    """Fields every verb shares (model, optimizer, run directory); method configs add sections and their own keys."""


@dataclasses.dataclass
class DecodingSection(Section):
    title = "sampling"
    temperature: float = field(1.0, "sampling temperature")
    top_p: float = field(1.0, "nucleus sampling")
    top_k: int = field(0, "top-k sampling (0: off)")
    sampling_shards: int = field(
        0,
        "a step's batch is sampled in this many shards (whole prompt groups), each with its own seeded generator (0: one per process); fixed, it makes the samples independent of the number of processes",
    )

    def __post_init__(self) -> None:
        check_at_least(self, ("temperature",), 0, inclusive=False)
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"'top_p' must be in (0, 1], got {self.top_p}.")
        check_at_least(self, ("top_k", "sampling_shards"), 0)
        super().__post_init__()

    @property
    def decoding(self) -> DecodingSection:
        return section_view(self, DecodingSection)


@dataclasses.dataclass
class SamplingSection(DecodingSection):
    """Sampling of G completions per prompt (``temperature``, ``top_p``, ``top_k`` from `DecodingSection`)."""

    title = "sampling"
    samples_per_prompt: int = field(8, "completions per prompt (G); a step trains on prompts x G completions")
    max_new_tokens: int = field(32, "completion length cap in tokens")
    stop: list[str] = field(
        [],
        "stop strings (engine=hf): a completion ends at the first one; rewards see the text before it (a base model prompted raw goes on to write the next 'User:' turn)",
    )

    def __post_init__(self) -> None:
        check_at_least(self, ("samples_per_prompt", "max_new_tokens"), 1)
        super().__post_init__()

    @property
    def sampling(self) -> SamplingSection:
        return section_view(self, SamplingSection)


@dataclasses.dataclass
class RewardSection(Section):
    title = "rewards"
    rewards: list[str] = field(
        ["task"],
        "reward functions: registry names, model:PATH (a reward model), http(s)://HOST/PATH (a reward server) or module:function",
    )
    reward_weights: list[float] = field([], "one weight per reward (default 1.0 each)")
    reward_kwargs: dict = field({}, "options per reward name, e.g. {overlong: {max_len: 32, cache_len: 8}}")
    on_reward_error: Literal["skip", "stop"] = field(
        "skip", "a failing reward function skips the step or stops the run"
    )
    max_skipped_steps: int = field(10, "on_reward_error=skip: this many failing steps in a row stop the run (exit 1)")
    reward_workers: int = field(
        1, "threads that call the reward functions concurrently, each once per batch (1: one after the other)"
    )
    reward_normalize: bool = field(
        False, "standardise each reward function over the batch, (r - mean) / (std + 1e-6), before the weighted sum"
    )

    def __post_init__(self) -> None:
        check_at_least(self, ("max_skipped_steps", "reward_workers"), 1)
        if self.reward_weights and len(self.reward_weights) != len(self.rewards):
            raise ConfigError(
                f"reward_weights has {len(self.reward_weights)} entries for {len(self.rewards)} rewards {self.rewards}: give one weight per reward, or none (1.0 each)."
            )
        super().__post_init__()

    @property
    def reward_setup(self) -> RewardSection:
        return section_view(self, RewardSection)


@dataclasses.dataclass
class ChatSection(Section):
    """Whether prompts go through the tokenizer's chat template: every verb that renders prompts has the key."""

    title = "data"
    chat: bool = field(
        True,
        "render prompts with the tokenizer's chat template (ChatML when it has none); false: the raw text with the "
        "tokenizer's own special tokens, e.g. a base model's BOS ('zero' RL)",
    )


@dataclasses.dataclass
class TaskSection(Section):
    """The arguments of a built-in task (``dataset=task:<name>``); a verb whose built-in source is not a task names
    its arguments otherwise (``data_args`` of the preference sources)."""

    title = "data"
    task_args: dict = field({}, "arguments of a built-in task (e.g. digits: 2)")


@dataclasses.dataclass
class RowsSection(ChatSection):
    """The rows a verb reads: the dataset, how many training and held-out rows, and the chat template (`lmrl rl`'s
    prompts). `DataSection` adds what the verbs that train on given completions need."""

    title = "data"
    dataset: str = field(
        "task:arithmetic",
        "task:<name> (built-in), a .jsonl/.json/.parquet/.csv file, or an HF dataset id (sampling verbs: rows with a "
        "prompt column)",
    )
    train_rows: int | None = field(
        2000, "rows generated for a built-in task or source, or the first N rows of a dataset (null: all)"
    )
    eval_rows: int = field(200, "held-out rows to evaluate on")

    @property
    def data(self) -> RowsSection:
        return section_view(self, RowsSection)


@dataclasses.dataclass
class DataSection(RowsSection):
    """The rows a verb trains and evaluates on (sft, reward, dpo, rejection-sampling, distill). A verb whose data
    differs changes a default by declaring the key again, e.g. `DPOConfig`'s ``dataset: str = field("builtin:prefs",
    ...)``; a built-in task's arguments are `TaskSection`'s, a built-in source's the verb's own (``data_args``)."""

    title = "data"
    split: str = field("train", "dataset split")
    eval_dataset: str | None = field(
        None, "held-out data; default: the test split of a built-in task or source, none for files"
    )
    eval_split: str = field("test", "split of eval_dataset (or of the built-in task or source)")
    max_length: int = field(256, "tokens per example (prompt + completion)")

    def __post_init__(self) -> None:
        check_at_least(self, ("max_length",), 2)
        super().__post_init__()

    @property
    def data(self) -> DataSection:
        return section_view(self, DataSection)

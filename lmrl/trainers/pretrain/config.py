"""`lmrl pretrain`'s config (`lmrl.trainers.pretrain.trainer`): objective, data, and one key per `AvatarlOptions` field.

Model, optimizer and run keys come from `TrainConfig`. ``top_k`` is avatarl's k (the student's and the critic's
top-k in the active set), not a sampling option: pretraining samples only its evaluation continuations, at T=1.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Literal

from lmrl.config import ConfigError, TrainConfig, check_at_least, field

if TYPE_CHECKING:
    from lmrl.algorithms import AvatarlOptions

# The avatarl keys' defaults are `AvatarlOptions`'s, written out (tests/trainers/test_pretrain_config.py keeps them
# equal): importing lmrl.algorithms takes torch, and `lmrl.cli` checks a config without it.


@dataclasses.dataclass
class PretrainConfig(TrainConfig):
    objective: Literal["ce", "avatarl"] = field(
        "ce", "ce: next-token cross-entropy; avatarl: REINFORCE on the critic+reality reward"
    )
    from_scratch: bool = field(
        False, "HF model: build it from its config.json (+ model_args) with random init instead of loading weights"
    )
    # data
    data: str = field(
        "builtin:pydoc", "builtin:pydoc, a .txt/.md file, or an HF dataset / .jsonl file with a text column"
    )
    text_column: str = field("text", "column holding the text of a dataset")
    data_split: str = field("train", "split of an HF dataset; its text is then cut into train/val by val_fraction")
    val_fraction: float = field(0.05, "last fraction of the text (cut at a line start) held out for eval/ce")
    block_size: int = field(128, "tokens per training window (context length)")
    batch_size: int = field(32, "windows per optimizer step (split into grad_accum micro-batches)")
    eval_batches: int | None = field(8, "validation batches of batch_size windows per evaluation (null: every window)")
    sample_tokens: int = field(96, "tokens sampled (T=1) after a validation prefix for each of num_samples samples")
    # avatarl
    critic: str | None = field(
        None,
        "avatarl: frozen CE-trained critic (HF dir, e.g. runs/pretrain-ce-tiny-pydoc/final) sharing the student's tokenizer",
    )
    top_k: int = field(16, "k of the student and critic top-k in the active set (write-up/blog run 16, HEAD 4)")
    epsilon: float = field(0.1, "reality smoothing: gold gets 1-eps, the rest of the active set shares eps")
    reality_weight: float = field(0.7, "w_r, exponent of the reality expert (0.7)")
    mentor_weight: float = field(0.3, "w_m, exponent of the critic expert (0.3)")
    threshold: Literal["sum_over_size", "mean"] = field(
        "sum_over_size", "sum_over_size: the code's bar s/|A| (dense); mean: the write-up's 1/|A|"
    )
    reward_scale: float = field(100.0, "multiplier of kept rewards (x100; cancelled by the clamp when |A| < 66)")
    reward_clamp: float | None = field(
        1.5, "per-position proportional rescale so that max reward <= this (code 1.5; null: off, as the blog charts)"
    )
    critic_topk: bool = field(
        True, "include the critic's top-k in the active set (avataRL yes; pretrain-zero-rl fork no)"
    )
    entropy_mode: Literal["bonus", "temperature"] = field(
        "bonus",
        "bonus: loss -= coef*H (write-up, blog-time code); temperature: log-probs of softmax(S/(1+coef)) (HEAD)",
    )
    entropy_coef: float = field(0.01, "beta of the entropy bonus, or the temperature offset (0.01)")
    chunk_size: int | None = field(
        1024, "positions per chunk in the avatarl reward/loss (memory only; results identical)"
    )
    output_dir: str = field("runs/pretrain", "run directory")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.batch_size % self.grad_accum:
            raise ConfigError(
                f"batch_size ({self.batch_size}) must be divisible by grad_accum ({self.grad_accum}); "
                "each micro-batch has batch_size/grad_accum windows."
            )
        check_at_least(self, ("block_size", "batch_size"), 1)
        if self.eval_batches is not None and self.eval_batches < 1:
            raise ConfigError(
                f"'eval_batches' must be >= 1 or null (every validation window), got {self.eval_batches}."
            )
        if not 0.0 < self.val_fraction < 1.0:
            raise ConfigError(f"'val_fraction' must be in (0, 1), got {self.val_fraction}.")
        if self.objective == "avatarl" and not self.critic:
            raise ConfigError(
                "objective=avatarl needs a critic: critic=<dir of a CE-trained model>, e.g. the final/ "
                "of a run of `lmrl pretrain --config pretrain/ce_tiny_pydoc`."
            )
        if self.objective == "ce" and self.critic:
            raise ConfigError(
                f"critic={self.critic!r} is only used by objective=avatarl; remove it (critic=null) "
                "or set objective=avatarl."
            )
        try:
            self.avatarl_options()
        except ValueError as exc:
            raise ConfigError(str(exc)) from exc

    def avatarl_options(self) -> AvatarlOptions:
        """The avatarl fields of this config as an ``AvatarlOptions`` (ignore_index unused: windows have no padding)."""
        from lmrl.algorithms import AvatarlOptions

        names = [f.name for f in dataclasses.fields(AvatarlOptions) if f.name != "ignore_index"]
        return AvatarlOptions(**{name: getattr(self, name) for name in names})

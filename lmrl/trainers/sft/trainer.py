"""Supervised fine-tuning (instruction tuning): next-token cross-entropy on completion tokens only.

RLHF book ch. 4: prompt tokens are masked out of the loss (labels -100); with
multi-turn chats either every assistant turn or only the last is trained
(``train_on``). The loss is the mean over all completion tokens of the optimizer
batch, whatever the micro-batching (``grad_accum``), so accumulation is exact.

Layout: the method (data, held-out evaluation, early stop, the step) is `lmrl.trainers.sft_method`, which
rejection sampling runs each round and distillation builds on; the loss and micro-batches are
`lmrl.trainers.sft_step`, which self-play's warm start shares.

Launch::

    lmrl sft --config sft/tiny_arithmetic                       # built-in task, CPU
    lmrl sft model=Qwen/Qwen2.5-0.5B dataset=data.jsonl max_length=1024 batch_size=64 grad_accum=8
"""

from __future__ import annotations

from lmrl.trainers import loop
from lmrl.trainers.sft.config import SFTConfig  # also `lmrl sft`'s config (lmrl/cli.py)
from lmrl.trainers.sft_method import SFT


def train(config: SFTConfig) -> dict[str, float]:
    """Run SFT end to end; returns the final evaluation metrics (plus ``initial/...`` ones)."""
    return loop.train(SFT, config, "sft")

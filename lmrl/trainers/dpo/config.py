"""`lmrl dpo`'s config: the DPO-family loss, its data and, with ``online=true``, the sampling and labelling keys.

Model, optimizer and run keys come from `TrainConfig`; the online sampling keys from `SamplingSection`
(``samples_per_prompt``, ``max_new_tokens``, ``temperature``, ``top_p``, ``top_k``) and the label rewards from
`RewardSection` (``rewards``, ``reward_weights``, ``reward_kwargs``, ``on_reward_error``). Offline DPO ignores both.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from lmrl.config import ConfigError, DataSection, RewardSection, SamplingSection, TrainConfig, field
from lmrl.data.loading import check_sources
from lmrl.rollout.engines.section import EngineSection

JUDGE_OPTIONS = ("swap", "max_new_tokens", "batch_size", "prompt", "chat")


def preference_losses():
    """`lmrl.algorithms.PREFERENCE_LOSSES`, imported on first use: a config's keys check without torch (`lmrl.cli`)."""
    from lmrl.algorithms import PREFERENCE_LOSSES

    return PREFERENCE_LOSSES


@dataclasses.dataclass
class DPOConfig(SamplingSection, EngineSection, RewardSection, DataSection, TrainConfig):
    loss: str = field("dpo", "dpo, cdpo, robust, ipo, hinge, simpo, orpo, dpo_nll, odpo, bco, cal_dpo or kto")
    beta: float = field(0.1, "β for every loss that takes it (KL strength); also scales the logged implicit rewards")
    loss_args: dict = field(
        {},
        "other loss options: label_smoothing (cdpo, robust), tau (ipo), gamma (simpo), "
        "lam (orpo), alpha (dpo_nll, odpo), lambda_d and lambda_u (kto)",
    )
    ref_model: str | None = field(None, "reference policy π_ref; default: the initial `model`")
    precompute_ref: bool = field(
        True,
        "cache π_ref log-probs once (memory + <output_dir>/reference_logps.pt); "
        "false: a frozen reference model recomputes them every step",
    )
    dataset: str = field("builtin:prefs", "builtin:prefs, or a .jsonl/.json/.parquet/.csv file or HF dataset")
    data_args: dict = field(
        {},
        "arguments of the built-in source (digits, num_completions, kinds, always_correct, "
        "seed, and the arithmetic task's ops, negative, style: chat, ...)",
    )
    eval_max_new_tokens: int = field(16, "tokens generated per held-out prompt for eval/gold_score (built-in data)")
    eval_samples: int = field(8, "completions sampled (temperature 1) per held-out prompt for eval/gold_score")
    ranking_pairs: Literal["all", "best_worst"] = field(
        "all", "rankings of K > 2 become all C(K,2) pairs, or best vs worst"
    )
    overlong: Literal["drop", "error"] = field("drop", "pairs longer than max_length: drop them or stop")
    batch_size: int = field(
        32, "pairs (KTO: examples) per optimizer step, split into grad_accum micro-batches; online: prompts per step"
    )
    max_tokens_per_microbatch: int | None = field(
        None,
        "pack pairs into micro-batches of at most this many tokens (both sequences of a pair together; positions restart per sequence; replaces grad_accum; null: padded rows)",
    )
    output_dir: str = field("runs/dpo", "run directory")
    # online DPO (lmrl/trainers/dpo/online.py): pairs sampled from the current policy and labelled each step
    online: bool = field(False, "sample pairs from the current policy each step, label them with `rewards` or `judge`")
    samples_per_prompt: int = field(2, "online: completions per prompt (K); the pair is the best vs the worst")
    max_new_tokens: int = field(16, "online: completion length cap in tokens")
    rewards: list[str] = field([], "online: label rewards (registry names, model:PATH, module:function), weighted sum")
    min_gap: float = field(0.0, "online: skip a prompt (a tie) when best - worst label reward <= min_gap")
    judge: str | None = field(
        None, "online: label each pair with this pairwise LLM judge (K=2); rewards are only logged"
    )
    judge_args: dict = field({}, "online: PairwiseJudge options: swap, max_new_tokens, batch_size, prompt, chat")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_sources(self)  # a missing data path: before the loss registry's import (torch), as lmrl.cli wants
        from lmrl.algorithms.registry import check_options, keyword_options

        if self.loss not in preference_losses().names():
            preference_losses().get(self.loss)  # raises, naming the choices
        if "beta" in self.loss_args:
            raise ConfigError("Set β with beta=..., not loss_args.beta.")
        try:
            options = keyword_options(preference_losses().get(self.loss))
            check_options(f"preference loss {self.loss!r}", self.loss_options, options)
        except ValueError as exc:
            raise ConfigError(f"loss_args: {exc}") from exc
        if self.eval_samples < 1:
            raise ConfigError(f"'eval_samples' must be >= 1, got {self.eval_samples}.")
        if self.beta <= 0:
            raise ConfigError(f"'beta' must be > 0, got {self.beta}.")
        if self.batch_size % self.grad_accum:
            raise ConfigError(f"batch_size ({self.batch_size}) must be divisible by grad_accum ({self.grad_accum}).")
        if self.max_tokens_per_microbatch is not None and (
            self.unpaired or self.max_tokens_per_microbatch < 2 * self.max_length
        ):
            raise ConfigError(
                f"max_tokens_per_microbatch={self.max_tokens_per_microbatch} packs pairs into micro-batches "
                f"of that many tokens: it must be >= 2 x max_length ({2 * self.max_length}) so that every pair "
                f"fits, and takes paired losses only (loss={self.loss})."
            )
        if self.unpaired and self.batch_size // self.grad_accum < 2:
            raise ConfigError(
                f"loss={self.loss} needs >= 2 examples per micro-batch (z0 pairs prompts with other completions)."
            )
        if self.online:
            self.check_online()

    def check_online(self) -> None:
        """The online keys (the sampling and reward sections check their own values)."""
        if self.unpaired:  # online sampling yields pairs
            raise ConfigError(
                f"online=true does not support loss={self.loss} (it takes unpaired examples); use a "
                "paired loss such as dpo, ipo or simpo."
            )
        if self.samples_per_prompt < 2:
            raise ConfigError(
                f"online=true needs samples_per_prompt >= 2 to form a pair, got {self.samples_per_prompt}."
            )
        if not self.rewards and not self.judge:
            raise ConfigError(
                "online=true needs a label source: rewards=[...] (e.g. rewards=[gold], rewards=[task], "
                "rewards=[model:runs/reward/final]) or judge=PATH (a pairwise LLM judge)."
            )
        if self.judge and self.samples_per_prompt != 2:
            raise ConfigError(
                f"judge=... compares two completions: set samples_per_prompt=2 (got "
                f"{self.samples_per_prompt}), or label K samples with rewards=[judge] against a reference."
            )
        if self.judge and self.needs_scores:
            raise ConfigError(
                f"loss={self.loss} needs label scores; a pairwise judge gives none. Use rewards=[...] with {self.loss}."
            )
        unknown = set(self.judge_args) - set(JUDGE_OPTIONS)
        if unknown:
            raise ConfigError(f"judge_args: unknown options {sorted(unknown)}; they are {', '.join(JUDGE_OPTIONS)}.")

    @property
    def loss_options(self) -> dict[str, Any]:
        from lmrl.algorithms.registry import keyword_options

        takes_beta = "beta" in keyword_options(preference_losses().get(self.loss))
        return {**({"beta": self.beta} if takes_beta else {}), **self.loss_args}

    @property
    def uses_reference(self) -> bool:
        return not preference_losses().trait(self.loss, "reference_free", False)

    @property
    def unpaired(self) -> bool:
        """The loss takes labelled single completions (KTO), not pairs."""
        return bool(preference_losses().trait(self.loss, "unpaired", False))

    @property
    def needs_scores(self) -> bool:
        """The loss reads the pairs' ratings (ODPO's offset)."""
        return bool(preference_losses().trait(self.loss, "needs_scores", False))

    @property
    def running_delta(self) -> bool:
        """The loss reads the running mean δ of the implicit rewards (BCO)."""
        return bool(preference_losses().trait(self.loss, "running_delta", False))

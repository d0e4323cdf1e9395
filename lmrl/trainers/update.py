"""One RL update: ``ppo_epochs`` x ``minibatches`` optimizer steps on a rollout batch, with options built once.

    plan = ForwardPlan.resolve(model, forward_options(config, dtype), device)   # the training forward's speed tricks
    options = UpdateOptions.from_config(config, plan)    # at the method's constructor (the swarm node builds its own)
    stats = update(parts, batch, Targets(adv, old_logp, ref_logp), options, dtype, step, generator)

Each optimizer step trains one minibatch (whole groups where they split evenly) in ``grad_accum`` micro-batches: the
policy loss of the registry (`lmrl.algorithms.policy_loss`: the surrogate, the train-inference importance weights
and masks, a KL in the loss), PPO's value loss, then PPO-ptx's pretraining term. Every part is weighted by its
share of the minibatch over every rank (`lmrl.algorithms.global_share`), so neither ``grad_accum`` nor the number of
processes changes the gradient. Rows whose gradient is exactly 0 (advantage 0 under a loss that scales by it, no KL
or value term) are not run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import torch

from lmrl.algorithms import (
    POLICY_LOSSES,
    adaptive_entropy_coef,
    adaptive_kl_coef,
    global_share,
    high_entropy_tokens,
    policy_loss,
)
from lmrl.data import packing
from lmrl.models import memory, usage
from lmrl.models.forward_plan import ForwardOptions, ForwardPlan
from lmrl.models.usage import Usage
from lmrl.parallel import runtime
from lmrl.rollout.samplers.factory import sampler_name
from lmrl.rollout.types import RolloutBatch
from lmrl.trainers import common
from lmrl.trainers.ppo_value import value_term

CORRECTION_KEYS = ("tis_cap", "is_level", "is_mode", "is_low", "offpolicy_mask_threshold", "offpolicy_mask_rows")
"""The train-inference correction's config keys, handed to `policy_loss` as they are."""


@dataclasses.dataclass(frozen=True)
class LossSpec:
    """A policy loss of the registry and every option the run has for it (`policy_loss` takes the entry's own)."""

    name: str
    options: dict[str, Any]

    @property
    def scales_by_advantage(self) -> bool:
        """Each row's term is its advantage times something: a row with advantage 0 has gradient 0."""
        return bool(POLICY_LOSSES.trait(self.name, "scales_by_advantage", False))


@dataclasses.dataclass(frozen=True)
class UpdateOptions:
    """What an update reads, from the config once (`from_config`)."""

    loss: LossSpec
    plan: ForwardPlan = ForwardPlan()
    """the training forward (`lmrl.models.forward_plan`)"""
    ppo_epochs: int = 1
    minibatches: int = 1
    grad_accum: int = 1
    group_size: int = 1
    max_grad_norm: float | None = 1.0
    vf_coef: float = 0.1
    value_clip: float | None = 0.2
    skip_zero_advantage: bool = True
    top_entropy_quantile: float = 1.0
    max_tokens: int | None = None  # max_tokens_per_microbatch: micro-batches of packed rows (lmrl.data.packing)

    @property
    def updates(self) -> int:
        return self.ppo_epochs * self.minibatches

    @property
    def kl_in_loss(self) -> bool:
        return self.loss.options.get("kl_coef", 0.0) > 0

    @property
    def entropy_in_loss(self) -> bool:
        """An entropy bonus (fixed or adaptive): the training forward's entropy keeps its gradient."""
        return "entropy_coef" in self.loss.options

    def with_coefficients(self, coefs: Coefficients) -> UpdateOptions:
        """These options with the step's adaptive coefficients in place of the loss's kl_coef and entropy_coef."""
        current = {"kl_coef": coefs.kl_coef, "entropy_coef": coefs.entropy_coef}
        loss_options = {**self.loss.options, **{k: v for k, v in current.items() if k in self.loss.options}}
        return dataclasses.replace(self, loss=LossSpec(self.loss.name, loss_options))

    @classmethod
    def from_config(cls, config, plan: ForwardPlan) -> UpdateOptions:
        """From an `RLConfig`: the algorithm's loss with its options, training forwards under ``plan``."""
        max_len = config.max_total_tokens if config.multi_turn else config.max_new_tokens  # seq_sum_norm's constant
        return cls.from_sections(
            config.preset,
            config.update,
            config.correction,
            config.value,
            config.memory,
            max_len=max_len,
            group_size=config.samples_per_prompt,
            grad_accum=config.grad_accum,
            max_grad_norm=config.max_grad_norm,
            plan=plan,
        )

    @classmethod
    def from_sections(
        cls, preset, update, correction, value, memory, *, max_len, group_size, grad_accum, max_grad_norm, plan
    ) -> UpdateOptions:
        """From an algorithm's `Preset` and the RL sections (`lmrl.trainers.rl.sections`: update, correction, value,
        memory), as an `RLConfig` has them or as the swarm builds them."""
        low, high = preset.clip
        options: dict[str, Any] = {
            "agg": update.loss_agg or preset.agg,
            "max_len": max_len,
            "kl_estimator": update.kl_estimator,
            **{k: v for k, v in dataclasses.asdict(correction).items() if k in CORRECTION_KEYS},
        }  # lmrl.algorithms.mismatch
        clips = {
            "clip_low": update.clip_low if update.clip_low is not None else low,
            "clip_high": update.clip_high if update.clip_high is not None else high,
            **{
                k: v
                for k, v in (("clip_ratio_c", update.clip_ratio_c), ("clip_delta", update.clip_delta))
                if v is not None
            },
        }
        options.update(POLICY_LOSSES.own_options(preset.loss, clips))
        if update.kl_coef > 0 and preset.kl_in == "loss":
            options["kl_coef"] = update.kl_coef
        if update.entropy_coef > 0 or update.entropy_target is not None:
            options["entropy_coef"] = update.entropy_coef
        return cls(
            LossSpec(preset.loss, options),
            plan,
            update.ppo_epochs,
            update.minibatches,
            grad_accum,
            group_size,
            max_grad_norm,
            value.vf_coef,
            value.value_clip,
            memory.skip_zero_advantage,
            update.top_entropy_quantile,
            memory.max_tokens_per_microbatch,
        )


def forward_options(config, dtype: torch.dtype | None) -> ForwardOptions:
    """What an `RLConfig` asks of its training forwards (`ForwardPlan.resolve` decides what it gets)."""
    world = runtime.world()
    return ForwardOptions(
        config.temperature,
        dtype,
        config.logprob_chunk_mb,
        config.share_prompts,
        config.max_tokens_per_microbatch,
        config.reuse_sampling_forward,
        config.updates_per_step,
        config.engine,
        sampler_name(config),
        (config.sampling_shards or world) // world,
        config.release_memory,
        entropy_grad=config.entropy_coef > 0 or config.entropy_target is not None,
    )


@dataclasses.dataclass
class Coefficients:
    """The loss coefficients of a run that adapt step by step (`lmrl.algorithms.controls`): kl_coef towards
    ``kl_target`` (Ziegler et al. 2019) and entropy_coef towards ``entropy_target`` (Skywork-OR1). Without targets
    they stay the config's. Saved in the method state, so a resumed run continues with the same values."""

    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    kl_target: float | None = None
    kl_horizon: int = 10000
    entropy_target: float | None = None
    entropy_coef_step: float = 0.005

    @classmethod
    def from_config(cls, config) -> Coefficients:
        return cls(
            config.kl_coef,
            config.entropy_coef,
            config.kl_target,
            config.kl_horizon,
            config.entropy_target,
            config.entropy_coef_step,
        )

    def advance(self, stats: dict[str, float], completions: int) -> dict[str, float]:
        """After a step's update: move each adaptive coefficient with the step's measured ``kl`` and ``entropy``
        (the update's metrics) over its ``completions`` (every rank's); returns the coefficients used next step."""
        out = {}
        if self.kl_target is not None and "kl" in stats:
            self.kl_coef = adaptive_kl_coef(self.kl_coef, stats["kl"], self.kl_target, self.kl_horizon, completions)
            out["optim/kl_coef"] = self.kl_coef
        if self.entropy_target is not None and "entropy" in stats:
            self.entropy_coef = adaptive_entropy_coef(
                self.entropy_coef, stats["entropy"], self.entropy_target, self.entropy_coef_step
            )
            out["optim/entropy_coef"] = self.entropy_coef
        return out

    def state_dict(self) -> dict[str, float]:
        return {"kl_coef": self.kl_coef, "entropy_coef": self.entropy_coef}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.kl_coef, self.entropy_coef = float(state["kl_coef"]), float(state["entropy_coef"])


@dataclasses.dataclass
class Targets:
    """Per-row learning targets of a batch: advantages (N,) or (N, T); ``old_logp`` None = on-policy with one
    update (pi_old is the current policy, detached); PPO's ``returns`` and ``old_values`` (N, T)."""

    advantages: torch.Tensor
    old_logp: torch.Tensor | None = None
    ref_logp: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    old_values: torch.Tensor | None = None

    def to(self, device: torch.device) -> Targets:
        return Targets(*(t.to(device) if t is not None else None for t in dataclasses.astuple(self)))

    def rows(self, index: torch.Tensor, width: int | None = None) -> Targets:
        """The targets of rows ``index``; per-token ones cut to the first ``width`` completion columns."""
        return Targets(
            *(
                None if t is None else t[index] if t.dim() == 1 or width is None else t[index, :width]
                for t in dataclasses.astuple(self)
            )
        )


@dataclasses.dataclass
class Weighted:
    """One batch of an update with its targets: its loss (None: the options'), the weight of that loss in the sum the
    optimizer steps on, and the namespace of its metrics (self-play's two roles: "challenger/loss", "solver/kl")."""

    batch: RolloutBatch
    targets: Targets
    coef: float = 1.0
    name: str = ""
    loss: LossSpec | None = None

    def key(self, stat: str) -> str:
        """A stat's metric name: as it is, or in the namespace (``policy/`` dropped, the policy loss as ``loss``)."""
        if not self.name:
            return stat
        return f"{self.name}/{'loss' if stat == 'loss/policy' else stat.removeprefix('policy/')}"


def update(
    parts, batch: RolloutBatch, targets: Targets, options: UpdateOptions, dtype, step: int, generator: torch.Generator
) -> dict[str, float]:
    """``options.updates`` optimizer steps on the batch; returns the stats averaged over them (over every rank)."""
    return update_weighted(parts, [Weighted(batch, targets)], options, dtype, step, generator)


def update_weighted(
    parts, weighted: list[Weighted], options: UpdateOptions, dtype, step: int, generator: torch.Generator
) -> dict[str, float]:
    """``options.updates`` optimizer steps, each on sum_b coef_b L_b over the weighted batches (each loss normalised
    by its own minibatch's share on every rank, `global_share`); the stats averaged over the steps, per namespace."""
    params = [*parts.model.parameters(), *(parts.value_model.parameters() if parts.value_model is not None else [])]
    orders = [list(minibatches(len(w.batch), options, generator)) for w in weighted]
    # once per batch, not per minibatch: its loss's options, the rows it skips, its targets on the batch's device
    own = [options if w.loss is None else dataclasses.replace(options, loss=w.loss) for w in weighted]
    skips = [zero_gradient_rows(w.targets.advantages, o, parts.value_model is not None) for w, o in zip(weighted, own)]
    weighted = [dataclasses.replace(w, targets=w.targets.to(w.batch.input_ids.device)) for w in weighted]
    totals: dict[str, float] = {}  # sums of share-weighted stats: this rank's part of each minibatch's
    with usage.counting() as used:  # what the training forwards and backwards really did
        for index, mbs in enumerate(zip(*orders), start=1):
            for w, mb, o, skip in zip(weighted, mbs, own, skips):
                train_minibatch(parts, w, mb, index, skip, o, dtype, step, totals)
            if parts.ptx is not None and parts.ptx.coef > 0:  # PPO-ptx: + gamma * CE on pretraining text
                ce = parts.ptx.backward(parts.model, (step - 1) * options.updates + index, dtype, options.plan.chunk_mb)
                add(totals, {"loss/ptx": ce}, 1 / options.updates)
            add(totals, {"optim/grad_norm": optimizer_step(parts, params, options, step)}, 1 / options.updates)
        if options.plan.release_memory:  # the backward's free heap, before the next rollout
            memory.release_free_memory()
    return {**mean_over_ranks(totals, [w.name for w in weighted]), **usage_metrics(used)}


def train_minibatch(
    parts, w: Weighted, mb, index: int, skip, options: UpdateOptions, dtype, step: int, totals: dict[str, float]
) -> None:
    """Forward and backward of minibatch ``mb`` of ``w`` (the ``index``-th optimizer step) under its loss's
    ``options``, micro-batch by micro-batch, without the ``skip`` rows (N,); adds the stats to ``totals``."""
    targets = w.targets
    counts = minibatch_counts(w.batch, mb)
    for micro, last, weight in micro_batches(w.batch, mb, skip, options, totals):
        if options.plan.release_memory:  # what sampling and the last backward left free, before the forward peaks
            memory.release_free_memory()
        sub = w.batch.select(micro).trimmed()  # a part of shorter rows: none of the batch's padding after them
        stats = train_micro(
            parts,
            sub,
            targets.rows(micro, sub.completion_ids.shape[1]),
            options,
            dtype,
            step,
            counts,
            last_use=last and index == options.updates,
            weight=weight,
            coef=w.coef,
        )
        add(totals, {w.key(k): v for k, v in stats.items()}, 1 / options.updates)


def train_micro(
    parts,
    sub: RolloutBatch,
    targets: Targets,
    options: UpdateOptions,
    dtype,
    step: int,
    counts,
    last_use: bool,
    weight: float = 1.0,
    coef: float = 1.0,
) -> dict[str, float]:
    """Forward and backward of one micro-batch: its policy loss weighted by its share of the minibatch (+ vf_coef x
    its part of the value loss), times ``coef`` (its batch's weight in the update's sum). Returns its stats times that
    share (the value loss: its part), and the share. ``weight`` 0: a repeat that only keeps the ranks' backward passes
    in step (packed micro-batches)."""
    record = sub.linear_outputs
    if record is not None and last_use:
        record = record.for_last_use()  # freed as the forward replays it: not held through the backward
    mask = sub.train_mask  # multi-turn: tool outputs are attended to, never trained
    logp, entropy = options.plan.logprobs(
        parts.model, sub.input_ids, sub.attention_mask, sub.prompt_ids.shape[1], entropy=True, linear_outputs=record
    )
    old_logp = logp.detach() if targets.old_logp is None else targets.old_logp
    keep = (
        high_entropy_tokens(entropy, mask, options.top_entropy_quantile) if options.top_entropy_quantile < 1 else None
    )
    loss, stats = policy_loss(
        options.loss.name,
        logp,
        old_logp,
        targets.advantages,
        mask,
        ref_logp=targets.ref_logp,
        sampler_logp=sub.sampler_logp,
        entropy=entropy,
        train_tokens=keep,
        **options.loss.options,
    )
    share = float(global_share(options.loss.options["agg"], mask, *counts)) * weight
    stats.update(
        {"loss/policy": loss.item(), "entropy": float((entropy.detach() * mask).sum() / mask.sum().clamp(min=1))}
    )
    stats = {key: float(value) * share for key, value in stats.items()}
    loss = loss * share
    if parts.value_model is not None:  # its own normalisation: a mean over every rank's trained rows
        vloss, vstats = value_term(
            parts.value_model, sub, targets.old_values, targets.returns, options.value_clip, dtype, counts[1]
        )
        loss = loss + options.vf_coef * vloss * weight
        stats.update(
            {**{key: float(value) * share for key, value in vstats.items()}, "loss/value": vloss.item() * weight}
        )
    common.check_finite(loss, step)
    (loss * coef).backward()
    return {**stats, "train/share": share}


def minibatches(n: int, options: UpdateOptions, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """The row indices of each optimizer step's minibatch, epoch after epoch."""
    for _ in range(options.ppo_epochs):
        yield from minibatch_order(n, options.group_size, options.minibatches, generator).chunk(options.minibatches)


def minibatch_order(n: int, group_size: int, minibatches: int, generator: torch.Generator) -> torch.Tensor:
    """A random order of the n rows in which every minibatch holds whole groups (so prompts can be shared),
    when the groups split evenly into minibatches; else a random order of rows. One minibatch: the rows in order
    (the full-batch gradient does not depend on it, and in-order rows need no gathering)."""
    if minibatches == 1:
        return torch.arange(n)
    if n % group_size or (n // group_size) % minibatches:
        return torch.randperm(n, generator=generator)
    groups = torch.randperm(n // group_size, generator=generator)  # (n/G,)
    return (groups[:, None] * group_size + torch.arange(group_size)).flatten()  # (n,)


def minibatch_counts(batch: RolloutBatch, mb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, trained rows) of minibatch ``mb`` over every rank (dropped groups' rows have no tokens)."""
    mask = batch.train_mask[mb]  # (M, T)
    counts = torch.stack([mask.sum(), mask.any(dim=1).sum().float()])
    tokens, rows = runtime.all_sum(counts).clamp(min=1)
    return tokens, rows


def micro_batches(
    batch: RolloutBatch, mb: torch.Tensor, skip: torch.Tensor | None, options: UpdateOptions, totals: dict[str, float]
) -> Iterator[tuple[torch.Tensor, bool, float]]:
    """The micro-batches of minibatch ``mb`` without the skipped rows (they add exactly 0 to the loss; the shares keep
    the minibatch's size), each with whether it is the minibatch's last and its loss weight; counts the skipped
    share. ``grad_accum`` equal parts of the rows sorted by completion length (each part is trimmed to its own
    longest row: `RolloutBatch.trimmed`), or with ``max_tokens`` the rows packed first-fit-decreasing by their real
    tokens; then every rank runs as many as the rank with the most (a repeat at weight 0: each backward reduces
    gradients across ranks)."""
    if skip is not None:
        totals["update/skipped_rows_frac"] = (
            totals.get("update/skipped_rows_frac", 0.0)
            + float(skip[mb].float().sum()) / len(batch) / options.ppo_epochs
        )
    kept = mb[~skip[mb]] if skip is not None else mb
    if options.max_tokens is None:
        if options.grad_accum > 1:  # parts of similar lengths: each is padded to its own longest row only
            kept = kept[torch.sort(batch.completion_lengths[kept].cpu(), stable=True).indices]
        micros = list(kept.chunk(options.grad_accum))
    else:
        lengths = batch.attention_mask[kept].sum(dim=1).tolist()
        micros = [kept[torch.tensor(sorted(b))] for b in packing.first_fit_decreasing(lengths, options.max_tokens)]
    micros = [micro for micro in micros if len(micro)]
    for index, micro in enumerate(micros):
        yield micro, index == len(micros) - 1, 1.0
    if options.max_tokens is not None:
        for _ in range(runtime.parts_behind(len(micros))):
            yield (micros[0] if micros else mb[:1]), False, 0.0


def zero_gradient_rows(adv: torch.Tensor, options: UpdateOptions, has_value_model: bool) -> torch.Tensor | None:
    """Rows (N,) bool, on the CPU, whose loss gradient is exactly 0: advantage 0 on every token under a loss that
    scales each row's term by its advantage (a registry trait), no KL or entropy term in the loss and no value loss.
    None: skip nothing (also with several processes: every rank runs the same forwards, FSDP gathers weights in
    each)."""
    if (
        not options.skip_zero_advantage
        or not options.loss.scales_by_advantage
        or options.kl_in_loss
        or options.entropy_in_loss
        or has_value_model
        or runtime.world() > 1
    ):
        return None
    return ((adv == 0).all(dim=-1) if adv.dim() == 2 else adv == 0).cpu()


def optimizer_step(parts, params: list, options: UpdateOptions, step: int) -> float:
    """Clip and step; when every row was skipped, step on the exact zero gradient (AdamW's momentum still moves)."""
    if all(p.grad is None for p in params):
        for p in params:
            p.grad = torch.zeros_like(p) if p.requires_grad else None
    return common.optimizer_step(params, parts.optimizer, parts.scheduler, options.max_grad_norm, step)


def add(totals: dict[str, float], stats: dict[str, float], scale: float) -> None:
    for key, value in stats.items():
        totals[key] = totals.get(key, 0.0) + float(value) * scale


def mean_over_ranks(totals: dict[str, float], names: list[str] = ("",)) -> dict[str, float]:
    """Losses stay sums over all rows (skipped rows add exactly 0); statistics become means over every rank's trained
    rows: this rank's share-weighted sum x world / the share of every rank, whose mean over ranks is the global
    mean. A rank's loss is its share of the loss: x world averages over ranks to the loss. ``names``: the weighted
    batches' namespaces, each with its own share."""
    world, out = runtime.world(), {}
    spaces = sorted({"", *(f"{n}/" for n in names if n)}, key=len, reverse=True)  # the longest prefix first
    every_rank = {p: runtime.all_sum(totals.pop(f"{p}train/share", 0.0)) for p in spaces}
    for key, value in totals.items():
        space = next(p for p in spaces if key.startswith(p))
        if key.startswith("loss/") or key == f"{space}loss" or key.startswith(f"{space}loss/"):
            out[key] = value * world
        elif every_rank[space] > 0 and not key.startswith(("optim/", "update/")):
            out[key] = value * world / every_rank[space]
        else:
            out[key] = value
    return out


def usage_metrics(usage: Usage) -> dict[str, float]:
    """The speed-ups the training forwards used, measured: the share of forwards that ran each distinct prompt once,
    through the chunked LM head and as packed rows, and the share of linear-layer calls that returned the sampler's
    outputs; the fused RMSNorm/SwiGLU calls per training forward (`lmrl.models.fused`); the saves per training forward
    the backward rebuilds instead of keeping, and the MiB that spared (`lmrl.models.rebuild`); the share of the
    replayed layers' backward rows skipped as all-zero gradient (`replay.rows_with_gradient`); the times free memory
    went back to the system during the update (`release_memory`)."""
    forwards = max(usage.get("forwards", 0), 1)
    calls = usage.get("replayed", 0) + usage.get("computed", 0)
    rows = usage.get("backward_rows", 0) + usage.get("backward_rows_skipped", 0)
    return {
        "update/shared_prompts": usage.get("shared_prompts", 0) / forwards,
        "update/chunked_head": usage.get("chunked_head", 0) / forwards,
        "update/packed": usage.get("packed", 0) / forwards,
        "update/reused_sampling_forward": usage.get("replayed", 0) / calls if calls else 0.0,
        "update/fused_calls": usage.get("forward_fused", 0) / forwards,
        "update/rebuilt_saves": usage.get("rebuilt", 0) / forwards,
        "update/rebuilt_mib": usage.get("rebuilt_bytes", 0) / forwards / 2**20,
        "update/backward_rows_skipped": usage.get("backward_rows_skipped", 0) / rows if rows else 0.0,
        "update/memory_releases": float(usage.get("memory_releases", 0)),
    }

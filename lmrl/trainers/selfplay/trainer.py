"""Language Self-Play (LSP, LSP-Zero): data-free RL in which one model plays Challenger and Solver.

Kuba et al. 2025, "Language Self-Play For Data-Free Training" (arXiv 2509.07414), Algorithm 1.
Each step, with the same weights:

1. Challenger: N queries q_i ~ pi(.|<cp>), <cp> the challenger prompt with ``task`` and ``template``;
2. environment: the queries are checked (``verifier``): with ``arithmetic`` a query must be an
   arithmetic problem and its true answer is computed by ``lmrl.data.tasks`` (never Python eval);
   a malformed query is not answered and its Challenger reward is ``malformed_reward``;
3. Solver: G answers a_i^j ~ pi(.|q_i) per valid query (q_i as the user turn);
4. rewards r_ij = R(q_i, a_i^j) from ``rewards`` (a reward model, the ``task`` verifier, any reward
   function); LSP adds the frozen reference model's 7-point quality score R_Q (``lmrl.rewards.self_reward``);
5. advantages of both roles (``lmrl.algorithms.selfplay``), then ONE optimizer step on
   L_Sol + challenger_coef * L_Ch, each a REINFORCE loss with a per-token KL to the reference.

Choices where the paper is silent or loose (each an option; docs/selfplay.md):
1. KL: per-token ``kl_estimator`` (default k3) in the loss, token-mean aggregation (TRL semantics);
   eqs. 4-5 write a sequence-level k1 term, whose on-policy expected gradient is 0.
2. Solver baseline: mean of r + R_Q (``solver_baseline=total``); no std scaling (``adv_scale=none``).
3. Truncated importance sampling against the sampler's log-probs (cap 2), as ``lmrl rl`` does.
4. A built-in model writes garbage at first, so ``warm_start_steps`` > 0 first fine-tunes the model on
   both roles' formats from built-in task rows (Challenger: <cp> -> a problem; Solver: problem ->
   answer). The self-play phase itself reads no dataset; the reference model is the policy at its start.

Why not ``online.update``: it takes one optimizer step per batch and aggregates over that batch,
while LSP sums two separately normalised losses into one step. This module reuses its
``ForwardPlan.scores``, ``policy_loss`` and the common optimizer step instead.

Layout: this module is the method (one step, set-up); its keys are in ``config.py``, the environment (challenger
prompt, query checks) in ``env.py``, the held-out evaluation in ``heldout.py``, the warm start and the reference
model in ``start.py``.

Launch::

    lmrl selfplay --config selfplay/tiny_arithmetic              # CPU, verifiable, built-in model
    lmrl selfplay --config selfplay/lsp_llama_3b                 # GPU, reward model + self-reward
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import torch

from lmrl.algorithms.selfplay import selfplay_advantages
from lmrl.data.loading import load_rows
from lmrl.data.prompt_format import PromptFormat
from lmrl.models import describe_parameters
from lmrl.models.forward_plan import ForwardPlan
from lmrl.models.setup import ModelSetup
from lmrl.parallel import runtime
from lmrl.rewards import RewardFailure, RewardSet
from lmrl.rewards.self_reward import QUALITY_PROMPT, SelfReward
from lmrl.rollout.engines.factory import make_engine
from lmrl.rollout.protocol import Engine
from lmrl.rollout.samplers.groups import seeded_shards
from lmrl.rollout.types import RolloutBatch, SamplingParams, concat_batches
from lmrl.trainers import common, loop
from lmrl.trainers.selfplay.config import SelfPlayConfig
from lmrl.trainers.selfplay.env import (  # noqa: F401 - re-exported
    QUERY_CHECKERS,
    Query,
    arithmetic_query,
    challenger_text,
    open_query,
    query_metrics,
)
from lmrl.trainers.selfplay.heldout import evaluate
from lmrl.trainers.selfplay.start import (
    reference_model,
    warm_start,
    warm_start_examples,
)
from lmrl.trainers.update import LossSpec, Targets, UpdateOptions, Weighted, update_weighted

# ----------------------------------------------------------------------------- learning


@dataclasses.dataclass
class SelfPlayParts:
    """The live objects of a run that a step uses."""

    model: Any
    tokenizer: Any
    ref_model: Any
    engine: Engine  # lmrl.rollout.engines.factory.make_engine
    reward_set: RewardSet
    judge_set: RewardSet | None
    check: Callable[[str], Query | None]
    challenger_ids: list[int]
    optimizer: torch.optim.Optimizer
    scheduler: Any
    value_model: None = None  # the RL update's members a self-play learner has none of
    ptx: None = None


def update(
    parts: SelfPlayParts,
    roles: list[tuple[str, RolloutBatch | None, torch.Tensor, float]],
    config: SelfPlayConfig,
    dtype,
    step: int,
) -> dict[str, float]:
    """One optimizer step on sum_role coef * L_role, L_role = policy_loss("pg") with KL over that role's rows of every
    rank: the RL update's weighted batches (`lmrl.trainers.update.update_weighted`, each role normalised by its own
    share of every rank's tokens or rows); a rank with fewer rows forwards masked pads (`pad_rows`)."""
    plan = ForwardPlan(config.temperature, dtype, config.logprob_chunk_mb)
    options = UpdateOptions(
        LossSpec("pg", {}),
        plan,
        grad_accum=config.grad_accum,
        max_grad_norm=config.max_grad_norm,
        skip_zero_advantage=False,
    )
    weighted = []
    for name, batch, adv, coef in roles:
        batch, adv = pad_rows(batch, adv, roles[0][1], parts.tokenizer.pad_token_id)
        if batch is None:
            continue
        ref_logp = plan.scores(parts.ref_model, batch) if config.kl_coef > 0 else None  # (n, T)
        max_len = config.challenger_max_new_tokens if name == "challenger" else config.solver_max_new_tokens
        loss = LossSpec(
            "pg",
            {
                "agg": config.loss_agg,
                "max_len": max_len,
                "kl_coef": config.kl_coef,
                "kl_estimator": config.kl_estimator,
                "tis_cap": config.tis_cap,
            },
        )
        weighted.append(Weighted(batch, Targets(adv, None, ref_logp), coef, name, loss))
    # on-policy, one update: pi_old = sg(pi_theta), so the ratio is 1 in value and grad log pi in gradient
    totals = update_weighted(parts, weighted, options, dtype, step, torch.Generator().manual_seed(step))
    totals["loss"] = sum(w.coef * totals[f"{w.name}/loss"] for w in weighted)
    for key in ("kl", "entropy"):  # the standard names carry the Solver's values
        if f"solver/{key}" in totals:
            totals[key] = totals[f"solver/{key}"]
    return totals


def pad_rows(batch: RolloutBatch | None, adv: torch.Tensor, source: RolloutBatch, pad_id: int):
    """``batch`` (and its advantages) padded to the most rows any rank has, with masked copies of ``source``'s first
    row (loss weight 0): every rank runs the same forwards. None when no rank has a row."""
    n = len(batch) if batch is not None else 0
    most = int(runtime.all_max(n))
    if most == n:
        return (batch, adv) if n else (None, adv)
    pad = source.select([0] * (most - n))
    pad = dataclasses.replace(pad, loss_mask=torch.zeros_like(pad.train_mask))
    if batch is not None:  # its loss mask made explicit, so that the concatenation keeps the pads' zeros
        batch = concat_batches([dataclasses.replace(batch, loss_mask=batch.train_mask), pad], pad_id)
    return pad if batch is None else batch, torch.cat([adv, adv.new_zeros(most - n)])


def score(parts: SelfPlayParts, answered: list[Query], solver: RolloutBatch, config: SelfPlayConfig):
    """R(q, a) for every answer (M*G,), the scaled self-reward R_Q (LSP; else None) and their metrics."""
    G = config.answers_per_query
    texts = [q.text for q in answered for _ in range(G)]  # (M*G,) prompt-major
    columns = {k: [q.columns[k] for q in answered for _ in range(G)] for k in answered[0].columns}
    extra = dict(truncated=solver.truncated.tolist(), completion_lengths=solver.completion_lengths.tolist())
    rewards, _, metrics = parts.reward_set.compute(texts, solver.completions, **extra, **columns)
    if parts.judge_set is None:
        return rewards, None, metrics
    t0 = time.perf_counter()
    quality, _, judge_metrics = parts.judge_set.compute(texts, solver.completions, **extra)
    metrics.update({k: v for k, v in judge_metrics.items() if k.count("/") == 2})  # R_Q's own: reward/<fn>/<stat>
    metrics.update(
        {
            "time/judge_s": time.perf_counter() - t0,
            "reward/self_reward/parse_failures_total": float(parts.judge_set.fns[0].failures),
        }
    )
    return rewards, config.self_reward_weight * quality, metrics


def sample_shard(parts: SelfPlayParts, config: SelfPlayConfig, generator: torch.Generator, n: int):
    """One shard of the step (`lmrl.rollout.samplers.groups.seeded_shards`: its seeded generator, resume-exact): ``n``
    Challenger queries, their checks, and G Solver answers to each valid one (None if none is valid)."""
    sampling, tok = dict(temperature=config.temperature, top_p=config.top_p, top_k=config.top_k), parts.tokenizer
    challenger = parts.engine.generate(
        [parts.challenger_ids], SamplingParams(config.challenger_max_new_tokens, **sampling), n=n, generator=generator
    )  # (n rows)
    queries = [parts.check(text) for text in challenger.completions]
    ids = [PromptFormat().ids(tok, q.text) for q in queries if q is not None]
    solver = (
        parts.engine.generate(
            ids,
            SamplingParams(config.solver_max_new_tokens, **sampling),
            n=config.answers_per_query,
            generator=generator,
        )
        if ids
        else None
    )  # (m*G rows)
    return challenger, queries, solver


def rollout(parts: SelfPlayParts, config: SelfPlayConfig, step: int):
    """This rank's queries (its sampling shards) and answers, with the whole policy on each rank (FSDP)."""
    pad_id = parts.tokenizer.pad_token_id
    parts.engine.sync(parts.model, step - 1)  # the weights after step - 1 updates (resumed: the restored ones)
    queries = runtime.shard(range(config.queries_per_step))
    with runtime.full_params(parts.model):
        shards = [
            sample_shard(parts, config, generator, len(part))
            for _, part, generator in seeded_shards(
                queries, config.sampling_shards, config.seed, step, parts.engine.device
            )
        ]
    solvers = [solver for _, _, solver in shards if solver is not None]
    return (
        concat_batches([c for c, _, _ in shards], pad_id),
        [q for _, queries, _ in shards for q in queries],
        concat_batches(solvers, pad_id) if solvers else None,
    )


def global_advantages(rewards, self_rewards, valid: torch.Tensor, config: SelfPlayConfig):
    """Both roles' advantages on every rank's queries (the Challenger's baseline is the mean over all of them),
    and this rank's Solver and Challenger rows of them."""
    G, lsp = config.answers_per_query, config.variant == "lsp"  # lsp: self-rewards R_Q of every answer
    parts = runtime.gather_objects(
        (rewards.tolist(), self_rewards.tolist() if self_rewards is not None else [], valid.tolist())
    )
    every = lambda i: torch.tensor([x for p in parts for x in p[i]])  # noqa: E731
    adv = selfplay_advantages(
        every(0),
        G,
        every(1) if lsp else None,
        every(2).bool(),
        malformed_reward=config.malformed_reward,
        baseline=config.solver_baseline,
        scale=config.adv_scale,
    )
    rank = runtime.rank()
    start = sum(len(p[0]) for p in parts[:rank])  # this rank's first Solver row, then its first query
    own = slice(start, start + len(rewards)), slice(rank * len(valid), (rank + 1) * len(valid))
    return adv, own


def selfplay_step(parts: SelfPlayParts, config: SelfPlayConfig, dtype, step: int, tracker) -> dict[str, float]:
    """Challenger writes, the environment checks, Solver answers, rewards, advantages, one update. Several
    processes: each rank plays its shard of the queries; the advantages are computed on every rank's rewards."""
    t0 = time.perf_counter()
    challenger, queries, solver = rollout(parts, config, step)
    answered = [q for q in queries if q is not None]
    metrics = query_metrics(challenger, queries)
    rewards, self_rewards = torch.zeros(0), None
    if answered:
        metrics.update(
            {
                "completion_len/mean": solver.completion_lengths.float().mean().item(),
                "rollout/truncated_frac": solver.truncated.float().mean().item(),
            }
        )
    metrics["time/rollout_s"] = time.perf_counter() - t0
    with runtime.full_params(parts.ref_model if parts.judge_set is not None else None), RewardFailure() as failure:
        if answered:  # LSP's judge generates with the reference model
            rewards, self_rewards, reward_metrics = score(parts, answered, solver, config)
            metrics.update(reward_metrics)
    if failure.skips(tracker, step):
        judge_errors = parts.judge_set.errors if parts.judge_set is not None else 0
        return failure.skipped(parts.reward_set.errors + judge_errors)
    valid = torch.tensor([q is not None for q in queries], dtype=torch.bool)  # (N,)
    adv, (own_rows, own_queries) = global_advantages(rewards, self_rewards, valid, config)
    if adv.query_values.numel():
        metrics["challenger/pass_rate"] = adv.query_values.mean().item()  # the Solver's mean R on valid queries
    metrics["challenger/reward_mean"] = adv.challenger_rewards.mean().item()
    if step % config.sample_every == 0 or step == 1:  # rank 0's queries lead every rank's
        log_samples(tracker, step, challenger, queries, solver, rewards, adv, config)
    t1 = time.perf_counter()
    stats = update(
        parts,
        [
            ("challenger", challenger, adv.challenger[own_queries], config.challenger_coef),
            ("solver", solver, adv.solver[own_rows], 1.0),
        ],
        config,
        dtype,
        step,
    )
    metrics.update(stats, **{"time/train_s": time.perf_counter() - t1, "lr": parts.scheduler.get_last_lr()[0]})
    return metrics


def log_samples(tracker, step, challenger, queries, solver, rewards, adv, config) -> None:
    rows, k = [], 0  # k: index of the query among the answered ones
    for i, (text, query) in enumerate(zip(challenger.completions, queries)):
        row = {"query": text, "valid": query is not None, "challenger_reward": adv.challenger_rewards[i].item()}
        if query is not None:
            row.update(
                answer=solver.completions[k * config.answers_per_query],
                reward=rewards[k * config.answers_per_query].item(),
                pass_rate=adv.query_values[k].item(),
            )
            k += 1
        if i < config.num_samples:
            rows.append(row)
    tracker.log_samples(step, rows, "self-play queries and first answers")


# ----------------------------------------------------------------------------- the method


class SelfPlay(loop.MethodDefaults):
    """The self-play method for `loop.run`: one step is `selfplay_step` (both roles, one optimizer step).

    Set up in two parts. The constructor loads all that can fail on bad input (policy, rewards, held-out and
    warm-start data), before the run directory exists; `start(run)` then runs the warm start on a fresh run and
    builds what depends on it: the reference model (the policy at the start of self-play) and the judge that uses it.
    """

    data_parallel = True  # each rank plays its share of the queries (the warm start runs in one process)

    def __init__(self, config: SelfPlayConfig, setup: ModelSetup):
        self.config, self.setup = config, setup
        self.model, self.tokenizer = setup.policy()
        self.reward_set = RewardSet.from_config(config)
        self.eval_rows = (
            load_rows(config.eval_dataset, split="test", limit=config.eval_rows, **config.eval_task_args)
            if config.eval_dataset
            else []
        )
        self.warm_start_data = warm_start_examples(config, self.tokenizer) if config.warm_start_steps else []
        self.optimizer = common.build_optimizer(self.model, config)
        self.scheduler = common.build_scheduler(self.optimizer, config)
        self.initial_metrics: dict[str, float] = {}  # the warm start's, logged at step 0

    def start(self, run: common.Run) -> None:
        """Warm start (a fresh run only), reference model, self-reward judge, and the parts a step uses."""
        config, dtype, tokenizer = self.config, self.setup.dtype, self.tokenizer
        if not run.checkpoint and config.warm_start_steps:
            self.initial_metrics = warm_start(self.model, tokenizer, self.warm_start_data, config, dtype, run.tracker)
        self.warm_start_data = []
        needs_ref = config.kl_coef > 0 or config.variant == "lsp"
        ref_model = reference_model(self.setup, self.model, tokenizer, run, config) if needs_ref else None
        judge_set = None
        if config.variant == "lsp":
            judge = SelfReward(
                ref_model,
                tokenizer,
                fallback=config.self_reward_fallback,
                autocast_dtype=dtype,
                template=QUALITY_PROMPT if config.judge_prompt == "lsp" else config.judge_prompt,
                max_new_tokens=config.judge_max_new_tokens,
            )
            judge_set = RewardSet(
                [judge], on_reward_error=config.on_reward_error, max_skipped_steps=config.max_skipped_steps
            )
        cp_ids = PromptFormat().ids(tokenizer, challenger_text(config))
        longest = SamplingParams(
            max(config.challenger_max_new_tokens, config.solver_max_new_tokens),
            temperature=config.temperature,
            top_p=config.top_p,
            top_k=config.top_k,
        )
        engine = make_engine(config, self.model, tokenizer, dtype, sampling=longest, longest_prompt=len(cp_ids))
        self.parts = SelfPlayParts(
            self.model,
            tokenizer,
            ref_model,
            engine,
            self.reward_set,
            judge_set,
            lambda text: QUERY_CHECKERS[config.verifier](text, **config.query_args),
            cp_ids,
            self.optimizer,
            self.scheduler,
        )

    def describe(self, run: common.Run) -> str:
        config = self.config
        return (
            f"selfplay {config.variant}: {describe_parameters(self.model)}, {config.queries_per_step} queries x "
            f"{config.answers_per_query} answers/step, precision={self.setup.precision_name}, run dir {run.dir}"
        )

    def step(self, step: int) -> dict[str, float]:
        return selfplay_step(self.parts, self.config, self.setup.dtype, step, self.tracker)

    def close(self) -> None:
        self.parts.engine.close()

    def evaluate(self, step: int) -> tuple[dict[str, float], list[dict]]:
        return evaluate(self.model, self.tokenizer, self.eval_rows, self.config, self.setup.dtype)


def train(config: SelfPlayConfig) -> dict[str, float]:
    """Run self-play end to end; returns the final metrics (with ``initial/eval/accuracy`` when evaluated and the
    warm start's ``warm_start/loss``)."""
    return loop.train(SelfPlay, config, f"selfplay {config.variant}")

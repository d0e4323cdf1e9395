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
``logprobs_no_grad``, ``policy_loss`` and the common optimizer step instead.

Launch::

    lmrl selfplay --config selfplay/tiny_arithmetic              # CPU, verifiable, built-in model
    lmrl selfplay --config selfplay/lsp_llama_3b                 # GPU, reward model + self-reward
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import re
import time
from pathlib import Path
from typing import Any, Callable, Literal

import torch

from lmrl.algorithms import policy_loss
from lmrl.algorithms.selfplay import selfplay_advantages
from lmrl.config import ConfigError, TrainConfig, field
from lmrl.data.chat import IGNORE_INDEX, render_prompt
from lmrl.data.loading import load_rows
from lmrl.data.sft import SFTExample, build_sft_examples, collate_sft
from lmrl.data.tasks.expr import evaluate as evaluate_expression
from lmrl.eval.generation import task_accuracy
from lmrl.models import autocast, autocast_dtype, count_parameters, load_model, load_model_and_tokenizer
from lmrl.models.logprobs import completion_logprobs, selective_log_softmax
from lmrl.rewards import RewardError, RewardSet
from lmrl.rewards.self_reward import QUALITY_PROMPT, SelfReward
from lmrl.rollout.hf import HFEngine, SamplingParams
from lmrl.rollout.types import RolloutBatch
from lmrl.trainers import common
from lmrl.trainers.online import logprobs_no_grad
from lmrl.trainers.sft import train_step as sft_train_step

CHALLENGER_PROMPTS = {
    "lsp": """Background: a language task is an (input, output) tuple. The input is what a user gives a language agent; the output is the agent's reply.

Request: generate ONE valid input for the task '{task}'. It will be passed to another language agent. The input may be easy, intermediate, hard or noisy: it should stress-test the agent.

Details: copy the template between [Start Generation] and [End Generation] (without these tags) and fill in its {} placeholders.
[Start Generation]
{template}
[End Generation]

Final remarks: do not write the output, hints or anything that gives it away. Do not ask for actions a language agent cannot perform. Stop as soon as the template is filled. Follow the template strictly, unless the task and template are None or empty: then use your best judgement.""",
    "short": "Write one {task} problem like {template}",
}
"""Named challenger prompts: ``lsp`` paraphrases the paper's Box 1; ``short`` suits built-in char models."""


@dataclasses.dataclass
class SelfPlayConfig(TrainConfig):
    variant: Literal["lsp_zero", "lsp"] = field("lsp", "lsp_zero: zero-sum game on R; lsp: both roles also get the reference model's quality score R_Q")
    task: str = field("", "challenger prompt parameter {task} (empty: None, general instruction following)")
    template: str = field("", "challenger prompt parameter {template}: the form of a query, {} marks a slot (empty: None)")
    challenger_prompt: str = field("lsp", "'lsp' (the paper's Box 1, paraphrased), 'short' (one line), or your own text with {task}/{template}")
    verifier: Literal["none", "arithmetic"] = field("none", "none: any non-empty query; arithmetic: a query must be a problem like 12+34=, its answer is computed")
    query_args: dict = field({}, "limits of a verifiable query (arithmetic: max_digits, max_operands, ops, negative)")
    rewards: list[str] = field([], "R(q, a): reward specs (a reward model, 'task' with a verifier, module:function)")
    reward_weights: list[float] = field([], "one weight per reward (default 1.0 each)")
    reward_kwargs: dict = field({}, "options per reward name")
    on_reward_error: Literal["skip", "stop"] = field("skip", "a failing reward function skips the step or stops the run")
    queries_per_step: int = field(8, "N: queries the Challenger writes per step (paper: 8)")
    answers_per_query: int = field(4, "G: Solver answers per query (not given in the paper)")
    challenger_max_new_tokens: int = field(64, "query length cap in tokens")
    solver_max_new_tokens: int = field(128, "answer length cap in tokens")
    temperature: float = field(1.0, "sampling temperature of both roles")
    top_p: float = field(1.0, "nucleus sampling")
    top_k: int = field(0, "top-k sampling (0: off)")
    challenger_coef: float = field(1.0, "alpha_Ch: weight of the Challenger loss (not given in the paper)")
    kl_coef: float = field(0.05, "beta: weight of the per-token KL to the frozen reference, both roles (paper: 0.05)")
    kl_estimator: Literal["k1", "k2", "k3"] = field("k3", "per-token KL estimator (k3: TRL's)")
    solver_baseline: Literal["total", "task"] = field("total", "Solver baseline: mean of r+R_Q (total) or of r only (task)")
    adv_scale: Literal["none", "std"] = field("none", "none (paper); std: divide by the group std (Solver) and batch std (Challenger)")
    loss_agg: Literal["token_mean", "seq_mean", "seq_sum_norm"] = field("token_mean", "loss aggregation within each role")
    tis_cap: float | None = field(2.0, "truncated importance-sampling cap on pi_learner/pi_sampler (null: off)")
    malformed_reward: float = field(-1.0, "Challenger reward of a malformed query (a valid one earns -V(q) [+V_Q(q)])")
    self_reward_weight: float = field(1.0, "lsp: R_Q is multiplied by this before it is added (paper: 1)")
    self_reward_fallback: float = field(0.0, "lsp: R_Q of a judgement without a parseable <Score> (counted and logged)")
    judge_prompt: str = field("lsp", "lsp: the paper's 7-point prompt (Box 3, paraphrased), or your text with {instruction}/{response}")
    judge_max_new_tokens: int = field(256, "lsp: length cap of the judge's reasoning and score")
    warm_start_steps: int = field(0, "SFT steps on both roles' formats before self-play (0: none; for built-in models)")
    warm_start_dataset: str = field("task:arithmetic", "built-in task whose train rows teach the formats: prompt = problem, completion = answer")
    warm_start_task_args: list[dict] = field([{}], "one task_args dict per problem family mixed into the warm start")
    warm_start_rows: int = field(2000, "rows per problem family")
    warm_start_lr: float = field(3e-3, "warm-start peak lr (cosine)")
    warm_start_batch_size: int = field(64, "warm-start examples per step")
    eval_dataset: str | None = field(None, "held-out Solver accuracy: a built-in task (test split), e.g. task:arithmetic")
    eval_task_args: dict = field({}, "task_args of eval_dataset")
    eval_rows: int = field(200, "held-out problems")
    lr: float = field(3e-6, "peak learning rate (paper: 3e-6 for a 3B model)")
    warmup_steps: int = field(0, "linear warmup (optimizer steps)")
    lr_schedule: Literal["cosine", "linear", "constant"] = field("constant", "decay after warmup")
    sample_every: int = field(10, "log num_samples queries with their answers and rewards every N steps")
    output_dir: str = field("runs/selfplay", "run directory")

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("queries_per_step", "answers_per_query", "challenger_max_new_tokens", "solver_max_new_tokens",
                     "judge_max_new_tokens", "warm_start_batch_size", "sample_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"'{name}' must be >= 1, got {getattr(self, name)}.")
        for name in ("kl_coef", "challenger_coef", "warm_start_steps", "self_reward_weight"):
            if getattr(self, name) < 0:
                raise ConfigError(f"'{name}' must be >= 0, got {getattr(self, name)}.")
        if not self.rewards:
            raise ConfigError("selfplay needs R(q, a): set rewards=[...] (a reward model, a 'module.path:function'), "
                              "or verifier=arithmetic with rewards=[task] for the verifiable variant.")
        if "task" in self.rewards and self.verifier == "none":
            raise ConfigError("The 'task' reward needs each query's true answer, which only a verifier computes: "
                              "set verifier=arithmetic, or use another reward (e.g. a reward model).")
        if self.reward_weights and len(self.reward_weights) != len(self.rewards):
            raise ConfigError(f"reward_weights has {len(self.reward_weights)} entries for {len(self.rewards)} rewards.")
        if self.adv_scale == "std" and (self.answers_per_query < 2 or self.queries_per_step < 2):
            raise ConfigError("adv_scale=std needs answers_per_query >= 2 and queries_per_step >= 2 "
                              "(the std of one value is undefined).")
        placeholders = set(re.findall(r"\{\w+\}", self.judge_prompt))
        if self.judge_prompt != "lsp" and not {"{instruction}", "{response}"} <= placeholders:
            raise ConfigError("judge_prompt must be 'lsp' or a text containing {instruction} and {response}.")
        try:
            inspect.signature(QUERY_CHECKERS[self.verifier]).bind("query", **self.query_args)
        except TypeError as exc:
            raise ConfigError(f"query_args {self.query_args} do not fit verifier={self.verifier}: {exc}. Its options: "
                              f"{list(inspect.signature(QUERY_CHECKERS[self.verifier]).parameters)[1:]}.") from exc


# ----------------------------------------------------------------------------- the environment


@dataclasses.dataclass(frozen=True)
class Query:
    """A valid Challenger query: what the Solver sees, the reward columns it comes with, numbers to log."""

    text: str
    columns: dict[str, Any]
    stats: dict[str, float]


def open_query(text: str) -> Query | None:
    """Any non-empty text is a query (generation tags the model copied are removed)."""
    text = text.replace("[Start Generation]", "").replace("[End Generation]", "").strip()
    return Query(text, {}, {}) if text else None


def arithmetic_query(text: str, max_digits: int = 3, max_operands: int = 3, ops: str = "+-",
                     negative: bool = True) -> Query | None:
    """An integer expression such as ``12+34=`` (spaces and the final ``=`` optional), or None.

    Operands: 2..max_operands non-negative integers of at most max_digits digits, no leading zeros;
    operators among ``ops``; no parentheses or unary minus; the value must be an integer (exact
    division). The answer comes from ``lmrl.data.tasks.expr.evaluate`` (an ast whitelist).
    """
    expr = text.strip().removesuffix("=").replace(" ", "")
    if not re.fullmatch(r"[0-9+\-*/]+", expr):
        return None
    numbers = re.findall(r"\d+", expr)
    bad_number = any(len(x) > max_digits or (len(x) > 1 and x[0] == "0") for x in numbers)  # too long, leading 0
    if not 2 <= len(numbers) <= max_operands or bad_number:
        return None
    result = evaluate_expression(expr, ops)
    if result is None or result[0].denominator != 1 or (result[0] < 0 and not negative):
        return None
    stats = {"operands": float(len(numbers)), "max_digits": float(max(map(len, numbers)))}
    return Query(expr + "=", {"task": "arithmetic", "answer": str(int(result[0])), "meta": {"expression": expr}}, stats)


QUERY_CHECKERS: dict[str, Callable[..., Query | None]] = {"none": open_query, "arithmetic": arithmetic_query}


def challenger_text(config: SelfPlayConfig) -> str:
    """The challenger prompt <cp> with {task} and {template} filled in (empty means None, as in the paper)."""
    prompt = CHALLENGER_PROMPTS.get(config.challenger_prompt, config.challenger_prompt)
    return prompt.replace("{task}", config.task or "None").replace("{template}", config.template or "None")


def query_metrics(batch: RolloutBatch, queries: list[Query | None]) -> dict[str, float]:
    """Degeneration watch: malformed share, truncation, diversity and length of the Challenger's queries."""
    texts = [t.strip() for t in batch.completions]
    grams = [t[i : i + 3] for t in texts for i in range(max(0, len(t) - 2))]
    valid = [q for q in queries if q is not None]
    metrics = {"challenger/malformed_frac": 1 - len(valid) / len(queries),
               "challenger/truncated_frac": batch.truncated.float().mean().item(),
               "challenger/distinct_frac": len(set(texts)) / len(texts),
               "challenger/distinct_3gram_frac": len(set(grams)) / max(1, len(grams)),
               "challenger/query_len": sum(map(len, texts)) / len(texts)}
    for key in valid[0].stats if valid else ():
        metrics[f"challenger/{key}_mean"] = sum(q.stats[key] for q in valid) / len(valid)
    return metrics


# ----------------------------------------------------------------------------- learning


@dataclasses.dataclass
class Parts:
    """The live objects of a run that a step uses."""

    model: Any
    tokenizer: Any
    ref_model: Any
    engine: HFEngine
    reward_set: RewardSet
    judge_set: RewardSet | None
    check: Callable[[str], Query | None]
    challenger_ids: list[int]
    optimizer: torch.optim.Optimizer
    scheduler: Any


def update(parts: Parts, roles: list[tuple[str, RolloutBatch | None, torch.Tensor, float]],
           config: SelfPlayConfig, dtype, step: int) -> dict[str, float]:
    """One optimizer step on sum_role coef * L_role; L_role = policy_loss("pg") with KL, over that role's rows."""
    totals: dict[str, float] = {"loss": 0.0}
    for name, batch, adv, coef in roles:
        if batch is None or len(batch) == 0:
            continue
        ref_logp = logprobs_no_grad(parts.ref_model, batch, config, dtype) if config.kl_coef > 0 else None  # (n, T)
        tokens = batch.completion_mask.sum().clamp(min=1)
        max_len = config.challenger_max_new_tokens if name == "challenger" else config.solver_max_new_tokens
        for micro in torch.arange(len(batch)).chunk(config.grad_accum):
            sub = batch.select(micro)
            mask = sub.completion_mask
            weight = float(mask.sum() / tokens) if config.loss_agg == "token_mean" else len(micro) / len(batch)
            logp, entropy = completion_logprobs(parts.model, sub.input_ids, sub.attention_mask, sub.prompt_ids.shape[1],
                                                temperature=config.temperature, return_entropy=True,
                                                autocast_dtype=dtype)  # (m, T) each
            # on-policy, one update: pi_old = sg(pi_theta), so the ratio is 1 in value and grad log pi in gradient
            loss, stats = policy_loss("pg", logp, logp.detach(), adv[micro].to(logp.device), mask, agg=config.loss_agg,
                                      max_len=max_len, kl_coef=config.kl_coef, kl_estimator=config.kl_estimator,
                                      ref_logp=ref_logp[micro] if ref_logp is not None else None,
                                      tis_cap=config.tis_cap, sampler_logp=sub.sampler_logp)
            common.check_finite(loss, step)
            (coef * weight * loss).backward()
            stats.update(loss=loss.item(), entropy=float((entropy.detach() * mask).sum() / mask.sum().clamp(min=1)))
            for key, value in stats.items():
                totals[f"{name}/{key}"] = totals.get(f"{name}/{key}", 0.0) + float(value) * weight
            totals["loss"] += coef * weight * loss.item()
    totals["grad_norm"] = common.optimizer_step(parts.model, parts.optimizer, parts.scheduler, config.max_grad_norm,
                                                step)
    for key in ("kl", "entropy"):  # the standard names carry the Solver's values
        if f"solver/{key}" in totals:
            totals[key] = totals[f"solver/{key}"]
    return totals


def score(parts: Parts, answered: list[Query], solver: RolloutBatch, config: SelfPlayConfig):
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
    metrics.update({k: v for k, v in judge_metrics.items() if k.startswith("rewards/")})  # R_Q's own stats
    metrics.update({"time/judge_s": time.perf_counter() - t0,
                    "self_reward/parse_failures_total": float(parts.judge_set.fns[0].failures)})
    return rewards, config.self_reward_weight * quality, metrics


def selfplay_step(parts: Parts, config: SelfPlayConfig, dtype, step: int, tracker) -> dict[str, float]:
    """Challenger writes, the environment checks, Solver answers, rewards, advantages, one update."""
    G, tok = config.answers_per_query, parts.tokenizer
    generator = torch.Generator(parts.engine.device).manual_seed(config.seed * 1_000_003 + step)  # resume-exact
    sampling = dict(temperature=config.temperature, top_p=config.top_p, top_k=config.top_k)
    t0 = time.perf_counter()
    challenger = parts.engine.generate([parts.challenger_ids], SamplingParams(config.challenger_max_new_tokens,
                                       **sampling), n=config.queries_per_step, generator=generator)  # (N rows)
    queries = [parts.check(text) for text in challenger.completions]
    answered = [q for q in queries if q is not None]
    metrics = query_metrics(challenger, queries)
    solver, rewards, self_rewards = None, torch.zeros(0), None
    if answered:
        ids = [tok(render_prompt(tok, q.text), add_special_tokens=False)["input_ids"] for q in answered]
        solver = parts.engine.generate(ids, SamplingParams(config.solver_max_new_tokens, **sampling), n=G,
                                       generator=generator)  # (M*G rows)
        metrics.update({"completion_len/mean": solver.completion_lengths.float().mean().item(),
                        "completion/truncated_frac": solver.truncated.float().mean().item()})
    metrics["time/rollout_s"] = time.perf_counter() - t0
    if answered:
        try:
            rewards, self_rewards, reward_metrics = score(parts, answered, solver, config)
        except RewardError as exc:
            if not exc.skippable:
                raise
            tracker.print(f"[yellow]step {step} skipped: {exc}")
            judge_errors = parts.judge_set.errors if parts.judge_set is not None else 0
            return {"reward/errors": float(parts.reward_set.errors + judge_errors)}
        metrics.update(reward_metrics)
    valid = torch.tensor([q is not None for q in queries])  # (N,)
    adv = selfplay_advantages(rewards, G, self_rewards, valid, malformed_reward=config.malformed_reward,
                              baseline=config.solver_baseline, scale=config.adv_scale)
    if answered:
        metrics["challenger/pass_rate"] = adv.query_values.mean().item()  # the Solver's mean R on valid queries
    metrics["challenger/reward_mean"] = adv.challenger_rewards.mean().item()
    if step % config.sample_every == 0 or step == 1:
        log_samples(tracker, step, challenger, queries, solver, rewards, adv, config)
    t1 = time.perf_counter()
    stats = update(parts, [("challenger", challenger, adv.challenger, config.challenger_coef),
                           ("solver", solver, adv.solver, 1.0)], config, dtype, step)
    metrics.update(stats, **{"time/train_s": time.perf_counter() - t1, "lr": parts.scheduler.get_last_lr()[0]})
    return metrics


def log_samples(tracker, step, challenger, queries, solver, rewards, adv, config) -> None:
    rows, k = [], 0  # k: index of the query among the answered ones
    for i, (text, query) in enumerate(zip(challenger.completions, queries)):
        row = {"query": text, "valid": query is not None, "challenger_reward": adv.challenger_rewards[i].item()}
        if query is not None:
            row.update(answer=solver.completions[k * config.answers_per_query],
                       reward=rewards[k * config.answers_per_query].item(), pass_rate=adv.query_values[k].item())
            k += 1
        if i < config.num_samples:
            rows.append(row)
    tracker.log_samples(step, rows, "self-play queries and first answers")


# ----------------------------------------------------------------------------- warm start, eval, the loop


def warm_start(model, tokenizer, config: SelfPlayConfig, dtype, tracker) -> dict[str, float]:
    """SFT on both roles' formats: (<cp> -> problem) and (problem -> answer), from built-in task train rows."""
    rows = [r for args in config.warm_start_task_args
            for r in load_rows(config.warm_start_dataset, split="train", limit=config.warm_start_rows, **args)]
    cp = challenger_text(config)
    pairs = [{"prompt": cp, "completion": r["prompt"]} for r in rows] + \
            [{"prompt": r["prompt"], "completion": r["completion"]} for r in rows]
    examples, _ = build_sft_examples(pairs, tokenizer, max_length=1024, overlong="drop", where="warm start")
    wconfig = dataclasses.replace(config, lr=config.warm_start_lr, max_steps=config.warm_start_steps,
                                  warmup_steps=min(10, config.warm_start_steps // 10), lr_schedule="cosine")
    optimizer = common.build_optimizer(model, wconfig)
    scheduler = common.build_scheduler(optimizer, wconfig)
    model.train()
    for step in range(1, config.warm_start_steps + 1):
        indices = common.epoch_batch_indices(len(examples), config.warm_start_batch_size, step, config.seed)
        batch = [examples[i] for i in indices]
        stats = sft_train_step(model, batch, tokenizer.pad_token_id, 1, dtype, step)
        common.optimizer_step(model, optimizer, scheduler, config.max_grad_norm, step)
        if step % 50 == 0 or step == config.warm_start_steps:
            tracker.print(f"warm start {step}/{config.warm_start_steps}: loss {stats['loss']:.4f}")
    return {"warm_start/loss": stats["loss"], "warm_start/examples": float(len(examples))}


@torch.no_grad()
def answer_probability(model, examples: list[SFTExample], pad_id: int, temperature: float, dtype,
                       batch_size: int = 64) -> float:
    """mean_i pi(y_i | x_i) at the sampling temperature, y_i = the reference answer and its end of turn.

    The Solver's exact expected pass@1 on these problems if only the reference form counts (a lower
    bound of its expected reward): a held-out measure without sampling noise.
    """
    device, total = next(model.parameters()).device, 0.0
    for start in range(0, len(examples), batch_size):
        batch = {k: v.to(device) for k, v in collate_sft(examples[start : start + batch_size], pad_id).items()}
        with autocast(device.type, dtype):
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        targets = batch["labels"][:, 1:]  # (B, L-1): token t+1 is predicted at t
        logp = selective_log_softmax(logits[:, :-1], targets.clamp(min=0), temperature=temperature)  # (B, L-1)
        total += (logp * (targets != IGNORE_INDEX)).sum(dim=1).exp().sum().item()
    return total / len(examples)


def evaluate(model, tokenizer, eval_rows, config: SelfPlayConfig, dtype) -> tuple[dict[str, float], list[dict]]:
    """Held-out Solver: greedy accuracy (task verifier) and the exact probability of the reference answers."""
    if not eval_rows:
        return {}, []
    metrics, samples = task_accuracy(model, tokenizer, eval_rows, config.solver_max_new_tokens, dtype,
                                     num_samples=config.num_samples)
    examples, _ = build_sft_examples(eval_rows, tokenizer, max_length=1024, where=config.eval_dataset)
    prob = answer_probability(model, examples, tokenizer.pad_token_id, config.temperature, dtype)
    return {"eval/accuracy": metrics["accuracy"], "eval/answer_prob": prob}, samples


def reference_model(model, tokenizer, run, config: SelfPlayConfig):
    """The frozen pi_Ref: the policy at the start of self-play (saved in output_dir/reference after a warm start)."""
    path = Path(run.dir) / "reference"
    if run.checkpoint and config.warm_start_steps:
        if not path.is_dir():
            raise FileNotFoundError(f"Resuming {run.dir} needs its reference model in {path}, which is missing. "
                                    "Start a fresh run (overwrite=true).")
        ref = load_model(str(path), tokenizer)
    elif run.checkpoint:
        ref = load_model(config.model, tokenizer, seed=config.seed, model_args=config.model_args)
    else:
        ref = copy.deepcopy(model)
        if config.warm_start_steps:  # a loadable model dir: model=<run>/reference starts a run from the warm start
            ref.save_pretrained(path)
            tokenizer.save_pretrained(path)
    return ref.eval().requires_grad_(False)


def train(config: SelfPlayConfig) -> dict[str, float]:
    """Run self-play end to end; returns the final metrics (with ``initial/eval/accuracy`` when evaluated)."""
    model, tokenizer = load_model_and_tokenizer(config.model, config.tokenizer, config.seed, config.model_args)
    reward_set = RewardSet(config.rewards, config.reward_weights or None, config.reward_kwargs, config.on_reward_error)
    eval_rows = load_rows(config.eval_dataset, split="test", limit=config.eval_rows, **config.eval_task_args) \
        if config.eval_dataset else []
    run = common.start_run(config, f"selfplay {config.variant}")
    tracker, dtype = run.tracker, autocast_dtype(config.precision)
    initial: dict[str, float] = {}
    if not run.checkpoint and config.warm_start_steps:
        initial.update(warm_start(model, tokenizer, config, dtype, tracker))
    needs_ref = config.kl_coef > 0 or config.variant == "lsp"
    ref_model = reference_model(model, tokenizer, run, config) if needs_ref else None
    optimizer = common.build_optimizer(model, config)
    scheduler = common.build_scheduler(optimizer, config)
    judge_set = None
    if config.variant == "lsp":
        judge = SelfReward(ref_model, tokenizer, fallback=config.self_reward_fallback, autocast_dtype=dtype,
                           template=QUALITY_PROMPT if config.judge_prompt == "lsp" else config.judge_prompt,
                           max_new_tokens=config.judge_max_new_tokens)
        judge_set = RewardSet([judge], on_reward_error=config.on_reward_error)
    cp_ids = tokenizer(render_prompt(tokenizer, challenger_text(config)), add_special_tokens=False)["input_ids"]
    tracker.print(f"selfplay {config.variant}: {count_parameters(model) / 1e6:.2f}M params, "
                  f"{config.queries_per_step} queries x {config.answers_per_query} answers/step, run dir {run.dir}")
    if run.checkpoint:
        initial = common.restore_checkpoint(run.checkpoint, model, optimizer, scheduler).get("initial", {})
    else:
        metrics, samples = evaluate(model, tokenizer, eval_rows, config, dtype)
        initial.update({f"initial/{k}": v for k, v in metrics.items()})
        tracker.log(0, {**metrics, **{k: v for k, v in initial.items() if k.startswith("warm_start/")}})
        tracker.log_samples(0, samples, "held-out samples")
    parts = Parts(model, tokenizer, ref_model, HFEngine(model, tokenizer, autocast_dtype=dtype), reward_set, judge_set,
                  lambda text: QUERY_CHECKERS[config.verifier](text, **config.query_args), cp_ids, optimizer, scheduler)
    try:
        for step in range(run.start_step + 1, config.max_steps + 1):
            metrics = selfplay_step(parts, config, dtype, step, tracker)
            if step % config.log_every == 0 or step == config.max_steps or step == 1:
                tracker.log(step, metrics)
            else:
                tracker.advance(step)
            if common.is_due(step, config.eval_every, config.max_steps):
                tracker.log(step, evaluate(model, tokenizer, eval_rows, config, dtype)[0])
            if common.is_due(step, config.save_every, config.max_steps):
                common.save_checkpoint(run, step, model, tokenizer, optimizer, scheduler, {"initial": initial},
                                       config.keep_checkpoints)
    except common.TrainingDiverged:
        tracker.close()
        raise
    final, samples = evaluate(model, tokenizer, eval_rows, config, dtype)
    tracker.log(config.max_steps, final)
    tracker.log_samples(config.max_steps, samples, "held-out samples")
    common.save_checkpoint(run, config.max_steps, model, tokenizer, optimizer, scheduler, {"initial": initial},
                           config.keep_checkpoints)
    final_dir = common.save_final(run, model, tokenizer)
    tracker.close()
    tracker.print(f"Final model: {final_dir}  plots: {run.dir / 'plots'}")
    return {**initial, **final}

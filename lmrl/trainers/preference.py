"""Direct alignment: DPO and its family (cDPO, IPO, SimPO, ORPO, KTO, DPO+NLL, robust, hinge, ODPO, BCO, Cal-DPO).

RLHF book ch. 8 (`spec/rlhf-book-advanced.md` §1, §7). Every loss comes from the registry
`lmrl.algorithms.preference_loss(name, batch)` on summed completion log-probs of the policy and of
a frozen reference policy π_ref (the initial model unless `ref_model` is set):
1. reference log-probs are computed ONCE before training (book §8.3) and cached in memory and in
   `<output_dir>/reference_logps.pt`, so a resumed run reuses them (`precompute_ref=false`
   keeps a frozen reference model and recomputes them every step instead; same numbers);
2. each step forwards the chosen and rejected completions of `batch_size` pairs in one batch and
   minimises the mean loss; KTO takes unpaired rows (prompt, completion, label) or splits pairs into
   a desirable and an undesirable example, with z0 estimated on mismatched prompt/completion pairs;
3. logged: `logps/chosen`, `logps/rejected` (both usually fall: preference displacement),
   implicit rewards β(logπ − logπ_ref) `rewards/chosen|rejected|margin|accuracy`; on the built-in
   preference data, `eval/gold_score` is the hidden gold score of sampled (and greedy) generations.

Deviations: SimPO and ORPO use no reference (their formulas have none); BCO's δ is the running mean
of all implicit rewards seen so far (kept in checkpoints).

Launch::

    lmrl dpo --config dpo/tiny_prefs                                   # built-in data, CPU
    lmrl dpo model=runs/sft/final dataset=prefs.jsonl loss=ipo loss_args.tau=0.1 lr=5e-7 batch_size=64
    lmrl dpo --config dpo/online_tiny_prefs                            # online DPO (lmrl/trainers/online_dpo.py)
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import time
from pathlib import Path
from collections.abc import Sequence
from typing import Any, Literal

import torch

from lmrl.algorithms import PREFERENCE_LOSSES, kto_reference_kl, preference_loss, preference_stats
from lmrl.algorithms.registry import check_options, keyword_options
from lmrl.config import ConfigError, TrainConfig, field
from lmrl.data import preference as prefs
from lmrl.data.chat import render_prompt
from lmrl.models import autocast_dtype, count_parameters, is_builtin, load_model, load_model_and_tokenizer
from lmrl.models.logprobs import completion_logprobs
from lmrl.rollout.hf import HFEngine, SamplingParams
from lmrl.trainers import common

REFERENCE_FREE = ("simpo", "orpo")  # losses whose formula has no π_ref: no reference log-probs needed
REF_CACHE = "reference_logps.pt"


@dataclasses.dataclass
class DPOConfig(TrainConfig):
    loss: str = field("dpo", "dpo, cdpo, robust, ipo, hinge, simpo, orpo, dpo_nll, odpo, bco, cal_dpo or kto")
    beta: float = field(0.1, "β for every loss that takes it (KL strength); also scales the logged implicit rewards")
    loss_args: dict = field({}, "other loss options: label_smoothing (cdpo, robust), tau (ipo), gamma (simpo), "
                                "lam (orpo), alpha (dpo_nll, odpo), lambda_d and lambda_u (kto)")
    ref_model: str | None = field(None, "reference policy π_ref; default: the initial `model`")
    precompute_ref: bool = field(True, "cache π_ref log-probs once (memory + <output_dir>/reference_logps.pt); "
                                       "false: a frozen reference model recomputes them every step")
    dataset: str = field("builtin:prefs", "builtin:prefs, or a .jsonl/.json/.parquet/.csv file or HF dataset")
    data_args: dict = field({}, "arguments of the built-in source (digits, num_completions, kinds, seed)")
    split: str = field("train", "dataset split")
    train_rows: int | None = field(2000, "rows generated for the built-in source, or the first N rows (null: all)")
    eval_dataset: str | None = field(None, "held-out data; default: the built-in source's test split, none for files")
    eval_split: str = field("test", "split of eval_dataset (or of the built-in source)")
    eval_rows: int = field(200, "held-out rows")
    eval_max_new_tokens: int = field(16, "tokens generated per held-out prompt for eval/gold_score (built-in data)")
    eval_samples: int = field(8, "completions sampled (temperature 1) per held-out prompt for eval/gold_score")
    ranking_pairs: Literal["all", "best_worst"] = field("all", "rankings of K > 2 become all C(K,2) pairs, or best "
                                                               "vs worst")
    chat: bool = field(True, "render prompt/completion with the chat template (False: raw text + EOS)")
    max_length: int = field(256, "tokens per prompt + completion")
    overlong: Literal["drop", "error"] = field("drop", "pairs longer than max_length: drop them or stop")
    batch_size: int = field(32, "pairs (KTO: examples) per optimizer step, split into grad_accum micro-batches; "
                                "online: prompts per step")
    output_dir: str = field("runs/dpo", "run directory")
    # online DPO (lmrl/trainers/online_dpo.py): pairs sampled from the current policy and labelled each step
    online: bool = field(False, "sample pairs from the current policy each step, label them with `rewards` or `judge`")
    samples_per_prompt: int = field(2, "online: completions per prompt (K); the pair is the best vs the worst")
    max_new_tokens: int = field(16, "online: completion length cap in tokens")
    temperature: float = field(1.0, "online: sampling temperature")
    rewards: list[str] = field([], "online: label rewards (registry names, model:PATH, module:function), weighted sum")
    reward_weights: list[float] = field([], "online: one weight per reward (default 1.0 each)")
    reward_kwargs: dict = field({}, "online: options per reward name, e.g. {judge: {model: PATH}}")
    min_gap: float = field(0.0, "online: skip a prompt (a tie) when best - worst label reward <= min_gap")
    judge: str | None = field(None, "online: label each pair with this pairwise LLM judge (K=2); rewards are only logged")
    judge_args: dict = field({}, "online: PairwiseJudge options: swap, max_new_tokens, batch_size, prompt, chat")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.loss not in PREFERENCE_LOSSES.names():
            PREFERENCE_LOSSES.get(self.loss)  # raises, naming the choices
        if "beta" in self.loss_args:
            raise ConfigError("Set β with beta=..., not loss_args.beta.")
        try:
            options = keyword_options(PREFERENCE_LOSSES.get(self.loss))
            check_options(f"preference loss {self.loss!r}", self.loss_options, options)
        except ValueError as exc:
            raise ConfigError(f"loss_args: {exc}") from exc
        if self.eval_samples < 1:
            raise ConfigError(f"'eval_samples' must be >= 1, got {self.eval_samples}.")
        if self.beta <= 0:
            raise ConfigError(f"'beta' must be > 0, got {self.beta}.")
        if self.batch_size % self.grad_accum:
            raise ConfigError(f"batch_size ({self.batch_size}) must be divisible by grad_accum ({self.grad_accum}).")
        if self.loss == "kto" and self.batch_size // self.grad_accum < 2:
            raise ConfigError("loss=kto needs >= 2 examples per micro-batch (z0 pairs prompts with other completions).")
        if self.online:
            from lmrl.trainers.online_dpo import check_online_config

            check_online_config(self)

    @property
    def loss_options(self) -> dict[str, Any]:
        takes_beta = "beta" in keyword_options(PREFERENCE_LOSSES.get(self.loss))
        return {**({"beta": self.beta} if takes_beta else {}), **self.loss_args}

    @property
    def uses_reference(self) -> bool:
        return self.loss not in REFERENCE_FREE


@dataclasses.dataclass(frozen=True)
class Example:
    """Two sequences scored together: (chosen, rejected) of a pair, or KTO's (completion, mismatched completion)."""

    seqs: tuple[prefs.Tokenized, prefs.Tokenized]
    label: int = 1  # KTO: 1 desirable, 0 undesirable
    scores: tuple[float, float] | None = None  # ratings of chosen/rejected (ODPO)


# ----------------------------------------------------------------------------- data


def build_examples(rows: list[dict], tokenizer, config: DPOConfig, where: str) -> tuple[list[Example], int]:
    """Tokenized pairs (or KTO examples) of `rows`, dropping overlong ones; errors name the row."""
    tok = lambda p, c, w: prefs.tokenize(tokenizer, p, c, config.chat, w)  # noqa: E731
    if config.loss == "kto":
        if "label" in rows[0] and "completion" in rows[0]:
            records = [(r.prompt, r.completion, r.label, r.where) for r in prefs.parse_labelled_rows(rows, where)]
        else:
            pairs = prefs.to_pairs(prefs.parse_preference_rows(rows, where), "best_worst")
            records = [(g.prompt, c, label, g.where) for g in pairs for c, label in zip(g.completions, (1, 0))]
        examples, n = [], len(records)
        for i, (prompt, completion, label, w) in enumerate(records):
            # z0's mismatched pair: this prompt with the next example's completion that answers another prompt
            other = next((records[(i + j) % n] for j in range(1, n) if records[(i + j) % n][0] != prompt), None)
            if other is None:
                raise ValueError(f"{where}: KTO needs at least two different prompts (z0 uses mismatched pairs).")
            examples.append(Example((tok(prompt, completion, w), tok(prompt, other[1], w)), label))
    else:
        pairs = prefs.to_pairs(prefs.parse_preference_rows(rows, where), config.ranking_pairs)
        if config.loss == "odpo" and any(g.scores is None for g in pairs):
            bad = next(g for g in pairs if g.scores is None)
            raise ValueError(f"{bad.where}: loss=odpo needs chosen_score and rejected_score (or ranked `scores`).")
        examples = [Example((tok(g.prompt, g.completions[0], g.where), tok(g.prompt, g.completions[1], g.where)),
                            scores=g.scores) for g in pairs]
    kept = [e for e in examples if max(len(s) for s in e.seqs) <= config.max_length]
    if len(kept) < len(examples) and config.overlong == "error":
        raise ValueError(f"{where}: {len(examples) - len(kept)} of {len(examples)} examples are longer than "
                         f"max_length={config.max_length} tokens. Raise max_length or set overlong=drop.")
    if not kept:
        raise ValueError(f"{where}: every example is longer than max_length={config.max_length}. Raise max_length.")
    return kept, len(examples) - len(kept)


def load_data(config: DPOConfig, tokenizer):
    rows = prefs.load_preference_rows(config.dataset, config.split, config.train_rows, **config.data_args)
    examples, dropped = build_examples(rows, tokenizer, config, config.dataset)
    builtin = config.dataset in prefs.BUILTIN_SOURCES
    eval_source = config.eval_dataset or (config.dataset if builtin else None)
    eval_examples, eval_rows = [], []
    if eval_source:
        eval_rows = prefs.load_preference_rows(eval_source, config.eval_split, config.eval_rows,
                                               **(config.data_args if eval_source in prefs.BUILTIN_SOURCES else {}))
        eval_examples, _ = build_examples(eval_rows, tokenizer, config, eval_source)
    gold_rows = eval_rows if eval_source == "builtin:prefs" else []
    return examples, eval_examples, gold_rows, dropped


# ----------------------------------------------------------------------------- log-probs


def sequence_logps(model, seqs: list[prefs.Tokenized], pad_id: int, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed log-probs (N,) of each sequence's learned completion tokens, and their counts (N,)."""
    batch = prefs.collate_completions(seqs, pad_id)
    logp = completion_logprobs(model, batch["input_ids"], batch["attention_mask"], int(batch["completion_start"]),
                               autocast_dtype=dtype)  # (N, T)
    mask = batch["completion_mask"]  # (N, T)
    return (logp * mask).sum(dim=1), mask.sum(dim=1)


@torch.no_grad()
def reference_logps(model, examples: list[Example], pad_id: int, dtype, batch_size: int = 64) -> torch.Tensor:
    """(N, 2) summed reference log-probs of both sequences of every example."""
    was_training = model.training
    model.eval()
    out = []
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        logps, _ = sequence_logps(model, [e.seqs[0] for e in chunk] + [e.seqs[1] for e in chunk], pad_id, dtype)
        out.append(logps.view(2, -1).T)  # (b, 2)
    model.train(was_training)
    return torch.cat(out) if out else torch.zeros(0, 2)


def load_reference(config: DPOConfig, tokenizer):
    """The `ref_model` policy (a built-in one gets the same seed and model_args as `model`)."""
    args = config.model_args if is_builtin(config.ref_model) else None
    return load_model(config.ref_model, tokenizer, seed=config.seed, model_args=args)


def fingerprint(ref_model, precision: str, examples: list[Example], eval_examples: list[Example]) -> str:
    """Hash of what cached reference log-probs depend on: the reference weights, the precision and every token."""
    h = hashlib.sha256(precision.encode())
    for name, tensor in ref_model.state_dict().items():
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    for e in examples + eval_examples:
        for s in e.seqs:
            h.update(repr((s.prompt_ids, s.completion_ids, s.learn)).encode())
    return h.hexdigest()


@dataclasses.dataclass
class Reference:
    """π_ref log-probs (N, 2) of every example: cached tensors, or a frozen model that computes them on demand."""

    train: torch.Tensor | None = None  # (N, 2) of the training examples
    eval: torch.Tensor | None = None  # (M, 2) of the held-out examples
    model: Any = None  # frozen π_ref (precompute_ref=false)

    def logps(self, split: str, indices: Sequence[int], examples: list[Example], pad_id: int, dtype):
        """(b, 2) for `examples` (= rows `indices` of `split`), or None for reference-free losses."""
        if self.model is not None:
            return reference_logps(self.model, examples, pad_id, dtype)
        cached = self.train if split == "train" else self.eval
        return None if cached is None else cached[list(indices)]


def setup_reference(config: DPOConfig, run_dir: Path, model, tokenizer, examples, eval_examples, dtype,
                    tracker) -> Reference:
    """Reference log-probs, computed before any update (`model` is still π_ref), cached in the run directory."""
    if not config.uses_reference:
        return Reference()
    if not config.precompute_ref:
        frozen = load_reference(config, tokenizer) if config.ref_model else copy.deepcopy(model)
        return Reference(model=frozen.eval().requires_grad_(False))
    ref = load_reference(config, tokenizer) if config.ref_model else model
    key, path = fingerprint(ref, config.precision, examples, eval_examples), run_dir / REF_CACHE
    if path.exists():
        cache = torch.load(path)
        if cache.get("fingerprint") == key:
            tracker.print(f"Reference log-probs: loaded from {path}")
            return Reference(cache["train"], cache["eval"])
    t0 = time.perf_counter()
    train_ref = reference_logps(ref, examples, tokenizer.pad_token_id, dtype)
    eval_ref = reference_logps(ref, eval_examples, tokenizer.pad_token_id, dtype)
    torch.save({"fingerprint": key, "train": train_ref, "eval": eval_ref}, path)
    tracker.print(f"Reference log-probs: {len(examples) + len(eval_examples)} examples in "
                  f"{time.perf_counter() - t0:.1f}s, cached in {path}")
    return Reference(train_ref, eval_ref)


# ----------------------------------------------------------------------------- loss


def example_loss(model, examples: list[Example], ref: torch.Tensor | None, config: DPOConfig, pad_id: int, dtype,
                 bco_delta: float = 0.0) -> tuple[torch.Tensor, dict[str, float], dict[str, torch.Tensor]]:
    """Per-example losses (b,), logging stats and the loss batch, for pairs or KTO examples; `ref` (b, 2)."""
    b = len(examples)
    ref = torch.zeros(b, 2) if ref is None else ref
    if config.loss == "kto":
        logp, _ = sequence_logps(model, [e.seqs[0] for e in examples], pad_id, dtype)  # (b,)
        with torch.no_grad():
            mismatched, _ = sequence_logps(model, [e.seqs[1] for e in examples], pad_id, dtype)
        label = torch.tensor([float(e.label) for e in examples])
        kl_ref = kto_reference_kl(mismatched, ref[:, 1])
        fields = {"logp": logp, "ref_logp": ref[:, 0], "label": label, "kl_ref": kl_ref}
        losses = preference_loss("kto", fields, **config.loss_options)
        reward = config.beta * (logp - ref[:, 0]).detach()
        stats = {"kl_ref": float(fields["kl_ref"])}
        for name, sel in (("chosen", label == 1), ("rejected", label == 0)):
            if sel.any():
                stats[f"rewards/{name}"], stats[f"logps/{name}"] = reward[sel].mean().item(), logp[sel].mean().item()
        return losses, stats, fields
    logps, lengths = sequence_logps(model, [e.seqs[0] for e in examples] + [e.seqs[1] for e in examples], pad_id, dtype)
    fields = {"chosen": logps[:b], "rejected": logps[b:], "ref_chosen": ref[:, 0], "ref_rejected": ref[:, 1],
              "chosen_len": lengths[:b], "rejected_len": lengths[b:]}
    if config.loss == "odpo":
        fields["chosen_score"] = torch.tensor([e.scores[0] for e in examples])
        fields["rejected_score"] = torch.tensor([e.scores[1] for e in examples])
    if config.loss == "bco":
        fields["delta"] = torch.tensor(bco_delta)
    losses = preference_loss(config.loss, fields, **config.loss_options)
    return losses, preference_stats(fields, config.beta, reference_free=not config.uses_reference), fields


def train_step(model, examples, ref, config: DPOConfig, pad_id, dtype, step: int, state: dict) -> dict[str, float]:
    """Forward/backward over grad_accum micro-batches; the loss is the mean over all examples of the step."""
    sums: dict[str, float] = {}
    for part in torch.arange(len(examples)).tensor_split(config.grad_accum):  # equal parts when divisible
        if not len(part):
            continue
        delta = state["bco"][0] / max(1, state["bco"][1])
        losses, stats, fields = example_loss(model, [examples[i] for i in part], None if ref is None else ref[part],
                                             config, pad_id, dtype, delta)
        loss = losses.sum() / len(examples)
        common.check_finite(loss, step)
        loss.backward()
        if config.loss == "bco":  # δ: running mean of the implicit rewards β·u of chosen and rejected
            u = torch.cat([fields["chosen"] - fields["ref_chosen"], fields["rejected"] - fields["ref_rejected"]])
            state["bco"] = (state["bco"][0] + config.beta * u.detach().sum().item(), state["bco"][1] + u.numel())
        for key, value in {"loss": losses.mean().item(), **stats}.items():
            sums[key] = sums.get(key, 0.0) + value * len(part) / len(examples)
    return sums


@torch.no_grad()
def evaluate(model, tokenizer, examples, ref: Reference, gold_rows, config: DPOConfig, dtype,
             state) -> tuple[dict, list]:
    """Held-out loss and implicit-reward stats, plus the gold score of greedy generations (built-in data)."""
    was_training = model.training
    model.eval()
    sums: dict[str, float] = {}
    pad_id, delta = tokenizer.pad_token_id, state["bco"][0] / max(1, state["bco"][1])
    for start in range(0, len(examples), 64):
        chunk = examples[start : start + 64]
        ref_chunk = ref.logps("eval", range(start, start + len(chunk)), chunk, pad_id, dtype)
        losses, stats, _ = example_loss(model, chunk, ref_chunk, config, pad_id, dtype, delta)
        for key, value in {"loss": losses.mean().item(), **stats}.items():
            sums[key] = sums.get(key, 0.0) + value * len(chunk) / len(examples)
    metrics = {f"eval/{k}": v for k, v in sums.items()}
    samples: list[dict] = []
    if gold_rows:
        gold, samples = gold_eval(model, tokenizer, gold_rows, config, dtype)
        metrics.update(gold)
    model.train(was_training)
    return metrics, samples


def gold_eval(model, tokenizer, rows: list[dict], config: DPOConfig, dtype) -> tuple[dict[str, float], list[dict]]:
    """Gold score of the policy on the distinct held-out prompts, and a few greedy samples.

    `eval/gold_score` = mean over prompts and `eval_samples` samples at temperature 1 of `gold_score`
    (the expected gold reward of π, what DPO's KL-regularised objective raises; seeded, so resumable);
    `eval/gold_score_greedy` = the same for the greedy answer (a mode estimate, brittle early on).
    """
    unique = list({r["prompt"]: r for r in rows}.values())
    engine = HFEngine(model, tokenizer, autocast_dtype=dtype)
    ids = [tokenizer(render_prompt(tokenizer, r["prompt"]), add_special_tokens=False)["input_ids"] for r in unique]
    gold = lambda batch, n: [prefs.gold_score(unique[i // n]["prompt"], c, unique[i // n]["meta"])  # noqa: E731
                             for i, c in enumerate(batch.completions)]
    greedy = engine.generate(ids, SamplingParams(max_new_tokens=config.eval_max_new_tokens, greedy=True), n=1)
    sampled = engine.generate(ids, SamplingParams(max_new_tokens=config.eval_max_new_tokens, temperature=1.0),
                              n=config.eval_samples, generator=torch.Generator().manual_seed(config.seed))
    greedy_scores, sampled_scores = gold(greedy, 1), gold(sampled, config.eval_samples)
    samples = [{"prompt": r["prompt"], "greedy": c, "gold_score": g}
               for r, c, g in list(zip(unique, greedy.completions, greedy_scores))[: config.num_samples]]
    metrics = {"eval/gold_score": sum(sampled_scores) / len(sampled_scores),
               "eval/gold_score_greedy": sum(greedy_scores) / len(greedy_scores)}
    return metrics, samples


def check_kto_balance(examples: list[Example], config: DPOConfig, tracker) -> None:
    """Warn when λD·nD / (λU·nU) is outside [1, 4/3], the range the KTO paper recommends (spec §1)."""
    n_d = sum(e.label for e in examples)
    n_u = len(examples) - n_d
    lambda_d, lambda_u = config.loss_args.get("lambda_d", 1.0), config.loss_args.get("lambda_u", 1.0)
    ratio = lambda_d * n_d / max(1e-9, lambda_u * n_u)
    if not 1.0 <= ratio <= 4 / 3:
        tracker.print(f"[yellow]KTO: λD·nD / (λU·nU) = {ratio:.2f} with {n_d} desirable and {n_u} undesirable "
                      "examples; the KTO paper recommends [1, 4/3]. Set loss_args.lambda_d / lambda_u.")


# ----------------------------------------------------------------------------- entry point


def train(config: DPOConfig) -> dict[str, float]:
    """Run a DPO-family loss end to end; returns the final evaluation metrics (plus `initial/...` ones)."""
    if config.online:
        from lmrl.trainers.online_dpo import train_online

        return train_online(config)
    model, tokenizer = load_model_and_tokenizer(config.model, config.tokenizer, config.seed, config.model_args)
    examples, eval_examples, gold_rows, dropped = load_data(config, tokenizer)
    run = common.start_run(config, f"dpo ({config.loss})")
    tracker, dtype, pad_id = run.tracker, autocast_dtype(config.precision), tokenizer.pad_token_id
    tracker.print(f"{config.loss}: {count_parameters(model) / 1e6:.2f}M params, {len(examples)} training examples "
                  f"({dropped} dropped as overlong), {len(eval_examples)} held-out, run dir {run.dir}")
    if config.loss == "kto":
        check_kto_balance(examples, config, tracker)
    ref = setup_reference(config, run.dir, model, tokenizer, examples, eval_examples, dtype, tracker)
    optimizer = common.build_optimizer(model, config)
    scheduler = common.build_scheduler(optimizer, config)
    state: dict[str, Any] = {"initial": {}, "bco": (0.0, 0)}
    if run.checkpoint:
        state = common.restore_checkpoint(run.checkpoint, model, optimizer, scheduler)
    else:
        metrics, samples = evaluate(model, tokenizer, eval_examples, ref, gold_rows, config, dtype, state)
        state["initial"] = {f"initial/{k}": v for k, v in metrics.items()}
        tracker.log(0, metrics)
        tracker.log_samples(0, samples, "greedy generations")
    model.train()
    try:
        for step in range(run.start_step + 1, config.max_steps + 1):
            t0 = time.perf_counter()
            idx = common.epoch_batch_indices(len(examples), config.batch_size, step, config.seed)
            batch = [examples[i] for i in idx]
            stats = train_step(model, batch, ref.logps("train", idx, batch, pad_id, dtype), config, pad_id, dtype,
                               step, state)
            grad_norm = common.optimizer_step(model, optimizer, scheduler, config.max_grad_norm, step)
            elapsed = time.perf_counter() - t0
            if step % config.log_every == 0 or step == config.max_steps:
                tokens = sum(len(s) for e in batch for s in e.seqs)
                tracker.log(step, {**stats, "grad_norm": grad_norm, "lr": scheduler.get_last_lr()[0],
                                   "tokens_per_s": tokens / elapsed, "time/train_s": elapsed})
            else:
                tracker.advance(step)
            if common.is_due(step, config.eval_every, config.max_steps):
                metrics, samples = evaluate(model, tokenizer, eval_examples, ref, gold_rows, config, dtype, state)
                tracker.log(step, metrics)
                tracker.log_samples(step, samples, "greedy generations")
            if common.is_due(step, config.save_every, config.max_steps):
                common.save_checkpoint(run, step, model, tokenizer, optimizer, scheduler, state,
                                       config.keep_checkpoints)
    except common.TrainingDiverged:
        tracker.close()
        raise
    final, samples = evaluate(model, tokenizer, eval_examples, ref, gold_rows, config, dtype, state)
    tracker.log(config.max_steps, final)
    tracker.log_samples(config.max_steps, samples, "greedy generations")
    common.save_checkpoint(run, config.max_steps, model, tokenizer, optimizer, scheduler, state,
                           config.keep_checkpoints)
    final_dir = common.save_final(run, model, tokenizer)
    plots = tracker.close()
    tracker.print(f"Final model: {final_dir}  plots: {run.dir / 'plots'} ({len(plots)} files)")
    return {**state["initial"], **final}

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
3. logged: `policy/logp_chosen`, `policy/logp_rejected` (both usually fall: preference displacement),
   implicit rewards β(logπ − logπ_ref) `policy/reward_chosen|_rejected|_margin|_accuracy`; on the built-in
   preference data, `eval/gold_score` is the hidden gold score of sampled (and greedy) generations.

Deviations: SimPO and ORPO use no reference (their formulas have none); BCO's δ is the running mean
of all implicit rewards seen so far (kept in checkpoints).

Layout: the config is `dpo_config.py`, the examples, log-probs, loss step and evaluation that online DPO shares are
`dpo_common.py`; this module is the offline method and `lmrl dpo`'s entry point (``online=true``: `online_dpo.py`).

Launch::

    lmrl dpo --config dpo/tiny_prefs                                   # built-in data, CPU
    lmrl dpo model=runs/sft/final dataset=prefs.jsonl loss=ipo loss_args.tau=0.1 lr=5e-7 batch_size=64
    lmrl dpo --config dpo/online_tiny_prefs                            # online DPO (lmrl/trainers/dpo/online.py)
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any

import torch

from lmrl.algorithms import RunningDelta
from lmrl.data import preference as prefs
from lmrl.models import describe_parameters
from lmrl.models.setup import ModelSetup
from lmrl.parallel import runtime
from lmrl.trainers import common, loop
from lmrl.trainers.dpo import online as online_dpo
from lmrl.trainers.dpo.common import Example, Reference, build_examples, evaluate, reference_logps, train_step
from lmrl.trainers.dpo.config import DPOConfig  # also `lmrl dpo`'s config (lmrl/cli.py)

REF_CACHE = "reference_logps.pt"


def load_data(config: DPOConfig, tokenizer):
    rows = prefs.load_preference_rows(config.dataset, config.split, config.train_rows, **config.data_args)
    examples, dropped = build_examples(rows, tokenizer, config, config.dataset)
    builtin = config.dataset in prefs.BUILTIN_SOURCES
    eval_source = config.eval_dataset or (config.dataset if builtin else None)
    eval_examples, eval_rows = [], []
    if eval_source:
        eval_rows = prefs.load_preference_rows(
            eval_source,
            config.eval_split,
            config.eval_rows,
            **(config.data_args if eval_source in prefs.BUILTIN_SOURCES else {}),
        )
        eval_examples, _ = build_examples(eval_rows, tokenizer, config, eval_source)
    gold_rows = eval_rows if eval_source == "builtin:prefs" else []
    return examples, eval_examples, gold_rows, dropped


# ----------------------------------------------------------------------------- the reference


def fingerprint(ref_model, precision: str, examples: list[Example], eval_examples: list[Example]) -> str:
    """Hash of what cached reference log-probs depend on: the reference weights, the precision and every token."""
    h = hashlib.sha256(precision.encode())
    for name, tensor in ref_model.state_dict().items():
        tensor = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor  # FSDP2: the same key on every rank
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    for e in examples + eval_examples:
        for s in e.seqs:
            h.update(repr((s.prompt_ids, s.completion_ids, s.learn)).encode())
    return h.hexdigest()


def load_reference_cache(path: Path, tracker) -> dict | None:
    """The cached reference log-probs, loaded as data only (`weights_only=True`: a crafted file's pickled code
    never runs); None, with a notice, when the file is cut, damaged or not a cache (it is then rebuilt)."""
    try:
        cache = torch.load(path, weights_only=True, map_location="cpu")
        if not isinstance(cache, dict) or not {"fingerprint", "train", "eval"} <= cache.keys():
            raise ValueError(
                f"not a reference cache (keys: {sorted(cache) if isinstance(cache, dict) else type(cache).__name__})"
            )
    except Exception as exc:  # noqa: BLE001 - whatever is wrong with the file, the fix is to rebuild it
        tracker.print(
            f"[yellow]Reference log-probs: {path} is unreadable ({type(exc).__name__}: {str(exc).splitlines()[0][:160]}); "
            "computing them again and replacing it."
        )
        return None
    return cache


def setup_reference(
    config: DPOConfig, run_dir: Path, ref_model, tokenizer, examples, eval_examples, dtype, tracker
) -> Reference:
    """Reference log-probs, computed before any update (`ref_model` is π_ref: the frozen `ref_model`, or the
    policy before it trains or a checkpoint is restored), cached in the run directory; or a frozen model that
    computes them every step (precompute_ref=false)."""
    if not config.uses_reference:
        return Reference()
    if not config.precompute_ref:
        return Reference(model=ref_model, chunk_mb=config.logprob_chunk_mb)
    key, path = fingerprint(ref_model, config.precision, examples, eval_examples), run_dir / REF_CACHE
    cache = load_reference_cache(path, tracker) if path.exists() or path.is_symlink() else None
    if cache is not None and cache["fingerprint"] == key:
        tracker.print(f"Reference log-probs: loaded from {path}")
        return Reference(cache["train"], cache["eval"])
    t0 = time.perf_counter()
    train_ref = reference_logps(ref_model, examples, tokenizer.pad_token_id, dtype, chunk_mb=config.logprob_chunk_mb)
    eval_ref = reference_logps(
        ref_model, eval_examples, tokenizer.pad_token_id, dtype, chunk_mb=config.logprob_chunk_mb
    )
    if runtime.is_main():  # written aside, then renamed: a killed save leaves the old file or none, never half
        tmp = path.with_name(path.name + ".tmp")
        torch.save({"fingerprint": key, "train": train_ref, "eval": eval_ref}, tmp)
        os.replace(tmp, path)
    tracker.print(
        f"Reference log-probs: {len(examples) + len(eval_examples)} examples in "
        f"{time.perf_counter() - t0:.1f}s, cached in {path}"
    )
    return Reference(train_ref, eval_ref)


def check_kto_balance(examples: list[Example], config: DPOConfig, tracker) -> None:
    """Warn when λD·nD / (λU·nU) is outside [1, 4/3], the range the KTO paper recommends (spec §1)."""
    n_d = sum(e.label for e in examples)
    n_u = len(examples) - n_d
    lambda_d, lambda_u = config.loss_args.get("lambda_d", 1.0), config.loss_args.get("lambda_u", 1.0)
    ratio = lambda_d * n_d / max(1e-9, lambda_u * n_u)
    if not 1.0 <= ratio <= 4 / 3:
        tracker.print(
            f"[yellow]KTO: λD·nD / (λU·nU) = {ratio:.2f} with {n_d} desirable and {n_u} undesirable "
            "examples; the KTO paper recommends [1, 4/3]. Set loss_args.lambda_d / lambda_u."
        )


# ----------------------------------------------------------------------------- the method


class DPO(loop.MethodDefaults):
    """The offline DPO-family method for `loop.run`: one step is one optimizer step on ``batch_size`` pairs (KTO:
    examples). `start(run)` readies π_ref's log-probs once the run directory is open."""

    samples_title = "greedy generations"
    data_parallel = True  # exact for every loss but KTO (z0) and BCO (δ), whose batch statistics stay per rank

    def __init__(self, config: DPOConfig, setup: ModelSetup):
        self.config, self.setup = config, setup
        self.model, self.tokenizer = common.training_policy(setup, packed=bool(config.max_tokens_per_microbatch))
        self.examples, self.eval_examples, self.gold_rows, self.dropped = load_data(config, self.tokenizer)
        # π_ref: the frozen `ref_model`, or a frozen copy of the initial policy when it is recomputed every step
        needs_model = config.uses_reference and (config.ref_model or not config.precompute_ref)
        self.ref_model = setup.frozen(config.ref_model, self.tokenizer) if needs_model else None
        self.reference: Reference | None = None  # π_ref's log-probs: set by `start(run)` before the first step
        self.delta = RunningDelta()  # BCO's running mean of the implicit rewards (the other losses ignore it)
        self.optimizer = common.build_optimizer(self.model, config)
        self.scheduler = common.build_scheduler(self.optimizer, config)

    def describe(self, run: common.Run) -> str:
        return (
            f"{self.config.loss}: {describe_parameters(self.model)}, {len(self.examples)} training examples "
            f"({self.dropped} dropped as overlong), {len(self.eval_examples)} held-out, "
            f"precision={self.setup.precision_name}, run dir {run.dir}"
        )

    def start(self, run: common.Run) -> None:
        """KTO's balance warning, and π_ref's log-probs (before `loop.run` restores a checkpoint into the policy)."""
        if self.config.unpaired:
            check_kto_balance(self.examples, self.config, run.tracker)
        ref_model = self.ref_model if self.ref_model is not None else self.model
        self.reference = setup_reference(
            self.config,
            run.dir,
            ref_model,
            self.tokenizer,
            self.examples,
            self.eval_examples,
            self.setup.dtype,
            run.tracker,
        )
        self.ref_model = None  # kept by `reference` when it recomputes log-probs every step

    def step(self, step: int) -> dict[str, float]:
        config, dtype, pad_id, t0 = self.config, self.setup.dtype, self.tokenizer.pad_token_id, time.perf_counter()
        idx = runtime.shard(common.epoch_batch_indices(len(self.examples), config.batch_size, step, config.seed))
        batch = [self.examples[i] for i in idx]  # this rank's share of the step's batch_size examples
        stats = train_step(
            self.model,
            batch,
            self.reference.logps("train", idx, batch, pad_id, dtype),
            config,
            pad_id,
            dtype,
            step,
            self.delta,
            config.batch_size,
        )
        tokens = sum(len(s) for e in batch for s in e.seqs)
        return {**stats, **common.finish_step(self, step, t0, tokens)}

    def evaluate(self, step: int) -> tuple[dict[str, float], list[dict]]:
        return evaluate(
            self.model,
            self.tokenizer,
            self.eval_examples,
            self.reference,
            self.gold_rows,
            self.config,
            self.setup.dtype,
            self.delta,
        )

    def state_dict(self) -> dict[str, Any]:
        return {"bco": self.delta.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.delta = RunningDelta(*state["bco"])


def train(config: DPOConfig) -> dict[str, float]:
    """Run a DPO-family loss end to end (online=true: `online_dpo.train`); returns the final evaluation metrics
    (plus `initial/...` ones)."""
    if config.online:
        return online_dpo.train(config)
    return loop.train(DPO, config, f"dpo ({config.loss})")

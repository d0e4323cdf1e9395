"""Rejection sampling: sample N completions per prompt, score them, keep the best, SFT on the selection.

RLHF book ch. 9 (spec `rlhf-book-advanced.md` §2):
1. sample `samples_per_prompt` (N) completions for each of `train_rows` (M) prompts with the rollout engine;
2. score the M x N completions with a RewardSet (a reward model `model:PATH`, a verifier like `task`, or
   a user function `module:function`);
3. select per prompt (`select=best`: argmax_j r_ij, or the `per_prompt` best) or over all prompts
   (`select=top_k`: the `top_k` best of the flat M*N rewards); empty or truncated completions, duplicates
   within a prompt and rewards below `min_reward` are never selected;
4. write the selection to `<output_dir>/round-R/selection.jsonl` (prompt, completion, reward) and SFT the
   policy on it with the SFT method (`lmrl.trainers.sft_method.SFT`, run in `round-R/sft/`);
5. repeat for `rounds` rounds, each sampling from the previous round's policy.
Logged per round (step = round): reward of all samples vs the selected ones, the per-prompt max, and for
per-prompt best-of-N the KL(π_BoN ‖ π) the selection targets (`rs/kl_bon_bound` = log N − (N−1)/N, analytic;
`rs/kl_bon_empirical`, the plug-in estimate from each prompt's N rewards); then held-out `eval/...` metrics.

Deviations: rounds after the first continue from the previous round's policy (iterated rejection sampling,
as Llama 2), not from the starting checkpoint; `max_steps` is the number of SFT steps per round.

Launch::

    lmrl rejection-sampling --config rejection/tiny_arithmetic              # built-in task, CPU
    lmrl rejection-sampling model=runs/sft/final rewards=[model:runs/rm/final] dataset=prompts.jsonl \
        samples_per_prompt=16 select=top_k top_k=2000 lr=1e-5 batch_size=64
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import torch

from lmrl.algorithms.best_of_n import bon_kl_bound, bon_kl_empirical, select_best, select_top_k
from lmrl.config import TrainConfig, section_view, to_dict
from lmrl.data import preference as prefs
from lmrl.data.chat import encode_prompt
from lmrl.data.loading import is_generated, load_rows
from lmrl.data.prompt_format import PromptFormat
from lmrl.eval.generation import task_accuracy
from lmrl.eval.training import build_evaluator, evals_metrics
from lmrl.models.forward_plan import ForwardPlan
from lmrl.models.setup import ModelSetup
from lmrl.parallel import runtime
from lmrl.rewards import RewardSet
from lmrl.rollout.engines.factory import make_engine
from lmrl.rollout.engines.hf import HFEngine
from lmrl.rollout.samplers.groups import seeded_shards
from lmrl.rollout.types import RolloutBatch
from lmrl.tracking import Tracker
from lmrl.trainers import loop, rundir
from lmrl.trainers.rejection.config import RejectionConfig  # also `lmrl rejection-sampling`'s config (lmrl/cli.py)
from lmrl.trainers.sft.config import SFTConfig
from lmrl.trainers.sft_method import SFT

# ----------------------------------------------------------------------------- sampling and scoring


@dataclasses.dataclass
class Pool:
    """M prompts x N scored completions, prompt-major."""

    rows: list[dict]  # the M dataset rows
    batch: RolloutBatch  # M*N rows
    rewards: torch.Tensor  # (M, N) weighted total
    metrics: dict[str, float]  # RewardSet metrics (reward/<fn>/mean, reward/mean, ...)


def sample_and_score(
    model,
    tokenizer,
    rows: list[dict],
    rewards: RewardSet,
    config: RejectionConfig,
    n: int,
    generators: list[torch.Generator],
    dtype,
    engine=None,
) -> Pool:
    """N completions per row from `model` (batched; the k-th of len(generators) equal shards of `rows` with
    generator k) scored by `rewards`. engine: a long-lived engine (engine=vllm: one for the whole run, synced to
    each round's policy, a new model object, which `sync` pushes); None: an HF engine on `model`."""
    if engine is None:
        engine = HFEngine(model, tokenizer, autocast_dtype=dtype)
    engine.sync(model, 0)  # rounds replace the model rather than update it: the new object is what is pushed
    batches = []
    for k, generator in enumerate(generators):
        part = runtime.shard(rows, k, len(generators))
        for start in range(0, len(part), config.generation_batch):
            ids = [
                encode_prompt(tokenizer, r["prompt"], config.chat)
                for r in part[start : start + config.generation_batch]
            ]
            batches.append(engine.generate(ids, config.sampling, n=n, generator=generator))
    batch = concat_batches(batches, n, tokenizer.pad_token_id)
    keys = [k for k in rows[0] if k not in ("prompt", "completion")]
    columns = {k: [row[k] for row in rows for _ in range(n)] for k in keys}
    result = rewards.compute(
        batch.prompts,
        batch.completions,
        truncated=batch.truncated.tolist(),
        completion_lengths=batch.completion_lengths.tolist(),
        **columns,
    )
    return Pool(rows, batch, result.total.view(-1, n), result.metrics)


def gather_pool(pool: Pool, pad_id: int) -> Pool:
    """Every rank's pool of its share of the prompts, in rank order, on every rank; the reward metrics are averaged
    over ranks (`runtime.reduce_metrics`: exact for means over equal shares)."""
    if runtime.world() == 1:
        return pool
    batch = dataclasses.replace(pool.batch, **{k: v.cpu() for k, v in vars(pool.batch).items() if torch.is_tensor(v)})
    parts = runtime.gather_objects((pool.rows, batch, pool.rewards.cpu()))
    n = pool.rewards.shape[1]
    return Pool(
        [row for p in parts for row in p[0]],
        concat_batches([p[1] for p in parts], n, pad_id),
        torch.cat([p[2] for p in parts]),
        runtime.reduce_metrics(pool.metrics),
    )


def concat_batches(batches: list[RolloutBatch], n: int, pad_id: int) -> RolloutBatch:
    """One RolloutBatch from several (prompts left-padded, completions right-padded to the widest)."""
    if len(batches) == 1:
        return batches[0]
    p, t = max(b.prompt_ids.shape[1] for b in batches), max(b.completion_ids.shape[1] for b in batches)
    left = lambda x, w, v: torch.nn.functional.pad(x, (w - x.shape[1], 0), value=v)  # noqa: E731
    right = lambda x, w, v: torch.nn.functional.pad(x, (0, w - x.shape[1]), value=v)  # noqa: E731
    cat = lambda f: torch.cat([f(b) for b in batches])  # noqa: E731
    return RolloutBatch(
        prompt_ids=cat(lambda b: left(b.prompt_ids, p, pad_id)),
        prompt_mask=cat(lambda b: left(b.prompt_mask, p, 0)),
        completion_ids=cat(lambda b: right(b.completion_ids, t, pad_id)),
        completion_mask=cat(lambda b: right(b.completion_mask, t, 0.0)),
        sampler_logp=cat(lambda b: right(b.sampler_logp, t, 0.0)),
        truncated=cat(lambda b: b.truncated),
        finish_reason=[x for b in batches for x in b.finish_reason],
        prompts=[x for b in batches for x in b.prompts],
        completions=[x for b in batches for x in b.completions],
        group_size=n,
    )


def eligible_mask(pool: Pool, config: RejectionConfig) -> torch.Tensor:
    """Bool (M, N): samples that may be selected: non-empty text (SFT needs a target), not truncated, not a
    repeat within the prompt, reward >= min_reward."""
    m, n = pool.rewards.shape
    ok = torch.tensor([bool(c.strip()) for c in pool.batch.completions]).view(m, n)
    if config.drop_truncated:
        ok &= ~pool.batch.truncated.view(m, n)
    if config.min_reward is not None:
        ok &= pool.rewards >= config.min_reward
    if config.dedupe:  # the best copy of a repeated completion stays eligible
        for i in range(m):
            seen: set[str] = set()
            for j in torch.sort(pool.rewards[i], descending=True, stable=True).indices.tolist():
                text = pool.batch.completions[i * n + j]
                ok[i, j] &= text not in seen
                seen.add(text)
    return ok


def select(pool: Pool, config: RejectionConfig, tracker: Tracker | None = None) -> torch.Tensor:
    """Flat indices of the selected completions (select=best per prompt, or the global top_k)."""
    ok = eligible_mask(pool, config)
    if config.select == "best":
        return select_best(pool.rewards, config.per_prompt, ok)
    k = config.top_k
    if k > int(ok.sum()):  # too few eligible this round: keep them all rather than fail mid-run
        if tracker is not None:
            tracker.print(
                f"[yellow]top_k={k} but only {int(ok.sum())} completions are eligible this round; keeping all of them."
            )
        k = int(ok.sum())
    return select_top_k(pool.rewards, k, ok) if k else torch.zeros(0, dtype=torch.long)


def selection_stats(pool: Pool, chosen: torch.Tensor, config: RejectionConfig) -> dict[str, float]:
    """Mean reward of all samples vs the selected ones, per-prompt max, coverage, and the BoN KL."""
    m, n = pool.rewards.shape
    flat = pool.rewards.reshape(-1)  # (M*N,)
    stats = {
        **pool.metrics,
        "rs/reward_all": flat.mean().item(),
        "rs/reward_max": pool.rewards.max(1).values.mean().item(),
        "rs/selected": float(chosen.numel()),
        "rs/prompts_covered": len(set((chosen // n).tolist())) / m,
        "rs/truncated_frac": pool.batch.truncated.float().mean().item(),
        "completion_len/mean": pool.batch.completion_lengths.float().mean().item(),
    }
    if chosen.numel():
        stats["rs/reward_selected"] = flat[chosen].mean().item()
    if config.select == "best" and config.per_prompt == 1:  # the selection is a sample of π_BoN
        stats["rs/kl_bon_bound"] = bon_kl_bound(n)
        stats["rs/kl_bon_empirical"] = bon_kl_empirical(pool.rewards, n).mean().item()
    return stats


def write_selection(path: Path, pool: Pool, chosen: torch.Tensor) -> list[dict]:
    """selection.jsonl: one {prompt, completion, reward, ...dataset columns} row per selected completion."""
    n = pool.rewards.shape[1]
    records = []
    for k in chosen.tolist():
        row = pool.rows[k // n]
        extra = {key: v for key, v in row.items() if key not in ("prompt", "completion", "reward")}
        records.append(
            {
                "prompt": row["prompt"],
                "completion": pool.batch.completions[k],
                "reward": pool.rewards.view(-1)[k].item(),
                **extra,
            }
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return records


# ----------------------------------------------------------------------------- evaluation


@torch.no_grad()
def evaluate(
    model, tokenizer, rows: list[dict], rewards: RewardSet, config: RejectionConfig, dtype, reference=None, engine=None
) -> dict[str, float]:
    """Held-out reward of sampled completions, greedy task accuracy, gold score and KL to the start."""
    if not rows:
        return {}
    was_training = model.training
    model.eval()
    generator = torch.Generator().manual_seed(config.seed + 7)
    pool = sample_and_score(model, tokenizer, rows, rewards, config, config.eval_samples, [generator], dtype, engine)
    metrics = {
        "eval/reward": pool.rewards.mean().item(),
        **{
            f"eval/{k}": v
            for k, v in pool.metrics.items()  # eval/reward/<fn>/mean
            if k.startswith("reward/") and k.count("/") == 2 and k.endswith("/mean")
        },
    }
    if config.eval_gold:
        expanded = [row for row in rows for _ in range(config.eval_samples)]  # prompt-major, like the batch
        gold = [prefs.gold_score(row["prompt"], c, row.get("meta")) for row, c in zip(expanded, pool.batch.completions)]
        metrics["eval/gold_score"] = sum(gold) / len(gold)
    if reference is not None:
        batch = pool.batch
        ref_logp = ForwardPlan(config.temperature, dtype, config.logprob_chunk_mb).scores(reference, batch)  # (N, T)
        metrics["eval/kl"] = ((batch.sampler_logp - ref_logp) * batch.completion_mask).sum(1).mean().item()
    if "task" in rows[0] and "answer" in rows[0]:
        acc, _ = task_accuracy(
            model, tokenizer, rows, config.max_new_tokens, dtype, num_samples=0, prompt_format=PromptFormat(config.chat)
        )
        metrics["eval/accuracy"] = acc["accuracy"]
    model.train(was_training)
    return metrics


# ----------------------------------------------------------------------------- entry point


def load_prompts(config: RejectionConfig) -> tuple[list[dict], list[dict]]:
    """Training prompts and held-out prompts, checked at start-up."""
    rows = load_rows(config.dataset, split=config.split, limit=config.train_rows, **config.task_args)
    if "prompt" not in rows[0]:
        raise ValueError(f"{config.dataset}: rejection sampling needs a `prompt` column; found {sorted(rows[0])}.")
    source = config.eval_dataset or (config.dataset if is_generated(config.dataset) else None)
    eval_rows = []
    if source:
        args = config.task_args if is_generated(source) else {}
        eval_rows = load_rows(source, split=config.eval_split, limit=config.eval_rows, **args)
    shards = max(config.sampling_shards, runtime.world())
    if len(rows) % shards:
        raise ValueError(
            f"{config.dataset}: its {len(rows)} prompts do not split into {shards} equal sampling shards "
            f"(sampling_shards, processes). Fix: train_rows=<a multiple of {shards}>."
        )
    if config.select == "top_k" and config.top_k > len(rows) * config.samples_per_prompt:
        raise ValueError(
            f"top_k={config.top_k} exceeds the {len(rows) * config.samples_per_prompt} completions "
            f"sampled per round ({len(rows)} prompts x {config.samples_per_prompt}); lower top_k."
        )
    return rows, eval_rows


def sft_config(config: RejectionConfig, dataset: Path, model: str, out: Path, first: bool) -> SFTConfig:
    """The SFT phase of a round: the shared training fields of `config`, on the selection file."""
    shared = dataclasses.asdict(section_view(config, TrainConfig))
    shared.update(
        model=model,
        model_args=config.model_args if first else {},
        output_dir=str(out),
        overwrite=True,
        eval_every=0,
        eval_metrics=[],
        check_contamination=False,
    )  # evaluated per round
    return SFTConfig(
        **shared,
        dataset=str(dataset),
        train_rows=None,
        eval_dataset=None,
        chat=config.chat,
        max_length=config.max_length,
        batch_size=config.batch_size,
    )


def prepare_run_dir(config: RejectionConfig) -> tuple[Path, int]:
    """The run directory and the number of rounds already completed (resume=true)."""
    run_dir = Path(config.output_dir)
    done = 0
    while (run_dir / f"round-{done + 1}" / "sft" / "final").is_dir():
        done += 1
    rundir.check_writable(run_dir)
    if (rundir.has_run(run_dir) or done) and not config.resume:
        if not config.overwrite:
            raise FileExistsError(
                f"output_dir '{run_dir}' already holds a run. Pass resume=true to continue it, "
                "overwrite=true to replace it, or choose another output_dir=..."
            )
        for path in [*run_dir.glob("round-*"), run_dir / "final", run_dir / "plots"]:
            shutil.rmtree(path, ignore_errors=True)
        for name in ("metrics.jsonl", "samples.jsonl"):
            (run_dir / name).unlink(missing_ok=True)
        done = 0
    rundir.write_config(run_dir, to_dict(config))
    return run_dir, (done if config.resume else 0)


def evaluate_on_main(
    model, tokenizer, rows, rewards, config: RejectionConfig, dtype, reference, engine, evaluator
) -> dict[str, float]:
    """`evaluate` plus the ``eval_metrics``, run by rank 0 (a sharded π_start unsharded meanwhile); on every rank."""
    result = None
    with runtime.full_params(reference):
        if runtime.is_main():
            result = {
                **evaluate(model, tokenizer, rows, rewards, config, dtype, reference, engine),
                **evals_metrics(evaluator, model, tokenizer, dtype),
            }
    return runtime.broadcast_object(result)


def train(config: RejectionConfig) -> dict[str, float]:
    """Run rejection sampling end to end; returns the final eval metrics (plus `initial/...` ones). Several
    processes: each samples and scores its share of the prompts, every rank selects from the gathered pool, rank 0
    writes and evaluates, and each round's SFT is data-parallel."""
    setup = ModelSetup.from_config(config)
    rows, eval_rows = load_prompts(config)
    rewards = RewardSet.from_config(config)
    # samples and is evaluated only (each round's SFT trains its own, distributed copy): a full copy on each rank
    model, tokenizer = setup.policy(distribute=False)
    evaluator = build_evaluator(config)  # eval_metrics, logged as eval/metrics/<name> after every round
    run_dir, done = runtime.broadcast_object(prepare_run_dir(config) if runtime.is_main() else None)
    dtype = setup.dtype
    reference = model if config.eval_kl else None  # π_start: `model` is rebound to each round's trained policy
    tracker = (
        Tracker(run_dir, config.rounds, to_dict(config), config.report_to, "rejection sampling", done)
        if runtime.is_main()
        else runtime.NullTracker()
    )
    policy = config.model if done == 0 else str(run_dir / f"round-{done}" / "sft" / "final")
    if done:
        reference = setup.frozen(config.model, tokenizer) if config.eval_kl else None
        model, tokenizer = setup.policy(policy, distribute=False)
    engine = None  # engine=hf: a fresh HF engine per call; engine=vllm: one engine, synced to each round's policy
    if config.engine == "vllm":
        longest = max(len(encode_prompt(tokenizer, r["prompt"], config.chat)) for r in rows + eval_rows)
        engine = make_engine(config, model, tokenizer, dtype, sampling=config.sampling, longest_prompt=longest)
    initial = {
        f"initial/{k}": v
        for k, v in evaluate_on_main(
            model, tokenizer, eval_rows, rewards, config, dtype, None, engine, evaluator
        ).items()
    }
    if not done:
        tracker.log(0, {k.removeprefix("initial/"): v for k, v in initial.items()})
    final = dict(initial)
    for r in range(done + 1, config.rounds + 1):
        share = runtime.shard(rows)  # this rank's prompts, in its seeded sampling shards
        generators = [generator for _, _, generator in seeded_shards(share, config.sampling_shards, config.seed, r)]
        pool = gather_pool(
            sample_and_score(
                model, tokenizer, share, rewards, config, config.samples_per_prompt, generators, dtype, engine
            ),
            tokenizer.pad_token_id,
        )
        chosen = select(pool, config, tracker)
        if chosen.numel() == 0:
            raise ValueError(
                f"round {r}: no completion was eligible for selection (all truncated, or below "
                f"min_reward={config.min_reward}); lower min_reward or raise max_new_tokens."
            )
        if runtime.is_main():
            records = write_selection(run_dir / f"round-{r}" / "selection.jsonl", pool, chosen)
            tracker.log(r, selection_stats(pool, chosen, config))
            tracker.log_samples(
                r,
                [{k: rec[k] for k in ("prompt", "completion", "reward")} for rec in records[: config.num_samples]],
                f"round {r} selection",
            )
            tracker.progress.stop()  # the SFT trainer shows its own progress bar
        runtime.barrier()  # the selection file is written
        loop.train(
            SFT,
            sft_config(
                config, run_dir / f"round-{r}" / "selection.jsonl", policy, run_dir / f"round-{r}" / "sft", first=r == 1
            ),
            "sft",
        )
        if runtime.is_main():
            tracker.progress.start()
        policy = str(run_dir / f"round-{r}" / "sft" / "final")
        model, tokenizer = setup.policy(policy, distribute=False)
        final = evaluate_on_main(model, tokenizer, eval_rows, rewards, config, dtype, reference, engine, evaluator)
        tracker.log(r, final)
    if runtime.is_main():
        model.save_pretrained(run_dir / "final")
        tokenizer.save_pretrained(run_dir / "final")
    tracker.close()
    tracker.print(f"Final model: {run_dir / 'final'}  selections: {run_dir}/round-*/selection.jsonl")
    return {**initial, **final}

"""``lmrl generate``: sample completions from any model or checkpoint, to look at what it does.

    lmrl generate model=runs/sft/final prompts='["12+34=", "7*8="]' n=4 temperature=0.8

Best-of-N at inference (RLHF book ch. 9): sample N completions per prompt, score them with `rewards`, show
the best one and its reward, and report KL(π_BoN ‖ π) both ways: the analytic log N − (N−1)/N (exact for a
reward without ties, an upper bound otherwise) and an empirical plug-in estimate from the scored samples
(`lmrl.algorithms.best_of_n`; add `kl_samples` extra samples per prompt for a tighter estimate).

    lmrl generate model=runs/sft/final prompts='["12+34="]' best_of=16 rewards=[model:runs/reward/final]

With `tools=[...]` (or `env=`) it runs the tool loop on each prompt and shows the transcripts:

    lmrl generate model=runs/sft-tools/final prompts='["4821*9375="]' tools=[calculator] tool_parser=pythonic
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from rich.table import Table

from lmrl.algorithms.best_of_n import bon_kl_bound, bon_kl_empirical, select_best
from lmrl.data.prompt_format import PromptFormat
from lmrl.models import autocast_dtype, load_model_and_tokenizer
from lmrl.rewards import RewardSet
from lmrl.rollout.engines.factory import make_engine
from lmrl.rollout.engines.hf import HFEngine, SamplingParams
from lmrl.rollout.generate_config import GenerateConfig  # also `lmrl generate`'s config (lmrl/cli.py)
from lmrl.rollout.tools.multiturn import run_episodes
from lmrl.rollout.tools.section import build_env_factory, start_servers
from lmrl.rollout.types import RolloutBatch
from lmrl.tracking import console, plain


def run(config: GenerateConfig) -> list[list[str]]:
    """Prints a table of completions and returns them, grouped per prompt (best_of: the best one per prompt)."""
    prompts = config.all_prompts()
    start_servers(config)  # an MCP server that does not start stops here, before the model loads
    model, tokenizer = load_model_and_tokenizer(
        config.model, config.tokenizer, config.seed, chat=config.chat, chat_template=config.chat_template
    )
    params = SamplingParams(
        max_new_tokens=config.max_new_tokens,
        temperature=config.temperature or 1.0,
        top_p=config.top_p,
        top_k=config.top_k,
        stop_strings=tuple(config.stop),
        greedy=config.temperature == 0,
    )
    if config.multi_turn:  # tools or an environment: the tool loop
        engine = make_engine(
            config, model, tokenizer, autocast_dtype(config.precision), sampling=params, longest_prompt=1
        )
        return run_tool_episodes(config, engine, tokenizer, params, prompts)
    ids = [PromptFormat.from_config(config).ids(tokenizer, p) for p in prompts]
    engine = make_engine(
        config,
        model,
        tokenizer,
        autocast_dtype(config.precision),
        sampling=params,
        longest_prompt=max(len(i) for i in ids),
    )
    if config.best_of > 1:
        rewards = RewardSet(config.rewards, config.reward_weights or None, config.reward_kwargs, "stop")
        return [[c] for c in run_best_of(engine, ids, params, rewards, config, prompts)["completion"]]
    batch = engine.generate(ids, params, n=config.n, generator=torch.Generator().manual_seed(config.seed))
    if config.output_file:
        write_jsonl(
            config.output_file,
            [{"prompt": prompts[k // config.n], "completion": c} for k, c in enumerate(batch.completions)],
        )
    grouped = [batch.completions[i * config.n : (i + 1) * config.n] for i in range(len(prompts))]
    table = Table(title=f"{config.model}", show_lines=True)
    for column in ("prompt", "completion", "tokens", "finish"):
        table.add_column(column, overflow="fold")
    lengths = batch.completion_lengths.tolist()
    for i, prompt in enumerate(prompts):
        for j, completion in enumerate(grouped[i]):
            k = i * config.n + j
            table.add_row(
                plain(prompt if j == 0 else ""), plain(completion), str(int(lengths[k])), batch.finish_reason[k]
            )
    console.print(table)
    return grouped


def run_best_of(
    engine: HFEngine,
    ids: list[list[int]],
    params: SamplingParams,
    rewards: RewardSet,
    config: GenerateConfig,
    prompts: list[str],
) -> dict:
    """Best-of-N per prompt: the chosen completions, their rewards and the KL of best-of-N (printed too).

    The pool per prompt is N + kl_samples i.i.d. samples; the best is picked among the first N (ties: the
    earlier sample), and the empirical KL is the plug-in estimate from the whole pool's rewards.
    """
    n, pool_size = config.best_of, config.best_of + config.kl_samples
    batch = engine.generate(ids, params, n=pool_size, generator=torch.Generator().manual_seed(config.seed))
    result = rewards.compute(
        batch.prompts,
        batch.completions,
        truncated=batch.truncated.tolist(),
        completion_lengths=batch.completion_lengths.tolist(),
    )
    pool = result.total.view(len(prompts), pool_size)  # (B, N + kl_samples)
    chosen = select_best(pool[:, :n])  # (B,) flat indices into the (B, N) candidates
    rows = (chosen // n) * pool_size + chosen % n  # (B,) rows of `batch`
    out = {
        "completion": [batch.completions[k] for k in rows.tolist()],
        "reward": pool.reshape(-1)[rows].tolist(),
        "kl_bound": bon_kl_bound(n),
        "kl_empirical": bon_kl_empirical(pool, n).mean().item(),
    }
    show_best_of(batch, rows, out, prompts, n, pool)
    if config.output_file:
        write_jsonl(
            config.output_file,
            [
                {
                    "prompt": p,
                    "completion": c,
                    "reward": r,
                    "best_of": n,
                    "mean_reward_of_n": pool[i, :n].mean().item(),
                    "kl_bound": out["kl_bound"],
                    "kl_empirical": out["kl_empirical"],
                }
                for i, (p, c, r) in enumerate(zip(prompts, out["completion"], out["reward"]))
            ],
        )
    return out


def show_best_of(
    batch: RolloutBatch, rows: torch.Tensor, out: dict, prompts: list[str], n: int, pool: torch.Tensor
) -> None:
    table = Table(title=f"best of {n}", show_lines=True)
    for column in ("prompt", "best completion", "reward", f"mean reward of the {n}", "tokens", "finish"):
        table.add_column(column, overflow="fold")
    lengths = batch.completion_lengths.tolist()
    for i, k in enumerate(rows.tolist()):
        table.add_row(
            plain(prompts[i]),
            plain(out["completion"][i]),
            f"{out['reward'][i]:.4g}",
            f"{pool[i, :n].mean().item():.4g}",
            str(int(lengths[k])),
            batch.finish_reason[k],
        )
    console.print(table)
    console.print(
        f"KL(π_BoN ‖ π) with N={n}: analytic log N − (N−1)/N = {out['kl_bound']:.4f} nats (exact for a reward "
        f"without ties, an upper bound otherwise); empirical plug-in estimate = {out['kl_empirical']:.4f} nats "
        f"(mean over {len(prompts)} prompts of the exact best-of-{n} KL of each prompt's {pool.shape[1]} scored "
        f"samples; at most log {pool.shape[1]} = {math.log(pool.shape[1]):.3f}, so raise "
        "kl_samples for a tighter estimate)."
    )


def write_jsonl(path: str, records: list[dict]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in records))
    console.print(f"wrote {len(records)} rows to {path}")


def run_tool_episodes(config, engine, tokenizer, params, prompts: list[str]) -> list[list[str]]:
    """n episodes per prompt; returns the final answers grouped per prompt (transcripts are printed/written)."""
    make_env = build_env_factory(config, tokenizer)
    rows = [{"prompt": p} for p in prompts for _ in range(config.n)]
    batch = run_episodes(
        engine,
        tokenizer,
        [make_env(r) for r in rows],
        rows,
        params,
        config.turn_options(),
        torch.Generator().manual_seed(config.seed),
        group_size=config.n,
    )
    table = Table(title=f"{config.model} with tools {config.tools + config.mcp_servers}", show_lines=True)
    for column in ("prompt", "transcript", "turns", "tool calls", "finish"):
        table.add_column(column, overflow="fold")
    for k, info in enumerate(batch.info):
        table.add_row(
            plain(rows[k]["prompt"] if k % config.n == 0 else ""),
            plain(info["transcript"]),
            str(info["num_turns"]),
            f"{info['stats'].get('calls', 0)} ({info['stats'].get('call_errors', 0)} errors)",
            info["finish"],
        )
    console.print(table)
    if config.output_file:
        write_jsonl(
            config.output_file,
            [
                {
                    "prompt": r["prompt"],
                    "completion": c,
                    "transcript": i["transcript"],
                    "finish": i["finish"],
                    "tool_stats": i["stats"],
                }
                for r, c, i in zip(rows, batch.completions, batch.info)
            ],
        )
    return [batch.completions[i * config.n : (i + 1) * config.n] for i in range(len(prompts))]

"""`lmrl swarm mode=sim`: N swarm nodes on one machine, round by round, in one process.

Each round every node samples its questions, generates and publishes (to an in-memory
hub, or a folder with ``hub=file``); then every node fetches whatever its peers
published, builds its training set and takes its GRPO step. Nodes run one after the
other, which on a small machine is both the fastest and a deterministic schedule (the
same run gives the same numbers); "never wait for peers" still holds per node: a node
uses the peers' payloads present at its fetch and skips anything invalid.

Run directory (``output_dir``):

- ``metrics.jsonl`` — per round: the swarm means of every node metric (``reward/mean`` is
  the mean over nodes of each node's mean reward on its own rollouts), sums of the skip
  counters, ``swarm/cumulative_reward`` (the paper's metric: the sum over nodes and rounds
  of each node's mean own reward) and ``node/<name>/<key>`` for a few keys per node;
- ``nodes/<name>/metrics.jsonl`` — every metric of one node, every round;
  ``nodes/<name>/checkpoints/step-N`` and ``nodes/<name>/final``;
- ``checkpoints/step-N/trainer_state.pt`` — written after every node's step-N checkpoint,
  so ``resume=true`` restarts all nodes from the last round they all saved;
- ``swarm_summary.json`` — cumulative reward (swarm and per node), reward per round,
  held-out accuracy; ``plots/swarm_reward.png``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import shutil
from pathlib import Path
from typing import Any

import torch

from lmrl.config import ConfigError
from lmrl.data.tasks import get_task, make_rows
from lmrl.report.metric_names import upgrade
from lmrl.swarm.config import SwarmConfig
from lmrl.swarm.memory import FileHub, MemoryHub, MemoryTransport
from lmrl.swarm.node import SwarmNode
from lmrl.swarm.rounds import NodeSpec, builtin_args, fetch_rounds, heldout_rows, node_seed
from lmrl.tracking import read_jsonl, truncate_jsonl
from lmrl.trainers import common, rundir

NODE_KEYS = (
    "reward/mean",
    "reward/cumulative",
    "loss",
    "swarm/groups/local",
    "swarm/groups/external",
    "swarm/accepted",
    "swarm/skipped",
    "eval/accuracy",
)
"""Keys copied per node into the swarm's metrics.jsonl as ``node/<name>/<key>``."""

SUM_KEYS = ("reward/cumulative", "swarm/accepted", "swarm/skipped", "swarm/publish_errors")
"""Keys (and ``swarm/skipped/*``) summed over nodes; every other numeric key is averaged."""


def _json_safe(metrics: dict[str, Any]) -> dict[str, Any]:
    """Metrics with NaN/inf as strings (JSON has no such numbers)."""
    return {k: (str(v) if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}


def node_specs(config: SwarmConfig) -> list[NodeSpec]:
    """The nodes of a simulation: models, model_args and group sizes cycled over ``nodes``."""

    def pick(values: list, i: int, default: Any) -> Any:
        return values[i % len(values)] if values else default

    specs = []
    for i in range(config.nodes):
        name = f"node-{i}"
        model = pick(config.node_models, i, config.model)
        specs.append(
            NodeSpec(
                name,
                model,
                builtin_args(model, pick(config.node_model_args, i, config.model_args)),
                pick(config.node_samples_per_prompt, i, config.samples_per_prompt),
                node_seed(config.seed, name),
            )
        )
    return specs


def make_hub(config: SwarmConfig, run_dir: Path) -> MemoryHub | FileHub:
    if config.hub == "memory":
        return MemoryHub(keep_rounds=config.keep_rounds)
    return FileHub(
        config.hub_dir or run_dir / "hub", keep_rounds=config.keep_rounds, max_entry_bytes=config.max_payload_bytes + 1
    )


def swarm_metrics(per_node: dict[str, dict[str, float]]) -> dict[str, float]:
    """Swarm-level metrics of one round: sums of counters and cumulative rewards, means of the rest,
    plus ``node/<name>/<key>`` for `NODE_KEYS`."""
    out: dict[str, float] = {}
    keys = sorted({k for m in per_node.values() for k, v in m.items() if isinstance(v, (int, float))})
    for key in keys:
        values = [float(m[key]) for m in per_node.values() if isinstance(m.get(key), (int, float))]
        summed = key in SUM_KEYS or key.startswith("swarm/skipped/")
        name = "swarm/cumulative_reward" if key == "reward/cumulative" else key
        out[name] = sum(values) if summed else sum(values) / len(values)
    for name, m in per_node.items():
        out.update({f"node/{name}/{k}": m[k] for k in NODE_KEYS if k in m})
    return out


def save_sim(run: common.Run, step: int, nodes: list[SwarmNode], keep: int, state: dict[str, Any]) -> Path:
    """Every node's checkpoint, then the swarm's marker `checkpoints/step-N/trainer_state.pt` (atomically)."""
    for node in nodes:
        node.save(step, keep)
    final = run.checkpoints_dir / f"step-{step}"
    tmp = run.checkpoints_dir / f".tmp-step-{step}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    torch.save({"step": step, "rng": common.rng_state(), "trainer": state}, tmp / common.STATE_FILE)
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in common.list_checkpoints(run.dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def evaluate_nodes(nodes: list[SwarmNode], rows: list[dict]) -> dict[str, float]:
    """Greedy held-out accuracy of every node and their mean (``eval/accuracy``)."""
    acc = {node.name: node.evaluate(rows) for node in nodes}
    return {"eval/accuracy": sum(acc.values()) / len(acc), **{f"node/{n}/eval/accuracy": a for n, a in acc.items()}}


def summarize(run_dir: Path, nodes: list[SwarmNode], config: SwarmConfig, evals: dict[str, dict]) -> dict[str, Any]:
    """The run's `swarm_summary.json`: cumulative reward (swarm and per node) and reward per round."""
    per_round: dict[int, list[float]] = {}
    for node in nodes:
        for record in read_jsonl(node.dir / "metrics.jsonl"):
            if isinstance(record.get("reward/mean"), (int, float)):
                per_round.setdefault(record["step"], []).append(record["reward/mean"])
    rounds = sorted(per_round)
    return {
        "nodes": config.nodes,
        "local": config.local,
        "external": config.external,
        "seed": config.seed,
        "rounds": config.max_steps,
        "samples_per_prompt": config.samples_per_prompt,
        "cumulative_reward": sum(node.cumulative_reward for node in nodes),
        "cumulative_reward_per_node": {node.name: node.cumulative_reward for node in nodes},
        "reward_per_round": [sum(per_round[r]) / len(per_round[r]) for r in rounds],
        "swarm_reward_per_round": [sum(per_round[r]) for r in rounds],
        **evals,
    }


def plot_sim(run_dir: Path, nodes: list[SwarmNode]) -> Path | None:
    """``plots/swarm_reward.png``: each node's cumulative reward over rounds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for node in nodes:
        records = [r for r in map(upgrade, read_jsonl(node.dir / "metrics.jsonl")) if "reward/cumulative" in r]
        if records:
            ax.plot([r["step"] for r in records], [r["reward/cumulative"] for r in records], label=node.name)
    if not ax.lines:
        plt.close(fig)
        return None
    ax.set_xlabel("round")
    ax.set_ylabel("cumulative own reward")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path = run_dir / "plots" / "swarm_reward.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def check_output_dir(config: SwarmConfig) -> None:
    """Fail before any warm start if `output_dir` holds a run that neither resume nor overwrite allows
    (the same rule `common.start_run` applies, checked minutes earlier)."""
    if config.eval_metrics:
        raise ConfigError(
            "eval_metrics is not run by `lmrl swarm sim` (its nodes step in lockstep outside the shared "
            "loop); evaluate a node afterwards: lmrl eval model=<output_dir>/nodes/node-0/final."
        )
    run_dir = Path(config.output_dir)
    rundir.check_writable(run_dir)
    if rundir.has_run(run_dir) and not config.resume and not config.overwrite:
        raise FileExistsError(
            f"output_dir '{run_dir}' already holds a run. Pass resume=true to continue it, overwrite=true "
            f"to replace it, or choose another output_dir=..."
        )


def warm_start_cache(config: SwarmConfig) -> Path:
    return Path(config.warm_start_dir or Path(config.output_dir) / "warm_start")


def warm_start_model(config: SwarmConfig, model: str, model_args: dict, cache_dir: Path) -> str:
    """`model` after `warm_start_steps` of SFT on reference answers of the task mix; returns its path.

    A stand-in for the paper's instruct-tuned starting point (its nodes start from
    Qwen2.5-0.5B-Instruct), so that rewards are not all 0 at round 1. Every node with the
    same model starts from the same warm model. Results are cached in `cache_dir` under a
    hash of the settings, so a resumed run or another configuration reuses them."""
    if config.warm_start_steps == 0:
        return model
    from lmrl.trainers.sft.trainer import SFTConfig, train

    names = list(dict.fromkeys(config.tasks))
    key = {
        "model": model,
        "model_args": model_args,
        "tokenizer": config.tokenizer,
        "tasks": names,
        "task_args": {n: config.task_args.get(n, {}) for n in names},
        "steps": config.warm_start_steps,
        "lr": config.warm_start_lr,
        "rows": config.warm_start_rows,
        "batch_size": config.warm_start_batch_size,
        "seed": config.warm_start_seed,
        "precision": config.precision,
    }
    out = cache_dir / hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    final = out / "sft" / "final"
    if (out / "done.json").exists():
        return str(final)
    out.mkdir(parents=True, exist_ok=True)
    data = out / "data.jsonl"
    with data.open("w") as f:
        for name in names:
            for row in make_rows(
                get_task(name, **config.task_args.get(name, {})),
                config.warm_start_rows,
                "train",
                seed=config.warm_start_seed,
            ):
                f.write(json.dumps({"prompt": row["prompt"], "completion": row["completion"]}) + "\n")
    steps = config.warm_start_steps
    train(
        SFTConfig(
            model=model,
            model_args=dict(model_args),
            tokenizer=config.tokenizer,
            dataset=str(data),
            train_rows=None,
            max_steps=steps,
            batch_size=config.warm_start_batch_size,
            lr=config.warm_start_lr,
            warmup_steps=max(1, steps // 10),
            lr_schedule="cosine",
            max_length=config.max_prompt_tokens + config.max_new_tokens,
            eval_every=0,
            save_every=0,
            log_every=max(1, steps // 10),
            seed=config.warm_start_seed,
            precision=config.precision,
            output_dir=str(out / "sft"),
            overwrite=True,
        )
    )
    (out / "done.json").write_text(json.dumps(key, indent=1))
    return str(final)


def run_sim(config: SwarmConfig) -> dict[str, Any]:
    """Simulate a swarm of `config.nodes` nodes for `config.max_steps` rounds; returns the summary."""
    check_output_dir(config)
    warm: dict[str, str] = {}
    specs = []
    for spec in node_specs(config):  # warm start each distinct model once, before the run's progress display
        key = json.dumps([spec.model, spec.model_args], sort_keys=True)
        if key not in warm:
            warm[key] = warm_start_model(config, spec.model, spec.model_args, warm_start_cache(config))
        if warm[key] != spec.model:
            spec = dataclasses.replace(spec, model=warm[key], model_args={})
        specs.append(spec)
    run = common.start_run(config, f"swarm sim {config.nodes}x I={config.local} J={config.external}")
    tracker = run.tracker
    if run.checkpoint is None:  # a fresh (or overwritten) run: no node state or payloads of an older one
        for name in ("nodes", "hub"):
            shutil.rmtree(run.dir / name, ignore_errors=True)
    hub = make_hub(config, run.dir)
    nodes = [SwarmNode(config, spec, MemoryTransport(hub, spec.name), run.dir / "nodes" / spec.name) for spec in specs]
    sizes = sorted({f"{n.num_parameters / 1e6:.2f}M" for n in nodes})
    tracker.print(
        f"swarm sim: {config.nodes} nodes ({', '.join(sizes)} params), I={config.local} J={config.external}, "
        f"{config.questions} questions x G completions per node and round, tasks {config.tasks}, "
        f"run dir {run.dir}"
    )
    eval_rows = heldout_rows(config)
    evals: dict[str, dict] = {}
    if run.checkpoint:
        evals = common.read_state(run.checkpoint)["trainer"].get("evals", {})
        for node in nodes:
            node.restore(node.dir / "checkpoints" / run.checkpoint.name)
    elif eval_rows:
        evals["initial_eval"] = evaluate_nodes(nodes, eval_rows)
        tracker.log(0, evals["initial_eval"])
    common.write_run_config(run, config)
    for node in nodes:
        truncate_jsonl(node.dir / "metrics.jsonl", run.start_step)
    try:
        for step in range(run.start_step + 1, config.max_steps + 1):
            owns = [node.generate(step, step) for node in nodes]  # everyone samples and publishes ...
            per_node = {
                node.name: node.train(own, step, fetch_rounds(config, step))  # ... then fetches and trains
                for node, own in zip(nodes, owns)
            }
            for node in nodes:
                with (node.dir / "metrics.jsonl").open("a") as f:
                    f.write(json.dumps({"step": step, **_json_safe(per_node[node.name])}) + "\n")
            if step % config.sample_every == 0 or step == 1:
                tracker.log_samples(step, [s for own in owns for s in own.samples[:1]], "one completion per node")
            metrics = swarm_metrics(per_node)
            if config.eval_every and eval_rows and step % config.eval_every == 0 and step != config.max_steps:
                metrics.update(evaluate_nodes(nodes, eval_rows))
            if step % config.log_every == 0 or step == config.max_steps or step == 1:
                tracker.log(step, metrics)
            else:
                tracker.advance(step)
            if common.is_due(step, config.save_every, config.max_steps):
                save_sim(run, step, nodes, config.keep_checkpoints, {"evals": evals})
        if eval_rows:
            evals["final_eval"] = evaluate_nodes(nodes, eval_rows)
            tracker.log(config.max_steps, evals["final_eval"])
        save_sim(run, config.max_steps, nodes, config.keep_checkpoints, {"evals": evals})
        for node in nodes:
            common.save_final(common.Run(node.dir, None, config.max_steps, None), node.model, node.tokenizer)
    finally:
        tracker.close()
    summary = summarize(run.dir, nodes, config, evals)
    (run.dir / "swarm_summary.json").write_text(json.dumps(summary, indent=1))
    plot_sim(run.dir, nodes)
    tracker.print(
        f"swarm cumulative reward {summary['cumulative_reward']:.2f} over {config.nodes} nodes x "
        f"{config.max_steps} rounds; summary {run.dir / 'swarm_summary.json'}"
    )
    return summary

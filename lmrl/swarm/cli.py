"""`lmrl swarm`: decentralized RL with rollout sharing (SAPO, arXiv 2509.08721), simulated or for real.

- ``mode=sim``: N nodes in this process, round by round over an in-memory (or
  folder) hub, on a mix of built-in verifiable tasks; per-node and swarm
  metrics, the cumulative reward, checkpoints and resume.
- ``mode=join``: this process is one node of a real swarm over hivemind (or a
  shared folder, ``transport=file``), restartable from its checkpoints.

Launch::

    lmrl swarm --config swarm/tiny_sim nodes=8 local=4 external=4      # 8 nodes on one CPU
    lmrl swarm mode=join model=runs/sft/final initial_peers=[/ip4/1.2.3.4/tcp/31337/p2p/Qm...]

The method is called "swarm" everywhere (not "SAPO" alone: that name is taken by
Soft Adaptive Policy Optimization).
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import Any

from lmrl.swarm.config import SwarmConfig
from lmrl.swarm.node import SwarmNode
from lmrl.swarm.rounds import NodeSpec, builtin_args, fetch_rounds, heldout_rows, node_seed
from lmrl.swarm.sim import check_output_dir, run_sim, warm_start_cache, warm_start_model
from lmrl.swarm.transport import Transport
from lmrl.trainers import common, loop

ROUND_EPOCH = 1_700_000_000
"""Unix time of round 0 when rounds follow the clock (`round_seconds` > 0), so round numbers stay small."""


def run(config: SwarmConfig) -> dict[str, Any]:
    """`lmrl swarm`: the simulation or one real node, by `config.mode`."""
    return run_sim(config) if config.mode == "sim" else run_join(config)


# ---------------------------------------------------------------------- one real node


def swarm_round(config: SwarmConfig, step: int, now: float | None = None) -> int:
    """The round a node publishes under at `step`: the step itself, or the clock's round
    floor((now - ROUND_EPOCH) / round_seconds) when `round_seconds` > 0."""
    if config.round_seconds <= 0:
        return step
    return max(0, int(((time.time() if now is None else now) - ROUND_EPOCH) // config.round_seconds))


NODE_NAME_FILE = "swarm_node_name"


def default_node_name(run_dir: Path) -> str:
    """transport=file without node_name: a random ``node-<hex>`` kept in the run directory. Two nodes left at the
    default then have two names (one name per seed made two such nodes one peer, each skipping the other's
    entries as its own), and a resumed node keeps its name."""
    path = run_dir / NODE_NAME_FILE
    name = path.read_text().strip() if path.is_file() else ""
    if not name:
        name = f"node-{secrets.token_hex(4)}"
        path.write_text(name + "\n")
    return name


def join_transport(config: SwarmConfig, run_dir: Path) -> Transport:
    """The transport of `lmrl swarm mode=join`: hivemind (identity kept in the run dir) or a shared folder."""
    from lmrl.swarm.memory import FileHub, MemoryTransport

    if config.transport == "file":
        hub = FileHub(config.hub_dir, keep_rounds=config.keep_rounds, max_entry_bytes=config.max_payload_bytes + 1)
        return MemoryTransport(hub, config.node_name or default_node_name(run_dir))
    try:
        from lmrl.swarm.hivemind_transport import HivemindOptions, HivemindTransport
    except ImportError as err:
        raise ValueError(
            f"mode=join transport=hivemind needs hivemind ({err}). Install it with pip install 'lmrl[swarm]' "
            "(hivemind==1.1.12 wheels bundle the p2p daemon), or use transport=file hub_dir=<shared folder>."
        ) from None
    options = HivemindOptions(
        initial_peers=tuple(config.initial_peers),
        host_maddrs=tuple(config.host_maddrs),
        announce_maddrs=tuple(config.announce_maddrs),
        namespace=config.namespace,
        identity_path=config.identity_path or str(run_dir / "swarm.key"),
        max_payload_bytes=config.max_payload_bytes,
    )
    return HivemindTransport(options)


class JoinedNode(loop.MethodDefaults):
    """One node of a real swarm as a method of `lmrl.trainers.loop`: a step is one round (sample, score,
    publish, fetch peers' rollouts, train)."""

    def __init__(self, config: SwarmConfig, node: SwarmNode) -> None:
        self.config, self.node, self.eval_rows = config, node, heldout_rows(config)
        self.model, self.tokenizer = node.model, node.tokenizer
        self.optimizer, self.scheduler = node.optimizer, node.scheduler
        self.last_metrics: dict[str, float] = {}

    def step(self, step: int) -> dict[str, float]:
        r = swarm_round(self.config, step)
        own = self.node.generate(step, r)
        metrics = self.node.train(own, step, fetch_rounds(self.config, r))
        metrics["swarm/round"] = float(r)
        if step % self.config.sample_every == 0 or step == 1:
            self.tracker.log_samples(step, own.samples, "own completions")
        self.last_metrics = metrics
        return metrics

    def describe(self, run: common.Run) -> str:
        config = self.config
        return (
            f"swarm join: {self.node.num_parameters / 1e6:.2f}M params, I={config.local} J={config.external} "
            f"G={config.samples_per_prompt}, run dir {run.dir}"
        )

    def evaluate(self, step: int) -> tuple[dict[str, float], list[dict]]:
        return ({"eval/accuracy": self.node.evaluate(self.eval_rows)} if self.eval_rows else {}), []

    def state_dict(self) -> dict[str, Any]:
        return self.node.state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.node.load_state(state)


def run_join(config: SwarmConfig, transport: Transport | None = None) -> dict[str, float]:
    """One node of a real swarm, `max_steps` rounds; resumable (`resume=true` keeps the peer id and data).
    Returns the last round's metrics and the held-out evaluation (`eval_rows`).

    `transport` replaces the configured one (tests, custom backends)."""
    check_output_dir(config)
    model_args = builtin_args(config.model, config.model_args)
    model = warm_start_model(config, config.model, model_args, warm_start_cache(config))
    run = common.start_run(config, "swarm join")
    try:
        transport = transport or join_transport(config, run.dir)
    except BaseException:
        run.tracker.close()
        raise
    try:
        name = transport.peer_id
        spec = NodeSpec(
            name,
            model,
            model_args if model == config.model else {},
            config.samples_per_prompt,
            node_seed(config.seed, name),
        )
        node = SwarmNode(config, spec, transport, run.dir)
        if hasattr(transport, "visible_maddrs"):
            run.tracker.print(f"swarm node {name}; peers join with initial_peers={transport.visible_maddrs}")
        method = JoinedNode(config, node)
        run.tracker.print(method.describe(run))
        result = loop.run(config, method, run)
    finally:
        transport.close()
    return {**method.last_metrics, **result}

"""`SwarmConfig`: the options of `lmrl swarm` (SAPO, arXiv 2509.08721), shared by the CLI, the nodes and the simulation."""

from __future__ import annotations

import dataclasses
from typing import Literal

from lmrl.config import (
    ConfigError,
    RewardSection,
    SamplingSection,
    TrainConfig,
    check_at_least,
    check_output_dir,
    field,
)
from lmrl.data.tasks import TASKS
from lmrl.data.tasks.reasoning_gym import PREFIX as RG_PREFIX
from lmrl.data.tasks.reasoning_gym import dataset_names
from lmrl.rollout.engines.section import EngineSection

PEER_SAMPLER_NAMES = ("uniform", "first", "max_variance", "per_peer")
"""`lmrl.swarm.sampling.PEER_SAMPLERS`'s names, for the help of `peer_sampling` (that module imports torch; a test
keeps the two equal)."""
DEFAULT_TASKS = ["arithmetic", "countdown", "sorting", "reverse", "count", "linear"]
"""The built-in task mix (6 verifiable families, like the paper's ReasoningGym specialties)."""


@dataclasses.dataclass
class SwarmConfig(SamplingSection, EngineSection, RewardSection, TrainConfig):
    mode: Literal["sim", "join"] = field(
        "sim", "sim: N nodes in this process; join: this process is one node of a real swarm"
    )
    # ---- what every node does each round (SAPO section 2)
    local: int = field(4, "I: own question groups trained on per round")
    external: int = field(4, "J: peers' question groups trained on per round (0: plain GRPO, no sharing used)")
    questions_per_round: int | None = field(
        None, "questions a node samples, answers and shares per round (default: local)"
    )
    samples_per_prompt: int = field(4, "G (the paper's L): completions per question; peers may use other values")
    tasks: list[str] = field(DEFAULT_TASKS, "task mix: each question's task is drawn uniformly (with replacement)")
    task_args: dict = field({}, "per-task generation parameters, e.g. {arithmetic: {digits: 1}}")
    peer_sampling: str = field("uniform", "how the J peers' groups are picked: " + ", ".join(PEER_SAMPLER_NAMES))
    drop_zero_advantage: bool = field(True, "drop groups whose rewards (by this node's verifier) are all equal")
    max_peer_groups: int = field(64, "peers' groups considered per round; beyond it a random subset")
    max_prompt_tokens: int = field(256, "peers' questions longer than this in this node's tokens are dropped")
    max_payload_bytes: int = field(1 << 20, "largest payload published or accepted (the same on every node)")
    # ---- sampling and rewards: lmrl.config.SamplingSection and RewardSection
    rewards: list[str] = field(["task"], "this node's verifier: reward functions (registry names or module:function)")
    # ---- the GRPO update (no KL, asymmetric clip, as in the paper)
    algorithm: Literal["grpo", "dr_grpo", "dapo", "gspo", "cispo", "rloo"] = field(
        "grpo", "group-based policy-gradient method (lmrl rl)"
    )
    clip_low: float = field(0.2, "lower ratio clip (epsilon_low)")
    clip_high: float = field(0.28, "upper ratio clip (epsilon_high)")
    loss_agg: Literal["token_mean", "seq_mean", "seq_sum_norm"] | None = field(
        None, "loss aggregation (default: the algorithm's)"
    )
    adv_scale: Literal["group", "none"] = field(
        "group", "GRPO advantages divided by the group's std, or not (Dr. GRPO)"
    )
    tis_cap: float | None = field(2.0, "truncated importance-sampling cap on own rows (peer rows have weight 1)")
    ppo_epochs: int = field(1, "passes over each round's training set")
    minibatches: int = field(1, "optimizer steps per pass")
    lr: float = field(1e-4, "peak learning rate (AdamW)")
    lr_schedule: Literal["cosine", "linear", "constant"] = field("constant", "decay after warmup")
    warmup_steps: int = field(0, "linear warmup (optimizer steps)")
    max_steps: int = field(100, "rounds to run")
    sample_every: int = field(10, "log num_samples of each node's completions every N rounds")
    eval_rows: int = field(0, "held-out questions per task, greedy pass@1 per node at the start and end (0: off)")
    warm_start_steps: int = field(
        0, "SFT steps on the task mix's reference answers before round 1, per distinct model (0: off)"
    )
    warm_start_dir: str | None = field(
        None, "cache of warm-started models, reused when settings match (default <output_dir>/warm_start)"
    )
    warm_start_seed: int = field(
        0, "warm start: seed of its data and of a built-in model's init (kept fixed across runs)"
    )
    warm_start_lr: float = field(3e-3, "warm start: SFT learning rate (cosine, 10% warmup)")
    warm_start_rows: int = field(1000, "warm start: training questions per task")
    warm_start_batch_size: int = field(32, "warm start: SFT examples per step")
    output_dir: str = field("runs/swarm", "run directory")
    # ---- sim
    nodes: int = field(8, "sim: number of nodes")
    node_models: list[str] = field([], "sim: model of each node, cycled over the nodes (default: model)")
    node_model_args: list[dict] = field([], "sim: model_args of each node, cycled (default: model_args)")
    node_samples_per_prompt: list[int] = field([], "sim: G of each node, cycled (default: samples_per_prompt)")
    hub: Literal["memory", "file"] = field(
        "memory", "sim: where payloads meet: a dict in this process, or files in hub_dir"
    )
    hub_dir: str | None = field(None, "file hub directory (default: <output_dir>/hub)")
    keep_rounds: int = field(4, "rounds a memory/file hub keeps")
    # ---- join
    transport: Literal["hivemind", "file"] = field(
        "hivemind", "join: hivemind DHT, or a folder shared by the nodes (hub_dir)"
    )
    node_name: str | None = field(
        None,
        "join with transport=file: this node's peer id (default: a random node-<hex>, kept in output_dir for resume)",
    )
    initial_peers: list[str] = field([], "join: multiaddrs of running nodes (empty: start a new swarm)")
    host_maddrs: list[str] = field(["/ip4/0.0.0.0/tcp/0"], "join: where to listen (port 0: any free port)")
    announce_maddrs: list[str] = field([], "join: public addresses to announce (behind NAT)")
    identity_path: str | None = field(
        None, "join: libp2p key file, kept so a restart keeps the peer id (default <output_dir>/swarm.key)"
    )
    namespace: str = field("lmrl-swarm", "join: DHT key prefix; one per swarm")
    round_seconds: float = field(
        0.0, "join: 0 = rounds are this node's steps; > 0 = rounds follow the clock (nodes that start late catch up)"
    )
    fetch_window: int = field(0, "also use peers' payloads of this many previous rounds")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.nproc > 1:
            raise ConfigError(
                f"lmrl swarm runs one process per node (got nproc={self.nproc}): every rank would run "
                "the same node. Fix: nproc=1; more nodes: nodes=N (sim) or one `lmrl swarm join` each."
            )
        check_at_least(self, ("local", "external", "fetch_window"), 0)
        check_at_least(
            self,
            (
                "samples_per_prompt",
                "nodes",
                "max_peer_groups",
                "max_prompt_tokens",
                "max_new_tokens",
                "keep_rounds",
                "ppo_epochs",
                "minibatches",
                "max_payload_bytes",
            ),
            1,
        )
        if self.round_seconds < 0 or self.eval_rows < 0 or self.warm_start_steps < 0:
            raise ConfigError("'round_seconds', 'eval_rows' and 'warm_start_steps' must be >= 0.")
        check_at_least(
            self,
            (
                "sample_every",
                "warm_start_rows",
                "warm_start_batch_size",
                "warm_start_lr",
            ),
            0,
            inclusive=False,
        )
        if self.questions < max(self.local, 1):
            raise ConfigError(
                f"questions_per_round={self.questions_per_round} is below local={self.local}: a node trains on "
                "local of the questions it sampled this round, and samples at least one. Raise questions_per_round "
                "or leave it unset (= local)."
            )
        if self.local + self.external == 0:
            raise ConfigError(
                "local + external is 0: a node would never train. Set local=I and external=J (e.g. 4 and 4)."
            )
        if not self.tasks:
            raise ConfigError(f"'tasks' is empty; list built-in tasks from {sorted(TASKS)}.")
        for name in [*self.tasks, *self.task_args]:
            if name.startswith(RG_PREFIX):
                try:
                    dataset_names(name)
                except ValueError as err:
                    raise ConfigError(str(err)) from None
            elif name not in TASKS:
                raise ConfigError(
                    f"'tasks'/'task_args' name unknown task '{name}'. Built-in tasks: {sorted(TASKS)}, or "
                    "rg:<name> for a reasoning-gym dataset."
                )
        from lmrl.swarm.sampling import PEER_SAMPLERS  # here: a config checks without torch (lmrl.cli)

        if self.peer_sampling not in PEER_SAMPLERS.names():
            raise ConfigError(
                f"'peer_sampling' must be one of {list(PEER_SAMPLERS.names())}, got '{self.peer_sampling}'."
            )
        if min([self.samples_per_prompt, *self.node_samples_per_prompt]) < 2:
            raise ConfigError(
                f"{self.algorithm} needs samples_per_prompt >= 2 on every node (node_samples_per_prompt too): its "
                "baseline is the other samples of the same question. Use samples_per_prompt=4."
            )
        if any(g < 1 for g in self.node_samples_per_prompt):
            raise ConfigError(f"'node_samples_per_prompt' entries must be >= 1, got {self.node_samples_per_prompt}.")
        if self.hub_dir:
            check_output_dir(self.hub_dir, "hub_dir")  # a file there: a message, not a raw errno at mkdir
        if self.mode == "join" and self.transport == "file" and not self.hub_dir:
            raise ConfigError("mode=join transport=file needs hub_dir: the folder every node of the swarm shares.")

    @property
    def questions(self) -> int:
        """B: questions sampled per node and round."""
        return self.questions_per_round if self.questions_per_round is not None else max(self.local, 1)

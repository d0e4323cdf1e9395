"""`lmrl selfplay`'s config: the keys of Language Self-Play (`lmrl.trainers.selfplay.trainer`).

Sampling of both roles (`DecodingSection`: temperature, top_p, top_k), rewards (`RewardSection`), model,
optimizer and run keys come from the shared sections of `lmrl.config`; the keys below are self-play's own.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from typing import Literal

from lmrl.config import ConfigError, DecodingSection, RewardSection, TrainConfig, check_at_least, field
from lmrl.rollout.engines.section import EngineSection
from lmrl.trainers.selfplay.env import QUERY_CHECKERS


@dataclasses.dataclass
class SelfPlayConfig(DecodingSection, EngineSection, RewardSection, TrainConfig):
    variant: Literal["lsp_zero", "lsp"] = field(
        "lsp", "lsp_zero: zero-sum game on R; lsp: both roles also get the reference model's quality score R_Q"
    )
    task: str = field("", "challenger prompt parameter {task} (empty: None, general instruction following)")
    template: str = field(
        "", "challenger prompt parameter {template}: the form of a query, {} marks a slot (empty: None)"
    )
    challenger_prompt: str = field(
        "lsp", "'lsp' (the paper's Box 1, paraphrased), 'short' (one line), or your own text with {task}/{template}"
    )
    verifier: Literal["none", "arithmetic"] = field(
        "none", "none: any non-empty query; arithmetic: a query must be a problem like 12+34=, its answer is computed"
    )
    query_args: dict = field(
        {}, "limits of a verifiable query (arithmetic: max_digits, max_operands, ops, negative, prefix)"
    )
    rewards: list[str] = field([], "R(q, a): reward specs (a reward model, 'task' with a verifier, module:function)")
    queries_per_step: int = field(8, "N: queries the Challenger writes per step (paper: 8)")
    answers_per_query: int = field(4, "G: Solver answers per query (not given in the paper)")
    challenger_max_new_tokens: int = field(64, "query length cap in tokens")
    solver_max_new_tokens: int = field(128, "answer length cap in tokens")
    challenger_coef: float = field(1.0, "alpha_Ch: weight of the Challenger loss (not given in the paper)")
    kl_coef: float = field(0.05, "beta: weight of the per-token KL to the frozen reference, both roles (paper: 0.05)")
    kl_estimator: Literal["k1", "k2", "k3"] = field("k3", "per-token KL estimator (k3: TRL's)")
    solver_baseline: Literal["total", "task"] = field(
        "total", "Solver baseline: mean of r+R_Q (total) or of r only (task)"
    )
    adv_scale: Literal["none", "std"] = field(
        "none", "none (paper); std: divide by the group std (Solver) and batch std (Challenger)"
    )
    loss_agg: Literal["token_mean", "seq_mean", "seq_sum_norm"] = field(
        "token_mean", "loss aggregation within each role"
    )
    tis_cap: float | None = field(2.0, "truncated importance-sampling cap on pi_learner/pi_sampler (null: off)")
    malformed_reward: float = field(-1.0, "Challenger reward of a malformed query (a valid one earns -V(q) [+V_Q(q)])")
    self_reward_weight: float = field(1.0, "lsp: R_Q is multiplied by this before it is added (paper: 1)")
    self_reward_fallback: float = field(0.0, "lsp: R_Q of a judgement without a parseable <Score> (counted and logged)")
    judge_prompt: str = field(
        "lsp", "lsp: the paper's 7-point prompt (Box 3, paraphrased), or your text with {instruction}/{response}"
    )
    judge_max_new_tokens: int = field(256, "lsp: length cap of the judge's reasoning and score")
    warm_start_steps: int = field(0, "SFT steps on both roles' formats before self-play (0: none; for built-in models)")
    warm_start_dataset: str = field(
        "task:arithmetic", "built-in task whose train rows teach the formats: prompt = problem, completion = answer"
    )
    warm_start_task_args: list[dict] = field([{}], "one task_args dict per problem family mixed into the warm start")
    warm_start_rows: int = field(2000, "rows per problem family")
    warm_start_lr: float = field(3e-3, "warm-start peak lr (cosine)")
    warm_start_batch_size: int = field(64, "warm-start examples per step")
    eval_dataset: str | None = field(
        None, "held-out Solver accuracy: a built-in task (test split), e.g. task:arithmetic"
    )
    eval_task_args: dict = field({}, "task_args of eval_dataset")
    eval_rows: int = field(200, "held-out problems")
    lr: float = field(3e-6, "peak learning rate (paper: 3e-6 for a 3B model)")
    warmup_steps: int = field(0, "linear warmup (optimizer steps)")
    lr_schedule: Literal["cosine", "linear", "constant"] = field("constant", "decay after warmup")
    sample_every: int = field(10, "log num_samples queries with their answers and rewards every N steps")
    output_dir: str = field("runs/selfplay", "run directory")
    sampled_key = "queries_per_step"  # what sampling_shards divide (`lmrl.parallel.config.check_world`)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.warm_start_steps and self.processes > 1:
            raise ConfigError(
                "The warm start runs in one process: run it with nproc=1 max_steps=1, then self-play "
                "from its saved policy with model=<that run>/reference warm_start_steps=0 nproc=N."
            )
        check_at_least(
            self,
            (
                "queries_per_step",
                "answers_per_query",
                "challenger_max_new_tokens",
                "solver_max_new_tokens",
                "judge_max_new_tokens",
                "warm_start_batch_size",
                "sample_every",
            ),
            1,
        )
        check_at_least(self, ("kl_coef", "challenger_coef", "warm_start_steps", "self_reward_weight"), 0)
        if not self.rewards:
            raise ConfigError(
                "selfplay needs R(q, a): set rewards=[...] (a reward model, a 'module.path:function'), "
                "or verifier=arithmetic with rewards=[task] for the verifiable variant."
            )
        if "task" in self.rewards and self.verifier == "none":
            raise ConfigError(
                "The 'task' reward needs each query's true answer, which only a verifier computes: "
                "set verifier=arithmetic, or use another reward (e.g. a reward model)."
            )
        if self.adv_scale == "std" and (self.answers_per_query < 2 or self.queries_per_step < 2):
            raise ConfigError(
                "adv_scale=std needs answers_per_query >= 2 and queries_per_step >= 2 "
                "(the std of one value is undefined)."
            )
        placeholders = set(re.findall(r"\{\w+\}", self.judge_prompt))
        if self.judge_prompt != "lsp" and not {"{instruction}", "{response}"} <= placeholders:
            raise ConfigError("judge_prompt must be 'lsp' or a text containing {instruction} and {response}.")
        try:
            inspect.signature(QUERY_CHECKERS[self.verifier]).bind("query", **self.query_args)
        except TypeError as exc:
            raise ConfigError(
                f"query_args {self.query_args} do not fit verifier={self.verifier}: {exc}. Its options: "
                f"{list(inspect.signature(QUERY_CHECKERS[self.verifier]).parameters)[1:]}."
            ) from exc

    def held_out_dataset(self) -> str | None:
        """The Solver's held-out task (``eval_dataset``), which eval_metrics fall back on."""
        return self.eval_dataset

"""Metric names before the namespaces of ``docs/metrics.md``, and their current names: runs written earlier still
read (``lmrl report``, ``lmrl dashboard``, ``keep_best``, configs that name a metric).

Every metric is named ``<namespace>/<name>``: ``loss/``, ``policy/``, ``value/``, ``update/``, ``optim/``,
``rollout/``, ``reward/``, ``time/``, ``eval/`` and a method's own (``avatarl/``, ``challenger/``, ``solver/``,
``label/``, ``rs/``, ``swarm/``, ``warm_start/``). ``initial/<name>`` (the evaluation before training, in a run's
results) and ``node/<node>/<name>`` (a swarm simulation's nodes) wrap a current name. Imports nothing of lmrl, so any
module may use it.
"""

from __future__ import annotations

RENAMED = {
    # optimisation
    "grad_norm": "optim/grad_norm",
    "kl_coef": "optim/kl_coef",
    "entropy_coef": "optim/entropy_coef",
    # losses
    "train/ce": "loss/ce",
    "train/kl_forward": "loss/kl_forward",
    "train/kl_reverse": "loss/kl_reverse",
    # the trained model on the step's batch
    "clip_frac": "policy/clip_frac",
    "clip_frac_lower": "policy/clip_frac_lower",
    "approx_kl": "policy/approx_kl",
    "ratio/mean": "policy/ratio_mean",
    "ratio/max": "policy/ratio_max",
    "seq_ratio/mean": "policy/seq_ratio_mean",
    "seq_ratio/max": "policy/seq_ratio_max",
    "entropy/trained_frac": "policy/entropy_trained_frac",
    "sampler_logp_gap": "policy/sampler_logp_gap",
    "sampler_logp_gap_alarm": "policy/sampler_logp_gap_alarm",
    "tis/weight_mean": "policy/tis_weight_mean",
    "tis/weight_max": "policy/tis_weight_max",
    "tis/clip_frac": "policy/tis_clip_frac",
    "tis/masked_frac": "policy/tis_masked_frac",
    "offpolicy/masked_frac": "policy/offpolicy_masked_frac",
    "accuracy": "policy/accuracy",
    "margin": "policy/margin",
    "kl_ref": "policy/kl_ref",
    "rewards/chosen": "policy/reward_chosen",
    "rewards/rejected": "policy/reward_rejected",
    "rewards/margin": "policy/reward_margin",
    "rewards/accuracy": "policy/reward_accuracy",
    "logps/chosen": "policy/logp_chosen",
    "logps/rejected": "policy/logp_rejected",
    "vf_clip_frac": "value/clip_frac",
    # how the update's training forwards ran
    "train/skipped_rows_frac": "update/skipped_rows_frac",
    "train/reused_sampling_forward": "update/reused_sampling_forward",
    "train/shared_prompts": "update/shared_prompts",
    "train/chunked_head": "update/chunked_head",
    "train/packed": "update/packed",
    # rollouts
    "completion/truncated_frac": "rollout/truncated_frac",
    "groups/zero_variance_frac": "rollout/zero_variance_frac",
    "groups/refill_batches": "rollout/refill_batches",
    "groups/kept_frac": "rollout/refill_kept_frac",
    "groups/filled_frac": "rollout/refill_filled_frac",
    "async/staleness": "rollout/staleness",
    "async/staleness_mean": "rollout/staleness_mean",
    "async/stale_rows_frac": "rollout/stale_rows_frac",
    "async/worker_restarts": "rollout/worker_restarts",
    "curriculum/skipped": "rollout/curriculum_skipped",
    "curriculum/sitting_out": "rollout/curriculum_sitting_out",
    "on_policy/rows": "rollout/on_policy_rows",
    "on_policy/completion_len": "completion_len/mean",
    # rewards, time, held-out evaluation
    "cumulative_reward": "reward/cumulative",
    "self_reward/parse_failures_total": "reward/self_reward/parse_failures_total",
    "tokens": "time/tokens",
    "val/ce": "eval/ce",
    "val/ppl": "eval/ppl",
    "val/entropy": "eval/entropy",
    "critic/val_ce": "eval/critic_ce",
    "teacher/eval_accuracy": "eval/teacher_accuracy",
    "eval/rewards/chosen": "eval/reward_chosen",
    "eval/rewards/rejected": "eval/reward_rejected",
    "eval/rewards/margin": "eval/reward_margin",
    "eval/rewards/accuracy": "eval/reward_accuracy",
    "eval/logps/chosen": "eval/logp_chosen",
    "eval/logps/rejected": "eval/logp_rejected",
    # self-play's roles: the policy statistics without their namespace
    **{
        f"{role}/{old}": f"{role}/{old.replace('/', '_')}"
        for role in ("challenger", "solver")
        for old in ("ratio/mean", "ratio/max", "tis/weight_mean", "tis/weight_max", "tis/clip_frac", "tis/masked_frac")
    },
}
"""Old name -> current name, for the names that changed one by one."""

RENAMED_PREFIXES = (
    ("rewards/", "reward/"),  # each reward function: reward/<fn>/mean
    ("eval/rewards/", "eval/reward/"),
    ("evals/", "eval/metrics/"),  # eval_metrics=[...] at each evaluation
    ("tools/", "rollout/tools/"),  # multi-turn rollouts
    ("episode/", "rollout/"),
    ("groups/", "swarm/groups/"),  # the swarm's groups (RL's groups/* are in RENAMED)
)
"""Old prefix -> current prefix, for the names RENAMED does not list."""

WRAPPERS = ("initial/",)
"""Prefixes around a metric name: the evaluation before training."""


def current_name(name: str) -> str:
    """The current name of a metric named ``name`` in an earlier run (a current name is returned as it is)."""
    for wrapper in WRAPPERS:
        if name.startswith(wrapper):
            return wrapper + current_name(name[len(wrapper) :])
    if name.startswith("node/") and name.count("/") >= 2:  # node/<node>/<name>
        _, node, rest = name.split("/", 2)
        return f"node/{node}/{current_name(rest)}"
    if name in RENAMED:
        return RENAMED[name]
    for old, new in RENAMED_PREFIXES:
        if name.startswith(old):
            return new + name[len(old) :]
    return name


def upgrade(record: dict) -> dict:
    """A metrics.jsonl record with current names; where an old and a current name meet, the current one is kept."""
    out: dict = {}
    for key, value in record.items():
        name = current_name(key)
        if name not in out or name == key:
            out[name] = value
    return out


def configured_metric(name: str, key: str) -> str:
    """A metric a user's config names (``keep_best``, a stop threshold) under its current name; an old name works,
    with a note to update the config."""
    new = current_name(name)
    if new != name:
        import warnings

        warnings.warn(
            f"{key}={name!r}: metrics are now named {new!r} (docs/metrics.md); the old name still works, "
            f"but set {key}={new!r}.",
            FutureWarning,
            stacklevel=2,
        )
    return new

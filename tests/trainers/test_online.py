"""Online RL trainers: every algorithm moves every trained parameter and learns a trivial task."""

import pytest
import torch

from lmrl.config import ConfigError, load_config
from lmrl.tracking import read_jsonl
from lmrl.trainers.rl import trainer as online
from tests.helpers import RL_RUN, RL_SMOKE, TINY, digit_fraction, register_once
from tests.rounding import assert_trained_alike


def failing(prompts, completions, **kwargs):
    raise RuntimeError("boom")


register_once("test_digit_fraction", digit_fraction)
register_once("test_failing", failing)


def rl_config(tmp_path, algorithm, *overrides):
    return load_config(
        online.RLConfig,
        None,
        [
            f"algorithm={algorithm}",
            f"output_dir={tmp_path / algorithm}",
            "precision=fp32",
            *TINY,
            *RL_RUN,
            "rewards=[test_digit_fraction]",
            "eval_every=0",
            "save_every=0",
            "log_every=1",
            "lr=1e-2",
            "sample_every=100",
            *overrides,
        ],
    )


@pytest.mark.parametrize("algorithm", list(online.ALGORITHMS))
def test_every_algorithm_updates_every_parameter(tmp_path, algorithm, monkeypatch):
    seen = {}
    real_update = online.update

    def spy(parts, *args, **kwargs):
        before = {n: p.detach().clone() for n, p in parts.model.named_parameters()}
        stats = real_update(parts, *args, **kwargs)
        seen["unchanged"] = [n for n, p in parts.model.named_parameters() if torch.equal(p, before[n])]
        return stats

    monkeypatch.setattr(online, "update", spy)
    online.train(rl_config(tmp_path, algorithm, "max_steps=1", "ppo_epochs=2", "minibatches=2", "dynamic_sampling=off"))
    assert seen["unchanged"] == [], f"{algorithm}: parameters not updated: {seen['unchanged']}"


# ~30-80 s each on 2 shared cores: the default suite shows grpo, gspo, rloo and cispo learning, `make test-all` every one
SLOW_TO_LEARN = {"ppo", "dapo", "dr_grpo", "reinforce"}


@pytest.mark.parametrize(
    "algorithm", [pytest.param(a, marks=pytest.mark.slow) if a in SLOW_TO_LEARN else a for a in online.ALGORITHMS]
)
def test_every_algorithm_learns_a_trivial_task(tmp_path, algorithm):
    # gspo's default clip (3e-4/4e-4) is for long sequences; a higher lr/clip keeps this test short
    extra = ["clip_low=0.2", "clip_high=0.2"] if algorithm == "gspo" else []
    config = rl_config(tmp_path, algorithm, "max_steps=20", *extra)
    online.train(config)
    rewards = [r["reward/mean"] for r in read_jsonl(tmp_path / algorithm / "metrics.jsonl") if "reward/mean" in r]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.1, f"{algorithm}: reward {first:.3f} -> {last:.3f}"


def test_ppo_with_kl_logs_kl_and_value_loss(tmp_path):
    online.train(rl_config(tmp_path, "ppo", "max_steps=2", "kl_coef=0.05"))
    record = read_jsonl(tmp_path / "ppo" / "metrics.jsonl")[-2]
    assert {"kl", "loss/value", "loss/policy", "value/clip_frac"} <= set(record)


def test_grpo_kl_in_loss_is_logged(tmp_path):
    online.train(rl_config(tmp_path, "grpo", "max_steps=2", "kl_coef=0.1"))
    assert "kl" in read_jsonl(tmp_path / "grpo" / "metrics.jsonl")[-2]


@pytest.mark.parametrize("algorithm", ["grpo", "rloo", "dr_grpo", "dapo", "gspo", "cispo"])
def test_group_baselines_with_one_sample_per_prompt_are_refused_at_start_up(tmp_path, algorithm):
    with pytest.raises(ConfigError, match=f"{algorithm} needs samples_per_prompt >= 2"):
        rl_config(tmp_path, algorithm, "samples_per_prompt=1")


@pytest.mark.parametrize("algorithm", ["reinforce", "ppo"])
def test_batch_baselines_accept_one_sample_per_prompt(tmp_path, algorithm):
    assert rl_config(tmp_path, algorithm, "samples_per_prompt=1").samples_per_prompt == 1


def test_failing_reward_skips_the_step_and_names_the_function(tmp_path, capsys):
    from lmrl.trainers.common import TrainingStopped

    with pytest.raises(TrainingStopped, match="every one of the 2 steps"):  # nothing trained: no final/
        online.train(rl_config(tmp_path, "grpo", "max_steps=2", "rewards=[test_failing]"))
    out = capsys.readouterr().out
    assert "step 1 skipped" in out and "test_failing" in out and "boom" in out
    records = read_jsonl(tmp_path / "grpo" / "metrics.jsonl")
    assert [r["reward/errors"] for r in records if "reward/errors" in r] == [1.0, 2.0]


def test_failing_reward_stops_when_asked(tmp_path):
    from lmrl.rewards import RewardError

    with pytest.raises(RewardError, match="test_failing"):
        online.train(rl_config(tmp_path, "grpo", "max_steps=2", "rewards=[test_failing]", "on_reward_error=stop"))


def test_a_reward_that_always_fails_stops_the_run_after_max_skipped_steps(tmp_path):
    from lmrl import cli

    args = [
        "rl",
        f"output_dir={tmp_path / 'run'}",
        "precision=fp32",
        *TINY,
        *RL_SMOKE,
        "rewards=[test_failing]",
        "eval_every=0",
        "max_steps=12",
    ]  # the default max_skipped_steps: 10
    assert cli.main(args) != 0  # main: exit 0 and a "trained" model after 0 updates
    records = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert max(r["step"] for r in records) < 10 and not (tmp_path / "run" / "final").exists()


def digits_on_additions(prompts, completions, **kwargs):
    """Digit share on '+' problems, a constant 1 on the others: their groups have zero reward variance."""
    return [
        sum(c.isdigit() for c in text) / max(1, len(text)) if "+" in p else 1.0 for p, text in zip(prompts, completions)
    ]


register_once("test_digits_on_additions", digits_on_additions)


@pytest.mark.portable
@pytest.mark.parametrize("algorithm", ["grpo", "rloo", pytest.param("gspo", marks=pytest.mark.slow)])
def test_shared_prompts_and_skipped_zero_advantage_rows_change_nothing(tmp_path, algorithm):
    from lmrl.models import load_model

    finals, skipped = [], []
    for fast in ("true", "false"):
        out = tmp_path / fast
        online.train(
            rl_config(
                tmp_path,
                algorithm,
                "max_steps=3",
                "ppo_epochs=2",
                "minibatches=2",
                "rewards=[test_digits_on_additions]",
                "task_args.ops=+-",
                f"output_dir={out}",
                f"share_prompts={fast}",
                f"skip_zero_advantage={fast}",
                "adam_eps=1.0",  # AdamW linear in the gradient: rounding stays rounding (tests/rounding.py)
            )
        )
        finals.append(dict(load_model(str(out / "final")).named_parameters()))
        skipped.append([r.get("update/skipped_rows_frac", 0.0) for r in read_jsonl(out / "metrics.jsonl")])
    assert max(skipped[0]) > 0 and max(skipped[1]) == 0  # the fast run really skipped rows
    records = [r for r in read_jsonl(tmp_path / "true" / "metrics.jsonl") if "policy/ratio_mean" in r]
    # statistics average over the trained rows: on-policy, the first epoch's ratios are exactly 1
    assert all(r["policy/ratio_max"] >= 1.0 - 1e-6 and r["policy/ratio_mean"] > 0.9 for r in records)
    assert_trained_alike(finals[0], finals[1])


@pytest.mark.portable
@pytest.mark.parametrize(
    "lora",
    [[], pytest.param(["lora_r=4", "lora_alpha=8", "merge_lora=true"], marks=pytest.mark.slow)],
    ids=["full", "lora"],
)
def test_reusing_the_sampling_forward_gives_the_same_training(tmp_path, monkeypatch, lora):
    import contextlib

    import lmrl.models.forward_plan as logprobs
    from lmrl.models import load_model

    counts, real = [], logprobs.replaying

    @contextlib.contextmanager
    def spy(*args, **kwargs):
        with real(*args, **kwargs) as seen:
            yield seen
        counts.append(dict(seen))

    monkeypatch.setattr(logprobs, "replaying", spy)
    finals = []
    for reuse in ("true", "false"):
        out = tmp_path / reuse
        online.train(
            rl_config(
                tmp_path,
                "grpo",
                "max_steps=3",
                "skip_zero_advantage=false",
                f"output_dir={out}",
                f"reuse_sampling_forward={reuse}",
                "adam_eps=1.0",  # AdamW linear in the gradient: rounding stays rounding (tests/rounding.py)
                *lora,
            )
        )
        finals.append(dict(load_model(str(out / "final")).named_parameters()))
    assert len(counts) == 6, counts  # one shared-prompt training forward per step and run: none silently skipped
    reused, recomputed = counts[:3], counts[3:]
    assert all(c["replayed"] > 0 and c["computed"] == 0 for c in reused), reused  # every layer, every step
    assert all(c["replayed"] == 0 for c in recomputed)
    for reuse, expected in (("true", 1.0), ("false", 0.0)):  # the metrics are the counts, not the settings
        rows = [r for r in read_jsonl(tmp_path / reuse / "metrics.jsonl") if "update/shared_prompts" in r]
        assert len(rows) == 3 and all(r["update/shared_prompts"] == 1.0 for r in rows), rows
        assert all(r["update/reused_sampling_forward"] == expected for r in rows), rows
        skipped = [r["update/backward_rows_skipped"] for r in rows]  # the padding after early stops, not multiplied
        assert all(0 < s < 1 for s in skipped) if reuse == "true" else skipped == [0.0] * 3, skipped
    # fp32: the two forwards differ by rounding (~1e-6 in log-probs), the weights after 3 steps by rounding of their
    # scale (a wrong replay, e.g. of other rows' outputs, moves them by a step's gradient)
    assert_trained_alike(finals[0], finals[1])


def test_the_sampling_forward_is_reused_by_default_on_a_cpu_and_not_on_a_gpu(tmp_path):
    """reuse_sampling_forward=null (default): the record is kept where the engine samples on a CPU; on a GPU it held
    15 GB and slowed sampling (docs/gpu.md). An explicit true or false holds on either device."""
    from lmrl.models import load_model
    from lmrl.models.forward_plan import ForwardPlan
    from lmrl.models.memory import enable_gradient_checkpointing
    from lmrl.trainers.update import forward_options

    config = rl_config(tmp_path, "grpo", "max_steps=2", "skip_zero_advantage=false")
    assert config.reuse_sampling_forward is None
    model = load_model("builtin:tiny").eval()

    def records(config, device: str) -> bool:
        plan = ForwardPlan.resolve(model, forward_options(config, None), device)
        return plan.recorder is not None

    assert records(config, "cpu") and not records(config, "cuda")
    for reuse in (True, False):
        options = load_config(online.RLConfig, None, [f"reuse_sampling_forward={reuse}"])
        assert records(options, "cpu") is reuse and records(options, "cuda") is reuse
    enable_gradient_checkpointing(model)
    assert not records(config, "cpu")  # nothing could replay it: the shared-prompt forward is off
    online.train(config)  # the default on this CPU: every training forward replays the record
    rows = [r for r in read_jsonl(tmp_path / "grpo" / "metrics.jsonl") if "update/reused_sampling_forward" in r]
    assert len(rows) == 2 and all(r["update/reused_sampling_forward"] == 1.0 for r in rows), rows

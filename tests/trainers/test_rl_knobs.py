"""The algorithm knobs of `lmrl rl` reach the update: dual/two-sided clip, entropy bonus and top-entropy tokens,
adaptive entropy and KL coefficients (exact on resume), overlong filtering and REINFORCE++."""

import pytest
import torch
from safetensors.torch import load_file

from lmrl.config import ConfigError
from lmrl.models.forward_plan import ForwardPlan
from lmrl.numerics import agreement, rounding_bound
from lmrl.tracking import read_jsonl
from lmrl.trainers import update as rl_update
from lmrl.trainers.rl import trainer as online
from tests.helpers import register_once
from tests.rounding import assert_trained_alike
from tests.trainers.test_online import rl_config


def constant(prompts, completions, **kwargs):
    return [0.5 for _ in completions]


register_once("test_constant", constant)


def test_update_options_carry_the_knobs_to_the_loss(tmp_path):
    config = rl_config(
        tmp_path, "grpo", "clip_ratio_c=3.0", "clip_delta=4.0", "entropy_coef=0.01", "top_entropy_quantile=0.2"
    )
    options = rl_update.UpdateOptions.from_config(config, ForwardPlan())
    assert {k: options.loss.options[k] for k in ("clip_ratio_c", "clip_delta", "entropy_coef")} == {
        "clip_ratio_c": 3.0,
        "clip_delta": 4.0,
        "entropy_coef": 0.01,
    }
    assert options.top_entropy_quantile == 0.2 and options.entropy_in_loss
    # the entropy bonus has a gradient on every row: no row may be skipped for its zero advantage
    assert rl_update.zero_gradient_rows(torch.zeros(4), options, has_value_model=False) is None
    plain = rl_update.UpdateOptions.from_config(rl_config(tmp_path, "grpo"), ForwardPlan())
    assert not {"clip_ratio_c", "clip_delta", "entropy_coef"} & set(plain.loss.options)
    assert plain.top_entropy_quantile == 1.0 and not plain.entropy_in_loss


def test_adaptive_coefficients_replace_the_losss_own():
    options = rl_update.UpdateOptions(
        rl_update.LossSpec("ppo", {"agg": "token_mean", "kl_coef": 0.1, "entropy_coef": 0.0})
    )
    coefs = rl_update.Coefficients(kl_coef=0.2, entropy_coef=0.03)
    assert options.with_coefficients(coefs).loss.options == {"agg": "token_mean", "kl_coef": 0.2, "entropy_coef": 0.03}
    no_kl = rl_update.UpdateOptions(rl_update.LossSpec("ppo", {"agg": "token_mean"}))
    assert no_kl.with_coefficients(coefs).loss.options == {"agg": "token_mean"}  # PPO: KL in the reward


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["algorithm=gspo", "clip_ratio_c=3.0"], "'gspo' loss, which has no such option"),
        (["algorithm=cispo", "clip_delta=4.0"], "'cispo' loss, which has no such option"),
        (["top_entropy_quantile=0"], "top_entropy_quantile"),
        (["kl_target=0.1"], "kl_coef > 0"),
        (["entropy_coef=-0.1"], "entropy_coef"),
        (["entropy_target=0"], "entropy_target"),
    ],
)
def test_bad_knobs_are_refused_at_start_up(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        rl_config(tmp_path, "grpo", *overrides)


def test_reinforce_pp_takes_one_sample_per_prompt(tmp_path):
    config = rl_config(tmp_path, "reinforce_pp", "samples_per_prompt=1")
    assert config.advantage == "reinforce_pp" and config.preset.loss == "ppo"


@pytest.mark.parametrize("mask_truncated", [False, True])
def test_mask_truncated_gives_truncated_completions_loss_mask_zero(tmp_path, monkeypatch, mask_truncated):
    seen = {}
    real_update = online.update

    def spy(parts, batch, *args, **kwargs):
        seen["truncated"], seen["mask"] = batch.truncated.clone(), batch.train_mask.clone()
        return real_update(parts, batch, *args, **kwargs)

    monkeypatch.setattr(online, "update", spy)
    online.train(rl_config(tmp_path, "grpo", "max_steps=1", "max_new_tokens=3", f"mask_truncated={mask_truncated}"))
    truncated, per_row = seen["truncated"], seen["mask"].sum(dim=1)
    assert truncated.any()  # a random tiny model rarely stops within 3 tokens
    assert bool((per_row[truncated] == 0).all()) is mask_truncated
    assert bool((per_row[~truncated] > 0).all())


def test_entropy_bonus_has_a_gradient_when_every_advantage_is_zero(tmp_path):
    # constant rewards: every advantage is 0, so the policy loss alone has gradient 0; the bonus does not
    grad_norms = {}
    for coef in ("0.0", "0.1"):
        out = tmp_path / coef
        online.train(
            rl_config(
                tmp_path, "grpo", "max_steps=1", "rewards=[test_constant]", f"entropy_coef={coef}", f"output_dir={out}"
            )
        )
        record = next(r for r in read_jsonl(out / "metrics.jsonl") if "optim/grad_norm" in r)
        grad_norms[coef] = record["optim/grad_norm"]
        assert ("loss/entropy" in record) is (coef == "0.1")
    assert grad_norms["0.0"] == 0.0 and grad_norms["0.1"] > 0.0


def test_top_entropy_quantile_trains_that_share_of_the_tokens(tmp_path):
    online.train(rl_config(tmp_path, "grpo", "max_steps=2", "top_entropy_quantile=0.25", "skip_zero_advantage=false"))
    fracs = [
        r["policy/entropy_trained_frac"]
        for r in read_jsonl(tmp_path / "grpo" / "metrics.jsonl")
        if "policy/entropy_trained_frac" in r
    ]
    assert len(fracs) == 2 and all(0.2 <= f <= 0.35 for f in fracs), fracs


def test_adaptive_entropy_and_kl_coefficients_move_each_step_and_resume_exactly(tmp_path):
    # entropy far below the target 100: entropy_coef rises by 0.01 a step from 0; at step 1 the policy is the
    # reference (KL ~ 0): kl_coef = 0.05 * (1 - 0.2 * 16 completions / 16) = 0.04
    args = [
        "entropy_coef=0",
        "entropy_target=100",
        "entropy_coef_step=0.01",
        "kl_coef=0.05",
        "kl_target=0.001",
        "kl_horizon=16",
        "save_every=2",
        "keep_checkpoints=5",
    ]
    online.train(rl_config(tmp_path / "full", "grpo", *args, "max_steps=4"))
    online.train(rl_config(tmp_path / "half", "grpo", *args, "max_steps=2"))
    online.train(rl_config(tmp_path / "half", "grpo", *args, "max_steps=4", "resume=true"))
    full, half = (
        {r["step"]: r for r in read_jsonl(tmp_path / d / "grpo" / "metrics.jsonl") if "optim/entropy_coef" in r}
        for d in ("full", "half")
    )
    assert [full[s]["optim/entropy_coef"] for s in (1, 2, 3, 4)] == pytest.approx([0.01, 0.02, 0.03, 0.04])
    assert full[1]["optim/kl_coef"] == pytest.approx(0.04)
    for step in (3, 4):
        for key in ("optim/entropy_coef", "optim/kl_coef", "loss/policy", "kl"):
            assert half[step][key] == full[step][key], (step, key)


def test_the_reward_section_reaches_every_sampling_trainers_reward_set(tmp_path):
    """reward_workers and reward_normalize are not only accepted: the RL method's RewardSet runs with them."""
    from lmrl.models.setup import ModelSetup

    config = rl_config(tmp_path, "grpo", "reward_workers=2", "reward_normalize=true")
    method = online.OnlineRL(config, ModelSetup.from_config(config))
    assert method.parts.reward_set.reward_workers == 2 and method.parts.reward_set.reward_normalize


@pytest.mark.portable
def test_packed_training_forwards_train_like_padded_ones(tmp_path):
    """Packed and padded rows are the same algebra in another float order. The bound is measured, not a constant: the
    padded run again with grad_accum=2 (the same sums split differently) gives the spread rounding alone makes on this
    CPU; packing may differ from padding by a margin times that. adam_eps=1 keeps the update linear in the gradient
    (lr * m / (sqrt(v) + 1)), so AdamW does not blow a near-zero gradient's rounding up to a full step of lr (the 1e-4
    once measured on an AMD EPYC at lr 1e-2)."""
    final = {}
    runs = (
        ("padded", ["share_prompts=false"]),
        ("padded_again", ["share_prompts=false", "grad_accum=2"]),
        ("packed", ["max_tokens_per_microbatch=64"]),
    )
    for name, extra in runs:  # 16 rows of ~25-28 tokens into 64-token packed sequences: several per forward
        online.train(
            rl_config(
                tmp_path, "grpo", "max_steps=2", "kl_coef=0.05", "adam_eps=1.0", f"output_dir={tmp_path / name}", *extra
            )
        )
        final[name] = load_file(tmp_path / name / "final" / "model.safetensors")
        records = [r for r in read_jsonl(tmp_path / name / "metrics.jsonl") if "update/packed" in r]
        assert [r["update/packed"] for r in records] == [float(name == "packed")] * 2  # measured, not the setting
    flat = {name: torch.cat([w.flatten() for w in weights.values()]) for name, weights in final.items()}
    bound = rounding_bound(flat["padded"], [flat["padded_again"]], dtype=torch.float32, floor_ulps=8)
    outcome = agreement(flat["packed"], flat["padded"], bound)
    assert outcome, str(outcome)


def test_packed_micro_batches_hold_whole_rows_within_the_budget():
    from lmrl.rollout.types import RolloutBatch  # noqa: F401 - the layout micro_batches reads

    class Rows:  # the one field micro_batches reads: each row's real tokens
        attention_mask = torch.tensor([[1] * n + [0] * (10 - n) for n in (10, 4, 6, 3, 7, 2)])

        def __len__(self):
            return 6

    options = rl_update.UpdateOptions(rl_update.LossSpec("ppo", {"agg": "token_mean"}), max_tokens=10)
    micros = [(m.tolist(), w) for m, _, w in rl_update.micro_batches(Rows(), torch.arange(6), None, options, {})]
    # first-fit-decreasing: 10 | 7+3 | 6+4 | 2
    assert micros == [([0], 1.0), ([3, 4], 1.0), ([1, 2], 1.0), ([5], 1.0)]


def test_grad_accum_parts_hold_rows_of_similar_lengths():
    class Rows:  # the field micro_batches reads for grad_accum: each row's completion length
        completion_lengths = torch.tensor([10, 4, 6, 3, 7, 2])

        def __len__(self):
            return 6

    options = rl_update.UpdateOptions(rl_update.LossSpec("ppo", {"agg": "token_mean"}), grad_accum=2)
    micros = [m.tolist() for m, _, _ in rl_update.micro_batches(Rows(), torch.arange(6), None, options, {})]
    assert micros == [[5, 3, 1], [2, 4, 0]]  # lengths 2, 3, 4 | 6, 7, 10: the short part pads to 4, not 10
    skip = torch.tensor([False, False, True, False, False, False])
    micros = [m.tolist() for m, _, _ in rl_update.micro_batches(Rows(), torch.arange(6), skip, options, {})]
    assert micros == [[5, 3, 1], [4, 0]]


@pytest.mark.portable
def test_a_part_is_trimmed_to_its_longest_completion_and_trains_as_the_whole_batch(tmp_path):
    from lmrl.rollout.types import RolloutBatch

    lengths = torch.tensor([2, 3])
    mask = (torch.arange(6) < lengths[:, None]).float()  # (2, 6): three columns of padding after every row
    batch = RolloutBatch(
        prompt_ids=torch.ones(2, 2, dtype=torch.long),
        prompt_mask=torch.ones(2, 2, dtype=torch.long),
        completion_ids=torch.arange(12).view(2, 6),
        completion_mask=mask,
        sampler_logp=-mask,
        truncated=torch.zeros(2, dtype=torch.bool),
        finish_reason=["stop", "stop"],
        prompts=["a", "b"],
        completions=["x", "y"],
        group_size=1,
        loss_mask=mask.clone(),
    )
    part = batch.trimmed()
    assert part.completion_ids.tolist() == [[0, 1, 2], [6, 7, 8]]
    assert part.completion_mask.tolist() == part.loss_mask.tolist() == [[1, 1, 0], [1, 1, 1]]
    assert part.sampler_logp.shape == (2, 3) and part.trimmed() is part
    targets = rl_update.Targets(torch.ones(2), old_logp=torch.zeros(2, 6))
    assert targets.rows(torch.tensor([1]), 3).old_logp.shape == (1, 3)

    final = {}
    for accum in (1, 4):  # 16 rows in 4 parts of similar lengths, each trimmed, against one forward
        out = tmp_path / str(accum)
        online.train(
            rl_config(tmp_path, "grpo", "max_steps=2", f"grad_accum={accum}", "adam_eps=1.0", f"output_dir={out}")
        )
        final[accum] = load_file(out / "final" / "model.safetensors")
    assert_trained_alike(final[1], final[4])


def test_release_memory_runs_before_each_training_forward_and_after_the_step(tmp_path, monkeypatch):
    from lmrl.models import memory

    trims = []  # the trim itself is tested in a child process (tests/models/test_attention.py): this one's heap stays
    monkeypatch.setattr(memory, "_malloc_trim", lambda: lambda pad: trims.append(pad) or 0)
    monkeypatch.setattr(memory, "MIN_GROWTH", 0)  # builtin:tiny never grows by the default 256 MiB
    for on in ("true", "false"):
        out = tmp_path / on
        args = ["max_steps=2", "skip_zero_advantage=false", "grad_accum=2", f"release_memory={on}"]
        online.train(rl_config(tmp_path, "grpo", *args, f"output_dir={out}"))
        runs = [r["update/memory_releases"] for r in read_jsonl(out / "metrics.jsonl") if "update/memory_releases" in r]
        # 2 parts + 1 after the optimizer step (builtin:tiny's 2 layers are fewer than the 10 a layer release needs)
        assert runs == ([3.0, 3.0] if on == "true" else [0.0, 0.0])
    assert trims == [0] * 6


def test_stop_strings_reach_the_sampler_and_vllm_refuses_them(tmp_path):
    from lmrl.rollout.samplers.groups import GroupOptions

    config = rl_config(tmp_path, "grpo", 'stop=["User:"]')
    assert GroupOptions.from_config(config).params.stop_strings == ("User:",)
    with pytest.raises(ConfigError, match="'stop' strings are applied by engine=hf only"):
        rl_config(tmp_path, "grpo", 'stop=["User:"]', "engine=vllm")


STOP_SEEN: list[str] = []


def stop_spy(prompts, completions, **kwargs):
    STOP_SEEN.extend(completions)
    return [0.5] * len(completions)


register_once("test_stop_spy", stop_spy)


def test_a_run_with_a_stop_string_scores_the_text_before_it(tmp_path):
    seen = STOP_SEEN
    seen.clear()
    online.train(
        rl_config(tmp_path, "grpo", "max_steps=1", 'stop=["1"]', "max_new_tokens=12", "rewards=[test_stop_spy]")
    )
    assert seen and not any("1" in text for text in seen)  # cut before the stop string


def test_the_held_out_evaluation_ends_at_the_runs_stop_strings(tmp_path, monkeypatch):
    from lmrl.trainers.rl import prompts

    seen = {}

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return {"accuracy": 0.0}, []

    monkeypatch.setattr(prompts, "task_accuracy", spy)
    config = rl_config(tmp_path, "grpo", 'stop=["User:"]', "chat=false")
    prompts.evaluate(None, None, [{"task": "arithmetic"}], config, None)
    assert seen["stop_strings"] == ("User:",) and seen["prompt_format"].chat is False

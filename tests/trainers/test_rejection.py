"""Rejection sampling: selection rules on a hand-made scored pool, the selection file, stats, a run that
improves the reward, resume, and clear errors on bad input."""

import dataclasses
import json
import math

import pytest
import torch

from lmrl.config import ConfigError, load_config
from lmrl.rollout.types import RolloutBatch
from lmrl.tracking import read_jsonl
from lmrl.trainers.rejection import trainer as rejection
from tests.helpers import TINY, digit_fraction, register_once

register_once("test_rs_digit_fraction", digit_fraction)


def config(tmp_path, *overrides):
    return load_config(
        rejection.RejectionConfig,
        None,
        [f"output_dir={tmp_path / 'rs'}", "precision=fp32", "task_args.digits=1", *overrides],
    )


# --------------------------------------------------------------------------- a hand-made scored pool

# 2 prompts x 3 samples, prompt-major.
#   prompt 0: "a" (1.0), "b" (0.5), "a" (1.0)   -> the second "a" repeats the first: a duplicate
#   prompt 1: "x" (0.2), ""  (3.0), "z" (0.9, truncated)   -> "" is empty, "z" truncated: only "x" is eligible
TEXTS = ["a", "b", "a", "x", "", "z"]
REWARDS_2x3 = torch.tensor([[1.0, 0.5, 1.0], [0.2, 3.0, 0.9]])
TRUNCATED = torch.tensor([False, False, False, False, False, True])
ROWS = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+2=", "answer": "4"}]


def pool():
    n_rows, t = 6, 2
    batch = RolloutBatch(
        prompt_ids=torch.ones(n_rows, 1, dtype=torch.long),
        prompt_mask=torch.ones(n_rows, 1, dtype=torch.long),
        completion_ids=torch.ones(n_rows, t, dtype=torch.long),
        completion_mask=torch.ones(n_rows, t),
        sampler_logp=torch.zeros(n_rows, t),
        truncated=TRUNCATED,
        finish_reason=["length" if x else "stop" for x in TRUNCATED.tolist()],
        prompts=[r["prompt"] for r in ROWS for _ in range(3)],
        completions=TEXTS,
        group_size=3,
    )
    return rejection.Pool(ROWS, batch, REWARDS_2x3.clone(), {"reward/mean": 1.1})


def test_eligibility_drops_empty_truncated_duplicate_and_low_reward_samples(tmp_path):
    cfg = config(tmp_path)
    assert rejection.eligible_mask(pool(), cfg).tolist() == [[True, True, False], [True, False, False]]
    cfg = config(tmp_path, "dedupe=false", "drop_truncated=false", "min_reward=0.6")
    # no dedupe: both "a" (1.0) stay; 0.5 and 0.2 are below 0.6; "" is always dropped; "z" (0.9) now allowed
    assert rejection.eligible_mask(pool(), cfg).tolist() == [[True, False, True], [False, False, True]]


@pytest.mark.parametrize(
    "overrides, expected",
    [
        ([], [0, 3]),  # prompt 0: 1.0 at j0 and j2 (duplicate) -> j0; prompt 1: only "x" (flat 3) is eligible
        (["per_prompt=2"], [0, 1, 3]),  # prompt 0: "a" then "b"; prompt 1 has a single eligible sample
        (["per_prompt=2", "dedupe=false"], [0, 2, 3]),  # the tie 1.0/1.0: earlier first
        (["select=top_k", "top_k=2"], [0, 1]),  # eligible flat rewards: 0 -> 1.0, 1 -> 0.5, 3 -> 0.2
        (["select=top_k", "top_k=3"], [0, 1, 3]),
        (["select=top_k", "top_k=4"], [0, 1, 3]),  # only 3 eligible this round: keep them all (warned)
        (["min_reward=0.6"], [0]),
    ],
)
def test_selection_rules_on_the_hand_made_pool(tmp_path, overrides, expected):
    assert rejection.select(pool(), config(tmp_path, *overrides)).tolist() == expected


def test_selection_stats_by_hand(tmp_path):
    p = pool()
    stats = rejection.selection_stats(p, torch.tensor([0, 3]), config(tmp_path))
    # all: (1 + 0.5 + 1 + 0.2 + 3 + 0.9) / 6 = 1.1; per-prompt max: (1.0 + 3.0) / 2 = 2.0; selected: (1.0 + 0.2) / 2
    assert stats["rs/reward_all"] == pytest.approx(1.1, abs=1e-6)
    assert stats["rs/reward_max"] == pytest.approx(2.0, abs=1e-6)
    assert stats["rs/reward_selected"] == pytest.approx(0.6, abs=1e-6)
    assert stats["rs/selected"] == 2 and stats["rs/prompts_covered"] == 1.0
    assert stats["rs/truncated_frac"] == pytest.approx(1 / 6)
    # analytic: log 3 - 2/3 = 0.4319456. Plug-in, N = 3 from each prompt's 3 rewards:
    #   prompt 0 [1, .5, 1]: P_BoN(.5) = (1/3)^3 = 1/27, P_BoN(1) = 26/27, pi-hat mass 1/3 and 2/3:
    #     (1/27) log(1/9) + (26/27) log(13/9) = -0.0813787 + 0.3541054 = 0.2727267
    #   prompt 1 [.2, 3, .9] (distinct): (1/27) log(1/9) + (7/27) log(7/9) + (19/27) log(19/9) = 0.3792833
    #   mean = 0.3260050
    assert stats["rs/kl_bon_bound"] == pytest.approx(0.4319456, abs=1e-6)
    assert stats["rs/kl_bon_empirical"] == pytest.approx(0.3260050, abs=1e-6)
    assert "rs/kl_bon_bound" not in rejection.selection_stats(p, torch.tensor([0, 1]), config(tmp_path, "per_prompt=2"))


def test_selection_file_has_prompt_completion_reward_and_the_row_columns(tmp_path):
    records = rejection.write_selection(tmp_path / "sel.jsonl", pool(), torch.tensor([0, 3]))
    on_disk = [json.loads(line) for line in (tmp_path / "sel.jsonl").read_text().splitlines()]
    assert (
        on_disk
        == records
        == [
            {"prompt": "1+1=", "completion": "a", "reward": 1.0, "answer": "2"},
            {"prompt": "2+2=", "completion": "x", "reward": pytest.approx(0.2), "answer": "4"},
        ]
    )


def test_engine_batches_are_concatenated_with_prompts_left_and_completions_right_padded():
    def batch(p_width, t_width, texts):
        n = len(texts)
        return RolloutBatch(
            prompt_ids=torch.full((n, p_width), 7),
            prompt_mask=torch.ones(n, p_width, dtype=torch.long),
            completion_ids=torch.full((n, t_width), 8),
            completion_mask=torch.ones(n, t_width),
            sampler_logp=torch.full((n, t_width), -0.5),
            truncated=torch.zeros(n, dtype=torch.bool),
            finish_reason=["stop"] * n,
            prompts=["p"] * n,
            completions=texts,
            group_size=2,
        )

    out = rejection.concat_batches([batch(3, 1, ["a", "b"]), batch(1, 2, ["c", "d"])], n=2, pad_id=0)
    assert out.completions == ["a", "b", "c", "d"] and out.group_size == 2
    # prompt width 3: the second batch's 1-token prompts get 2 pad ids on the LEFT (mask 0 there)
    assert out.prompt_ids[2].tolist() == [0, 0, 7] and out.prompt_mask[2].tolist() == [0, 0, 1]
    # completion width 2: the first batch's 1-token completions get a pad on the RIGHT (mask 0, log-prob 0)
    assert out.completion_ids[0].tolist() == [8, 0] and out.completion_mask[0].tolist() == [1.0, 0.0]
    assert out.sampler_logp[0].tolist() == [-0.5, 0.0] and out.completion_lengths.tolist() == [1, 1, 2, 2]


def test_eval_gold_score_is_the_hidden_rule_on_the_sampled_completions(tmp_path, monkeypatch):
    # gold = [v = a] + 1/(1 + |v - a|) - 0.05 e  (e: characters that are not v), or -1 - 0.05 len without a number:
    #   1+1= (a = 2): "2" -> 2, "3" -> 0 + 1/2 = 0.5, "the answer is 2" -> 2 - 0.05 * 14 = 1.3
    #   2+2= (a = 4): "4" -> 2, "xyz" -> -1 - 0.15 = -1.15, "5" -> 0.5          mean = 5.15 / 6 = 0.858333
    texts = ["2", "3", "the answer is 2", "4", "xyz", "5"]
    p = pool()
    fake = rejection.Pool(ROWS, dataclasses.replace(p.batch, completions=texts), REWARDS_2x3.clone(), {})
    monkeypatch.setattr(rejection, "sample_and_score", lambda *args, **kwargs: fake)
    cfg = config(tmp_path, "eval_samples=3", "eval_gold=true")
    metrics = rejection.evaluate(torch.nn.Linear(1, 1), None, ROWS, None, cfg, None)
    assert metrics["eval/gold_score"] == pytest.approx(5.15 / 6, abs=1e-6)
    assert metrics["eval/reward"] == pytest.approx(1.1, abs=1e-6)  # mean of the pool's rewards


# --------------------------------------------------------------------------- runs


def test_rejection_sampling_raises_the_reward_and_logs_the_selection(tmp_path):
    cfg = config(
        tmp_path,
        *TINY,
        "rewards=[test_rs_digit_fraction]",
        "train_rows=32",
        "eval_rows=16",
        "eval_samples=4",
        "samples_per_prompt=8",
        "max_new_tokens=6",
        "max_steps=15",
        "batch_size=16",
        "lr=1e-2",
        "warmup_steps=0",
        "rounds=2",
        "save_every=0",
        "log_every=5",
    )
    result = rejection.train(cfg)
    # measured: held-out digit fraction 0.086 -> 0.13 -> 0.35 over 2 rounds (0.70 after the resumed 3rd round)
    assert result["eval/reward"] > result["initial/eval/reward"] + 0.15, result
    assert result["eval/kl"] > 0
    records = read_jsonl(tmp_path / "rs" / "metrics.jsonl")
    selection = [r for r in records if "rs/reward_selected" in r]
    assert [r["step"] for r in selection] == [1, 2]
    for r in selection:  # the selection is better than the pool; per-prompt best-of-8 KL bound log 8 - 7/8
        assert r["rs/reward_selected"] > r["rs/reward_all"]
        assert r["rs/kl_bon_bound"] == pytest.approx(math.log(8) - 7 / 8)
        assert 0 < r["rs/kl_bon_empirical"] <= r["rs/kl_bon_bound"]
    rows = read_jsonl(tmp_path / "rs" / "round-1" / "selection.jsonl")
    assert len(rows) == selection[0]["rs/selected"] and {"prompt", "completion", "reward"} <= set(rows[0])
    assert (tmp_path / "rs" / "round-2" / "sft" / "final").is_dir() and (tmp_path / "rs" / "final").is_dir()
    # resume: the two finished rounds are kept, only round 3 runs
    rejection.train(dataclasses.replace(cfg, rounds=3, resume=True))
    steps = [r["step"] for r in read_jsonl(tmp_path / "rs" / "metrics.jsonl") if "rs/reward_selected" in r]
    assert steps == [1, 2, 3]


@pytest.mark.slow
def test_rejection_sampling_improves_task_accuracy_of_an_sft_policy(tmp_path):
    """Built-in task, verifier reward: SFT a tiny model briefly, then 2 rounds of RS keeping correct answers."""
    from lmrl.trainers.sft import trainer as sft

    sft.train(
        load_config(
            sft.SFTConfig,
            None,
            [
                f"output_dir={tmp_path / 'sft'}",
                "precision=fp32",
                "task_args.digits=1",
                "max_steps=100",
                "batch_size=64",
                "lr=3e-3",
                "warmup_steps=20",
                "eval_every=0",
                "save_every=0",
                "eval_rows=20",
            ],
        )
    )
    result = rejection.train(
        config(
            tmp_path,
            f"model={tmp_path / 'sft' / 'final'}",
            "train_rows=400",
            "eval_rows=200",
            "eval_samples=8",
            "max_new_tokens=8",
            "max_steps=50",
            "lr=1e-3",
            "warmup_steps=5",
            "min_reward=1",
            "rounds=2",
            "save_every=0",
        )
    )
    # the recipe rejection/tiny_arithmetic in docs/rejection-sampling.md measures the same setup (SFT there: 4000 rows)
    assert result["eval/reward"] > result["initial/eval/reward"] + 0.1, result


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["samples_per_prompt=0"], r"'samples_per_prompt' must be >= 1, got 0"),
        (["select=top_k"], "select=top_k needs top_k=K >= 1"),
        (
            ["select=top_k", "top_k=2000", "train_rows=100", "samples_per_prompt=8"],
            r"top_k=2000 exceeds the 800 completions sampled per round \(train_rows=100 x samples_per_prompt=8\)",
        ),
        (["top_k=5"], "top_k applies to select=top_k only; with select=best use per_prompt=k"),
        (["per_prompt=9", "samples_per_prompt=8"], "per_prompt=9 exceeds samples_per_prompt=8"),
        (["rewards=[]"], "'rewards' is empty"),
        (["temperature=0"], "'temperature' must be > 0"),
        (["rounds=0"], "'rounds' must be >= 1"),
    ],
)
def test_bad_config_is_a_clear_error(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        config(tmp_path, *overrides)


def test_top_k_above_the_prompts_available_fails_before_sampling(tmp_path):
    # the 1-digit test split has about 20 problems: top_k checks the rows actually loaded
    cfg = config(tmp_path, "split=test", "train_rows=1000", "select=top_k", "top_k=2000", "samples_per_prompt=2")
    with pytest.raises(ValueError, match="top_k=2000 exceeds the .* completions sampled per round"):
        rejection.load_prompts(cfg)


def test_cli_verb_runs_and_reports_bad_input(tmp_path, capsys):
    from lmrl.cli import main

    assert main(["rejection-sampling", f"output_dir={tmp_path}", "samples_per_prompt=0"]) == 2
    assert "'samples_per_prompt' must be >= 1" in capsys.readouterr().out

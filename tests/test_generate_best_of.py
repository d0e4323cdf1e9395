"""`lmrl generate best_of=N`: the best of N samples by reward, the KL of best-of-N, clear errors."""

import json
import math

import pytest
import torch

from lmrl.algorithms.best_of_n import bon_kl_empirical
from lmrl.config import ConfigError, load_config
from lmrl.generate import GenerateConfig, run
from lmrl.rewards import compose

PROMPTS = 'prompts=["1+2=", "3+4=", "5-1="]'


def digit_reward(prompts, completions, **columns):
    """r = the number of digits in the completion: varied over the random built-in model's samples."""
    return [float(sum(ch.isdigit() for ch in c)) for c in completions]


# a user function, imported by name like any 'module:function' reward (pytest puts tests/ on sys.path)
DIGITS = [f"rewards=[{__name__}:digit_reward]"]


def cfg(*overrides):
    return load_config(GenerateConfig, None, [PROMPTS, "max_new_tokens=8", "precision=fp32", "seed=3", *overrides])


@pytest.fixture
def scored(monkeypatch):
    """Every (completions, rewards) pair the reward set scores during the test, per prompt (3 prompts)."""
    seen: list[tuple[list[str], list[float]]] = []
    original = compose.RewardSet.compute

    def compute(self, prompts, completions, **columns):
        result = original(self, prompts, completions, **columns)
        size = len(completions) // 3
        for i in range(3):
            seen.append((completions[i * size : (i + 1) * size], result.total[i * size : (i + 1) * size].tolist()))
        return result

    monkeypatch.setattr(compose.RewardSet, "compute", compute)
    return seen


def test_best_of_n_returns_the_first_highest_reward_sample(tmp_path, scored):
    n = 6
    plain = run(cfg(f"n={n}"))  # same seed and n: the same N samples per prompt as best_of=N draws
    out = tmp_path / "bon.jsonl"
    best = run(cfg(f"best_of={n}", *DIGITS, f"output_file={out}"))
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["completion"] for r in rows] == [b[0] for b in best]
    assert len(scored) == 3
    assert any(len(set(rewards)) > 1 for _, rewards in scored), "all rewards tied: the test could not fail"
    for samples, (texts, rewards), row in zip(plain, scored, rows):
        assert texts == samples
        j = rewards.index(max(rewards))  # the first sample with the max reward
        assert row["completion"] == samples[j]
        assert row["reward"] == pytest.approx(rewards[j], abs=1e-6)
        assert row["mean_reward_of_n"] == pytest.approx(sum(rewards) / n, abs=1e-6)
        # analytic KL: log 6 - 5/6 = 1.791759 - 0.833333 = 0.958426
        assert row["kl_bound"] == pytest.approx(0.958426, abs=1e-6)


def test_empirical_kl_uses_the_pool_of_n_plus_kl_samples(tmp_path, scored):
    out = tmp_path / "bon.jsonl"
    run(cfg("best_of=2", "kl_samples=6", *DIGITS, f"output_file={out}"))
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    pools = [rewards for _, rewards in scored]  # 3 prompts x 8 samples: 2 candidates + 6 for the estimate
    assert [len(p) for p in pools] == [8, 8, 8]
    expected = bon_kl_empirical(torch.tensor(pools), 2).mean().item()
    assert rows[0]["kl_empirical"] == pytest.approx(expected, abs=1e-6)
    assert 0 < rows[0]["kl_empirical"] <= math.log(2) - 0.5 + 1e-9  # never above the analytic value 0.193147
    # the best is chosen among the first 2 samples only
    for (texts, rewards), row in zip(scored, rows):
        j = 0 if rewards[0] >= rewards[1] else 1
        assert row["completion"] == texts[j]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["best_of=0"], "'best_of' \\(N\\) must be >= 1, got 0"),
        (["best_of=4"], "best_of > 1 needs rewards"),
        (["best_of=4", "rewards=[length]", "n=2"], "best_of returns one completion per prompt; got n=2"),
        (["best_of=4", "rewards=[length]", "temperature=0"], "needs sampling"),
        (["best_of=4", "rewards=[length]", "kl_samples=-1"], "'kl_samples' must be >= 0"),
    ],
)
def test_bad_best_of_input_is_a_clear_error(overrides, message):
    with pytest.raises(ConfigError, match=message):
        cfg(*overrides)


def test_generate_without_best_of_is_unchanged(scored):
    out = run(cfg("n=2"))
    assert len(out) == 3 and all(len(group) == 2 for group in out)
    assert scored == []  # no reward is computed

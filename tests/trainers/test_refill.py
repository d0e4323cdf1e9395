"""DAPO dynamic sampling that refills (`lmrl.trainers.rl.refill`): the zero-variance groups of a step, and only they, are
replaced by the groups of the next prompts of the data stream, scored once, up to max_refill_batches rounds; the run
resumes exactly; broken variants are caught."""

import zlib

import pytest
import torch

from lmrl import tracking
from lmrl.config import ConfigError
from lmrl.rollout.types import RolloutBatch
from lmrl.tracking import read_jsonl
from lmrl.trainers import common
from lmrl.trainers.rl import refill
from lmrl.trainers.rl import trainer as online
from tests.helpers import has_digit, register_once
from tests.trainers.test_online import rl_config

G, B = 4, 4
ZERO_EVERY = {"n": 2}  # a prompt's group has zero variance unless crc32(expression) % n == 0
SCORED: list[list[str]] = []  # one entry per reward call: the expressions of its groups, in row order
TEXT: dict[str, str] = {}  # rendered prompt -> expression


def zero_group(expression: str) -> bool:
    return zlib.crc32(expression.encode()) % ZERO_EVERY["n"] != 0


def stub(prompts, completions, meta, **kwargs):
    """Deterministic: a zero-variance prompt's rows all get 0; another's get 0, 1, 2, 3 by position in the group."""
    expressions = [m["expression"] for m in meta]
    SCORED.append(expressions[::G])
    TEXT.update(zip(prompts, expressions))
    return [0.0 if zero_group(e) else float(i % G) for i, e in enumerate(expressions)]


register_once("test_refill_stub", stub)


@pytest.fixture(autouse=True)
def no_plots(monkeypatch):
    """The runs' end-of-run plots (matplotlib, most of a 3-step run's time here) are not under test."""
    monkeypatch.setattr(tracking, "plot_metrics", lambda *args: [])


def batch_of(names: list[str], rewards: list[list[float]]) -> tuple[RolloutBatch, torch.Tensor]:
    """One group of G rows per name (prompt text = name), with the given rewards."""
    n = len(names) * G
    ones = torch.ones(n, 2, dtype=torch.long)
    batch = RolloutBatch(
        prompt_ids=ones,
        prompt_mask=ones,
        completion_ids=ones,
        completion_mask=ones.float(),
        sampler_logp=torch.zeros(n, 2),
        truncated=torch.zeros(n, dtype=torch.bool),
        finish_reason=["stop"] * n,
        prompts=[p for p in names for _ in range(G)],
        completions=["c"] * n,
        group_size=G,
    )
    return batch, torch.tensor([r for group in rewards for r in group])


FLAT, VARIED = [1.0] * G, [0.0, 1.0, 0.0, 1.0]


def test_refill_keeps_the_first_varied_groups_in_data_order_up_to_the_bound():
    first = batch_of(["a", "b", "c", "d"], [VARIED, FLAT, VARIED, FLAT])
    rounds = {
        1: batch_of(["e", "f", "g", "h"], [FLAT, VARIED, FLAT, FLAT]),
        2: batch_of(["i", "j", "k", "l"], [VARIED, VARIED, VARIED, FLAT]),
    }
    filled = refill.refill(*first, rounds.get, want=4, max_rounds=5, pad_id=0)
    assert filled.batch.prompts[::G] == ["a", "c", "f", "i"]  # j, k: the surplus of the last round
    assert filled.rewards.tolist() == VARIED * 4 and filled.trained.all()
    assert filled.metrics() == {
        "rollout/refill_batches": 2,
        "rollout/refill_kept_frac": 4 / 12,
        "rollout/refill_filled_frac": 1.0,
    }
    bounded = refill.refill(*first, rounds.get, want=4, max_rounds=1, pad_id=0)
    assert bounded.batch.prompts[::G] == ["a", "c", "f"] and bounded.metrics()["rollout/refill_filled_frac"] == 0.75
    stopped = refill.refill(*first, {}.get, want=4, max_rounds=3, pad_id=0)  # round 1's rewards failed: None
    assert stopped.rounds == 0 and stopped.batch.prompts[::G] == ["a", "c"]
    nothing = refill.refill(*batch_of(["a"], [FLAT]), {}.get, want=1, max_rounds=0, pad_id=0)
    assert nothing.batch is None and nothing.kept == 0


def stream(config, position: int) -> list[str]:
    rows, _ = online.load_prompts(config)
    return [rows[i]["meta"]["expression"] for i in common.epoch_batch_indices(len(rows), B, position, config.seed)]


def run_and_check(tmp_path, *overrides):
    """Train 3 steps with the stub; per step, what was scored and what the update trained; assert that every round
    drew the next prompts of the stream, each scored once, and that the update trained exactly the first B groups
    with reward variance (all of round 0's among them), refilling only while short and at most to the bound."""
    SCORED.clear()
    steps, trained = [], []
    real_step, real_update = online.rl_step, online.update

    def update_spy(parts, batch, *args, **kwargs):
        trained.append([TEXT[p] for p in batch.prompts[::G]])
        return real_update(parts, batch, *args, **kwargs)

    def step_spy(*args, **kwargs):
        trained.clear()
        metrics = real_step(*args, **kwargs)
        steps.append((list(SCORED), trained[0] if trained else [], metrics))
        SCORED.clear()
        return metrics

    with pytest.MonkeyPatch.context() as m:
        m.setattr(online, "rl_step", step_spy)
        m.setattr(online, "update", update_spy)
        config = rl_config(
            tmp_path,
            "grpo",
            "rewards=[test_refill_stub]",
            "dynamic_sampling=refill",
            "max_steps=3",
            "max_new_tokens=2",
            "eval_rows=2",
            *overrides,
        )
        online.train(config)
    position = 1
    for scored, kept, metrics in steps:
        assert scored == [stream(config, position + k) for k in range(len(scored))]  # fresh prompts, scored once
        varied = [e for group in scored for e in group if not zero_group(e)]
        assert kept == varied[:B]
        assert set(e for e in scored[0] if not zero_group(e)) <= set(kept)  # only zero-variance groups replaced
        rounds = len(scored) - 1
        assert rounds <= config.max_refill_batches
        assert len(kept) == B or rounds == config.max_refill_batches  # short only at the bound
        assert all(
            len(varied_before) < B
            for varied_before in (  # no round drawn once the batch was full
                [e for g in scored[:k] for e in g if not zero_group(e)] for k in range(1, len(scored))
            )
        )
        assert metrics["rollout/refill_batches"] == rounds and metrics["rollout/refill_filled_frac"] == len(kept) / B
        position += 1 + rounds
    return steps, config


@pytest.mark.parametrize("zero_every, bound", [(2, 4), (7, 1)])
def test_refilling_replaces_exactly_the_zero_variance_groups(tmp_path, monkeypatch, zero_every, bound):
    monkeypatch.setitem(ZERO_EVERY, "n", zero_every)
    steps, _ = run_and_check(tmp_path, f"max_refill_batches={bound}")
    assert sum(len(scored) - 1 for scored, _, _ in steps) > 0  # some step refilled
    if bound == 1:  # 1 in 7 groups varies: some step ends short at the bound
        assert any(len(kept) < B for _, kept, _ in steps)


def broken_accept_keeps_zero_variance(zero_var, wanted):
    return torch.arange(len(zero_var)) < wanted


def broken_accept_overfills(zero_var, wanted):
    return ~zero_var


@pytest.mark.parametrize("broken", [broken_accept_keeps_zero_variance, broken_accept_overfills])
def test_a_broken_refill_is_caught(tmp_path, broken):
    with pytest.MonkeyPatch.context() as m, pytest.raises(AssertionError):
        m.setattr(refill, "accept", broken)
        run_and_check(tmp_path, "max_steps=2")


def resume(tmp_path, load_state_dict=None) -> tuple[dict, dict]:
    """Metrics by step of a 3-step run (a checkpoint each step) and of its copy resumed from step 1's checkpoint
    (with ``load_state_dict`` as `OnlineRL.load_state_dict`, if given)."""
    import shutil

    args = [
        "rewards=[test_refill_stub]",
        "dynamic_sampling=refill",
        "max_new_tokens=2",
        "eval_rows=2",
        "save_every=1",
        "keep_checkpoints=5",
        "max_steps=3",
    ]
    online.train(rl_config(tmp_path / "full", "grpo", *args))
    shutil.copytree(tmp_path / "full", tmp_path / "resumed")
    for gone in ("final", "checkpoints/step-2", "checkpoints/step-3"):
        shutil.rmtree(tmp_path / "resumed" / "grpo" / gone)
    with pytest.MonkeyPatch.context() as m:
        if load_state_dict is not None:
            m.setattr(online.OnlineRL, "load_state_dict", load_state_dict)
        online.train(rl_config(tmp_path / "resumed", "grpo", *args, "resume=true"))
    return (
        {r["step"]: r for r in read_jsonl(tmp_path / d / "grpo" / "metrics.jsonl") if "rollout/refill_kept_frac" in r}
        for d in ("full", "resumed")
    )  # the resumed run's last record of each step


KEYS = ("reward/mean", "loss/policy", "optim/grad_norm", "rollout/refill_batches", "rollout/refill_kept_frac")


def test_refilling_resumes_exactly(tmp_path):
    full, resumed = resume(tmp_path)
    assert full[1]["rollout/refill_batches"] > 0  # step 1's checkpoint holds a data position ahead of the step
    for step in (2, 3):
        for key in KEYS:
            assert resumed[step][key] == full[step][key], (step, key)


@pytest.mark.slow
def test_a_resume_that_forgets_the_refill_position_is_caught(tmp_path):
    real = online.OnlineRL.load_state_dict

    def forgets(self, state):
        real(self, {k: v for k, v in state.items() if k != "refill_batches"})

    full, resumed = resume(tmp_path, forgets)
    assert any(resumed[step][key] != full[step][key] for step in (2, 3) for key in KEYS)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["samples_per_prompt=1", "algorithm=reinforce"], "samples_per_prompt >= 2"),
        (["curriculum=[0.1, 0.9]"], "curriculum"),
        (["max_refill_batches=-1"], "max_refill_batches"),
    ],
)
def test_refill_with_what_it_cannot_serve_is_refused(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        rl_config(tmp_path, "grpo", "dynamic_sampling=refill", *overrides)


register_once("test_has_digit", has_digit)


@pytest.mark.slow
def test_dapo_with_refill_learns_a_sparse_trivial_task(tmp_path):
    """A 0/1 reward (a digit anywhere) whose groups are often all 0 or all 1: refilled steps keep learning."""
    online.train(rl_config(tmp_path, "dapo", "dynamic_sampling=refill", "rewards=[test_has_digit]", "max_steps=20"))
    records = [r for r in read_jsonl(tmp_path / "dapo" / "metrics.jsonl") if "reward/mean" in r]
    rewards = [r["reward/mean"] for r in records]
    assert sum(r["rollout/refill_batches"] for r in records) > 0
    assert sum(rewards[-5:]) / 5 > sum(rewards[:5]) / 5 + 0.1, rewards

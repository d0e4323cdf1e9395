"""The alarm on a broken weight sync (`lmrl.trainers.rl.sampler_gap`): an fp32 run whose sampler's log-probs are off
from the learner's by far more than rounding warns on every such step, or stops with `stop_on_sampler_logp_gap`.
The broken sync is simulated on engine=hf by shifting the sampler's log-probs by 1 (the size measured for a
broken vLLM sync); tests/trainers/test_online_vllm.py breaks a real vLLM sync."""

import dataclasses

import pytest

from lmrl.config import ConfigError, load_config
from lmrl.rollout.engines.hf import HFEngine
from lmrl.tracking import read_jsonl
from lmrl.trainers.common import TrainingStopped
from lmrl.trainers.rl import trainer as online
from lmrl.trainers.rl.sampler_gap import SamplerGapAlarm
from tests.helpers import TINY, register_once

register_once(  # a reward that differs within a group: every step trains
    "test_gap_varied", lambda prompts, completions, **kw: [(sum(map(ord, c)) % 7) / 7 for c in completions]
)


def config(tmp_path, *overrides):
    return load_config(
        online.RLConfig,
        None,
        [
            f"output_dir={tmp_path / 'run'}",
            "precision=fp32",
            *TINY,
            "task_args.digits=1",
            "train_rows=32",
            "eval_rows=4",
            "prompts_per_step=2",
            "samples_per_prompt=4",
            "max_new_tokens=4",
            "eval_every=0",
            "save_every=0",
            "log_every=1",
            "max_steps=2",
            "sample_every=100",
            "rewards=[test_gap_varied]",
            *overrides,
        ],
    )


@pytest.fixture
def broken_sync(monkeypatch):
    """The engine samples from weights other than the learner's: its log-probs are 1 nat off."""
    generate = HFEngine.generate

    def off_by_one(self, *args, **kwargs):
        batch = generate(self, *args, **kwargs)
        return dataclasses.replace(batch, sampler_logp=batch.sampler_logp - batch.completion_mask)

    monkeypatch.setattr(HFEngine, "generate", off_by_one)


def test_a_broken_sync_in_fp32_warns_loudly_on_every_step(tmp_path, broken_sync, capsys):
    online.train(config(tmp_path))
    rows = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "policy/sampler_logp_gap" in r]
    assert rows and all(r["policy/sampler_logp_gap"] > 0.9 and r["policy/sampler_logp_gap_alarm"] == 1.0 for r in rows)
    out = capsys.readouterr().out
    assert "WARNING" in out and "exceeds max_sampler_logp_gap=0.1 in fp32" in out and "broken weight sync" in out


def test_stop_on_sampler_logp_gap_stops_the_run_at_the_first_such_step(tmp_path, broken_sync):
    with pytest.raises(TrainingStopped, match=r"step 1: sampler_logp_gap=1 exceeds .*stop_on_sampler_logp_gap=true"):
        online.train(config(tmp_path, "stop_on_sampler_logp_gap=true"))


def test_a_healthy_sync_raises_no_alarm_and_the_limit_is_checked_at_start_up(tmp_path):
    online.train(config(tmp_path, "stop_on_sampler_logp_gap=true", "max_sampler_logp_gap=1e-4"))
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert any("policy/sampler_logp_gap" in r for r in rows) and not any(
        "policy/sampler_logp_gap_alarm" in r for r in rows
    )
    with pytest.raises(ConfigError, match="'max_sampler_logp_gap' must be > 0"):
        config(tmp_path, "max_sampler_logp_gap=0")


class Printed:
    def __init__(self):
        self.lines = []

    def print(self, *objects):
        self.lines.append(" ".join(map(str, objects)))


@pytest.mark.parametrize("case", ["bf16", "off", "async", "below"])
def test_no_alarm_where_a_gap_is_expected_or_the_check_is_off(case):
    settings = dict(
        max_sampler_logp_gap=None if case == "off" else 0.1,
        async_steps=1 if case == "async" else 0,
        stop_on_sampler_logp_gap=True,
        engine="hf",
    )
    metrics, tracker = {"policy/sampler_logp_gap": 0.05 if case == "below" else 1.0}, Printed()
    alarm = SamplerGapAlarm.from_config(type("C", (), settings)(), "bf16" if case == "bf16" else None)
    alarm.check(metrics, 3, tracker)
    assert "policy/sampler_logp_gap_alarm" not in metrics and not tracker.lines

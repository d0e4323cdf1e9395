"""`lmrl rl` / `lmrl sft` with tools or an environment: the policy loss sees only sampled tokens, and it learns."""

import dataclasses
import sys
from pathlib import Path

import pytest
import torch

from lmrl import algorithms
from lmrl.config import ConfigError, load_config
from lmrl.models.setup import ModelSetup
from lmrl.tracking import read_jsonl
from lmrl.trainers import update as rl_update
from lmrl.trainers.rl import trainer as online
from lmrl.trainers.sft import trainer as sft
from lmrl.trainers.sft_method import SFT
from tests.helpers import TINY, TOOL_RUN

sys.path.insert(0, str(Path(__file__).parent))  # env=agentic_envs:digits

MODEL = [*TINY, "precision=fp32"]


def rl_config(tmp_path, *overrides):
    return load_config(
        online.RLConfig,
        None,
        [
            f"output_dir={tmp_path / 'rl'}",
            *MODEL,
            "train_rows=64",
            "eval_rows=4",
            "prompts_per_step=4",
            "samples_per_prompt=4",
            "max_new_tokens=6",
            "eval_every=0",
            "save_every=0",
            "log_every=1",
            "lr=1e-2",
            "sample_every=100",
            *overrides,
        ],
    )


def test_tool_rollouts_train_only_sampled_tokens(tmp_path, monkeypatch):
    seen = []
    real = rl_update.policy_loss

    def spy(name, logp, old_logp, adv, mask, **kwargs):
        seen.append(mask.clone())
        return real(name, logp, old_logp, adv, mask, **kwargs)

    real_update = online.update

    def update_spy(parts, batch, *args, **kwargs):
        seen.append(batch)
        return real_update(parts, batch, *args, **kwargs)

    monkeypatch.setattr(rl_update, "policy_loss", spy)
    monkeypatch.setattr(online, "update", update_spy)
    config = rl_config(
        tmp_path,
        "dataset=task:tool_arithmetic",
        "task_args={digits: 1}",
        "tools=[calculator]",
        "max_turns=2",
        "max_total_tokens=40",
        "rewards=[test_len_reward]",
        "max_steps=1",
        "skip_zero_advantage=false",
    )
    online.train(config)
    batch, mask = seen[0], seen[1]
    assert batch.loss_mask is not None and torch.equal(mask, batch.loss_mask)
    assert (batch.loss_mask <= batch.completion_mask).all()
    rows = read_jsonl(tmp_path / "rl" / "metrics.jsonl")
    step = next(r for r in rows if r.get("step") == 1 and "reward/mean" in r)
    for key in (
        "rollout/tools/calls_per_episode",
        "rollout/tools/call_errors_per_episode",
        "rollout/done_frac",
        "rollout/turns_mean",
    ):
        assert key in step
    sample = next(r for r in read_jsonl(tmp_path / "rl" / "samples.jsonl") if r["step"] == 1)  # lossless
    assert sample["prompt"] == batch.prompts[0] and sample["messages"][0]["role"] == "user"
    assert sum(count for _, _, count in sample["token_roles"]) == int(batch.completion_mask[0].sum())


@pytest.fixture(autouse=True, scope="module")
def _length_reward():
    from lmrl.rewards import REWARDS, register_reward

    if "test_len_reward" not in REWARDS:
        register_reward("test_len_reward")(
            lambda **_: lambda prompts, completions, **kw: [len(c) / 10 for c in completions]
        )


def test_multi_turn_grpo_learns_an_environment_reward(tmp_path):
    config = rl_config(
        tmp_path,
        "env=agentic_envs:digits",
        "task_args.digits=1",
        "rewards=[env]",
        "max_turns=3",
        "max_total_tokens=40",
        "max_steps=20",
    )
    online.train(config)
    rows = read_jsonl(tmp_path / "rl" / "metrics.jsonl")
    rewards = [r["reward/mean"] for r in rows if "reward/mean" in r]
    turns = [r["rollout/turns_mean"] for r in rows if "rollout/turns_mean" in r]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last > first + 0.2, f"reward {first:.3f} -> {last:.3f}"
    assert max(turns) > 1, "some episodes reach the second turn (after the user feedback)"


def test_sft_on_tool_traces_and_tool_episode_eval(tmp_path):
    config = load_config(
        sft.SFTConfig,
        None,
        [
            f"output_dir={tmp_path / 'sft'}",
            *MODEL,
            "dataset=task:tool_arithmetic",
            "task_args={digits: 2}",
            "tools=[calculator]",
            "train_rows=32",
            "eval_rows=4",
            "batch_size=8",
            "max_steps=2",
            "eval_every=2",
            "save_every=0",
            "eval_max_new_tokens=8",
            "max_turns=2",
        ],
    )
    method = SFT(config, ModelSetup.from_config(config))
    ex = method.examples[0]
    text = method.tokenizer.decode([t for t, y in zip(ex.input_ids, ex.labels) if y != -100])
    assert text.startswith("<tool_call>") and text.count("<|im_end|>") == 2
    metrics, samples = method.evaluate(2)
    assert {"eval/accuracy", "eval/tool_calls_per_episode", "eval/loss"} <= set(metrics)


def test_bad_tool_config_fails_at_start_up(tmp_path):
    with pytest.raises(ConfigError, match="tool_parser"):
        rl_config(tmp_path, "tools=[calculator]", "tool_parser=xml")
    with pytest.raises(ConfigError, match="Did you mean 'calculator'"):
        online.train(rl_config(tmp_path, "tools=[calculater]", "max_steps=1"))
    with pytest.raises(ConfigError, match="max_turns"):
        rl_config(tmp_path, "tools=[calculator]", "max_turns=0")


def test_single_turn_batches_are_unchanged():
    assert algorithms is not None  # the single-turn path keeps loss_mask None: train_mask is completion_mask
    from lmrl.rollout.types import RolloutBatch

    assert "loss_mask" in RolloutBatch.__dataclass_fields__


def test_env_and_tool_paths_fail_at_start_up_with_the_key(tmp_path):
    from lmrl.data.tokenizers import build_char_tokenizer
    from lmrl.rollout.tools.section import build_env_factory

    tok = build_char_tokenizer()
    for overrides, match in (
        (["env=nosuchmodule:make"], "env='nosuchmodule:make': cannot import"),
        (["env=agentic_envs:nothing"], "has no attribute 'nothing'"),
        (["env=agentic_envs"], "module.path:name"),
        (["tools=[nosuchmodule:tool]"], "tools='nosuchmodule:tool': cannot import"),
    ):
        with pytest.raises(ConfigError, match=match):
            build_env_factory(rl_config(tmp_path, *overrides), tok)
    assert build_env_factory(rl_config(tmp_path, "env=agentic_envs:digits"), tok)({"prompt": "x"}).tools == []


def test_eval_metrics_of_a_tool_run_are_tool_episodes_like_its_own_eval(tmp_path, monkeypatch):
    """A tool run's eval_metrics run the run's tool episodes: evals/accuracy equals eval/accuracy on the same rows
    (it was 0.0 beside 0.25: the single-turn evaluator scored the tool call as the answer)."""
    from types import SimpleNamespace

    from lmrl.eval import runner
    from lmrl.eval.training import build_evaluator
    from lmrl.trainers import loop

    sys.path.insert(0, str(Path(__file__).parents[1] / "rollout"))
    from scripted_policy import CalculatorPolicy

    monkeypatch.setattr(runner, "HFEngine", CalculatorPolicy)  # calls the calculator, answers right on even a
    config = rl_config(
        tmp_path,
        *TOOL_RUN,
        "eval_rows=8",
        "eval_metrics=[accuracy]",
        "eval_metrics_rows=8",
        "eval_metrics_args={max_new_tokens: 24}",
    )
    method = online.OnlineRL(config, online.ModelSetup.from_config(config))
    metrics, _ = loop.evaluate(method, 0, SimpleNamespace(evaluator=build_evaluator(config)))
    assert 0 < metrics["eval/accuracy"] < 1
    assert metrics["eval/metrics/accuracy"] == metrics["eval/accuracy"]
    assert metrics["eval/metrics/tools/calls_per_episode"] == metrics["eval/tool_calls_per_episode"] == 1.0


def test_multi_turn_samples_keep_the_whole_episode(tmp_path):
    """samples.jsonl of a tool run: the whole prompt, the conversation, the turn spans and every completion token's
    role and loss mask (it kept the prompt's last 60 characters and the transcript only); single-turn rows stay
    small."""
    from lmrl.data.loading import load_rows
    from lmrl.data.tokenizers import build_char_tokenizer
    from lmrl.rollout.tools.multiturn import MultiTurnOptions, run_episodes
    from lmrl.rollout.tools.parsers import get_parser
    from lmrl.rollout.tools.section import build_env_factory
    from lmrl.rollout.types import SamplingParams
    from lmrl.trainers import agentic

    sys.path.insert(0, str(Path(__file__).parents[1] / "rollout"))
    from scripted_policy import CalculatorPolicy

    tok = build_char_tokenizer()
    config = rl_config(tmp_path, "tools=[calculator]", "tool_parser=pythonic")
    make_env = build_env_factory(config, tok)
    rows = load_rows("task:tool_arithmetic", split="test", limit=2, digits=2)
    options = MultiTurnOptions(3, 120, train_tool_calls=False, parser=get_parser("pythonic"))
    batch = run_episodes(
        CalculatorPolicy(None, tok),
        tok,
        [make_env(r) for r in rows],
        rows,
        SamplingParams(max_new_tokens=40, greedy=True),
        options,
    )
    from lmrl.tracking import Tracker

    tracker = Tracker(tmp_path / "run", 1)
    tracker.log_samples(1, [{**agentic.sample_fields(batch, i), "reward": 1.0} for i in range(2)])
    tracker.close()
    saved = read_jsonl(tmp_path / "run" / "samples.jsonl")
    for i, (row, record) in enumerate(zip(rows, saved)):
        assert record["prompt"] == batch.prompts[i] and record["prompt"].startswith("<|im_start|>system")
        assert [m["role"] for m in record["messages"]] == ["user", "assistant", "tool", "assistant"]
        assert record["messages"][0]["content"] == row["prompt"] and record["messages"][2]["content"] == row["answer"]
        (s1, e1), (s2, e2) = record["turns"]
        roles = [role for role, _, count in record["token_roles"] for _ in range(count)]
        mask = [m for _, m, count in record["token_roles"] for _ in range(count)]
        assert len(roles) == int(batch.completion_mask[i].sum()) == e2
        assert mask == batch.loss_mask[i, :e2].int().tolist()  # the loss mask, token by token
        assert set(roles[s1:e1]) == set(roles[s2:e2]) == {"assistant"} and set(roles[e1:s2]) == {"tool"}
        assert mask[s1:e1] == [0] * (e1 - s1 - 1) + [1]  # the call masked (train_tool_calls=false), not its end
        assert sum(mask[e1:s2]) == 0 and mask[s2:e2] == [1] * (e2 - s2)  # the tool output masked, the answer learned
    single = agentic.sample_fields(dataclasses.replace(batch, info=None), 0)
    assert set(single) == {"prompt", "completion"} and len(single["prompt"]) == 60

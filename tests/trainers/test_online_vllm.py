"""`lmrl rl engine=vllm` (vLLM's CPU build, `make test-vllm`): GRPO learns the dense task as engine=hf does, with the
weights synced after every step (the sampler/learner log-prob gap stays at fp32 rounding)."""

import os

import pytest

if os.environ.get("LMRL_REQUIRE_VLLM"):  # `make test-vllm`: a missing vLLM is a failure, not a skip
    import vllm  # noqa: F401
else:
    pytest.importorskip("vllm")

from lmrl.config import ConfigError, load_config  # noqa: E402
from lmrl.tracking import read_jsonl  # noqa: E402
from lmrl.trainers.rl import trainer as online  # noqa: E402
from tests.helpers import DISTILL_RUN, RL_RUN, VLLM_TINY, VLLM_TINY_ARGS, digit_fraction, register_once

pytestmark = pytest.mark.vllm
register_once("test_vllm_digit_fraction", digit_fraction)


def grpo(tmp_path, engine, *overrides):
    config = load_config(
        online.RLConfig,
        None,
        [
            "algorithm=grpo",
            f"engine={engine}",
            f"output_dir={tmp_path / engine}",
            "precision=fp32",
            *VLLM_TINY,
            *RL_RUN,
            "rewards=[test_vllm_digit_fraction]",
            "eval_every=0",
            "save_every=0",
            "log_every=1",
            "lr=1e-2",
            "sample_every=100",
            "vllm_kv_cache_gb=0.0625",
            "vllm_max_model_len=128",
            *overrides,
        ],
    )
    online.train(config)
    return [r for r in read_jsonl(tmp_path / engine / "metrics.jsonl") if "reward/mean" in r]


def test_grpo_with_engine_vllm_learns_the_dense_task_as_engine_hf_does(tmp_path):
    runs = {engine: grpo(tmp_path, engine, "max_steps=20") for engine in ("hf", "vllm")}
    gains = {}
    for engine, rows in runs.items():
        rewards = [r["reward/mean"] for r in rows]
        gains[engine] = sum(rewards[-5:]) / 5 - sum(rewards[:5]) / 5
        assert gains[engine] > 0.1, f"engine={engine}: reward gain {gains[engine]:.3f}"
    assert gains["vllm"] > 0.5 * gains["hf"], gains
    vllm_rows = runs["vllm"]
    assert len(vllm_rows) == 20 and all(r["time/weight_sync_s"] > 0 for r in vllm_rows)  # a sync before every rollout
    # logged on every step that trains (a step whose groups all have zero advantage runs no learner forward)
    gaps = [r["policy/sampler_logp_gap"] for r in vllm_rows if "policy/sampler_logp_gap" in r]
    assert len(gaps) >= 10 and max(gaps) < 1e-4, gaps  # the synced engine samples the learner's policy
    assert all("policy/tis_weight_mean" in r for r in vllm_rows if "policy/sampler_logp_gap" in r)  # TIS on by default


def test_engine_vllm_refuses_what_it_cannot_do_at_start_up(tmp_path):
    with pytest.raises(ConfigError, match="vllm_max_model_len=8 is shorter"):
        grpo(tmp_path, "vllm", "vllm_max_model_len=8", "max_steps=1")
    with pytest.raises(ConfigError, match="top_k=0 and top_p=1.*engine=hf"):
        grpo(tmp_path, "vllm", "top_k=5", "max_steps=1")
    with pytest.raises(ConfigError, match="head sizes.*engine=hf"):
        grpo(tmp_path, "vllm", "model_args.num_attention_heads=4", "max_steps=1")  # head size 16
    with pytest.raises(ConfigError, match="vllm_sleep=true needs a GPU"):
        grpo(tmp_path, "vllm", "vllm_sleep=true", "max_steps=1")


def test_a_broken_vllm_sync_stops_an_fp32_run_when_asked(tmp_path, monkeypatch):
    # the built-in model ties its LM head: without the CPU re-pack of the tied head after a reload the engine samples
    # with a stale head (sampler_logp_gap ~1), which max_sampler_logp_gap catches at the first step that trains
    from lmrl.rollout.engines.vllm import driver as vllm_driver
    from lmrl.trainers.common import TrainingStopped

    monkeypatch.setattr(vllm_driver, "repack_tied_head", lambda worker: 0)
    with pytest.raises(
        TrainingStopped,
        match=r"step \d+: sampler_logp_gap=.* exceeds max_sampler_logp_gap=0.1 in "
        r"fp32.*engine=vllm",
    ):
        grpo(tmp_path, "vllm", "max_steps=3", "stop_on_sampler_logp_gap=true")


def test_lora_grpo_with_engine_vllm_pushes_merged_adapters_and_learns(tmp_path):
    pytest.importorskip("peft")
    lora = ["lora_r=8", "lora_alpha=16", "lora_target_modules=[q_proj,v_proj,lm_head]"]  # an adapted head learns fast
    with pytest.raises(ConfigError, match="LoRA adapts the LM head, which this model ties"):
        grpo(tmp_path, "vllm", "max_steps=1", *lora)  # the built-in models tie their head: vLLM cannot untie it
    rows = grpo(tmp_path, "vllm", "max_steps=20", "lr=3e-2", "model_args.tie_word_embeddings=false", *lora)
    rewards = [r["reward/mean"] for r in rows]
    gain = sum(rewards[-5:]) / 5 - sum(rewards[:5]) / 5
    assert gain > 0.1, f"LoRA engine=vllm: reward gain {gain:.3f} ({rewards})"
    assert len(rows) == 20 and all(r["time/weight_sync_s"] > 0 for r in rows)
    gaps = [r["policy/sampler_logp_gap"] for r in rows if "policy/sampler_logp_gap" in r]
    # (once every group's reward saturates, a step has zero advantages and no learner forward: fewer gaps)
    assert len(gaps) >= 5 and max(gaps) < 1e-4, (len(gaps), gaps)  # the engine samples W + BA, the learner's policy


def test_grpo_with_a_vllm_server_learns_with_weights_pushed_every_step(tmp_path):
    # vllm_server=auto: lmrl starts `lmrl vllm-serve` in a child process and pushes the weights to it over HTTP
    rows = grpo(tmp_path, "vllm", "max_steps=20", "vllm_server=auto")
    rewards = [r["reward/mean"] for r in rows]
    gain = sum(rewards[-5:]) / 5 - sum(rewards[:5]) / 5
    assert gain > 0.1, f"vllm_server=auto: reward gain {gain:.3f} ({rewards})"
    assert len(rows) == 20 and all(r["time/weight_sync_s"] > 0 for r in rows)  # a push before every rollout
    gaps = [r["policy/sampler_logp_gap"] for r in rows if "policy/sampler_logp_gap" in r]
    assert len(gaps) >= 5 and max(gaps) < 1e-4, (len(gaps), gaps)  # the server samples the learner's policy


def test_on_policy_distillation_samples_through_engine_vllm(tmp_path, monkeypatch):
    """Distillation builds its engine with make_engine like every sampling trainer: with engine=vllm the student's
    completions come from vLLM, synced with the student before every step's rollout."""
    from lmrl.data.tokenizers import build_char_tokenizer
    from lmrl.models import load_model
    from lmrl.rollout.engines.vllm.engine import VLLMEngine
    from lmrl.trainers.distill import trainer as distill

    teacher, tokenizer = tmp_path / "teacher", build_char_tokenizer()
    load_model("builtin:tiny", tokenizer, seed=7, model_args=VLLM_TINY_ARGS).save_pretrained(teacher)
    tokenizer.save_pretrained(teacher)
    pushes = []
    real_push = VLLMEngine.sync_weights
    monkeypatch.setattr(VLLMEngine, "sync_weights", lambda self: pushes.append(1) or real_push(self))
    config = load_config(
        distill.DistillConfig,
        None,
        [
            f"output_dir={tmp_path / 'run'}",
            f"teacher={teacher}",
            "engine=vllm",
            "precision=fp32",
            *VLLM_TINY,
            "task_args.digits=1",
            "train_rows=32",
            "eval_rows=8",
            *DISTILL_RUN,
            "on_policy_frac=1.0",
            "max_steps=3",
            "vllm_kv_cache_gb=0.0625",
            "vllm_max_model_len=128",
        ],
    )
    distill.train(config)
    steps = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "loss" in r and r["step"] > 0]
    assert len(steps) == 3 and all("loss/kl_reverse" in r for r in steps)  # every row sampled by the student
    assert len(pushes) == 3  # the first rollout's weights, then each update's

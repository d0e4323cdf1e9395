"""The model-support matrix, end to end: every architecture of `arch_zoo` through lmrl's trainers and eval.

Each architecture is saved as an HF folder (random weights, the built-in char tokenizer) and given as `model=` to
GRPO (prompt sharing, forward reuse and the chunked LM head on, each counted as used in metrics.jsonl), GRPO with
LoRA and gradient checkpointing, PPO, SFT, DPO and `lmrl eval`; what a trainer saves in `final/` must load and
generate in plain transformers. GRPO on every architecture and LoRA GRPO on four are in the default suite (~2-3 s
each); the rest is `slow` (`make test-all`; ~4 s per architecture).
"""

from __future__ import annotations

import json

import pytest
import torch
from arch_zoo import ARCHITECTURES, save_model_dir
from transformers import AutoModelForCausalLM, AutoTokenizer

from lmrl.config import load_config
from lmrl.tracking import read_jsonl
from lmrl.trainers.dpo import trainer as preference
from lmrl.trainers.rl import trainer as online
from lmrl.trainers.sft import trainer as sft
from tests.helpers import digit_fraction, register_once

COMMON = ["precision=fp32", "device=cpu", "eval_every=0", "save_every=0", "log_every=1"]
RL = [
    "sample_every=100",
    "task_args.digits=1",
    "train_rows=32",
    "eval_rows=4",
    "prompts_per_step=2",
    "samples_per_prompt=3",
    "max_new_tokens=6",
    "rewards=[test_digit_share]",
    "lr=1e-3",
    "logprob_chunk_mb=0.0001",
]


register_once("test_digit_share", digit_fraction)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("zoo")
    return {arch: save_model_dir(arch, root / arch) for arch in ARCHITECTURES}


def loads_and_generates(final) -> None:
    """`final/` in plain transformers: the model loads and greedily generates a few tokens."""
    model = AutoModelForCausalLM.from_pretrained(final).eval()
    tokenizer = AutoTokenizer.from_pretrained(final)
    ids = tokenizer("1+2=", return_tensors="pt", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    assert out.shape == (1, ids.shape[1] + 3) or out.shape[1] > ids.shape[1]


def rl_run(model_dir, run, *overrides) -> list[dict]:
    """Two steps of `lmrl rl` on ``model_dir``; the metrics of its training steps."""
    online.train(
        load_config(
            online.RLConfig, None, [f"model={model_dir}", f"output_dir={run}", "max_steps=2", *COMMON, *RL, *overrides]
        )
    )
    return [r for r in read_jsonl(run / "metrics.jsonl") if "update/shared_prompts" in r]


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_grpo_runs_with_every_speed_up_used_and_final_loads_in_transformers(arch, model_dirs, tmp_path):
    run = tmp_path / "grpo"
    rows = rl_run(model_dirs[arch], run, "algorithm=grpo")
    assert len(rows) == 2 and all(torch.isfinite(torch.tensor(r["loss/policy"])) for r in rows), rows
    assert all(r["update/shared_prompts"] == 1.0 and r["update/chunked_head"] == 1.0 for r in rows), rows
    # every architecture reuses the sampler's outputs, GPT-2's Conv1D layers and dropout models (in eval mode) included
    assert all(r["update/reused_sampling_forward"] > 0 for r in rows), rows
    assert all(abs(r["policy/sampler_logp_gap"]) < 1e-4 for r in rows if "policy/sampler_logp_gap" in r), rows
    loads_and_generates(run / "final")


# in the default suite: the architectures this combination broke (GPT-2's cache, OPT's dropout) or that need more
# (MoE experts as LoRA parameters, a soft-capped head); every one with `make test-all`
LORA_DEFAULT = {"gpt2", "opt-dropout", "qwen3-moe", "gemma2"}


@pytest.mark.parametrize(
    "arch", [a if a in LORA_DEFAULT else pytest.param(a, marks=pytest.mark.slow) for a in ARCHITECTURES]
)
def test_lora_grpo_with_gradient_checkpointing(arch, model_dirs, tmp_path):
    run = tmp_path / "lora"
    rows = rl_run(model_dirs[arch], run, "gradient_checkpointing=true", "lora_r=4", "lora_alpha=8", "merge_lora=true")
    assert len(rows) == 2 and all(r["update/shared_prompts"] == 0.0 for r in rows), rows  # checkpointing: no sharing
    loads_and_generates(run / "final")


@pytest.mark.slow
@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_ppo(arch, model_dirs, tmp_path):
    run = tmp_path / "ppo"
    rows = rl_run(model_dirs[arch], run, "algorithm=ppo")
    assert len(rows) == 2 and all("loss/value" in r for r in rows), rows
    loads_and_generates(run / "final")


# in the default suite: GPT-2 (its blocks take the KV cache positionally: the value model's forward built one and
# the recompute appended to it, "size of tensor a (66) must match b (33)") and a Llama; every one with `make test-all`
PPO_CHECKPOINTING_DEFAULT = {"gpt2", "llama"}


@pytest.mark.parametrize(
    "arch", [a if a in PPO_CHECKPOINTING_DEFAULT else pytest.param(a, marks=pytest.mark.slow) for a in ARCHITECTURES]
)
def test_ppo_with_gradient_checkpointing(arch, model_dirs, tmp_path):
    """The policy and the value model (a copy of its backbone) recompute their layers in the backward (2-digit
    problems: prompts of several lengths, so the value model's rows carry padding, where GPT-2 crashed)."""
    run = tmp_path / "ppo_ckpt"
    rows = rl_run(model_dirs[arch], run, "algorithm=ppo", "gradient_checkpointing=true", "task_args.digits=2")
    assert len(rows) == 2 and all(torch.isfinite(torch.tensor(r["loss/value"])) for r in rows), rows
    loads_and_generates(run / "final")


@pytest.mark.slow
@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_sft(arch, model_dirs, tmp_path):
    offline_run(
        sft.train,
        sft.SFTConfig,
        tmp_path / "sft",
        f"model={model_dirs[arch]}",
        "task_args.digits=1",
        "logprob_chunk_mb=0.0001",
    )


@pytest.mark.slow
@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_dpo(arch, model_dirs, tmp_path):
    offline_run(
        preference.train, preference.DPOConfig, tmp_path / "dpo", f"model={model_dirs[arch]}", "data_args.digits=1"
    )


def offline_run(train, config_class, run, *overrides) -> None:
    """Two steps of an offline trainer: finite losses, and a final/ that plain transformers loads and runs."""
    train(
        load_config(
            config_class,
            None,
            [f"output_dir={run}", "max_steps=2", "train_rows=16", "eval_rows=4", "batch_size=4", *COMMON, *overrides],
        )
    )
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if "loss" in r]
    assert rows and all(torch.isfinite(torch.tensor(r["loss"])) for r in rows), rows
    loads_and_generates(run / "final")


@pytest.mark.slow
@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_eval(arch, model_dirs, tmp_path):
    from lmrl.cli import main

    out = tmp_path / "eval.json"
    assert (
        main(
            [
                "eval",
                f"model={model_dirs[arch]}",
                "dataset=task:arithmetic",
                "task_args.digits=1",
                "rows=4",
                "metrics=[accuracy,pass@2]",
                "max_new_tokens=4",
                "precision=fp32",
                f"output_file={out}",
            ]
        )
        == 0
    )
    result = json.loads(out.read_text())
    assert "accuracy" in json.dumps(result)

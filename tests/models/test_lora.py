"""LoRA through peft in every trainer: only adapters (and heads) train, the reference is the base with adapters
disabled, resume is exact, final/ loads; gradient checkpointing and device placement; bad input at start-up."""

from pathlib import Path

import pytest
import torch

from lmrl.config import ConfigError, load_config
from lmrl.models.lora import BaseModelView, is_peft, linear_module_names
from lmrl.models.memory import enable_gradient_checkpointing
from lmrl.models.placement import resolve_device
from lmrl.models.setup import LoraSettings, ModelSetup
from lmrl.tracking import read_jsonl
from lmrl.trainers.dpo import trainer as preference
from lmrl.trainers.rl import trainer as online
from lmrl.trainers.sft import trainer as sft
from tests.helpers import PREFERENCE_RUN, RL_RUN, TINY, TINY_ARGS, digit_fraction, register_once

pytest.importorskip("peft")

MODEL = [
    *TINY,
    "precision=fp32",
    "device=cpu",
    # a random base with the usual 0.02 init has logits of at most ~0.6 through its frozen embeddings, so no
    # adapter could make a prediction sharp; a pretrained base is not like that, a 0.3 init is closer to it
    "model_args.initializer_range=0.3",
]
LORA = ["lora_r=4", "lora_alpha=8"]


def test_only_adapters_train_and_the_reference_is_the_base_with_adapters_off():
    setup = ModelSetup(
        "builtin:tiny",
        model_args=TINY_ARGS,
        precision="fp32",
        lora=ModelSetup.from_config(load_config(sft.SFTConfig, None, LORA)).lora,
    )
    policy, tok = setup.policy()
    reference = setup.frozen(None, tok)
    assert is_peft(policy) and isinstance(reference, BaseModelView)
    assert not list(reference.named_parameters(recurse=False))  # no second copy of any weight
    trainable = [n for n, p in policy.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    base = setup.frozen("builtin:tiny", tok, seed=1)  # not the policy's base: loaded as a model of its own
    assert not isinstance(base, BaseModelView)
    with torch.no_grad():
        for p in policy.parameters():
            if p.requires_grad:
                p.add_(0.5)  # B != 0: the adapters now change the output
        with_adapters = policy(input_ids=ids).logits
        ref = reference(input_ids=ids).logits
        with policy.disable_adapter():
            plain = policy(input_ids=ids).logits
    assert not torch.allclose(with_adapters, ref)
    torch.testing.assert_close(ref, plain)
    fresh = ModelSetup("builtin:tiny", model_args=setup.model_args, precision="fp32").policy()[0]
    torch.testing.assert_close(ref, fresh(input_ids=ids).logits)  # the base is the untouched initial model


def test_lora_sft_learns_changes_only_adapters_and_final_loads(tmp_path):
    cfg = load_config(
        sft.SFTConfig,
        None,
        [
            f"output_dir={tmp_path / 'run'}",
            *MODEL,
            *LORA,
            "task_args.digits=1",
            "train_rows=200",
            "eval_rows=20",
            "max_steps=40",
            "batch_size=16",
            "lr=1e-2",
            "lora_r=8",
            "eval_every=0",
            "save_every=0",
            "log_every=1",
            "merge_lora=true",
        ],
    )
    result = sft.train(cfg)
    assert result["eval/loss"] < 0.7 * result["initial/eval/loss"], result
    final = Path(cfg.output_dir) / "final"
    assert (final / "config.json").exists() and (final / "adapter" / "adapter_config.json").exists()
    from lmrl.models import load_model_and_tokenizer

    merged, tok = load_model_and_tokenizer(str(final))
    adapter, _ = load_model_and_tokenizer(str(final / "adapter"))  # an adapter dir loads as base + adapter
    ids = torch.tensor([[5, 6, 7, 8]])
    torch.testing.assert_close(merged(input_ids=ids).logits, adapter(input_ids=ids).logits, rtol=1e-4, atol=1e-5)


register_once("test_lora_digits", digit_fraction)


@pytest.mark.slow  # ~1-1.5 min; the default suite trains LoRA in test_lora_resume_is_exact
def test_lora_grpo_learns_and_trains_only_adapters(tmp_path, monkeypatch):
    seen = {}
    real_update = online.update

    def spy(parts, *args, **kwargs):
        before = {n: p.detach().clone() for n, p in parts.model.named_parameters()}
        stats = real_update(parts, *args, **kwargs)
        seen.setdefault("changed", set()).update(
            n for n, p in parts.model.named_parameters() if not torch.equal(p, before[n])
        )
        return stats

    monkeypatch.setattr(online, "update", spy)
    config = load_config(
        online.RLConfig,
        None,
        [
            f"output_dir={tmp_path / 'grpo'}",
            *MODEL,
            *RL_RUN,
            "rewards=[test_lora_digits]",
            "eval_every=0",
            "save_every=0",
            "log_every=1",
            "sample_every=100",
            "max_steps=20",
            "lora_r=8",
            "lora_alpha=16",
            "lr=3e-2",
            "kl_coef=0.01",
        ],
    )
    online.train(config)
    assert seen["changed"] and all("lora_" in n for n in seen["changed"])
    rows = read_jsonl(Path(config.output_dir) / "metrics.jsonl")
    rewards = [r["reward/mean"] for r in rows if "reward/mean" in r]
    assert sum(rewards[-5:]) / 5 > sum(rewards[:5]) / 5 + 0.1, rewards
    assert rows[1]["kl"] == pytest.approx(0.0, abs=1e-6)  # step 1: policy == base with adapters off


def test_lora_dpo_learns(tmp_path):
    cfg = load_config(
        preference.DPOConfig,
        None,
        [
            f"output_dir={tmp_path / 'dpo'}",
            *MODEL,
            *LORA,
            "data_args.digits=1",
            *PREFERENCE_RUN,
            "max_steps=15",
            "lr=2e-2",
            "precompute_ref=false",
        ],
    )
    preference.train(cfg)
    rows = [r for r in read_jsonl(Path(cfg.output_dir) / "metrics.jsonl") if "loss" in r and r["step"] > 0]
    assert rows[0]["loss"] == pytest.approx(0.693147, abs=1e-5)  # the reference is exactly the initial policy
    assert rows[-1]["policy/reward_accuracy"] >= 0.75 and rows[-1]["loss"] < 0.6, rows[-1]


def test_lora_resume_is_exact(tmp_path):
    args = [
        *MODEL,
        *LORA,
        "task_args.digits=1",
        "train_rows=64",
        "eval_rows=8",
        "batch_size=8",
        "lr=1e-2",
        "eval_every=0",
        "log_every=1",
        "max_steps=6",
    ]
    whole = sft.train(load_config(sft.SFTConfig, None, [f"output_dir={tmp_path / 'a'}", *args, "save_every=0"]))
    part = load_config(sft.SFTConfig, None, [f"output_dir={tmp_path / 'b'}", *args, "save_every=3"])
    from lmrl.trainers import sft_step

    original = sft_step.train_step
    calls = {"n": 0}

    def crash_after_3(*a, **k):
        calls["n"] += 1
        if calls["n"] == 5:  # inside step 5, after checkpoint 3 was written
            raise KeyboardInterrupt
        return original(*a, **k)

    sft_step.train_step = crash_after_3
    try:
        with pytest.raises(KeyboardInterrupt):
            sft.train(part)
    finally:
        sft_step.train_step = original
    assert (tmp_path / "b" / "checkpoints" / "step-3" / "trainable.safetensors").exists()
    resumed = sft.train(
        load_config(sft.SFTConfig, None, [f"output_dir={tmp_path / 'b'}", *args, "save_every=3", "resume=true"])
    )
    assert resumed["eval/loss"] == whole["eval/loss"]
    a = read_jsonl(tmp_path / "a" / "metrics.jsonl")
    b = read_jsonl(tmp_path / "b" / "metrics.jsonl")
    assert [r["loss"] for r in a if r.get("step") == 6 and "loss" in r] == [
        r["loss"] for r in b if r.get("step") == 6 and "loss" in r
    ]


def test_gradient_checkpointing_gives_the_same_gradients_and_keeps_fewer_activations(monkeypatch):
    import functools

    from lmrl.models import forward_plan, rebuild
    from lmrl.models.forward_plan import ForwardOptions, ForwardPlan

    setup = ModelSetup("builtin:tiny", precision="fp32")
    grads, saved = [], []
    for checkpointing in (False, True):
        model, _ = setup.policy()
        model.eval()  # as RL trainers keep the policy (no dropout): checkpointing must work there too
        if checkpointing:
            enable_gradient_checkpointing(model)
        torch.manual_seed(0)
        ids = torch.randint(3, 40, (4, 12))
        kept = [0]

        def pack(tensor):
            kept[0] += tensor.numel() * tensor.element_size()
            return tensor

        # the training forward's own hooks (`lmrl.models.rebuild`) are innermost: they report what they keep
        monkeypatch.setattr(forward_plan, "saving_less", functools.partial(rebuild.saving_less, observe=pack))
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            plan = ForwardPlan.resolve(model, ForwardOptions(share_prompts=True))  # checkpointing: not shared
            logp = plan.logprobs(model, ids, torch.ones_like(ids), 6)
        logp.sum().backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
        saved.append(kept[0])
        assert not model.model.layers[0].self_attn.training  # no dropout switched on
    assert saved[1] < saved[0] / 10, saved  # measured 7.6 MB -> 0.26 MB: the layers' activations are recomputed
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["device=cuda"], "sees no CUDA GPU"),
        (["device=gpu"], "'device' must be auto, cpu, cuda or cuda:N"),
        (["lora_r=4", "lora_target_modules=[q_proj,qkv]"], r"\['qkv'\] are not linear layers of this model"),
        (["lora_r=4", "load_in_4bit=true"], "load_in_4bit=true needs a CUDA GPU"),
        (["merge_lora=true"], "merge_lora=true needs LoRA"),
    ],
)
def test_bad_placement_and_lora_input_fails_at_start_up(tmp_path, overrides, message, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises((ConfigError, ValueError)) as info:
        cfg = load_config(sft.SFTConfig, None, [f"output_dir={tmp_path / 'run'}", *MODEL, *overrides])
        sft.train(cfg)
    assert len(str(info.value).splitlines()) <= 8
    assert __import__("re").search(message, str(info.value)), str(info.value)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_the_linear_module_list_names_the_models_layers():
    model, _ = ModelSetup("builtin:tiny", precision="fp32").policy()
    assert linear_module_names(model) == [
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
        "lm_head",
    ]


def test_device_auto_is_cpu_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")


ADAPTER_CHECKSUM = """
import sys, torch
from lmrl.models.setup import LoraSettings, ModelSetup
torch.manual_seed(int(sys.argv[1]))  # whatever the process drew before: the run's seed alone decides the adapters
torch.rand(int(sys.argv[1]) + 1)
setup = ModelSetup("builtin:tiny", seed=int(sys.argv[2]), precision="fp32", device="cpu",
                   lora=LoraSettings(4, 8, 0.0, ["all-linear"], False))
model, _ = setup.policy()
print(repr(sum(float(p.double().sum()) for n, p in model.named_parameters() if "lora_A" in n)))
"""


def test_lora_adapters_are_initialised_from_the_runs_seed_in_fresh_processes():
    import subprocess
    import sys

    def checksum(global_seed: int, seed: int) -> str:
        out = subprocess.run(
            [sys.executable, "-c", ADAPTER_CHECKSUM, str(global_seed), str(seed)],
            check=True,
            capture_output=True,
            text=True,
            env={**__import__("os").environ, "OMP_NUM_THREADS": "1"},
        )
        return out.stdout.strip().splitlines()[-1]

    first = checksum(1, 7)
    assert checksum(2, 7) == first  # same seed: the same adapters, bit for bit
    other = ModelSetup(
        "builtin:tiny", seed=8, precision="fp32", device="cpu", lora=LoraSettings(4, 8, 0.0, ["all-linear"], False)
    ).policy()[0]
    assert repr(sum(float(p.double().sum()) for n, p in other.named_parameters() if "lora_A" in n)) != first

"""The model-support matrix, numerics: every architecture of `arch_zoo` with every log-prob option.

In fp32 the sampler's log-probs (HFEngine, KV cache, one token at a time) must equal the training forward's
(`completion_logprobs`, the whole sequence at once) within 1e-4 with every option, dropout models included, and the
options must give the plain forward's gradients. Each speed-up is counted as it runs (`usage`, layer calls), never
assumed from the settings that asked for it.
"""

from __future__ import annotations

import pytest
import torch
from arch_zoo import ARCHITECTURES, build_model
from support_table import record

from lmrl.data.tokenizers import load_tokenizer
from lmrl.models.forward_plan import ForwardOptions, ForwardPlan
from lmrl.models.fused import fuse_layers, fused_count
from lmrl.models.lora import apply_lora
from lmrl.models.memory import enable_gradient_checkpointing
from lmrl.models.replay import SamplingRecorder, has_dropout
from lmrl.models.usage import counting
from lmrl.rollout.engines.hf import HFEngine
from lmrl.rollout.types import SamplingParams

OPTIONS = [
    "plain",
    "share_prompts",
    "reuse_sampling_forward",
    "chunked_head",
    "gradient_checkpointing",
    "lora",
    "fused_layers",
]

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer("builtin:char")


def prepared(arch: str, option: str, tokenizer):
    model = build_model(arch, tokenizer)
    if option == "gradient_checkpointing":
        enable_gradient_checkpointing(model)
    if option == "fused_layers":
        fuse_layers(model)
    if option == "lora":
        model = apply_lora(model, 4, 8, 0.0, ["all-linear"], {"model": arch, "seed": 0})
        trained = [n for n, p in model.named_parameters() if p.requires_grad]
        assert trained and all("lora_" in n for n in trained)
        if arch.endswith("moe"):  # the fused experts train too (peft's "all-linear" alone skips them)
            assert any("experts" in n for n in trained), trained
    return model


def sample(model, tokenizer, record: bool):
    prompts = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in ("12+34=", "7+8=", "123+456+7=")]
    params = SamplingParams(max_new_tokens=12, temperature=1.0)  # 10-13 prompt + 12 tokens: past the 8-token windows
    return HFEngine(model, tokenizer).generate(
        prompts,
        params,
        n=3,
        generator=torch.Generator().manual_seed(0),
        recorder=SamplingRecorder() if record else None,
    )


def learner_logprobs(model, batch, option: str):
    """The training forward under the plan `ForwardPlan.resolve` makes for ``option`` on this model."""
    asked = ForwardOptions(
        share_prompts=option in ("share_prompts", "reuse_sampling_forward", "gradient_checkpointing", "lora"),
        chunk_mb=1e-4 if option == "chunked_head" else 128,
    )
    plan = ForwardPlan.resolve(model, asked)
    return plan.logprobs(
        model, batch.input_ids, batch.attention_mask, batch.prompt_ids.shape[1], linear_outputs=batch.linear_outputs
    )


def layer_calls(model) -> tuple[dict[str, int], list]:
    """Counts of forward calls of every module inside a decoder layer (a recompute in the backward calls them again)."""
    counts: dict[str, int] = {}
    handles = []
    for name, module in model.named_modules():
        if getattr(module, "lmrl_checkpointed", False):
            for child_name, child in module.named_children():
                key = f"{name}.{child_name}"
                count = lambda *_, key=key: counts.__setitem__(key, counts.get(key, 0) + 1)  # noqa: E731
                handles.append(child.register_forward_hook(count))
    return counts, handles


@pytest.mark.parametrize("option", OPTIONS)
@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_sampler_and_learner_log_probs_agree_with_every_option(arch, option, tokenizer):
    model = prepared(arch, option, tokenizer)
    modes = [m.training for m in model.modules()]
    batch = sample(model, tokenizer, record=option == "reuse_sampling_forward")
    assert [m.training for m in model.modules()] == modes  # sampling puts every module's own mode back
    assert not any(modes[1:]) or option == "lora"  # RL policies run in eval mode: no dropout in sampler or learner
    counts, handles = layer_calls(model)
    with counting() as usage:
        logp = learner_logprobs(model, batch, option)
    mask = batch.completion_mask.bool()
    gap = (logp - batch.sampler_logp)[mask].abs().max().item()
    logp.sum().backward()
    for handle in handles:
        handle.remove()
    record(arch, option, gap=gap, usage=usage)
    assert gap < TOLERANCE, f"{arch} {option}: sampler/learner log-prob gap {gap:.2e}"
    # each speed-up really ran (counted while the forward ran)
    assert usage["forwards"] == 1
    assert usage["shared_prompts"] == int(option in ("share_prompts", "reuse_sampling_forward", "lora"))
    assert usage["chunked_head"] == int(option == "chunked_head")
    if option == "reuse_sampling_forward":
        expect_replay = not has_dropout(model)  # eval mode: GPT-2 and OPT drop nothing
        flat_mlp = arch.startswith("opt")  # OPT runs its MLP on (rows x tokens, H): those layers are computed
        computed_ok = usage["computed"] == 0 or flat_mlp and usage["computed"] < usage["replayed"]
        replayed_all = usage["replayed"] > 0 and computed_ok
        assert replayed_all if expect_replay else usage["replayed"] == 0, usage
    # fused RMSNorm/SwiGLU ran in the forward exactly where `fuse_layers` swapped them in (none in other options)
    assert usage["forward_fused"] == (fused_count(model) if option == "fused_layers" else 0), usage
    if option == "gradient_checkpointing":  # the backward recomputed each layer (it may stop once it has what it needs)
        assert counts and all(1 <= n <= 2 for n in counts.values()) and max(counts.values()) == 2, counts


@pytest.mark.parametrize("option", [o for o in OPTIONS if o not in ("plain", "lora")])
@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_every_option_gives_the_plain_forwards_gradients(arch, option, tokenizer):
    weights = None
    grads = []
    for which in ("plain", option):
        model = prepared(arch, which, tokenizer)
        batch = sample(model, tokenizer, record=which == "reuse_sampling_forward")
        logp = learner_logprobs(model, batch, which)
        if weights is None:  # a fixed random per-token weighting, as a policy loss's advantages would be
            weights = torch.randn(logp.shape, generator=torch.Generator().manual_seed(1))
        (logp * weights * batch.completion_mask).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and grads[0]
    scale = max(g.abs().max().item() for g in grads[0].values())  # rounding is relative to the largest gradient
    for name, grad in grads[0].items():
        assert torch.allclose(grads[1][name], grad, atol=1e-5 * scale, rtol=1e-4), f"{arch} {option}: {name}"

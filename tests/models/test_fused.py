"""Fused RMSNorm, SwiGLU and tanh GELU (`lmrl.models.fused`): hand-computed values and gradients, the HF modules' own values and
gradients on real decoders, what is refused, and a GRPO run that counts the fused calls it reports."""

from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from lmrl.models.fused import RMSNormFunction, SwiGLUFunction, fuse_layers, fused_count
from lmrl.models.usage import counting
from lmrl.notices import SpeedupOff
from lmrl.tracking import read_jsonl
from tests.helpers import SMALL_DECODER
from tests.rounding import assert_trained_alike

pytestmark = pytest.mark.portable  # `make test-portable`: again under other CPU kernels and threads


def test_rms_norm_hand_values_and_gradients():
    # x = (3, 4), w = (1, 2), eps 0: mean(x^2) = 12.5, r = 1/sqrt(12.5), n = x r = (0.848528, 1.131371), y = w n
    x = torch.tensor([[3.0, 4.0]], requires_grad=True)
    w = torch.tensor([1.0, 2.0], requires_grad=True)
    y = RMSNormFunction.apply(x, w, 0.0)
    r = 1 / math.sqrt(12.5)
    torch.testing.assert_close(y, torch.tensor([[3 * r, 8 * r]]))
    # dy = (1, 0): g = dy w = (1, 0), mean(g n) = 3r/2; dx = r (g - n 3r/2), dw = dy n = (3r, 0)
    y.backward(torch.tensor([[1.0, 0.0]]))
    mean_gn = 3 * r / 2
    torch.testing.assert_close(x.grad, torch.tensor([[r * (1 - 3 * r * mean_gn), r * (0 - 4 * r * mean_gn)]]))
    torch.testing.assert_close(w.grad, torch.tensor([3 * r, 0.0]))


def test_swiglu_hand_values_and_gradients():
    # a = 0: silu(0) = 0, silu'(0) = 1/2; a = 2: sigmoid(2) = s, silu = 2s, silu' = s (1 + 2 (1 - s))
    a = torch.tensor([0.0, 2.0], requires_grad=True)
    b = torch.tensor([3.0, 5.0], requires_grad=True)
    out = SwiGLUFunction.apply(a, b)
    s = 1 / (1 + math.exp(-2))
    torch.testing.assert_close(out, torch.tensor([0.0, 2 * s * 5]))
    out.sum().backward()
    torch.testing.assert_close(a.grad, torch.tensor([0.5 * 3, s * (1 + 2 * (1 - s)) * 5]))
    torch.testing.assert_close(b.grad, torch.tensor([0.0, 2 * s]))
    a64 = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    b64 = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(SwiGLUFunction.apply, (a64, b64))


def tiny(cls, config_cls, **extra):
    torch.manual_seed(0)
    config = config_cls(vocab_size=97, **SMALL_DECODER, max_position_embeddings=64, **extra)
    model = cls(config).eval()
    with torch.no_grad():  # norms away from their all-ones init, so a wrong weight gradient shows
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


@pytest.mark.parametrize(
    "build,norms",
    [
        (lambda: tiny(LlamaForCausalLM, LlamaConfig), 5),  # 2 per layer + the final norm
        (lambda: tiny(Qwen3ForCausalLM, Qwen3Config, head_dim=16), 9),  # + q_norm and k_norm over each head
    ],
    ids=["llama", "qwen3"],
)
def test_fused_decoders_give_the_modules_values_and_gradients(build, norms):
    own = build()
    model = copy.deepcopy(own)
    assert fuse_layers(model) == {"rms_norm": norms, "swiglu": 2}
    assert fuse_layers(model) == {"rms_norm": norms, "swiglu": 2} and fused_count(model) == norms + 2  # idempotent
    ids = torch.randint(0, 97, (3, 9), generator=torch.Generator().manual_seed(0))
    for autocast in (False, True):
        results = []
        for m in (own, model):
            m.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                logits = m(input_ids=ids).logits.float()
            logits.log_softmax(-1)[..., 5].sum().backward()
            results.append((logits.detach(), {k: p.grad for k, p in m.named_parameters()}))
        (a, grads_a), (b, grads_b) = results
        assert torch.equal(a, b)  # the forward runs the modules' own ops in their order
        for name, grad in grads_a.items():
            tol = 1e-5 if not autocast else 2e-2  # bf16: the norm's backward rounds in another order
            torch.testing.assert_close(grads_b[name], grad, rtol=tol, atol=tol * grad.abs().max().item(), msg=name)


def test_a_norm_the_fused_version_does_not_reproduce_keeps_its_own_forward():
    class OffsetRMSNorm(torch.nn.Module):  # Gemma-style (1 + w): looks like an RMSNorm, computes something else
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(8))
            self.variance_epsilon = 1e-6

        def forward(self, x):
            return (1 + self.weight) * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)

    class MLP(torch.nn.Module):  # SwiGLU's parts with GELU: not fused
        def __init__(self):
            super().__init__()
            self.gate_proj, self.up_proj, self.down_proj = (torch.nn.Linear(8, 8) for _ in range(3))
            self.act_fn = torch.nn.GELU()

        def forward(self, x):
            return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))

    model = torch.nn.Sequential(OffsetRMSNorm(), MLP())
    with counting() as used:
        with pytest.warns(SpeedupOff, match=r"the fused rms_norm is off for Sequential: 1 of 1 modules .*differs by"):
            assert fuse_layers(model) == {"rms_norm": 0, "swiglu": 0} and fused_count(model) == 0
    assert used.total_of("fused_") == 0  # the check's own calls are not counted as uses


def test_a_norm_that_rounds_in_another_order_is_fused():
    """A bf16 RMSNorm that rounds every op to bf16 (the fused one computes in fp32 and rounds once): the two differ
    by a few bf16 roundoffs, above the 1e-2 once allowed; the fused one is as close to the float64 value."""

    class DividingRMSNorm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.linspace(0.5, 2.0, 64, dtype=torch.bfloat16))
            self.variance_epsilon = 1e-6

        def forward(self, x):
            return self.weight * (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    norm = DividingRMSNorm()
    x = 3 * torch.randn(2, 3, 64, generator=torch.Generator().manual_seed(0)).bfloat16()
    own = norm(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SpeedupOff)
        assert fuse_layers(norm) == {"rms_norm": 1, "swiglu": 0}
    assert (norm(x).float() - own.float()).abs().max() > 1e-2  # not bitwise: the old constant refused it


def test_grpo_counts_the_fused_calls_it_reports_and_trains_as_without_them(tmp_path):
    from lmrl.models import load_model
    from lmrl.trainers.rl import trainer as online
    from tests.trainers.test_online import rl_config

    finals = []
    for on in ("true", "false"):
        out = tmp_path / on
        with counting() as used:
            online.train(
                rl_config(tmp_path, "grpo", "max_steps=2", f"output_dir={out}", f"fused_layers={on}", "adam_eps=1.0")
            )
        ran = used.total_of("fused_")
        rows = [r for r in read_jsonl(out / "metrics.jsonl") if "update/fused_calls" in r]
        assert len(rows) == 2
        if on == "true":  # builtin:tiny, 2 layers: (2 x (2 norms + 1 MLP) + the final norm) x 2 decoder passes
            # (shared prompts: each distinct prompt once, then the completions)
            assert ran > 0 and all(r["update/fused_calls"] == 14 for r in rows), rows
            # the inputs of q, k, v (a norm's output), gate, up (the other norm's) and down (SwiGLU's) are rebuilt
            # in the backward, not kept (`lmrl.models.rebuild`): 6 saves x 2 layers x 2 passes
            assert all(r["update/rebuilt_saves"] == 24 and r["update/rebuilt_mib"] > 0 for r in rows), rows
        else:
            assert ran == 0 and all(r["update/fused_calls"] == 0 for r in rows), rows
            assert all(r["update/rebuilt_saves"] == 0 for r in rows), rows
        finals.append(dict(load_model(str(out / "final")).named_parameters()))
    assert_trained_alike(finals[0], finals[1])  # fp32: the fused backward differs from autograd's by rounding only


def test_fused_swiglu_gradients_are_autograds_bit_for_bit_in_bf16():
    torch.manual_seed(0)
    a, b, d = torch.randn(64, 256) * 3, torch.randn(64, 256), torch.randn(64, 256)

    def grads(fn):
        x, y = a.bfloat16().requires_grad_(), b.bfloat16().requires_grad_()
        fn(x, y).backward(d.bfloat16())
        return x.grad, y.grad

    for mine, native in zip(grads(SwiGLUFunction.apply), grads(lambda x, y: F.silu(x) * y)):
        assert torch.equal(mine, native)


def test_gpt2s_tanh_gelu_runs_as_one_kernel_with_the_same_values_and_fewer_saves():
    """GPT-2's NewGELUActivation (seven autograd ops) becomes F.gelu(approximate="tanh"): the same logits and
    gradients up to rounding, one save per MLP instead of its ops' intermediates, and every call counted."""
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=97, n_embd=64, n_layer=2, n_head=4, n_positions=64, resid_pdrop=0.0)
    own = GPT2LMHeadModel(config).eval()
    model = copy.deepcopy(own)
    assert fuse_layers(model) == {"rms_norm": 0, "swiglu": 0, "gelu_tanh": 2} and fused_count(model) == 2
    ids = torch.randint(0, 97, (3, 9), generator=torch.Generator().manual_seed(0))
    results = []
    for m in (own, model):
        m.zero_grad(set_to_none=True)
        saved = []
        with (
            counting() as used,
            torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.shape) or t, lambda t: t),
        ):
            logits = m(input_ids=ids).logits
        logits.log_softmax(-1)[..., 5].sum().backward()
        results.append((logits.detach(), {k: p.grad for k, p in m.named_parameters()}, len(saved)))
        assert used["fused_gelu_tanh"] == (2 if m is model else 0)
    (a, grads_a, saves_a), (b, grads_b, saves_b) = results
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    for name, grad in grads_a.items():
        torch.testing.assert_close(grads_b[name], grad, rtol=1e-4, atol=1e-5, msg=name)
    assert saves_a - saves_b == 2 * 3  # 3 fewer tensors kept per layer: F.gelu keeps x only

"""lmrl.models.rebuild: saves replaced by recipes give the same bits and keep fewer bytes, counted."""

import contextlib

import pytest
import torch

from lmrl.models import forward_plan
from lmrl.models.attention import use_fp32_cpu_attention
from lmrl.models.fused import fuse_layers
from lmrl.models.rebuild import rebuildable, saving_less
from lmrl.models.usage import counting
from tests.models.test_replay import PROMPTS, bf16_logprobs, sample_bf16, tiny_llama


def bf16_replay_step(model, batch, monkeypatch, less: bool):
    """One replayed bf16 training forward and backward; the log-probs, the gradients and the usage counts."""
    model.zero_grad(set_to_none=True)
    with monkeypatch.context() as patch, counting() as usage:
        if not less:
            patch.setattr(forward_plan, "saving_less", lambda: contextlib.nullcontext({}))
        logp = bf16_logprobs(model, batch, batch.linear_outputs)
    (logp * torch.linspace(-1, 1, logp.numel()).view_as(logp)).sum().backward()
    return logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}, usage


def test_rebuilt_saves_give_the_same_bits_and_keep_the_bytes_counted(monkeypatch):
    model = tiny_llama()  # hidden 64, 4 heads of 16 on 2 key/value heads, MLP 128, 2 layers
    fuse_layers(model)
    use_fp32_cpu_attention(model)
    batch = sample_bf16(model)
    logp, grads, usage = bf16_replay_step(model, batch, monkeypatch, less=False)
    assert usage["rebuilt"] == 0 and usage["rebuilt_bytes"] == 0
    logp_less, grads_less, usage_less = bf16_replay_step(model, batch, monkeypatch, less=True)
    assert torch.equal(logp, logp_less)
    assert all(torch.equal(grads[name], grads_less[name]) for name in grads)

    # by hand, per layer and forward of n rows x t positions (k keys): the bf16 inputs of q/k/v (one cast, saved 3x),
    # of gate/up (one, saved 2x) and of o (3 x t x 64 x 2 bytes, rebuilt from what the norms and the attention keep),
    # SwiGLU's output (t x 128 x 2, from gate and up), the fp32 values (2 heads x 16 x k x (4 - 2): the bf16 ones
    # are kept instead)
    rows, prompt_len = len(PROMPTS), batch.prompt_ids.shape[1]
    forwards = [(rows, prompt_len, prompt_len), (len(batch.input_ids), batch.input_ids.shape[1] - prompt_len - 1, None)]
    expected = 0
    for n, t, k in forwards:
        k = batch.input_ids.shape[1] - 1 if k is None else k  # the completions attend to the prompt's keys too
        expected += n * (3 * t * 64 * 2 + t * 128 * 2 + 2 * 16 * k * 2)
    layers = model.config.num_hidden_layers
    assert usage_less["rebuilt_bytes"] == layers * expected
    assert usage_less["rebuilt"] == layers * 2 * (6 + 1 + 1)  # q k v o gate up, v's fp32 cast, down's input


def test_a_recipe_is_used_only_when_it_keeps_fewer_bytes():
    x = torch.randn(6, 8, requires_grad=True)
    with saving_less() as stats:
        h = x * 2  # fp32, kept by nobody
        low = rebuildable(h.bfloat16(), torch.Tensor.bfloat16, h, name="cast")
        (low * low).sum().backward()  # keeping h (4 bytes each) to rebuild low (2 bytes each) would cost more
    assert stats == {"rebuilt": 0, "rebuilt_bytes": 0}
    with saving_less() as stats:
        e = x.exp()  # exp keeps its output e: rebuilding from it costs nothing
        low = rebuildable(e.bfloat16(), torch.Tensor.bfloat16, e, name="cast")
        y = (low * low).sum()
    y.backward()
    assert stats == {"rebuilt": 2, "rebuilt_bytes": 6 * 8 * 2}  # one tensor saved twice, one saving


def test_a_source_modified_in_place_after_the_forward_is_refused_at_the_backward():
    x = torch.randn(6, 8, requires_grad=True)
    with saving_less():
        e = x.exp()
        low = rebuildable(e.bfloat16(), torch.Tensor.bfloat16, e, name="cast")
        y = (low * low).sum()
    with torch.no_grad():
        e.add_(1)
    with pytest.raises(RuntimeError, match="modified by an in-place operation"):
        y.backward()


def test_nothing_is_registered_without_gradients():
    from lmrl.models import rebuild

    x = torch.randn(4, 4)
    with saving_less(), torch.no_grad():
        e = x.exp()
        low = rebuildable(e.bfloat16(), torch.Tensor.bfloat16, e, name="cast")
        assert low.dtype == torch.bfloat16 and rebuild._ACTIVE[-1] == {}


def test_observe_sees_every_tensor_kept_as_itself():
    x = torch.randn(6, 8, requires_grad=True)
    seen = []
    with saving_less(observe=seen.append) as stats:
        e = x.exp()  # keeps e
        low = rebuildable(e.bfloat16(), torch.Tensor.bfloat16, e, name="cast")
        (low * low).sum().backward()
    assert stats["rebuilt"] == 2 and len(seen) == 1 and seen[0] is e

"""Packed bf16 weights while sampling on a CPU (`lmrl.models.packed`): bitwise the same rollouts, counted as used."""

import pytest
import torch
from test_replay import Tok, tiny_llama

from lmrl.models import packed
from lmrl.models.replay import SamplingRecorder
from lmrl.models.usage import counting
from lmrl.notices import SpeedupOff
from lmrl.rollout import HFEngine, SamplingParams

pytestmark = [
    pytest.mark.skipif(not packed.available(), reason="oneDNN without bf16 on this CPU: nothing is packed"),
    pytest.mark.portable,  # `make test-portable`: again under other CPU kernels and threads
]


@pytest.fixture(scope="module")
def tok():
    return Tok()


@pytest.fixture(scope="module")
def model():
    return tiny_llama(attention_bias=True).eval()  # q/k/v/o with biases: the packed path adds them too


@pytest.fixture(scope="module")
def prompts():
    return [[5, 6, 7, 8], [9, 10], [11, 12, 13]]


LINEARS_PER_FORWARD = 2 * 7 + 1  # q, k, v, o, gate, up, down per layer, and the LM head


def rollout(model, tok, prompts, pack: bool, record: bool = False):
    engine = HFEngine(model, tok, autocast_dtype=torch.bfloat16, pack_weights=pack)
    params = SamplingParams(max_new_tokens=12, temperature=1.0, stop_token_ids=())
    batch = engine.generate(
        prompts,
        params,
        n=4,
        generator=torch.Generator().manual_seed(3),
        recorder=SamplingRecorder() if record else None,
    )
    return batch, engine.metrics()


def test_packed_rollouts_equal_plain_ones_bitwise_and_are_counted(model, tok, prompts):
    plain, plain_metrics = rollout(model, tok, prompts, pack=False)
    batch, metrics = rollout(model, tok, prompts, pack=True)
    assert torch.equal(batch.completion_ids, plain.completion_ids)
    assert torch.equal(batch.sampler_logp, plain.sampler_logp)
    # one prefill and 11 decode forwards (the 12th token needs none), each through every linear layer
    assert metrics == {"rollout/packed_linear_calls": 12 * LINEARS_PER_FORWARD}
    assert plain_metrics == {}
    assert all("forward" not in vars(m) for m in model.modules())  # the class's forward is back


def test_the_record_for_replay_is_the_same_packed(model, tok, prompts):
    plain, _ = rollout(model, tok, prompts, pack=False, record=True)
    batch, metrics = rollout(model, tok, prompts, pack=True, record=True)
    assert metrics["rollout/packed_linear_calls"] > 0
    ours, theirs = batch.linear_outputs, plain.linear_outputs
    assert ours is not None and set(ours.prefill) == set(theirs.prefill) and set(ours.decode) == set(theirs.decode)
    for name in theirs.prefill:
        assert torch.equal(ours.prefill[name], theirs.prefill[name]), name
        assert torch.equal(ours.decode[name], theirs.decode[name]), name


def test_each_weight_is_cast_once_per_rollout(model, tok, prompts):
    from torch.profiler import profile

    packed.reproduces(128, 64, False)  # the shape check's own casts, once per process, before counting
    with profile(record_shapes=True) as prof:
        rollout(model, tok, prompts, pack=True)
    casts = sum(
        e.count
        for e in prof.key_averages(group_by_input_shape=True)
        if e.key == "aten::copy_" and e.input_shapes[:2] == [[128, 64], [128, 64]]
    )
    assert casts == 4  # gate_proj and up_proj of 2 layers, packed once for 12 forwards


def test_nothing_is_packed_with_gradients_on_without_bf16_or_for_other_layers(model):
    with torch.enable_grad(), packed.packed_linears(model, torch.bfloat16, rows=4) as swapped:
        assert swapped == 0
    with torch.no_grad(), packed.packed_linears(model, None, rows=4) as swapped:
        assert swapped == 0

    class Scaled(torch.nn.Linear):  # a subclass may do more in its forward (quantized, LoRA): kept
        def forward(self, x):
            return 2 * super().forward(x)

    layers = torch.nn.Sequential(torch.nn.Linear(8, 8), Scaled(8, 8))
    with torch.no_grad(), torch.autocast("cpu", torch.bfloat16), counting() as used:
        with packed.packed_linears(layers, torch.bfloat16, 4) as n:
            assert n == 1
            layers(torch.randn(3, 8))
    assert used["packed_linear_calls"] == 1
    assert "forward" not in vars(layers[0])


@pytest.fixture
def fresh_shape_checks():
    packed.reproduces.cache_clear()
    yield
    packed.reproduces.cache_clear()  # the next test checks the real kernel again


def test_a_packed_product_off_by_rounding_is_used_and_one_off_by_more_is_not(monkeypatch, fresh_shape_checks):
    """Another CPU's oneDNN may sum in another order: one bf16 ulp off is within the product's rounding bound (the
    packed linear is used); 1% off is a different product (F.linear kept, said in one line)."""
    real = packed._packed_linear

    def off_by(relative):
        return lambda x, w, b: (real(x, w, b).float() * (1 + relative)).to(torch.bfloat16)

    monkeypatch.setattr(packed, "_packed_linear", off_by(2.0**-8))  # one bf16 roundoff
    assert packed.reproduces(128, 64, True)
    packed.reproduces.cache_clear()
    monkeypatch.setattr(packed, "_packed_linear", off_by(1e-2))
    assert not packed.reproduces(128, 64, True)
    layers = torch.nn.Sequential(torch.nn.Linear(64, 128))
    with (
        pytest.warns(SpeedupOff, match=r"the packed bf16 linear is off for Sequential's 64 -> 128 layers"),
        torch.no_grad(),
        packed.packed_linears(layers, torch.bfloat16, 4) as swapped,
    ):
        assert swapped == 0


def test_without_onednn_bf16_the_packed_linear_says_it_is_off(monkeypatch):
    monkeypatch.setattr(packed, "available", lambda: False)
    layers = torch.nn.Sequential(torch.nn.Linear(8, 8))
    with (
        pytest.warns(SpeedupOff, match="the packed bf16 linear is off for Sequential: oneDNN has no bf16"),
        torch.no_grad(),
        packed.packed_linears(layers, torch.bfloat16, 4) as swapped,
    ):
        assert swapped == 0

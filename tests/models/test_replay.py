"""Reusing the sampler's linear outputs (lmrl.models.replay) gives the recomputed log-probs and gradients."""

import dataclasses
import functools
import weakref
from unittest import mock

import pytest
import torch

from lmrl.models import forward_plan, rebuild, replay
from lmrl.models.forward_plan import ForwardPlan, completion_logprobs
from lmrl.models.logprobs import prompt_groups, shared_prompt_outputs
from lmrl.models.replay import LinearRecorder, SamplingRecorder, has_dropout, is_linear, replaying
from lmrl.models.usage import counting
from lmrl.rollout import HFEngine, SamplingParams
from tests.helpers import tiny_gpt2, tiny_llama
from tests.rounding import assert_grads_alike

pytestmark = pytest.mark.portable  # `make test-portable`: again under other CPU kernels and threads

VOCAB = 50


class Tok:
    """The little of a tokenizer HFEngine.generate needs: ids in, text out."""

    pad_token_id, eos_token_id = 0, 2

    def batch_decode(self, rows, skip_special_tokens=True):
        return [" ".join(map(str, row)) for row in rows]


def llama(**extra):
    """A tiny Llama in train mode (as built); ``extra``: LlamaConfig keys (dropout)."""
    return tiny_llama(VOCAB, pad_token_id=0, **extra).train()


def gpt2():
    """A tiny GPT-2 in train mode (as built) with its dropout off."""
    return tiny_gpt2(VOCAB, pad_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0).train()


PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12, 13], [14, 15], [16, 17, 18, 19]]  # unequal: left padding


def sample(model, stop_ids=tuple(range(3, 12)), max_new=8, compact=0.5):
    """4 prompts x 4 samples; stop ids that end many rows early so that rows finish at different steps and the
    batch is compacted."""
    engine = HFEngine(model, Tok(), compact_threshold=compact)
    params = SamplingParams(max_new_tokens=max_new, temperature=1.0, stop_token_ids=stop_ids)
    return engine.generate(
        PROMPTS, params, n=4, generator=torch.Generator().manual_seed(0), recorder=SamplingRecorder()
    )


def sample_bf16(model):
    """4 prompts x 4 samples under bf16 autocast, recorded for replay."""
    engine = HFEngine(model, Tok(), autocast_dtype=torch.bfloat16)
    params = SamplingParams(max_new_tokens=8, temperature=1.0, stop_token_ids=(3,))
    return engine.generate(
        PROMPTS, params, n=4, generator=torch.Generator().manual_seed(0), recorder=SamplingRecorder()
    )


def bf16_logprobs(model, batch, record):
    """The training forward under bf16 autocast, prompts shared, replaying ``record``."""
    plan = ForwardPlan(dtype=torch.bfloat16, share_prompts=True)
    return plan.logprobs(model, batch.input_ids, batch.attention_mask, batch.prompt_ids.shape[1], linear_outputs=record)


def logprobs_and_grads(model, batch, replay: bool):
    model.zero_grad(set_to_none=True)
    logp = completion_logprobs(
        model,
        batch.input_ids,
        batch.attention_mask,
        batch.prompt_ids.shape[1],
        ForwardPlan(share_prompts=True),
        linear_outputs=batch.linear_outputs if replay else None,
    )
    weights = torch.linspace(-1, 1, logp.numel()).view_as(logp)
    (logp * weights).sum().backward()
    return logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same(model, batch):
    (a, grads_a), (b, grads_b) = logprobs_and_grads(model, batch, False), logprobs_and_grads(model, batch, True)
    assert torch.allclose(a, b, atol=1e-5)
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        assert torch.allclose(grads_a[name], grads_b[name], atol=1e-5, rtol=1e-4), name


def replay_counts(model, batch):
    ids, mask, start = batch.input_ids, batch.attention_mask, batch.prompt_ids.shape[1]
    first, inverse = prompt_groups(ids, mask, start)
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 1)
    with replaying(model, batch.linear_outputs, first) as counts:
        shared_prompt_outputs(model, ids, mask, positions, start, first, inverse)
    return counts


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_replayed_forward_gives_the_recomputed_logprobs_and_gradients(arch):
    model = llama() if arch == "llama" else gpt2()
    batch = sample(model)
    lengths = batch.completion_lengths.tolist()
    assert len(set(lengths)) >= 3 and max(lengths) == batch.completion_ids.shape[1]  # rows end at different steps
    model.train()
    assert_same(model, batch)
    linears = sum(is_linear(m) for m in model.modules())  # GPT-2: its Conv1D layers and the LM head
    assert replay_counts(model, batch) == {"replayed": 2 * linears, "computed": 0}
    # the learner's log-probs are the sampler's own
    logp, _ = logprobs_and_grads(model, batch, True)
    assert torch.allclose(logp, batch.sampler_logp, atol=1e-5)


def test_sub_batches_replay_their_own_rows():
    model = llama()
    batch = sample(model)
    model.train()
    for rows in (torch.tensor([4, 5, 6, 7, 12, 13, 14, 15]), torch.tensor([3, 0, 9, 1, 6, 2, 11])):
        sub = batch.select(rows)
        assert_same(model, sub)
        assert replay_counts(model, sub)["computed"] == 0


def test_changed_weights_or_shapes_are_computed_not_replayed():
    model = llama()
    batch = sample(model)
    model.train()
    with torch.no_grad():
        model.model.norm.weight.mul_(1.5)  # an in-place update, like an optimizer step's, of no linear layer
    assert_same(model, batch)  # equal to the forward with the new weight
    assert replay_counts(model, batch)["replayed"] == 0
    ids, mask = batch.input_ids, batch.attention_mask
    with replaying(model, batch.linear_outputs, prompt_groups(ids, mask, batch.prompt_ids.shape[1])[0]) as counts:
        model(input_ids=ids, attention_mask=mask)  # one unshared forward: no recorded output has its shape
    assert counts["replayed"] == 0
    assert "forward" not in vars(model.lm_head)  # the layers' own forward is back


def test_models_with_dropout_or_a_layer_used_twice_are_not_recorded():
    assert sample(llama(attention_dropout=0.1).train()).linear_outputs is None
    assert has_dropout(llama(attention_dropout=0.1).train()) and not has_dropout(llama().train())
    assert not has_dropout(llama(attention_dropout=0.1).eval())  # eval mode (an RL policy): nothing dropped
    assert sample(llama(attention_dropout=0.1).eval()).linear_outputs is not None
    model = llama()
    recorder = LinearRecorder(model, rows=1, steps=2)
    with recorder.prefill():
        model(input_ids=torch.tensor([[5, 6]]))
        model(input_ids=torch.tensor([[5, 6]]))  # every layer runs twice in one recorded forward
    assert recorder.finish(steps=1, group_size=1) is None
    assert not model.lm_head._forward_hooks  # hooks removed


def test_not_recorded_unless_asked():
    model = llama()
    batch = HFEngine(model, Tok()).generate(PROMPTS, SamplingParams(max_new_tokens=4), n=2)
    assert batch.linear_outputs is None and not model.lm_head._forward_hooks


def test_the_last_forward_frees_each_layers_record_as_it_replays_it():
    model = llama()
    batch = sample(model)
    model.train()
    record = batch.linear_outputs
    logp_kept, grads_kept = logprobs_and_grads(model, batch, True)
    assert record.prefill and record.decode  # a forward that is not the last one leaves the record whole
    buffers = [weakref.ref(t._base) for t in record.decode.values()]  # the step-major buffers the record views
    last = dataclasses.replace(batch, linear_outputs=record.for_last_use())
    logp, grads = logprobs_and_grads(model, last, True)
    assert record.prefill == {} and record.decode == {}  # every sub-batch shares these dicts
    assert all(ref() is None for ref in buffers)  # freed before the backward, not held through it
    assert torch.equal(logp, logp_kept)
    assert all(torch.equal(grads[name], grads_kept[name]) for name in grads_kept)


def test_layers_reading_one_input_share_one_cast_of_it():
    """q, k and v (and gate and up) read the same input: replayed under autocast, they take one bf16 cast of it,
    which the backward keeps once instead of once per layer; the gradients are those of the forward that computes
    every layer under autocast (one cast per layer, each layer's input gradient added in fp32)."""
    model = llama()
    batch = sample_bf16(model)
    inputs = []
    apply = replay._ReplayedLinear.apply

    def spy(x, weight, bias, recorded, x_low):
        inputs.append(x_low)  # what the backward keeps
        return apply(x, weight, bias, recorded, x_low)

    with mock.patch.object(replay._ReplayedLinear, "apply", spy), torch.autocast("cpu", dtype=torch.bfloat16):
        bf16_logprobs(model, batch, batch.linear_outputs)
    layers = model.config.num_hidden_layers
    per_forward = 7 * layers + 1  # q, k, v, o, gate, up, down per layer, then the LM head
    assert len(inputs) == 2 * per_forward  # the prompt forward and the completion forward, every layer replayed
    for start in range(0, len(inputs), per_forward):
        for layer in range(layers):
            q, k, v, o, gate, up, down = inputs[start + 7 * layer : start + 7 * layer + 7]
            assert q is k is v and gate is up and q.dtype == torch.bfloat16
            assert o is not q and down is not gate
    grads = []
    for record in (batch.linear_outputs, None):
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logp = bf16_logprobs(model, batch, record)
        (logp * torch.linspace(-1, 1, logp.numel()).view_as(logp)).sum().backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    assert_grads_alike(grads[0], grads[1], model)  # the replayed outputs are the sampler's: bf16 rounding apart


def test_replayed_layers_keep_the_fp32_weight_not_a_bf16_copy_of_it():
    """Under autocast a computed layer keeps a bf16 copy of its weight for the backward; a replayed one keeps the
    parameter itself (held by the model anyway) and casts it when the backward reads it: no storage of a weight's
    shape is saved beside the parameters, and the gradients match the forward that computes every layer."""
    model = llama()
    batch = sample_bf16(model)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    shapes = {s for p in model.parameters() if p.dim() == 2 for s in (tuple(p.shape), tuple(p.shape)[::-1])}
    grads, copies = [], []
    for record in (batch.linear_outputs, None):
        saved = []

        def pack(t):
            if t.untyped_storage().data_ptr() not in params and tuple(t.shape) in shapes:
                saved.append(t.dtype)
            return t

        model.zero_grad(set_to_none=True)
        observed = functools.partial(rebuild.saving_less, observe=pack)  # the training forward's hooks are innermost
        with mock.patch.object(forward_plan, "saving_less", observed), torch.autocast("cpu", dtype=torch.bfloat16):
            logp = bf16_logprobs(model, batch, record)
        (logp * torch.linspace(-1, 1, logp.numel()).view_as(logp)).sum().backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
        copies.append(saved)
    layers = model.config.num_hidden_layers
    assert copies[0] == []  # replayed: no weight copy kept
    assert len(copies[1]) >= 7 * layers and set(copies[1]) == {torch.bfloat16}  # computed: autocast's copies
    assert all(grad.dtype == torch.float32 for grad in grads[0].values())
    assert_grads_alike(grads[0], grads[1], model)


def test_rows_with_gradient_keeps_every_row_that_is_not_all_zero():
    grad = torch.zeros(10, 4)
    grad[1, 2], grad[4] = 1e-30, float("nan")  # a tiny and a NaN row are kept: only exact zeros add nothing
    assert replay.rows_with_gradient(grad).tolist() == [1, 4]
    assert replay.rows_with_gradient(torch.ones(10, 4)) is None  # every row: the plain backward, no gather
    grad[:9] = 1.0  # 9 of 10 rows (>= DENSE_SHARE): not worth gathering
    assert replay.rows_with_gradient(grad) is None


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_the_replayed_backward_skips_the_padding_rows_and_gives_the_same_gradients(arch):
    """Rows that stop early leave padding whose output gradient is exactly 0 at every layer: the replayed backward
    multiplies only the other rows (counted), and the gradients equal those of the backward that multiplies every
    row, and of the forward that computes every layer."""
    model = llama() if arch == "llama" else gpt2()
    batch = sample(model, max_new=12)
    assert (batch.completion_mask == 0).float().mean() > 0.3  # rows of very different lengths
    with counting() as used:
        _, skipping = logprobs_and_grads(model, batch, True)
    assert used["backward_rows_skipped"] > 0.3 * (used["backward_rows"] + used["backward_rows_skipped"])
    with mock.patch.object(replay, "DENSE_SHARE", 0.0), counting() as used:  # every row multiplied
        _, dense = logprobs_and_grads(model, batch, True)
        assert used["backward_rows_skipped"] == 0 and used["backward_rows"] > 0
    _, computed = logprobs_and_grads(model, batch, False)
    assert skipping.keys() == dense.keys() == computed.keys()
    for name in dense:
        torch.testing.assert_close(skipping[name], dense[name], rtol=1e-5, atol=1e-5, msg=name)  # order of sums
        torch.testing.assert_close(skipping[name], computed[name], rtol=1e-4, atol=1e-5, msg=name)

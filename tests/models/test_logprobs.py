"""selective_log_softmax, entropy_from_logits and completion_logprobs against direct computations."""

import functools
import math

import pytest
import torch

from lmrl.models.forward_plan import ForwardPlan, completion_logprobs
from lmrl.models.logprobs import accepts_kwarg, entropy_from_logits, prompt_groups, selective_log_softmax
from tests.helpers import tiny_gpt2, tiny_llama

pytestmark = pytest.mark.portable  # `make test-portable`: again under other CPU kernels and threads

PAD = 0


build_llama = functools.partial(tiny_llama, pad_token_id=PAD)
build_gpt2 = functools.partial(tiny_gpt2, pad_token_id=PAD)  # absolute positions: wrong position_ids show


@pytest.fixture(scope="module")
def model():
    return build_llama()


@pytest.fixture(scope="module")
def gpt2():
    return build_gpt2()


def test_selective_log_softmax_hand_values():
    # logits (0, ln 3): p = (1/4, 3/4) -> log p(1) = ln 0.75, log p(0) = ln 0.25
    logits = torch.tensor([[0.0, math.log(3)], [0.0, math.log(3)]])
    out = selective_log_softmax(logits, torch.tensor([1, 0]))
    assert torch.allclose(out, torch.tensor([math.log(0.75), math.log(0.25)]), atol=1e-7)
    # temperature 0.5: z = (0, 2 ln 3) -> p = (1/10, 9/10)
    out = selective_log_softmax(logits, torch.tensor([1, 0]), temperature=0.5)
    assert torch.allclose(out, torch.tensor([math.log(0.9), math.log(0.1)]), atol=1e-7)


@pytest.mark.parametrize("chunk_size", [None, 1, 7])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_selective_log_softmax_equals_log_softmax_gather(chunk_size, temperature):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 40, generator=gen) * 4
    index = torch.randint(0, 40, (3, 5), generator=gen)
    ref = torch.log_softmax(logits / temperature, -1).gather(-1, index[..., None])[..., 0]
    out = selective_log_softmax(logits, index, temperature=temperature, chunk_size=chunk_size)
    assert out.shape == (3, 5) and torch.allclose(out, ref, atol=1e-6)
    # bf16 logits are upcast before the softmax: equal to the fp32 log-softmax of the bf16 values
    low = logits.bfloat16()
    ref = torch.log_softmax(low.float() / temperature, -1).gather(-1, index[..., None])[..., 0]
    out = selective_log_softmax(low, index, temperature=temperature, chunk_size=chunk_size)
    assert out.dtype == torch.float32 and torch.allclose(out, ref, atol=1e-6)


def test_selective_log_softmax_is_differentiable_and_checks_shapes():
    logits = torch.randn(4, 10, requires_grad=True)
    index = torch.tensor([1, 2, 3, 4])
    selective_log_softmax(logits, index).sum().backward()
    # d/dz_v log p(i) = 1[v = i] - p_v
    expected = torch.nn.functional.one_hot(index, 10).float() - logits.detach().softmax(-1)
    assert torch.allclose(logits.grad, expected, atol=1e-6)
    with pytest.raises(ValueError, match="index shape"):
        selective_log_softmax(torch.randn(4, 10), torch.tensor([1, 2]))


def test_entropy_hand_values_and_stability():
    # uniform over 8 -> ln 8; p = (1/4, 3/4) -> -(1/4 ln 1/4 + 3/4 ln 3/4) = 0.562335
    assert math.isclose(entropy_from_logits(torch.zeros(8)).item(), math.log(8), abs_tol=1e-6)
    h = entropy_from_logits(torch.tensor([0.0, math.log(3)]))
    assert math.isclose(h.item(), -(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), abs_tol=1e-6)
    # a 1e4 logit gap: p = (1, e^-1e4 = 0) -> H = 0, finite
    assert entropy_from_logits(torch.tensor([1e4, 0.0])).item() == pytest.approx(0.0, abs=1e-6)
    logits = torch.randn(2, 3, 30)
    p = torch.softmax(logits / 0.7, -1)
    ref = -(p * p.log()).sum(-1)
    assert torch.allclose(entropy_from_logits(logits, temperature=0.7, chunk_size=4), ref, atol=1e-5)


def left_padded(seqs, completion_lens, pad_prompt_to, pad_completion_to):
    """Build (ids, mask) with prompts left-padded to P and completions right-padded to T."""
    ids, mask = [], []
    for seq, c in zip(seqs, completion_lens):
        prompt, completion = seq[: len(seq) - c], seq[len(seq) - c :]
        left, right = pad_prompt_to - len(prompt), pad_completion_to - len(completion)
        ids.append([PAD] * left + prompt + completion + [PAD] * right)
        mask.append([0] * left + [1] * len(seq) + [0] * right)
    return torch.tensor(ids), torch.tensor(mask)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_completion_logprobs_equal_unpadded_per_row_forward(arch, model, gpt2, temperature):
    model = {"llama": model, "gpt2": gpt2}[arch]
    gen = torch.Generator().manual_seed(1)
    prompt_lens, completion_lens = [3, 6, 1], [4, 2, 5]
    seqs = [torch.randint(1, 97, (p + c,), generator=gen).tolist() for p, c in zip(prompt_lens, completion_lens)]
    ids, mask = left_padded(seqs, completion_lens, pad_prompt_to=6, pad_completion_to=5)
    with torch.no_grad():
        logp, entropy = completion_logprobs(model, ids, mask, 6, ForwardPlan(temperature=temperature), entropy=True)
        assert logp.shape == (3, 5) and entropy.shape == (3, 5)
        for r, (seq, c) in enumerate(zip(seqs, completion_lens)):
            # Reference: the row alone, no padding; token at position k is predicted by the logits at k-1.
            logits = model(input_ids=torch.tensor([seq])).logits[0] / temperature  # (L, V)
            ref = torch.log_softmax(logits, -1)
            positions = range(len(seq) - c, len(seq))
            expected = torch.stack([ref[k - 1, seq[k]] for k in positions])
            expected_h = torch.stack([-(ref[k - 1].exp() * ref[k - 1]).sum() for k in positions])
            assert torch.allclose(logp[r, :c], expected, atol=1e-5)
            assert torch.allclose(entropy[r, :c], expected_h, atol=1e-5)
            assert (logp[r, c:] == 0).all() and (entropy[r, c:] == 0).all()  # right padding -> 0


class NoLogitsToKeep(torch.nn.Module):
    """A causal LM whose forward has no `logits_to_keep` (like many custom or older models)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, attention_mask=None, position_ids=None):
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)


def test_models_without_logits_to_keep_give_the_same_result(model):
    wrapped = NoLogitsToKeep(model)
    assert accepts_kwarg(model, "logits_to_keep") and not accepts_kwarg(wrapped, "logits_to_keep")
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(1, 97, (2, 9), generator=gen)
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    with torch.no_grad():
        a = completion_logprobs(model, ids, mask, 5)
        b = completion_logprobs(wrapped, ids, mask, 5)
    assert torch.allclose(a, b, atol=1e-6)


def test_bf16_autocast_is_close_and_fp32(model):
    ids = torch.randint(1, 97, (2, 10), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        full = completion_logprobs(model, ids, mask, 4)
        low = completion_logprobs(model, ids, mask, 4, ForwardPlan(dtype=torch.bfloat16))
    assert low.dtype == torch.float32 and (low - full).abs().max() < 0.1 and not torch.equal(low, full)


def test_completion_logprobs_errors(model):
    ids = torch.ones(2, 5, dtype=torch.long)
    with pytest.raises(ValueError, match="completion_start"):
        completion_logprobs(model, ids, torch.ones_like(ids), 5)
    with pytest.raises(ValueError, match="completion_start"):
        completion_logprobs(model, ids, torch.ones_like(ids), 0)
    with pytest.raises(ValueError, match="attention_mask"):
        completion_logprobs(model, ids, torch.ones(2, 4, dtype=torch.long), 2)
    with pytest.raises(ValueError, match="temperature"):
        completion_logprobs(model, ids, torch.ones_like(ids), 2, ForwardPlan(temperature=0.0))


def grouped_batch(gen, n_prompts=3, group=4, width=5, shuffle=True):
    """Left-padded prompts of lengths 2..4, each repeated `group` times (shuffled unless told), completions of
    lengths 1..width."""
    rows, completion_lens = [], []
    for i in range(n_prompts):
        prompt = torch.randint(1, 97, (2 + i,), generator=gen).tolist()
        for _ in range(group):
            c = int(torch.randint(1, width + 1, (1,), generator=gen))
            rows.append(prompt + torch.randint(1, 97, (c,), generator=gen).tolist())
            completion_lens.append(c)
    ids, mask = left_padded(rows, completion_lens, pad_prompt_to=n_prompts + 1, pad_completion_to=width)
    order = torch.randperm(len(rows), generator=gen) if shuffle else torch.arange(len(rows))
    return ids[order], mask[order]  # shuffled: groups need not be contiguous; else prompt-major (repeat paths)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("width", [5, 1])
@pytest.mark.parametrize("layout", ["shuffled", "grouped", "unequal groups"])
def test_shared_prompts_give_the_same_logprobs_and_gradients(arch, model, gpt2, width, layout):
    model = {"llama": model, "gpt2": gpt2}[arch]
    ids, mask = grouped_batch(torch.Generator().manual_seed(4), width=width, shuffle=layout == "shuffled")
    if layout == "unequal groups":  # prompt-major, groups of 4, 2 and 3 rows
        ids, mask = ids[[0, 1, 2, 3, 4, 5, 8, 9, 10]], mask[[0, 1, 2, 3, 4, 5, 8, 9, 10]]
    start = ids.shape[1] - width
    results = []
    for share in (False, True):
        model.zero_grad()
        logp, entropy = completion_logprobs(
            model, ids, mask, start, ForwardPlan(temperature=0.8, share_prompts=share), entropy=True
        )
        (logp * torch.linspace(-1, 1, logp.numel()).view_as(logp)).sum().backward()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        results.append((logp.detach(), entropy, grads))
    (a, ha, ga), (b, hb, gb) = results
    assert torch.allclose(a, b, atol=1e-5) and torch.allclose(ha, hb, atol=1e-5)
    assert len(ga) == len(gb) and all(torch.allclose(x, y, atol=1e-5) for x, y in zip(ga, gb))
    model.zero_grad()


def test_prompt_groups_find_repeated_prompts_in_any_order():
    ids = torch.tensor([[0, 5, 6, 9], [7, 7, 7, 1], [0, 5, 6, 2], [0, 5, 6, 3]])
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1], [0, 1, 1, 1], [0, 1, 1, 1]])
    first, inverse = prompt_groups(ids, mask, completion_start=3)
    assert inverse[0] == inverse[2] == inverse[3] != inverse[1]
    assert first[inverse].tolist() == [0, 1, 0, 0]  # each row's group starts at its first row
    assert inverse.tolist() == [0, 1, 0, 0]  # numbered in order of first appearance
    grouped, grouped_mask = ids[[1, 0, 2, 3]], mask[[1, 0, 2, 3]]  # the prompt that sorts last comes first
    first, inverse = prompt_groups(grouped, grouped_mask, completion_start=3)
    assert inverse.tolist() == [0, 1, 1, 1] and first.tolist() == [0, 1]  # prompt-major rows: non-decreasing ids
    assert prompt_groups(ids, mask, completion_start=3) is not None
    distinct = torch.tensor([[1, 2, 3], [2, 2, 3]])
    assert prompt_groups(distinct, torch.ones_like(distinct), completion_start=2) is None
    same_ids_other_mask = torch.tensor([[0, 0, 4], [0, 0, 5]])  # pad id 0 equals a real token id 0 in row 2
    assert prompt_groups(same_ids_other_mask, torch.tensor([[0, 1, 1], [1, 1, 1]]), completion_start=2) is None


def padded_rows(seed: int, left_padding: bool, n: int = 6, p: int = 5, t: int = 7):
    """(ids, mask, p): n rows of p prompt + t completion positions, completions right-padded to lengths
    t - (b % 4) (the padding after each row's stop), prompts left-padded by b % 3 when ``left_padding``."""
    mask = torch.ones(n, p + t, dtype=torch.long)
    for b in range(n):
        if left_padding:
            mask[b, : b % 3] = 0
        mask[b, p + t - b % 4 :] = 0
    return torch.randint(3, 97, (n, p + t), generator=torch.Generator().manual_seed(seed)) * mask, mask, p


@pytest.mark.parametrize("chunk_mb", [128.0, 1e-6])  # one ordinary forward; the chunked LM head
@pytest.mark.parametrize("build", [build_llama, build_gpt2])
def test_packed_rows_give_the_padded_log_probs_entropies_and_gradients(build, chunk_mb):
    model = build()
    ids, mask, p = padded_rows(seed=0, left_padding=True)
    outs = {}
    for packed in (False, True):
        model.zero_grad(set_to_none=True)
        logp, entropy = completion_logprobs(
            model, ids, mask, p, ForwardPlan(temperature=0.7, chunk_mb=chunk_mb, packed=packed), entropy=True
        )
        logp.sum().backward()
        outs[packed] = (logp.detach(), entropy, {k: v.grad.clone() for k, v in model.named_parameters()})
    torch.testing.assert_close(outs[True][0], outs[False][0], rtol=0, atol=1e-5)
    torch.testing.assert_close(outs[True][1], outs[False][1], rtol=0, atol=1e-5)
    for name, grad in outs[True][2].items():
        torch.testing.assert_close(grad, outs[False][2][name], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("build", [build_llama, build_gpt2])
def test_the_chunked_head_runs_on_completion_tokens_only_with_the_same_values_and_gradients(build, monkeypatch):
    model = build()
    ids, mask, p = padded_rows(seed=1, left_padding=False)  # completions of 7, 6, 5, 4, 7, 6 of 7 tokens
    n, t = ids.shape[0], ids.shape[1] - p
    head_rows = []
    hook = model.get_output_embeddings().register_forward_pre_hook(lambda m, a: head_rows.append(a[0].shape[0]))
    outs = {}
    for chunk_mb in (128.0, 1e-6):  # one ordinary forward (full logits); the chunked LM head
        head_rows.clear()
        model.zero_grad(set_to_none=True)
        logp, entropy = completion_logprobs(
            model, ids, mask, p, ForwardPlan(temperature=0.7, chunk_mb=chunk_mb), entropy=True
        )
        logp.sum().backward()
        outs[chunk_mb] = (logp.detach(), entropy, {k: v.grad.clone() for k, v in model.named_parameters()})
    hook.remove()
    torch.testing.assert_close(outs[1e-6][0], outs[128.0][0], rtol=0, atol=1e-5)
    torch.testing.assert_close(outs[1e-6][1], outs[128.0][1], rtol=0, atol=1e-5)
    for name, grad in outs[1e-6][2].items():
        torch.testing.assert_close(grad, outs[128.0][2][name], rtol=1e-4, atol=1e-6)
    # the chunked head's rows, counted where they enter it (the fused path calls no module hook)
    from lmrl.models import head

    seen = []
    original = head.head_logprobs

    def counting(hidden, *args, **kwargs):
        seen.append(hidden.reshape(-1, hidden.shape[-1]).shape[0])
        return original(hidden, *args, **kwargs)

    monkeypatch.setattr(head, "head_logprobs", counting)
    completion_logprobs(model, ids, mask, p, ForwardPlan(chunk_mb=1e-6))
    completion_tokens = int(mask[:, p:].sum())
    assert seen == [completion_tokens] and completion_tokens < n * t  # 35 of 42 positions reach the head

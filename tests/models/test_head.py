"""The memory-bounded LM head: chunked log-probs, entropy and gradients equal the unchunked ones, and a
151,936-token vocabulary trains a step within a memory bound set by the chunk size."""

import resource
import warnings
from unittest import mock

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from lmrl.data.sft import collate_sft
from lmrl.models.forward_plan import ForwardPlan, completion_logprobs
from lmrl.models.head import chunk_tokens, decoder_and_head, fusable, head_logprobs
from lmrl.models.logprobs import entropy_from_logits, selective_log_softmax
from lmrl.notices import SpeedupOff
from lmrl.trainers.sft_step import token_cross_entropy
from tests.rounding import add_rounding_noise

pytestmark = pytest.mark.portable  # `make test-portable`: again under other CPU kernels and threads


def qwen(vocab=3000, tied=True, seed=0):
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=vocab,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            tie_word_embeddings=tied,
        )
    )


def grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def assert_same_grads(a, b):
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5, msg=name)


def test_chunk_tokens_is_sized_by_memory():
    assert chunk_tokens(151_936, 256) == 256 * 2**20 // (4 * 151_936) == 441
    assert chunk_tokens(100, 1) == 2621 and chunk_tokens(10**9, 1) == 1


@pytest.mark.parametrize("bias", [False, True])  # False: the fused path; True: checkpointed chunks
def test_head_logprobs_equal_a_direct_log_softmax_in_values_and_gradients(bias):
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 50, bias=bias)
    assert fusable(head) is not bias
    hidden = torch.randn(3, 7, 16, requires_grad=True)
    targets = torch.randint(0, 50, (3, 7))
    direct = torch.log_softmax(head(hidden) / 0.7, -1).gather(-1, targets[..., None])[..., 0]
    direct.sum().backward()
    g_direct = (hidden.grad.clone(), head.weight.grad.clone())
    hidden.grad, head.weight.grad = None, None
    chunked, entropy = head_logprobs(
        hidden, head, targets, temperature=0.7, chunk_mb=4 * 50 * 4 / 2**20, return_entropy=True
    )  # 4 positions per chunk: 6 chunks, the last one short
    chunked.sum().backward()
    torch.testing.assert_close(chunked, direct)
    torch.testing.assert_close((hidden.grad, head.weight.grad), g_direct)
    with torch.no_grad():
        p = torch.softmax(head(hidden) / 0.7, -1)
    torch.testing.assert_close(entropy, -(p * p.log()).sum(-1))
    assert not entropy.requires_grad


@pytest.mark.parametrize("autocast", [False, True])
def test_fused_head_reuses_one_set_of_chunk_buffers_per_call(autocast):
    """Every chunk writes into the same (rows, V) buffers (fresh ones per chunk would each be a new mapping above
    glibc's mmap threshold, whose pages fault in again); without the entropy too, the values and gradients are the
    direct ones."""
    from lmrl.models import head as head_module

    torch.manual_seed(0)
    head = torch.nn.Linear(16, 50, bias=False)
    hidden = torch.randn(3, 7, 16, requires_grad=True)
    targets = torch.randint(0, 50, (3, 7))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        direct = torch.log_softmax(head(hidden).float() / 0.7, -1).gather(-1, targets[..., None])[..., 0]
    direct.sum().backward()
    g_direct = (hidden.grad.clone(), head.weight.grad.clone())
    hidden.grad, head.weight.grad = None, None
    made = []
    buffers = head_module._ChunkBuffers

    def counted(*args, **kwargs):
        made.append(args)
        return buffers(*args, **kwargs)

    with (
        mock.patch.object(head_module, "_ChunkBuffers", counted),
        torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast),
    ):
        chunked = head_logprobs(hidden, head, targets, temperature=0.7, chunk_mb=4 * 50 * 4 / 2**20)  # 11 chunks
        chunked.sum().backward()
    assert len(made) == 2  # one set for the forward, one for the backward
    tolerance = {"rtol": 2e-2, "atol": 2e-2} if autocast else {}
    torch.testing.assert_close(chunked, direct, **tolerance)
    torch.testing.assert_close((hidden.grad, head.weight.grad), g_direct, **tolerance)


def test_fused_head_under_bf16_autocast_matches_the_checkpointed_chunks():
    # both run the head's matmul in bf16 (as nn.Linear does under autocast) and the log-softmax in fp32
    torch.manual_seed(1)
    head = torch.nn.Linear(32, 300, bias=False)
    hidden = torch.randn(5, 9, 32)
    targets = torch.randint(0, 300, (5, 9))
    runs = []
    for fused in (True, False):
        h = hidden.clone().requires_grad_(True)
        head.zero_grad()
        with (
            torch.autocast("cpu", dtype=torch.bfloat16),
            mock.patch("lmrl.models.head.fusable", lambda _head, fused=fused: fused),
        ):
            logp, entropy = head_logprobs(h, head, targets, chunk_mb=8 * 300 * 4 / 2**20, return_entropy=True)
        (logp * torch.linspace(-1, 1, 45).view(5, 9)).sum().backward()
        runs.append((logp, entropy, h.grad, head.weight.grad.clone()))
    for fused_value, checkpointed_value in zip(*runs):
        torch.testing.assert_close(fused_value, checkpointed_value, rtol=1e-2, atol=1e-2)
    assert runs[0][0].dtype == torch.float32 and runs[0][2].dtype == torch.float32


@pytest.mark.parametrize("share_prompts", [False, True])
@pytest.mark.parametrize("tied", [True, False])
def test_completion_logprobs_chunked_equal_unchunked(share_prompts, tied):
    model = qwen(tied=tied)
    ids = torch.randint(0, 3000, (6, 14))
    mask = torch.ones_like(ids)
    ids[:3], ids[3:] = ids[0], ids[3]  # two prompt groups of 3 ...
    mask[:3, :2] = 0  # ... the first left-padded
    mask[4:, 12:] = 0  # ragged completions
    runs = {}
    for chunk_mb in (1000.0, 0.05):  # one chunk / 4 positions of 3000 fp32 logits per chunk
        model.zero_grad()
        logp, ent = completion_logprobs(
            model,
            ids,
            mask,
            8,
            ForwardPlan(share_prompts=share_prompts, chunk_mb=chunk_mb, temperature=0.9),
            entropy=True,
        )
        (logp * torch.arange(1, 7)[:, None]).sum().backward()
        runs[chunk_mb] = (logp.detach(), ent, grads(model))
    (a, ea, ga), (b, eb, gb) = runs.values()
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ea, eb, rtol=1e-5, atol=1e-5)
    assert_same_grads(ga, gb)
    assert (a[:, -1][4:] == 0).all()  # masked positions stay 0


def test_sft_cross_entropy_chunked_equals_unchunked():
    model = qwen()
    rows = [(list(range(5, 5 + n)), [-100] * 3 + list(range(8, 5 + n))) for n in (12, 9, 15)]
    from lmrl.data.sft import SFTExample

    batch = collate_sft([SFTExample(ids, labels) for ids, labels in rows], pad_id=0)
    out = {}
    for chunk_mb in (1000.0, 0.05):
        model.zero_grad()
        loss, n = token_cross_entropy(model, batch, None, chunk_mb)
        loss.backward()
        out[chunk_mb] = (loss.detach(), n, grads(model))
    (la, na, ga), (lb, nb, gb) = out.values()
    assert na == nb == sum(len(labels) - 3 for _, labels in rows)  # the 3 prompt positions are unlabelled
    torch.testing.assert_close(la, lb, rtol=1e-5, atol=1e-4)
    assert_same_grads(ga, gb)


def test_pretrain_cross_entropy_and_validation_chunked_equal_unchunked():
    from lmrl.algorithms import AvatarlOptions
    from lmrl.trainers.lm_windows import validation_stats
    from lmrl.trainers.pretrain.trainer import train_step

    model = qwen()
    windows = torch.randint(0, 3000, (4, 9), generator=torch.Generator().manual_seed(1))  # (B, L+1)
    out = {}
    for chunk_mb in (1000.0, 0.05):  # one chunk / 4 positions of 3000 fp32 logits per chunk
        model.zero_grad()
        stats = train_step(model, None, windows, "ce", AvatarlOptions(), 2, None, step=1, chunk_mb=chunk_mb)
        out[chunk_mb] = (stats, grads(model), validation_stats(model, windows, 3, None, chunk_mb))
    (sa, ga, va), (sb, gb, vb) = out.values()
    assert sa["loss"] == pytest.approx(sb["loss"], rel=1e-5) and sa["loss/ce"] == pytest.approx(sa["loss"])
    assert_same_grads(ga, gb)
    assert va == pytest.approx(vb, rel=1e-5) and va["eval/ce"] == pytest.approx(sa["loss"], rel=1e-5)


def test_pretrain_avatarl_chunked_equals_full_logits():
    from lmrl.algorithms import AvatarlOptions
    from lmrl.trainers.pretrain.trainer import chunked_avatarl, train_step

    model, critic = qwen(), qwen(seed=1).eval().requires_grad_(False)
    windows = torch.randint(0, 3000, (4, 9), generator=torch.Generator().manual_seed(1))  # (B, L+1)
    out = {}
    for chunk_mb in (1000.0, 0.1):  # full logits / 2 positions of student + critic logits per chunk
        model.zero_grad()
        stats = train_step(
            model, critic, windows, "avatarl", AvatarlOptions(top_k=4), 2, None, step=1, chunk_mb=chunk_mb
        )
        out[chunk_mb] = (stats, grads(model))
    (sa, ga), (sb, gb) = out.values()
    inputs, targets = windows[:, :-1], windows[:, 1:]
    assert chunked_avatarl(model, critic, inputs, targets, AvatarlOptions(top_k=4), 1000.0) is None  # one chunk
    assert chunked_avatarl(model, critic, inputs, targets, AvatarlOptions(top_k=4), 0.1) is not None
    assert sa.keys() == sb.keys()
    for key in sa:
        assert sa[key] == pytest.approx(sb[key], rel=1e-4, abs=1e-6), key
    assert_same_grads(ga, gb)


def test_dpo_sequence_log_probs_take_the_configured_chunk(monkeypatch):
    import lmrl.models.head as head
    from lmrl.trainers.dpo import common as dpo_common

    seen = []
    monkeypatch.setattr(head, "head_logprobs", lambda *a, **kw: seen.append(kw["chunk_mb"]) or torch.zeros(a[2].shape))
    model = qwen()
    seq = dpo_common.prefs.Tokenized(prompt_ids=[5, 6, 7], completion_ids=[8, 9, 10, 11], learn=[1, 1, 1, 1])
    ref = dpo_common.Reference(model=model, chunk_mb=0.05)
    ref.logps("train", [0], [dpo_common.Example(seqs=(seq, seq))], pad_id=0, dtype=None)
    assert seen == [0.05]


def test_a_logit_post_processing_lmrl_does_not_know_falls_back_to_full_logits_with_a_warning():
    model = qwen()
    parts = decoder_and_head(model)
    assert parts is not None and parts.plain
    other = qwen()
    other.config.final_logit_softcapping = 0.01  # the config says soft-capping, the model's forward does none
    with pytest.warns(SpeedupOff, match=r"the chunked LM head is off for Qwen2ForCausalLM: .*\(differs by"):
        assert decoder_and_head(other) is None


def test_a_head_whose_logits_differ_only_by_rounding_keeps_the_chunked_head():
    """Another CPU's kernels round the head's product differently from call to call: the split is still the model."""
    model = qwen(tied=False)
    with torch.no_grad():
        model.lm_head.weight.mul_(300)  # logits of ~30, a real model's scale: noise of ~3e-4
    add_rounding_noise(model.lm_head)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SpeedupOff)
        assert decoder_and_head(model) is not None


def test_scaled_and_soft_capped_heads_match_the_full_logits():
    """post(z) = c tanh(s z / c): the chunked paths (fused and checkpointed) against log_softmax of the full logits."""
    gen = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(16, 50, bias=False)
    hidden = torch.randn(6, 16, generator=gen, requires_grad=True)
    targets = torch.randint(0, 50, (6,), generator=gen)
    for scale, softcap in ((0.25, None), (1.0, 2.0), (3.0, 1.5)):
        z = head(hidden) * scale
        z = z if softcap is None else torch.tanh(z / softcap) * softcap
        expected = torch.log_softmax(z / 0.7, -1).gather(-1, targets[:, None])[:, 0]
        grad_expected = torch.autograd.grad(expected.sum(), hidden)[0]
        got = head_logprobs(
            hidden, head, targets, temperature=0.7, chunk_mb=50 * 4 * 2 / 2**20, scale=scale, softcap=softcap
        )  # chunks of 2 rows
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(torch.autograd.grad(got.sum(), hidden)[0], grad_expected, atol=1e-5, rtol=1e-5)


def test_selective_log_softmax_and_entropy_still_match_the_definitions():
    logits = torch.randn(4, 5, 11)
    index = torch.randint(0, 11, (4, 5))
    torch.testing.assert_close(
        selective_log_softmax(logits, index), torch.log_softmax(logits, -1).gather(-1, index[..., None])[..., 0]
    )
    p = logits.softmax(-1)
    torch.testing.assert_close(entropy_from_logits(logits), -(p * p.log()).sum(-1))


def _peak_rss_growth_mb(fn) -> float:
    """ru_maxrss grows only past the process's earlier peak, so the step runs in a child process."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_measure, args=(fn, queue))
    proc.start()
    proc.join(300)
    return queue.get(timeout=5)


def _measure(fn, queue):
    # glibc serves 16 MB blocks from its heap once its dynamic mmap threshold has risen, and small tensors allocated
    # between chunks split the freed holes, so RSS would count fragmentation, not live tensors: blocks >= 1 MB are
    # mmapped (and unmapped when freed) in this child, so its peak RSS is the peak of live memory
    import ctypes
    import ctypes.util

    ctypes.CDLL(ctypes.util.find_library("c")).mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    fn()
    queue.put((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024)


def big_vocab_llama(seed: int) -> LlamaForCausalLM:
    """Qwen's 151,936-token vocabulary on a 1-layer Llama of width 16 with a tied head (in train mode, as built)."""
    torch.manual_seed(seed)
    return LlamaForCausalLM(
        LlamaConfig(
            vocab_size=151_936,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            tie_word_embeddings=True,
        )
    )


def _big_vocab_step(chunk_mb):
    torch.set_num_threads(1)
    model = big_vocab_llama(seed=0)
    ids = torch.randint(0, 151_936, (16, 136))  # 16 rows x 128 completion tokens: full fp32 logits = 1.2 GB
    logp = completion_logprobs(model, ids, torch.ones_like(ids), 8, ForwardPlan(chunk_mb=chunk_mb))
    logp.mean().backward()


def test_a_151936_token_vocabulary_trains_within_a_bound_set_by_the_chunk():
    # full logits would be 16 x 128 x 151,936 x 4 B = 1.24 GB, and autograd keeps more than one such tensor
    chunked = _peak_rss_growth_mb(lambda: _big_vocab_step(16))
    # bound: a few chunks of 16 MB (logits, softmax/grad temporaries) plus the 151,936 x 16 embedding, its grad and
    # allocator slack (measured: +82 MB with the fused head, +94 MB checkpointing each chunk; unchunked: +3.5 GB)
    assert chunked < 200, f"peak grew by {chunked:.0f} MB with 16 MB chunks"


def _big_vocab_avatarl_step(chunk_mb):
    from lmrl.algorithms import AvatarlOptions
    from lmrl.trainers.pretrain.trainer import train_step

    torch.set_num_threads(1)
    models = [big_vocab_llama(seed) for seed in (0, 1)]  # student, critic
    windows = torch.randint(0, 151_936, (4, 129))  # 512 positions: full fp32 logits = 311 MB per model
    train_step(
        models[0],
        models[1].requires_grad_(False),
        windows,
        "avatarl",
        AvatarlOptions(),
        1,
        None,
        step=1,
        chunk_mb=chunk_mb,
    )


def test_avatarl_with_a_151936_token_vocabulary_trains_within_a_bound_set_by_the_chunk():
    # full logits: student and critic 311 MB each, plus softmaxes and the gradient (measured: +2.1 GB)
    chunked = _peak_rss_growth_mb(lambda: _big_vocab_avatarl_step(16))
    # bound: 16 MB of chunk tensors, the two 151,936 x 16 embeddings, the student's weight gradient, slack
    # (measured: +81 MB)
    assert chunked < 200, f"peak grew by {chunked:.0f} MB with 16 MB chunks"

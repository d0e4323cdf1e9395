"""HFEngine against HF `generate`, against one-forward log-probs, and its stop/layout/determinism contracts."""

import string

import pytest
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from lmrl.models.forward_plan import ForwardPlan, completion_logprobs
from lmrl.rollout import HFEngine, SamplingParams, StopStringMatcher
from tests.helpers import tiny_gpt2, tiny_llama

pytestmark = pytest.mark.portable  # `make test-portable`: again under other CPU kernels and threads

SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
PAD, BOS, EOS = 0, 1, 2
IDS = dict(pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS)
CHARS = string.ascii_lowercase + string.ascii_uppercase + string.digits + " .,:;!?+-=*/()\n"
TEXTS = ["hello world", "2+2=", "abc", "The cat sat on"]


def char_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {t: i for i, t in enumerate(SPECIALS + list(CHARS))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )


@pytest.fixture(scope="module")
def tok():
    return char_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return tiny_llama(len(tok), **IDS)


@pytest.fixture(scope="module")
def gpt2(tok):
    return tiny_gpt2(len(tok), **IDS)


@pytest.fixture(scope="module")
def prompts(tok):
    return [tok(t, add_special_tokens=False)["input_ids"] for t in TEXTS]


def hf_greedy(model, prompts, max_new_tokens, eos):
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[PAD] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        do_sample=False,
        max_new_tokens=max_new_tokens,
        pad_token_id=PAD,
        eos_token_id=eos,
    )
    return out[:, width:]


def first_index(row: list[int], token: int) -> int | None:
    return row.index(token) if token in row else None


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_greedy_matches_hf_generate_with_left_padding(arch, model, gpt2, prompts):
    model = {"llama": model, "gpt2": gpt2}[arch]
    engine = HFEngine(model, char_tokenizer())
    free = engine.generate(prompts, SamplingParams(max_new_tokens=20, greedy=True, stop_token_ids=()))
    expected = hf_greedy(model, prompts, 20, eos=None)
    assert torch.equal(free.completion_ids, expected)
    # Stop on a token that row 0 produces mid-way: HF pads after its eos exactly as we must.
    stop = free.completion_ids[0, 5].item()
    stopped = engine.generate(prompts, SamplingParams(max_new_tokens=20, greedy=True, stop_token_ids=(stop,)))
    expected = hf_greedy(model, prompts, 20, eos=stop)
    width = stopped.completion_ids.shape[1]
    assert torch.equal(stopped.completion_ids, expected[:, :width])
    assert (expected[:, width:] == PAD).all()  # HF ran longer only if it did not stop; rows padded there
    assert stopped.finish_reason[0] == "stop"


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampler_logp_matches_one_forward_recompute(arch, model, gpt2, tok, prompts, temperature):
    model = {"llama": model, "gpt2": gpt2}[arch]
    engine = HFEngine(model, tok)
    params = SamplingParams(
        max_new_tokens=24, temperature=temperature, stop_token_ids=(EOS, tok.convert_tokens_to_ids("e"))
    )
    batch = engine.generate(prompts, params, n=3, generator=torch.Generator().manual_seed(0))
    assert batch.completion_mask.sum() > 0
    with torch.no_grad():
        logp = completion_logprobs(
            model,
            batch.input_ids,
            batch.attention_mask,
            batch.prompt_ids.shape[1],
            ForwardPlan(temperature=temperature),
        )
    mask = batch.completion_mask.bool()
    assert torch.allclose(batch.sampler_logp[mask], logp[mask], atol=1e-4)
    assert (batch.sampler_logp[~mask] == 0).all()
    assert (batch.completion_lengths < 24).any() and (batch.completion_lengths == 24).any()  # some rows stopped early


def test_greedy_sampler_logp_and_top_k1_top_p_equal_greedy(model, tok, prompts):
    engine = HFEngine(model, tok)
    greedy = engine.generate(prompts, SamplingParams(max_new_tokens=16, greedy=True, temperature=0.7))
    with torch.no_grad():
        logp = completion_logprobs(
            model, greedy.input_ids, greedy.attention_mask, greedy.prompt_ids.shape[1], ForwardPlan(temperature=0.7)
        )
    mask = greedy.completion_mask.bool()
    assert torch.allclose(greedy.sampler_logp[mask], logp[mask], atol=1e-4)
    for params in (
        SamplingParams(max_new_tokens=16, temperature=0.7, top_k=1),
        SamplingParams(max_new_tokens=16, temperature=0.7, top_p=1e-6),
    ):
        sampled = engine.generate(prompts, params, generator=torch.Generator().manual_seed(5))
        assert torch.equal(sampled.completion_ids, greedy.completion_ids)
        assert torch.allclose(sampled.sampler_logp, greedy.sampler_logp, atol=1e-6)


def test_prompt_major_layout_and_determinism(model, tok, prompts):
    engine = HFEngine(model, tok)
    params = SamplingParams(max_new_tokens=12, stop_token_ids=())
    a = engine.generate(prompts, params, n=3, generator=torch.Generator().manual_seed(1))
    b = engine.generate(prompts, params, n=3, generator=torch.Generator().manual_seed(1))
    c = engine.generate(prompts, params, n=3, generator=torch.Generator().manual_seed(2))
    assert len(a) == 12 and a.group_size == 3 and a.num_prompts == 4
    for i, p in enumerate(prompts):
        for r in range(3 * i, 3 * i + 3):
            real = a.prompt_ids[r][a.prompt_mask[r].bool()].tolist()
            assert real == p and a.prompts[r] == TEXTS[i]
    assert torch.equal(a.completion_ids, b.completion_ids) and a.completions == b.completions
    as_tensors = engine.generate(
        [torch.tensor(p) for p in prompts], params, n=3, generator=torch.Generator().manual_seed(1)
    )
    assert torch.equal(as_tensors.completion_ids, a.completion_ids) and as_tensors.prompts == a.prompts
    assert not torch.equal(a.completion_ids, c.completion_ids)
    assert len({tuple(row) for row in a.completion_ids.tolist()}) == 12  # every row differs from every other


def test_stop_token_masks_and_finish_reasons(model, tok, prompts):
    engine = HFEngine(model, tok)
    free = engine.generate(prompts, SamplingParams(max_new_tokens=16, greedy=True, stop_token_ids=()))
    rows = free.completion_ids.tolist()
    stop = rows[0][4]
    batch = engine.generate(prompts, SamplingParams(max_new_tokens=16, greedy=True, stop_token_ids=(stop,)))
    width = batch.completion_ids.shape[1]
    for r, row in enumerate(rows):
        k = first_index(row, stop)
        if k is None:  # never sampled the stop token: runs to max_new_tokens
            assert batch.finish_reason[r] == "length" and batch.truncated[r] and batch.completion_lengths[r] == 16
            assert batch.completion_ids[r].tolist() == row
        else:  # mask 1 up to and including the stop token, pad and 0 after
            assert batch.finish_reason[r] == "stop" and not batch.truncated[r]
            assert batch.completion_mask[r].tolist() == [1.0] * (k + 1) + [0.0] * (width - k - 1)
            assert batch.completion_ids[r].tolist() == row[: k + 1] + [PAD] * (width - k - 1)
            assert batch.completions[r] == tok.decode(row[: k + 1], skip_special_tokens=True)
    assert "stop" in batch.finish_reason and "length" in batch.finish_reason


def test_stop_strings_end_rows_and_cut_text(model, tok, prompts):
    engine = HFEngine(model, tok)
    free = engine.generate(prompts, SamplingParams(max_new_tokens=24, greedy=True, stop_token_ids=()))
    stop_string = free.completions[1][3:5]
    batch = engine.generate(
        prompts, SamplingParams(max_new_tokens=24, greedy=True, stop_token_ids=(), stop_strings=(stop_string,))
    )
    for r, row in enumerate(free.completion_ids.tolist()):
        # expected length: the fewest tokens whose decoded text contains the stop string
        k = next((k for k in range(1, 25) if stop_string in tok.decode(row[:k], skip_special_tokens=True)), None)
        if k is None:
            assert batch.finish_reason[r] == "length" and batch.completions[r] == free.completions[r]
        else:
            assert batch.finish_reason[r] == "stop" and batch.completion_lengths[r] == k
            assert batch.completion_ids[r, :k].tolist() == row[:k]
            full = free.completions[r]
            assert batch.completions[r] == full[: full.index(stop_string)]
    assert batch.finish_reason[1] == "stop"


def test_stop_string_matcher_across_multichar_tokens():
    vocab = {"<pad>": 0, "<eos>": 1, "ab": 2, "cd": 3, "x": 4, "bcx": 5, "c": 6, "yy": 7}
    inner = Tokenizer(models.WordLevel(vocab=vocab, unk_token="x"))
    inner.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=inner, pad_token="<pad>", eos_token="<eos>")
    matcher = StopStringMatcher(tokenizer, ("bc",), vocab_size=8, device=torch.device("cpu"))
    # Candidates: tokens whose text contains "c" (cd, bcx, c) or decodes to nothing (the specials).
    assert matcher.candidate.tolist() == [True, True, False, True, False, True, True, False]
    history = torch.tensor([[2, 3], [4, 5], [2, 6], [4, 7], [2, 3]])  # "abcd", "xbcx", "abc", "xyy", "abcd"
    running = torch.tensor([True, True, True, True, False])
    assert matcher(history, history[:, -1], running).tolist() == [True, True, True, False, False]
    assert matcher.cut("aabcdbc") == ("aa", True) and matcher.cut("abd") == ("abd", False)


def test_compaction_does_not_change_results(model, tok):
    texts = TEXTS + ["xyz", "Q: 7*6", "zz top", "(a+b)"]
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    free = HFEngine(model, tok).generate(prompts, SamplingParams(max_new_tokens=20, greedy=True, stop_token_ids=()))
    rows = free.completion_ids.tolist()
    stops = (rows[0][2], rows[1][6], rows[2][10], rows[3][14])  # rows end at several different steps
    params = SamplingParams(max_new_tokens=20, greedy=True, stop_token_ids=stops)
    plain = HFEngine(model, tok, compact_threshold=None).generate(prompts, params)
    compact = HFEngine(model, tok, compact_threshold=0.1).generate(prompts, params)
    assert len(set(plain.completion_lengths.tolist()) - {20}) >= 3  # several compactions happen
    assert torch.equal(plain.completion_ids, compact.completion_ids)
    assert torch.equal(plain.completion_mask, compact.completion_mask)
    assert torch.allclose(plain.sampler_logp, compact.sampler_logp, atol=1e-5)
    assert plain.finish_reason == compact.finish_reason


def test_generate_text_restores_mode_and_outputs_are_trainable(model, tok):
    engine = HFEngine(model, tok)
    model.train()
    try:
        batch = engine.generate_text(
            ["ab", "hello"], SamplingParams(max_new_tokens=6), n=2, generator=torch.Generator().manual_seed(0)
        )
        assert model.training
    finally:
        model.eval()
    engine.generate_text(["ab"], SamplingParams(max_new_tokens=2))
    assert not model.training
    assert batch.prompts == ["ab", "ab", "hello", "hello"]
    assert batch.prompt_ids[0, -2:].tolist() == tok("ab", add_special_tokens=False)["input_ids"]
    # Rollout tensors are normal tensors (not inference tensors): a learner can backprop through them.
    logp = completion_logprobs(model, batch.input_ids, batch.attention_mask, batch.prompt_ids.shape[1])
    (logp * batch.completion_mask).sum().backward()
    assert model.lm_head.weight.grad is not None
    model.zero_grad(set_to_none=True)


def test_bf16_autocast_runs_close_to_fp32_recompute(model, tok, prompts):
    engine = HFEngine(model, tok, autocast_dtype=torch.bfloat16)
    batch = engine.generate(
        prompts, SamplingParams(max_new_tokens=10, stop_token_ids=()), n=2, generator=torch.Generator().manual_seed(0)
    )
    assert batch.sampler_logp.dtype == torch.float32 and batch.completion_ids.shape == (8, 10)
    with torch.no_grad():
        logp = completion_logprobs(model, batch.input_ids, batch.attention_mask, batch.prompt_ids.shape[1])
    # bf16 has ~3 significant digits: sampler and fp32 learner differ, but only slightly
    assert (batch.sampler_logp - logp).abs().max() < 0.1


@pytest.mark.parametrize(
    "prompt_ids, n, max_new, match",
    [
        ([[5, 6], []], 1, 4, "prompt 1 is empty"),
        ([[5, 1000]], 1, 4, "outside"),
        ([[5, 6]], 0, 4, "n \\(completions per prompt\\)"),
        ([[5] * 100], 1, 40, "max_position_embeddings"),
        ([], 1, 4, "non-empty list"),
    ],
)
def test_bad_inputs_raise_clear_errors(model, tok, prompt_ids, n, max_new, match):
    with pytest.raises(ValueError, match=match):
        HFEngine(model, tok).generate(prompt_ids, SamplingParams(max_new_tokens=max_new), n=n)


def test_bf16_autocast_casts_each_weight_once_per_rollout(model, tok, prompts):
    # Autocast re-casts weights at every forward inside inference_mode; the engine must not pay that per token.
    # gate_proj and up_proj weights are (128, 64) in each of the 2 layers: 4 casts for the whole rollout
    # (8 new tokens = 8 forwards; re-casting per forward would give 32).
    from torch.profiler import profile

    # packed weights cast once per rollout too: tests/models/test_packed.py
    engine = HFEngine(model, tok, autocast_dtype=torch.bfloat16, pack_weights=False)
    with profile(record_shapes=True) as prof:
        engine.generate(prompts, SamplingParams(max_new_tokens=8, stop_token_ids=()), n=2)
    casts = sum(
        e.count
        for e in prof.key_averages(group_by_input_shape=True)
        if e.key == "aten::copy_" and e.input_shapes[:2] == [[128, 64], [128, 64]]
    )
    assert casts == 4


def test_a_generator_on_another_device_seeds_one_on_the_models_device(monkeypatch):
    """Callers seed CPU generators; a GPU model samples with a generator on its device, drawn from theirs (the
    H100 run of `make gpu-check` refused DPO's evaluation before)."""
    from lmrl.rollout.engines import hf

    cpu = torch.device("cpu")
    same = torch.Generator().manual_seed(3)
    assert hf.on_device(same, cpu) is same and hf.on_device(None, torch.device("cuda")) is None
    callers = [torch.Generator().manual_seed(seed) for seed in (3, 3, 4)]

    class DeviceGenerator:  # torch.Generator("cuda") on a machine without one
        def __init__(self, device):
            self.device, self.seed = torch.device(device), None

        def manual_seed(self, seed):
            self.seed = seed
            return self

    monkeypatch.setattr(hf.torch, "Generator", DeviceGenerator)
    made = [hf.on_device(g, torch.device("cuda")) for g in callers]
    assert all(m.device.type == "cuda" for m in made)
    assert made[0].seed == made[1].seed != made[2].seed  # the caller's seed decides the samples


def test_a_bf16_kv_cache_is_kept_in_fp32_for_the_fp32_cpu_attention(tok, prompts, monkeypatch):
    """GPT-2's keys and values come out of c_attn in bf16 under autocast, and `lmrl_sdpa` reads them in fp32: the
    engine's cache holds them in fp32 (cast once, as written), so no decode step re-casts the whole cache; tokens
    and log-probs are bit for bit those of a bf16 cache."""
    from torch.profiler import profile

    from lmrl.models.attention import NAME, use_fp32_cpu_attention

    model = tiny_gpt2(len(tok), **IDS)
    use_fp32_cpu_attention(model)
    assert model.config._attn_implementation == NAME
    params = SamplingParams(max_new_tokens=8, stop_token_ids=())
    runs = []
    for dtype in (torch.float32, None):  # the engine's choice here, then the keys' own (bf16)
        engine = HFEngine(model, tok, autocast_dtype=torch.bfloat16)
        assert engine._cache_dtype() == torch.float32
        monkeypatch.setattr(engine, "_cache_dtype", lambda dtype=dtype: dtype)
        with profile(record_shapes=True) as prof:
            batch = engine.generate(prompts, params, n=2, generator=torch.Generator().manual_seed(0))
        cache_casts = sum(  # (rows, heads, positions > 1, head dim) cast to fp32 in the attention
            e.count
            for e in prof.key_averages(group_by_input_shape=True)
            if e.key == "aten::_to_copy" and len(e.input_shapes[0]) == 4 and e.input_shapes[0][2] > 1
        )
        runs.append((batch, cache_casts))
    (fp32, casts_fp32), (bf16, casts_bf16) = runs
    assert casts_fp32 == 2  # the prefill's queries, one per layer
    assert casts_bf16 - casts_fp32 == 2 * 2 * 8  # keys and values, 2 layers, 8 forwards (prefill, 7 decode steps)
    assert torch.equal(fp32.completion_ids, bf16.completion_ids) and torch.equal(fp32.sampler_logp, bf16.sampler_logp)
    assert HFEngine(model, tok)._cache_dtype() is None  # no autocast: the model's own dtype

"""lmrl_sdpa: HF sdpa, except computed in fp32 under CPU autocast; and the malloc setting."""

import json
import os
import platform

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from lmrl.data.tokenizers import build_char_tokenizer
from lmrl.models import load_model
from lmrl.models.attention import NAME, sdpa_fp32_on_cpu
from lmrl.models.memory import keep_freed_memory
from tests.models.test_replay import tiny_llama

pytestmark = pytest.mark.portable  # `make test-portable`: again under other CPU kernels and threads


class Module(torch.nn.Module):
    is_causal = True
    num_key_value_groups = 1


def qkv(dtype):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(2, 4, 5, 8, generator=g).to(dtype) for _ in range(3)]  # (B, H, L, D)


def test_without_autocast_it_is_hf_sdpa():
    q, k, v = qkv(torch.float32)
    ours, _ = sdpa_fp32_on_cpu(Module(), q, k, v, None)
    theirs, _ = sdpa_attention_forward(Module(), q, k, v, None)
    assert torch.equal(ours, theirs)


def test_under_autocast_it_runs_in_fp32():
    q, k, v = qkv(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours, _ = sdpa_fp32_on_cpu(Module(), q, k, v, None)
    reference, _ = sdpa_attention_forward(Module(), q.float(), k.float(), v.float(), None)
    assert ours.dtype == torch.float32
    assert torch.equal(ours, reference)  # the same fp32 computation, not a bf16 approximation of it


def test_gradients_flow_to_bf16_inputs():
    q, k, v = (x.requires_grad_() for x in qkv(torch.bfloat16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = sdpa_fp32_on_cpu(Module(), q, k, v, None)
    out.sum().backward()
    assert all(x.grad is not None and x.grad.dtype == torch.bfloat16 for x in (q, k, v))


def test_loaded_models_use_it_and_saved_configs_do_not_name_it(tmp_path):
    tokenizer = build_char_tokenizer()
    model = load_model("builtin:tiny", tokenizer)
    assert model.config._attn_implementation == NAME
    model.save_pretrained(tmp_path)
    assert NAME not in (tmp_path / "config.json").read_text()
    assert "attn_implementation" not in json.loads((tmp_path / "config.json").read_text())
    reloaded = load_model(str(tmp_path), tokenizer)
    assert reloaded.config._attn_implementation == NAME
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, reloaded(ids).logits)


def test_model_logits_match_plain_sdpa_in_fp32():
    model = load_model("builtin:tiny", build_char_tokenizer())
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        ours = model(ids).logits
        model.set_attn_implementation("sdpa")
        theirs = model(ids).logits
    assert torch.equal(ours, theirs)


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc mallopt")
def test_keep_freed_memory_is_accepted_by_glibc():
    assert keep_freed_memory() is True
    assert keep_freed_memory() is True  # idempotent (cached)


def test_left_padding_is_masked():
    """HF builds no mask at all for an attention name without a mask function: padding must still be ignored."""
    tokenizer = build_char_tokenizer()
    model = load_model("builtin:tiny", tokenizer)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad, pad, 5, 6, 7]])
    mask = torch.tensor([[0, 0, 1, 1, 1]])
    positions = torch.tensor([[1, 1, 0, 1, 2]])
    with torch.no_grad():
        padded = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[0, 2:]
        alone = model(input_ids=ids[:, 2:]).logits[0]
    assert torch.allclose(padded, alone, atol=1e-5)


class GroupedModule(torch.nn.Module):
    is_causal = True
    num_key_value_groups = 3  # 6 query heads on 2 key/value heads


def saved_bytes(fn):
    """The output of fn() and the bytes of the distinct storages autograd keeps for its backward."""
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(storages.values())


@pytest.mark.parametrize("autocast", [False, True])
def test_grouped_query_attention_is_grouped_by_the_kernel_not_repeated(autocast):
    """With a padding mask HF repeats keys and values to every query head; lmrl_sdpa lets the kernel group them:
    the same output, and the backward keeps keys and values at their own 2 heads."""
    g = torch.Generator().manual_seed(0)
    dtype = torch.bfloat16 if autocast else torch.float32
    q = torch.randn(2, 6, 5, 8, generator=g).to(dtype).requires_grad_()
    k, v = (torch.randn(2, 2, 7, 8, generator=g).to(dtype).requires_grad_() for _ in range(2))
    mask = torch.ones(2, 1, 5, 7, dtype=torch.bool).tril(2)
    mask[1, :, :, :3] = False  # row 1: 3 positions of left padding
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        ours, ours_saved = saved_bytes(lambda: sdpa_fp32_on_cpu(GroupedModule(), q, k, v, mask)[0])
    plain = [x.detach().float().requires_grad_() for x in (q, k, v)]
    theirs, theirs_saved = saved_bytes(lambda: sdpa_attention_forward(GroupedModule(), *plain, mask)[0])
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)
    assert ours_saved < theirs_saved  # theirs keeps keys and values repeated to 6 heads
    ours.sum().backward()
    theirs.sum().backward()
    for mine, reference in zip((q, k, v), plain):
        torch.testing.assert_close(
            mine.grad.float(), reference.grad, rtol=1e-2 if autocast else 1e-5, atol=1e-2 if autocast else 1e-6
        )


def test_decoding_keeps_hfs_own_grouping():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 6, 1, 8, generator=g)
    k, v = (torch.randn(2, 2, 7, 8, generator=g) for _ in range(2))
    mask = torch.ones(2, 1, 1, 7, dtype=torch.bool)
    ours, _ = sdpa_fp32_on_cpu(GroupedModule(), q, k, v, mask)
    theirs, _ = sdpa_attention_forward(GroupedModule(), q, k, v, mask)
    assert torch.equal(ours, theirs)


def _release_in_child(queue):
    """In a forked child: 255 MiB freed into malloc's heap, then released (plain malloc: no torch threads here)."""
    import ctypes
    import ctypes.util

    from lmrl.models import memory, usage

    keep_freed_memory()  # freed blocks stay in malloc's heap (never trimmed by malloc itself)
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]

    def rss_mib():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    blocks = [libc.malloc(2**20) for _ in range(256)]  # 256 x 1 MiB, below the mmap threshold: heap memory
    for block in blocks:
        ctypes.memset(block, 1, 2**20)  # resident
    for block in blocks[:-1]:
        libc.free(block)  # 255 MiB free but resident (the live block above them keeps the heap from shrinking)
    before = rss_mib()
    with usage.counting() as used:
        released = memory.release_free_memory(min_growth=0)
    dropped, counted = before - rss_mib(), used["memory_releases"]
    with usage.counting(used):
        refused = memory.release_free_memory(min_growth=2**40)  # grew by less than 1 TiB since: no trim
    queue.put((released, dropped, counted, refused, used["memory_releases"]))


def test_released_memory_goes_back_to_the_system_and_layers_release_in_both_passes(monkeypatch):
    import multiprocessing as mp

    from lmrl.models import memory

    ctx = mp.get_context("fork")  # a child: trimming this process's heap would change other tests' RSS baselines
    queue = ctx.Queue()
    proc = ctx.Process(target=_release_in_child, args=(queue,))
    proc.start()
    proc.join(120)
    released, dropped, counted, refused, total = queue.get(timeout=5)
    assert released is True and dropped > 200 and counted == 1
    assert refused is False and total == 1

    model = tiny_llama()  # 2 decoder layers
    calls = []
    monkeypatch.setattr(memory, "release_free_memory", lambda min_growth=None: calls.append(min_growth))
    assert memory.release_memory_in_layers(model, every=1) == 2
    assert memory.release_memory_in_layers(model, every=1) == 2  # idempotent: one hook per layer
    ids = torch.randint(3, 50, (2, 5))
    with torch.no_grad():
        model(ids)
    assert calls == []  # sampling: nothing
    model(ids).logits.sum().backward()
    assert calls == [None] * 4  # gated by memory.MIN_GROWTH: after each layer's forward, and as the backward reaches it

"""lmrl_sdpa: HF sdpa, except computed in fp32 under CPU autocast; and the malloc setting."""

import json
import platform

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from lmrl.data.tokenizers import build_char_tokenizer
from lmrl.models import load_model
from lmrl.models.attention import NAME, sdpa_fp32_on_cpu
from lmrl.models.memory import keep_freed_memory


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

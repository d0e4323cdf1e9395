"""ChatML rendering, role validation and SFT loss masks, token by token."""

import jinja2
import pytest
from tokenizers import Tokenizer

from lmrl.data.chat import (
    CHATML_TEMPLATE,
    encode_prompt,
    ensure_chat_template,
    render_prompt,
    tokenize_conversation,
    tokenize_prompt_completion,
    validate_messages,
)
from lmrl.data.tokenizers import build_bpe_tokenizer, build_char_tokenizer

M = -100
S, E, NL = 2, 3, 5  # <|im_start|>, <|im_end|>, "\n" in the char tokenizer


def c(text: str) -> list[int]:
    """Char-tokenizer ids computed by hand: printable ASCII code - 25, newline 5."""
    return [5 if ch == "\n" else ord(ch) - 25 for ch in text]


def user(x):
    return {"role": "user", "content": x}


def assistant(x):
    return {"role": "assistant", "content": x}


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


def test_chatml_exact_strings(tok):
    msgs = [{"role": "system", "content": "Be brief."}, user(" 12+34= "), assistant("46\n")]
    # content is trimmed (`| trim` in the book's template); no BOS for the char tokenizer
    assert tok.apply_chat_template(msgs, tokenize=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\n12+34=<|im_end|>\n"
        "<|im_start|>assistant\n46<|im_end|>\n"
    )
    assert tok.apply_chat_template([user("hi")], tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert render_prompt(tok, "hi") == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_chatml_renders_bos_when_tokenizer_has_one(tok):
    out = tok.apply_chat_template([user("a")], tokenize=False, chat_template=CHATML_TEMPLATE, bos_token="<s>")
    assert out == "<s><|im_start|>user\na<|im_end|>\n"


@pytest.mark.parametrize(
    "msgs",
    [
        [assistant("a")],
        [user("a"), user("b")],
        [user("a"), assistant("b"), {"role": "system", "content": "s"}],
        [user("a"), {"role": "tool", "content": "b"}],
    ],
)
def test_chatml_template_rejects_bad_order(tok, msgs):
    with pytest.raises(jinja2.TemplateError, match="roles must be"):
        tok.apply_chat_template(msgs, tokenize=False)


def test_validate_messages_accepts_good_orders():
    validate_messages([user("a"), assistant("b")], "row 1")
    validate_messages(
        [{"role": "system", "content": "s"}, user("a"), assistant("b"), user("c"), assistant("d")], "row 1"
    )
    validate_messages([user("a")], "prompt", require_assistant_last=False)


@pytest.mark.parametrize(
    "msgs, roles",
    [
        ([assistant("b"), user("a")], "['assistant', 'user']"),
        ([user("a"), user("b"), assistant("c")], "['user', 'user', 'assistant']"),
        (
            [user("a"), assistant("b"), {"role": "system", "content": "s"}, user("c"), assistant("d")],
            "['user', 'assistant', 'system', 'user', 'assistant']",
        ),
        ([user("a"), assistant("b"), user("c")], "['user', 'assistant', 'user']"),  # must end with assistant
        (
            [{"role": "system", "content": "s"}, {"role": "system", "content": "t"}, user("a"), assistant("b")],
            "['system', 'system', 'user', 'assistant']",
        ),
        ([{"role": "system", "content": "s"}], "['system']"),
    ],
)
def test_validate_messages_rejects_naming_where_and_roles(msgs, roles):
    with pytest.raises(ValueError) as e:
        validate_messages(msgs, "row 17 of data.jsonl")
    assert str(e.value).startswith("row 17 of data.jsonl: bad role order")
    assert roles in str(e.value)


@pytest.mark.parametrize(
    "msgs, match",
    [
        ([], "non-empty list"),
        ("hello", "non-empty list"),
        ([{"role": "user"}], "message 0 must be a dict with keys"),
        ([user("a"), {"role": "assistant", "content": ["x"]}], r"message 1 \('assistant'\) has content of type list"),
    ],
)
def test_validate_messages_rejects_malformed(msgs, match):
    with pytest.raises(ValueError, match="^row 3: .*" + match):
        validate_messages(msgs, "row 3")


def test_single_turn_labels_token_by_token(tok):
    ids, labels = tokenize_conversation(tok, [user("1+2="), assistant("3")])
    # <|im_start|>user\n1+2=<|im_end|>\n<|im_start|>assistant\n | 3<|im_end|> | \n
    prompt = [S] + c("user\n1+2=") + [E, NL, S] + c("assistant\n")
    assert ids == prompt + c("3") + [E, NL]
    assert labels == [M] * len(prompt) + c("3") + [E] + [M]


def test_multi_turn_all_and_last(tok):
    msgs = [{"role": "system", "content": "s"}, user("a"), assistant("bc"), user("d"), assistant("e")]
    ids, labels = tokenize_conversation(tok, msgs, train_on="all")
    head = [S] + c("system\ns") + [E, NL] + [S] + c("user\na") + [E, NL] + [S] + c("assistant\n")
    middle = [NL, S] + c("user\nd") + [E, NL] + [S] + c("assistant\n")
    assert ids == head + c("bc") + [E] + middle + c("e") + [E] + [NL]
    assert labels == [M] * len(head) + c("bc") + [E] + [M] * len(middle) + c("e") + [E] + [M]
    ids_last, labels_last = tokenize_conversation(tok, msgs, train_on="last")
    assert ids_last == ids
    assert labels_last == [M] * (len(head) + 3 + len(middle)) + c("e") + [E] + [M]
    assert tok.decode(ids) == tok.apply_chat_template(msgs, tokenize=False)


def test_tokenize_conversation_rejects_bad_roles_and_mode(tok):
    with pytest.raises(ValueError, match=r"row 5: bad role order \['user', 'user'\]"):
        tokenize_conversation(tok, [user("a"), user("b")], where="row 5")
    with pytest.raises(ValueError, match="train_on must be 'all' or 'last'"):
        tokenize_conversation(tok, [user("a"), assistant("b")], train_on="first")


def test_prompt_completion_chat_matches_conversation(tok):
    pc = tokenize_prompt_completion(tok, "1+2=", "3", chat=True)
    assert pc == tokenize_conversation(tok, [user("1+2="), assistant("3")])
    # conversational prompt/completion: only the completion's assistant turn is learned
    ids, labels = tokenize_prompt_completion(tok, [user("a"), assistant("b"), user("c")], [assistant("d")])
    learned = [i for i, l in zip(ids, labels) if l != M]
    assert learned == c("d") + [E]


def test_prompt_completion_raw_text(tok):
    ids, labels = tokenize_prompt_completion(tok, "ab", "cd", chat=False)
    # "ab" + "cd" + <|im_end|>, prompt masked
    assert ids == c("abcd") + [E]
    assert labels == [M, M] + c("cd") + [E]


def test_prompt_ids_match_generation_prompt(tok):
    ids, labels = tokenize_prompt_completion(tok, "7*6=", "42")
    first = next(i for i, l in enumerate(labels) if l != M)
    assert ids[:first] == encode_prompt(tok, "7*6=")
    assert tok.decode(ids[:first]) == render_prompt(tok, "7*6=")
    assert encode_prompt(tok, "ab", chat=False) == c("ab")


def test_render_prompt_needs_user_last(tok):
    with pytest.raises(ValueError, match="last message must be from the user"):
        render_prompt(tok, [user("a"), assistant("b")])


def test_bpe_segment_alignment():
    sentences = ["the answer is forty two", "what is six times seven", "the user asks the assistant"] * 4
    bpe = build_bpe_tokenizer(sentences, vocab_size=320)
    msgs = [
        user("what is six times seven"),
        assistant("the answer is forty two"),
        user("again"),
        assistant("forty two"),
    ]
    ids, labels = tokenize_conversation(bpe, msgs)
    assert bpe.decode(ids) == bpe.apply_chat_template(msgs, tokenize=False)
    # the learned runs are exactly the separately tokenized "content<|im_end|>" segments
    runs, run = [], []
    for i, l in zip(ids, labels):
        if l != M:
            assert l == i
            run.append(i)
        elif run:
            runs.append(run)
            run = []
    assert run == []
    enc = lambda t: bpe(t, add_special_tokens=False)["input_ids"]  # noqa: E731
    assert runs == [enc("the answer is forty two<|im_end|>"), enc("forty two<|im_end|>")]
    assert len(runs[0]) < len("the answer is forty two")  # BPE merged characters
    # the unlabelled prefix is the generation prompt, tokenized as for generation
    first = labels.index(runs[0][0])
    assert ids[:first] == encode_prompt(bpe, [user("what is six times seven")])


def test_other_template_end_of_turn_is_eos(tok):
    # A Zephyr-like template whose turns end with "</s>" (the tokenizer's EOS here).
    zephyr = build_char_tokenizer()
    zephyr.add_special_tokens({"eos_token": "</s>"})
    zephyr.chat_template = (
        "{% for m in messages %}{{ '<|' + m['role'] + '|>\n' + m['content'] + '</s>\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
    )
    ids, labels = tokenize_conversation(zephyr, [user("a"), assistant("b")])
    eos = zephyr.eos_token_id
    assert eos == 102
    assert [i for i, l in zip(ids, labels) if l != M] == c("b") + [eos]
    assert labels[-1] == M and ids[-1] == NL


def test_template_without_prefix_property_is_rejected():
    bad = build_char_tokenizer()
    bad.chat_template = (  # prints the number of messages first: history-dependent rendering
        "{{ messages | length }}{% for m in messages %}{{ m['role'] + ':' + m['content'] + '\n' }}{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    )
    with pytest.raises(ValueError, match="does not have the prefix property"):
        tokenize_conversation(bad, [user("a"), assistant("b")])


def test_ensure_chat_template_keeps_existing():
    t = build_char_tokenizer()
    t.chat_template = "{{ messages[0]['content'] }}"
    assert ensure_chat_template(t).chat_template == "{{ messages[0]['content'] }}"
    t.chat_template = None
    assert ensure_chat_template(t).chat_template == CHATML_TEMPLATE
    assert isinstance(t.backend_tokenizer, Tokenizer) and len(t) == 102  # markers already known: nothing added

"""Tool chat template and SFT masks on tool conversations, token-exact."""

import pytest

from lmrl.data.chat import CHATML_TEMPLATE, IGNORE_INDEX, tokenize_conversation
from lmrl.data.sft import build_sft_examples
from lmrl.data.tokenizers import build_builtin_bpe, build_char_tokenizer
from lmrl.data.tool_chat import (
    CHATML_TOOLS_TEMPLATE,
    ToolContext,
    between_turns_ids,
    ensure_tool_template,
    render,
    tokenize_tool_conversation,
    validate_tool_messages,
)
from lmrl.rollout.tools.parsers import ToolCall, get_parser
from lmrl.rollout.tools.toolbox import calculator

TOOLS = [calculator().schema()]
CALL = get_parser("hermes").format([ToolCall("calculator", {"expression": "12*34"})])
CONV = [
    {"role": "user", "content": "12*34="},
    {"role": "assistant", "content": CALL},
    {"role": "tool", "content": "408"},
    {"role": "assistant", "content": "408"},
]


@pytest.fixture(params=["char", "bpe"])
def tok(request):
    t = build_char_tokenizer() if request.param == "char" else build_builtin_bpe()
    return ensure_tool_template(t)


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
        [
            {"role": "system", "content": " be brief "},
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"},
        ],
    ],
)
@pytest.mark.parametrize("gen", [True, False])
def test_the_tool_template_renders_tool_free_chats_exactly_like_chatml(messages, gen):
    plain = build_char_tokenizer()
    assert plain.chat_template == CHATML_TEMPLATE
    want = plain.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
    ensure_tool_template(plain)
    assert plain.chat_template == CHATML_TOOLS_TEMPLATE
    assert plain.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen) == want


def test_tools_are_listed_in_the_system_message_and_tool_turns_rendered(tok):
    text = render(tok, CONV, TOOLS, add_generation_prompt=False)
    assert text.startswith("<|im_start|>system\nTools:\ncalculator(expression): Evaluate")
    assert "<|im_start|>tool\n408<|im_end|>\n" in text


def learned_text(tok, ids, labels):
    return [tok.decode([t for t, y in zip(ids, labels) if y != IGNORE_INDEX])]


def test_sft_labels_learn_assistant_turns_and_never_tool_outputs(tok):
    ids, labels = tokenize_tool_conversation(tok, CONV, TOOLS)
    assert ids == tok(render(tok, CONV, TOOLS, False), add_special_tokens=False)["input_ids"]
    learned = [i for i, y in enumerate(labels) if y != IGNORE_INDEX]
    assert tok.decode([ids[i] for i in learned]) == CALL + "<|im_end|>" + "408<|im_end|>"
    # the tool's "408" and every other non-assistant token are masked: the learned runs are exactly the two turns
    runs = [tok.decode([ids[i] for i in run]) for run in _runs(learned)]
    assert runs == [CALL + "<|im_end|>", "408<|im_end|>"]


def test_call_tokens_are_masked_when_asked(tok):
    ids, labels = tokenize_tool_conversation(tok, CONV, TOOLS, get_parser("hermes"), train_calls=False)
    learned = [i for i, y in enumerate(labels) if y != IGNORE_INDEX]
    runs = [tok.decode([ids[i] for i in run]) for run in _runs(learned)]
    assert runs == ["<|im_end|>", "408<|im_end|>"]


def test_tokens_between_turns_continue_the_sequence_exactly(tok):
    before = tok(render(tok, CONV[:1], TOOLS, True), add_special_tokens=False)["input_ids"]
    turn = tok(CALL, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    between = between_turns_ids(tok, CONV[:1], CONV[1], CONV[2:3], TOOLS)
    assert tok.decode(between) == "\n<|im_start|>tool\n408<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(before + turn + between) == render(tok, CONV[:3], TOOLS, True)


def test_sft_examples_from_openai_tool_call_rows(tok):
    row = {
        "messages": [
            CONV[0],
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"type": "function", "function": {"name": "calculator", "arguments": '{"expression": "12*34"}'}}
                ],
            },
            CONV[2],
            CONV[3],
        ]
    }
    ctx = ToolContext(TOOLS, get_parser("hermes"))
    (ex,), _ = build_sft_examples([row], tok, 512, tool_context=ctx)
    assert (ex.input_ids, ex.labels) == tokenize_tool_conversation(tok, CONV, TOOLS)
    with pytest.raises(ValueError, match="set tools="):
        build_sft_examples([row], tok, 512)


def test_plain_chats_tokenize_as_before(tok):
    msgs = [{"role": "user", "content": "2+2="}, {"role": "assistant", "content": "4"}]
    assert tokenize_tool_conversation(tok, msgs, None) == tokenize_conversation(tok, msgs)


@pytest.mark.parametrize(
    "roles",
    [["assistant"], ["user", "tool", "assistant"], ["user", "assistant", "tool"], ["user", "critic", "assistant"]],
)
def test_bad_role_orders_are_refused(roles):
    with pytest.raises(ValueError, match="bad role order"):
        validate_tool_messages([{"role": r, "content": "x"} for r in roles], "row 1")


def test_a_template_that_refuses_tool_messages_fails_with_the_fix():
    tok = build_char_tokenizer()
    tok.chat_template = CHATML_TEMPLATE.replace(
        "{{ bos_token", "{{ raise_exception('no tools') if messages|length > 2 else '' }}{{ bos_token"
    )
    with pytest.raises(ValueError, match="CHATML_TOOLS_TEMPLATE"):
        ensure_tool_template(tok)


def _runs(indices):
    runs, cur = [], []
    for i in indices:
        if cur and i != cur[-1] + 1:
            runs.append(cur)
            cur = []
        cur.append(i)
    return runs + ([cur] if cur else [])

"""Tool-call formats: round trips and malformed calls (errors, never exceptions)."""

import pytest

from lmrl.rollout.tools.parsers import TOOL_PARSERS, ToolCall, get_parser

CALLS = [
    ToolCall("calculator", {"expression": "4821*937"}),
    ToolCall("search", {"q": 'a "quoted" x', "k": 3, "flags": [True, None]}),
]


@pytest.mark.parametrize("name", sorted(TOOL_PARSERS))
@pytest.mark.parametrize("calls", [CALLS[:1], CALLS])
def test_format_then_parse_round_trips(name, calls):
    parser = get_parser(name)
    text = parser.format(calls)
    parsed = parser.parse(text)
    assert [(c.name, c.arguments) for c in parsed.calls] == [(c.name, c.arguments) for c in calls]
    assert parsed.errors == [] and parsed.content == ""
    assert all(text[s:e] for s, e in parsed.spans)


@pytest.mark.parametrize("name", sorted(TOOL_PARSERS))
@pytest.mark.parametrize("text", ["The answer is 42.", "42", "", "[1, 2, 3]", "see f (x) later"])
def test_plain_answers_are_not_calls(name, text):
    parsed = get_parser(name).parse(text)
    assert parsed.calls == [] and parsed.errors == [] and parsed.spans == []


def test_hermes_keeps_the_text_around_calls_and_their_spans():
    text = 'Let me compute. <tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}</tool_call> ok'
    parsed = get_parser("hermes").parse(text)
    assert parsed.content == "Let me compute.  ok"
    ((start, end),) = parsed.spans
    assert text[start:end].startswith("<tool_call>") and text[start:end].endswith("</tool_call>")
    assert parsed.calls == [ToolCall("calculator", {"expression": "2*3"})]


def test_openai_string_arguments_and_llama_parameters_are_accepted():
    hermes = get_parser("hermes").parse('<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>')
    assert hermes.calls == [ToolCall("f", {"x": 1})]
    plain = get_parser("json").parse('```json\n{"name": "f", "parameters": {"x": 2}}\n```')
    assert plain.calls == [ToolCall("f", {"x": 2})]


@pytest.mark.parametrize(
    "name, text, reason",
    [
        ("hermes", "<tool_call>{bad json}</tool_call>", "not valid JSON"),
        ("hermes", '<tool_call>{"arguments": {}}</tool_call>', "non-empty string 'name'"),
        ("hermes", '<tool_call>{"name": "f", "arguments": [1]}</tool_call>', "must be a JSON object"),
        ("hermes", '<tool_call>{"name": "f", "arguments": "{oops"}</tool_call>', "not valid JSON"),
        ("hermes", '<tool_call>{"name": "f", "argum', "not closed"),
        ("hermes", "<tool_call>[1, 2]</tool_call>", "must be a JSON object"),
        ("json", '{"name": "f", "arguments": {"x": 1}', "not valid JSON"),
        ("json", '{"arguments": {"x": 1}}', "non-empty string 'name'"),
        ("pythonic", "[f(x=1), g(y=2]", "not valid Python call syntax"),
        ("pythonic", "f(1, 2)", "keyword arguments only"),
        ("pythonic", "f(x=open('/etc/passwd'))", "not a literal"),
        ("pythonic", "f(**kw)", "**kwargs"),
        ("pythonic", "[f(x=1), 3]", "each item must be a call"),
    ],
)
def test_malformed_calls_are_errors_with_a_reason(name, text, reason):
    parsed = get_parser(name).parse(text)
    assert parsed.calls == [] or name == "pythonic"
    assert len(parsed.errors) == 1 and reason in parsed.errors[0]
    assert parsed.spans, "a malformed call still has a span (for the loss mask)"


def test_a_good_and_a_bad_call_in_one_message():
    text = '<tool_call>{"name": "f", "arguments": {}}</tool_call><tool_call>nope</tool_call>'
    parsed = get_parser("hermes").parse(text)
    assert parsed.calls == [ToolCall("f", {})] and len(parsed.errors) == 1 and len(parsed.spans) == 2


def test_unknown_format_names_the_known_ones():
    with pytest.raises(ValueError, match="hermes"):
        get_parser("xml")

"""Chat templates, role-order validation and SFT loss masks.

The loss mask follows the RLHF book, ch. 4 (spec `rlhf-book-core.md` §2): prompt
tokens are never in the loss (label -100); in a multi-turn conversation either
every assistant turn is learned (`train_on="all"`, the book's option b) or only
the last one (`train_on="last"`, option a).

Masks are found from the tokenizer's own chat template, for any template with
the *prefix property*: rendering `messages[:i]` (with or without the generation
prompt) yields a prefix of the rendering of the whole conversation. Each
assistant turn's text is then the span between `render(messages[:i],
add_generation_prompt=True)` and `render(messages[:i+1])`; the spans and the
text between them are tokenized separately and concatenated, so labels align
with tokens exactly even for BPE tokenizers, and the prompt part is tokenized
exactly as `render_prompt` + `encode_prompt` tokenize it for generation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

IGNORE_INDEX = -100
"""Label of tokens that are not in the loss (the convention of torch/HF cross-entropy)."""

CHATML_TEMPLATE = (
    "{{ bos_token if bos_token is defined and bos_token else '' }}"
    "{% if messages and messages[0]['role'] == 'system' %}{% set offset = 1 %}"
    "{% else %}{% set offset = 0 %}{% endif %}"
    "{% for message in messages %}"
    "{% if loop.index0 < offset %}{% set expected = 'system' %}"
    "{% elif (loop.index0 - offset) % 2 == 0 %}{% set expected = 'user' %}"
    "{% else %}{% set expected = 'assistant' %}{% endif %}"
    "{% if message['role'] != expected %}"
    "{{ raise_exception('Conversation roles must be an optional system message, then "
    "user/assistant/user/assistant/...') }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] | trim + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""ChatML (RLHF book ch. 4): `<|im_start|>{role}\\n{content|trim}<|im_end|>\\n` per message,
an optional system message first, then strict user/assistant alternation;
`add_generation_prompt` appends `<|im_start|>assistant\\n`. EOS is `<|im_end|>`."""

ROLES = ("system", "user", "assistant")


def ensure_chat_template(tokenizer: Any) -> Any:
    """Install `CHATML_TEMPLATE` on `tokenizer` if it has no chat template; returns it.

    ChatML needs `<|im_start|>` and `<|im_end|>` to be single tokens: if the
    tokenizer does not know them they are added as special tokens and listed in
    `tokenizer.lmrl_added_tokens`; `lmrl.models.loading.load_model` then resizes
    a model without spare embedding rows to `len(tokenizer)`.
    """
    if getattr(tokenizer, "chat_template", None):
        return tokenizer
    vocab = tokenizer.get_vocab()
    missing = [t for t in ("<|im_start|>", "<|im_end|>") if t not in vocab]
    if missing:
        tokenizer.add_special_tokens({"additional_special_tokens": missing})
        tokenizer.lmrl_added_tokens = missing
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def validate_messages(messages: Any, where: str, require_assistant_last: bool = True) -> None:
    """Check the role order of one conversation; raise a ValueError naming `where`.

    Valid: a list of {"role", "content"} dicts with string content; an optional
    single system message first, then user and assistant strictly alternating,
    starting with user and (for training, `require_assistant_last`) ending with
    assistant.
    """
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError(
            f"{where}: `messages` must be a non-empty list of {{'role': ..., 'content': ...}} "
            f"dicts, got {type(messages).__name__} {str(messages)[:80]!r}. Fix the row or drop it."
        )
    for j, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise ValueError(
                f"{where}: message {j} must be a dict with keys 'role' and 'content', got "
                f"{str(m)[:80]!r}. Fix the row or drop it."
            )
        if not isinstance(m["content"], str):
            raise ValueError(
                f"{where}: message {j} ({m['role']!r}) has content of type "
                f"{type(m['content']).__name__}, expected a string (multimodal or tool "
                "content is not supported). Convert the content to text or drop the row."
            )
    roles = [m["role"] for m in messages]
    offset = 1 if roles[0] == "system" else 0
    expected = ["system"] * offset + ["user" if (j % 2 == 0) else "assistant" for j in range(len(roles) - offset)]
    ok = roles == expected and len(roles) > offset
    if ok and require_assistant_last and roles[-1] != "assistant":
        ok = False
    if not ok:
        end = " and end with assistant" if require_assistant_last else ""
        raise ValueError(
            f"{where}: bad role order {roles}. A conversation is an optional single system "
            f"message, then user and assistant strictly alternating, starting with user{end} "
            "(e.g. ['system', 'user', 'assistant', 'user', 'assistant']). Merge consecutive "
            "messages of the same role, or drop the row."
        )


def _render(tokenizer: Any, messages: Sequence[dict], add_generation_prompt: bool) -> str:
    text = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=add_generation_prompt)
    if not isinstance(text, str):  # some versions return a list for batched input
        raise TypeError(f"apply_chat_template returned {type(text).__name__}, expected str")
    return text


def _as_messages(prompt: str | Sequence[dict]) -> list[dict]:
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return list(prompt)


def render_prompt(tokenizer: Any, prompt: str | Sequence[dict]) -> str:
    """Text of a prompt ready for generation: the chat template with `add_generation_prompt=True`.

    A plain string is wrapped as one user message. The messages must end with a
    user turn.
    """
    messages = _as_messages(prompt)
    validate_messages(messages, "prompt", require_assistant_last=False)
    if messages[-1]["role"] != "user":
        raise ValueError(
            f"prompt: the last message must be from the user to generate a reply, got roles "
            f"{[m['role'] for m in messages]}. Drop the trailing assistant message."
        )
    return _render(tokenizer, messages, add_generation_prompt=True)


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def special_strings(tokenizer: Any) -> tuple[str, ...]:
    """The strings this tokenizer turns into special or added tokens (chat markers, EOS, pad, ...)."""
    added = getattr(tokenizer, "get_added_vocab", dict)()
    return tuple(sorted({*getattr(tokenizer, "all_special_tokens", []), *added} - {""}))


def has_special_tokens(texts: Sequence[str], specials: Sequence[str]) -> bool:
    """Whether any of ``texts`` contains one of ``specials``: text from outside (a swarm peer, a tool, an MCP
    server) that would tokenize into control tokens."""
    return any(marker in text for text in texts for marker in specials)


def encode_plain(tokenizer: Any, text: str, specials: Sequence[str] | None = None) -> list[int]:
    """Tokens of ``text`` as plain text: a special-token string in it (``<|im_end|>``) becomes ordinary tokens,
    never the control token (`split_special_tokens`; a tokenizer without it: the string's first character is
    encoded apart, so the rest no longer matches)."""
    specials = special_strings(tokenizer) if specials is None else specials
    if not has_special_tokens([text], specials):
        return _encode(tokenizer, text)
    try:
        ids = list(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])
    except TypeError:
        ids = None
    control = {tokenizer.convert_tokens_to_ids(s) for s in specials}
    if ids is not None and not control & set(ids):
        return ids
    first = min((text.index(s), s) for s in specials if s in text)[0]  # encode "<" apart, then the rest
    return (
        _encode(tokenizer, text[:first])
        + _encode(tokenizer, text[first])
        + encode_plain(tokenizer, text[first + 1 :], specials)
    )


def encode_prompt(tokenizer: Any, prompt: str | Sequence[dict], chat: bool = True) -> list[int]:
    """Token ids of a prompt for generation, identical to the prompt part of SFT examples.

    chat=True: `render_prompt` then tokenize without extra special tokens (the
    template adds its own). chat=False: the raw text with the tokenizer's own
    special tokens (e.g. a Llama BOS), never a trailing EOS.
    """
    if chat:
        return _encode(tokenizer, render_prompt(tokenizer, prompt))
    if not isinstance(prompt, str):
        raise ValueError("encode_prompt(chat=False) needs a plain string prompt, got a message list.")
    ids = list(tokenizer(prompt, add_special_tokens=True)["input_ids"])
    eos = tokenizer.eos_token_id
    if ids and eos is not None and ids[-1] == eos and not prompt.endswith(tokenizer.eos_token):
        ids = ids[:-1]  # tokenizers whose post-processor appends EOS
    return ids


END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>")
"""End-of-turn markers of common templates, tried after the tokenizer's own EOS."""


def _turn_end(tokenizer: Any, span: str) -> int:
    """Length of the learned part of an assistant span: up to and including its end-of-turn text.

    ChatML renders an assistant turn as `content<|im_end|>\\n`; the model stops at
    `<|im_end|>` so the trailing newline is never generated and is not learned.
    The marker is the tokenizer's EOS if the span contains it, else the first of
    END_OF_TURN found; a span with none of them is learned whole.
    """
    eos = getattr(tokenizer, "eos_token", None)
    for marker in ([eos] if eos else []) + list(END_OF_TURN):
        if marker in span:
            return span.rindex(marker) + len(marker)
    return len(span)


def _prefix_check(full: str, part: str, upto: int, gen: bool) -> None:
    if not full.startswith(part):
        raise ValueError(
            "the tokenizer's chat template does not have the prefix property: rendering "
            f"messages[:{upto}] (add_generation_prompt={gen}) is not a prefix of rendering the "
            f"whole conversation, so assistant tokens cannot be located.\n  prefix: {part[-80:]!r}\n"
            f"  full:   {full[: len(part)][-80:]!r}\nUse a template without history-dependent "
            "rendering (e.g. one that strips reasoning from earlier turns), or set "
            "`chat_template` to lmrl.data.chat.CHATML_TEMPLATE."
        )


def tokenize_messages(tokenizer: Any, messages: Sequence[dict], learn: Sequence[int]) -> tuple[list[int], list[int]]:
    """Input ids and labels of a rendered conversation, learning the assistant turns `learn`.

    `learn` holds message indices (each an assistant message). Returns labels equal
    to input_ids on the learned turns' content + end-of-turn tokens and -100 elsewhere.
    """
    full = _render(tokenizer, messages, add_generation_prompt=False)
    learn_set = set(learn)
    # Cut points in `full`: (start, end, learned) for each assistant turn.
    spans: list[tuple[int, int, bool]] = []
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = _render(tokenizer, messages[:i], add_generation_prompt=True)
        after = _render(tokenizer, messages[: i + 1], add_generation_prompt=False)
        _prefix_check(full, before, i, True)
        _prefix_check(full, after, i + 1, False)
        _prefix_check(after, before, i, True)
        start = len(before)
        if spans and start < spans[-1][1]:
            raise ValueError(
                f"the chat template renders assistant message {i} before the end of the "
                "previous one; it does not render messages in order. Use CHATML_TEMPLATE."
            )
        end = start + _turn_end(tokenizer, after[start:])
        spans.append((start, end, i in learn_set))
    input_ids: list[int] = []
    labels: list[int] = []
    pos = 0
    for start, end, learned in spans:
        ids = _encode(tokenizer, full[pos:start])
        input_ids += ids
        labels += [IGNORE_INDEX] * len(ids)
        ids = _encode(tokenizer, full[start:end])
        input_ids += ids
        labels += ids if learned else [IGNORE_INDEX] * len(ids)
        pos = end
    ids = _encode(tokenizer, full[pos:])
    input_ids += ids
    labels += [IGNORE_INDEX] * len(ids)
    return input_ids, labels


def tokenize_conversation(
    tokenizer: Any,
    messages: Sequence[dict],
    train_on: Literal["all", "last"] = "all",
    where: str = "conversation",
) -> tuple[list[int], list[int]]:
    """Input ids and labels of a conversation (RLHF book ch. 4 multi-turn masking).

    Labels are -100 except on assistant turns' content and end-of-turn tokens
    (`<|im_end|>` for ChatML): every assistant turn with train_on="all", only
    the last with train_on="last". Input ids do not depend on `train_on`.
    """
    if train_on not in ("all", "last"):
        raise ValueError(f"train_on must be 'all' or 'last', got {train_on!r}.")
    validate_messages(messages, where)
    assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    learn = assistant if train_on == "all" else assistant[-1:]
    return tokenize_messages(tokenizer, messages, learn)


def tokenize_prompt_completion(
    tokenizer: Any,
    prompt: str | Sequence[dict],
    completion: str | Sequence[dict],
    chat: bool = True,
    where: str = "example",
) -> tuple[list[int], list[int]]:
    """Input ids and labels of one prompt/completion pair; prompt tokens get -100.

    chat=True: the conversation [user: prompt, assistant: completion] (a prompt or
    completion may also be a message list, as in TRL's conversational format; then
    only the completion's assistant turns are learned). chat=False: raw text
    `prompt + completion + eos_token`, learning the completion and the EOS.
    """
    if chat:
        prompt_msgs = _as_messages(prompt)
        if isinstance(completion, str):
            completion_msgs = [{"role": "assistant", "content": completion}]
        else:
            completion_msgs = list(completion)
        messages = prompt_msgs + completion_msgs
        validate_messages(messages, where)
        learn = [i for i, m in enumerate(messages) if i >= len(prompt_msgs) and m["role"] == "assistant"]
        return tokenize_messages(tokenizer, messages, learn)
    if not isinstance(prompt, str) or not isinstance(completion, str):
        raise ValueError(
            f"{where}: chat=False needs plain string prompt and completion, got "
            f"{type(prompt).__name__} and {type(completion).__name__}. Use chat=True for messages."
        )
    if tokenizer.eos_token_id is None:
        raise ValueError(
            "the tokenizer has no eos_token, so a completion cannot be terminated; set "
            "tokenizer.eos_token or load it with lmrl.data.tokenizers.load_tokenizer."
        )
    prompt_ids = encode_prompt(tokenizer, prompt, chat=False)
    completion_ids = _encode(tokenizer, completion) + [tokenizer.eos_token_id]
    return prompt_ids + completion_ids, [IGNORE_INDEX] * len(prompt_ids) + completion_ids

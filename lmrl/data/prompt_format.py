"""One prompt encoder for every verb and engine: a row's prompt -> the token ids the model is prompted with.

A model's prompt is

- ``chat=true``: its chat template with the generation prompt (`lmrl.data.chat.render_prompt`), tokenized without
  extra special tokens (the template writes its own BOS);
- ``chat=false``: the raw text with the tokenizer's own special tokens (a Llama or Gemma BOS), never a trailing EOS:
  what ``tokenizer(text)`` gives transformers' ``model.generate``;
- with a ``prompt_template`` (a string holding ``{prompt}``), the row's prompt put into the template first, e.g.
  DeepSeek-R1-Zero's "A conversation between User and Assistant. ... User: {prompt}. Assistant:" on a base model.

Sampling, training, evaluation, judging and scoring all take their ids from `PromptFormat.ids`, so a prompt is the
same tokens everywhere (a base model's BOS included).

    fmt = PromptFormat.from_config(config)          # config.chat, config.prompt_template
    ids = fmt.ids(tokenizer, row["prompt"])         # list[int]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lmrl.data.chat import encode_prompt, render_prompt

__all__ = ["PLACEHOLDER", "PromptFormat"]

PLACEHOLDER = "{prompt}"


@dataclass(frozen=True)
class PromptFormat:
    """How a row's prompt becomes the model's prompt (see the module docstring)."""

    chat: bool = True
    template: str | None = None

    def __post_init__(self) -> None:
        if self.template is not None and self.template.count(PLACEHOLDER) != 1:
            raise ValueError(
                f"prompt_template must hold '{PLACEHOLDER}' exactly once (where the row's prompt goes), got "
                f"{self.template[:80]!r}."
            )

    @classmethod
    def from_config(cls, config: Any) -> PromptFormat:
        """From a config's ``chat`` and ``prompt_template`` keys (`lmrl rl`, `lmrl generate`; a verb without the
        template key: ``PromptFormat(config.chat)``)."""
        return cls(config.chat, config.prompt_template)

    def apply(self, prompt: str | list[dict]) -> str | list[dict]:
        """The row's prompt inside the template (a message list: inside its last user message)."""
        if self.template is None:
            return prompt
        if isinstance(prompt, str):
            return self.template.replace(PLACEHOLDER, prompt)
        messages = [dict(m) for m in prompt]
        last = messages[-1]
        last["content"] = self.template.replace(PLACEHOLDER, last["content"])
        return messages

    def text(self, tokenizer: Any, prompt: str | list[dict]) -> str:
        """The prompt as text (for display and for engines that take text; ``ids`` is what the model reads)."""
        prompt = self.apply(prompt)
        return render_prompt(tokenizer, prompt) if self.chat else _raw(prompt)

    def ids(self, tokenizer: Any, prompt: str | list[dict]) -> list[int]:
        """Token ids of the prompt (`lmrl.data.chat.encode_prompt` of the templated prompt)."""
        prompt = self.apply(prompt)
        return encode_prompt(tokenizer, prompt if self.chat else _raw(prompt), chat=self.chat)


def _raw(prompt: str | list[dict]) -> str:
    if isinstance(prompt, str):
        return prompt
    raise ValueError(
        "chat=false prompts are plain text, got a message list: use chat=true (the chat template renders the "
        "messages) or a dataset whose prompt column is text."
    )

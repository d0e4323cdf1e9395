"""Preference examples as token ids: a prompt/completion split where the completion starts, step
positions of stepwise completions, and the two batch layouts (sequences, and prompts + completions)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from lmrl.data.chat import IGNORE_INDEX, tokenize_prompt_completion
from lmrl.data.preference_parsing import STEP_SEPARATOR, Text


@dataclasses.dataclass(frozen=True)
class Tokenized:
    """A prompt/completion as the policy sees it: completion tokens follow the prompt's generation prompt."""

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]  # up to and including the last learned token (the end-of-turn/EOS)
    learn: tuple[int, ...]  # 1 on completion tokens of the completion's assistant turns, 0 on others

    def __len__(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)


def tokenize(tokenizer: Any, prompt: Text, completion: Text, chat: bool = True, where: str = "row") -> Tokenized:
    """Token ids of a prompt/completion, split where the completion's first learned token starts.

    Uses `tokenize_prompt_completion` (chat template, end-of-turn, prompt/answer boundary tokenized
    separately), then drops what follows the last learned token (e.g. ChatML's newline after
    `<|im_end|>`), so the sequence ends the way a generated completion ends.
    """
    ids, labels = tokenize_prompt_completion(tokenizer, prompt, completion, chat, where)
    learned = [j for j, y in enumerate(labels) if y != IGNORE_INDEX]
    first, last = learned[0], learned[-1]
    if first == 0:
        raise ValueError(f"{where}: the prompt renders to no tokens; a completion needs a prompt to condition on.")
    learn = tuple(int(labels[j] != IGNORE_INDEX) for j in range(first, last + 1))
    return Tokenized(tuple(ids[:first]), tuple(ids[first : last + 1]), learn)


def step_positions(tokenizer: Any, tokenized: Tokenized, steps: Sequence[str], where: str = "row") -> list[int]:
    """Index in `tokenized.completion_ids` of the token that ends each step (its last character)."""
    text = STEP_SEPARATOR.join(steps)
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = list(enc["input_ids"]), enc["offset_mapping"]
    if list(tokenized.completion_ids[: len(ids)]) != ids:
        raise ValueError(
            f"{where}: the tokenizer splits the step text differently inside the chat template than alone, so "
            "step labels cannot be placed; use chat=false or a tokenizer whose template keeps the assistant text "
            "as is (ChatML does)."
        )
    positions, start = [], 0
    for step in steps:
        last_char = start + len(step) - 1
        positions.append(next(t for t, (a, b) in enumerate(offsets) if a <= last_char < b))
        start += len(step) + len(STEP_SEPARATOR)
    return positions


def collate_sequences(items: Sequence[Tokenized], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded prompt+completion: input_ids, attention_mask (N, L) and `learn` (N, L), 1 on learned tokens."""
    width = max(len(x) for x in items)
    input_ids = torch.full((len(items), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(items), width), dtype=torch.long)
    learn = torch.zeros((len(items), width), dtype=torch.long)
    for b, x in enumerate(items):
        p, n = len(x.prompt_ids), len(x)
        input_ids[b, :n] = torch.tensor(x.prompt_ids + x.completion_ids)
        attention_mask[b, :n] = 1
        learn[b, p:n] = torch.tensor(x.learn)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "learn": learn}


def collate_completions(items: Sequence[Tokenized], pad_id: int) -> dict[str, torch.Tensor]:
    """The rollout layout: prompts left-padded to P, completions right-padded to T.

    input_ids, attention_mask (N, P+T); completion_mask (N, T) float, 1 on learned completion tokens;
    completion_start = P (as a 0-d tensor).
    """
    p_width = max(len(x.prompt_ids) for x in items)
    t_width = max(len(x.completion_ids) for x in items)
    n = len(items)
    input_ids = torch.full((n, p_width + t_width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((n, p_width + t_width), dtype=torch.long)
    completion_mask = torch.zeros((n, t_width))
    for b, x in enumerate(items):
        p, t = len(x.prompt_ids), len(x.completion_ids)
        input_ids[b, p_width - p : p_width] = torch.tensor(x.prompt_ids)
        input_ids[b, p_width : p_width + t] = torch.tensor(x.completion_ids)
        attention_mask[b, p_width - p : p_width + t] = 1
        completion_mask[b, :t] = torch.tensor(x.learn, dtype=torch.float)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "completion_mask": completion_mask,
        "completion_start": torch.tensor(p_width),
    }

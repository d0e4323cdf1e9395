"""A trained reward model as a reward function: `lmrl rl rewards=[model:runs/reward/final]`.

    fn = reward_model_reward("runs/reward/final")
    fn(prompts, completions, truncated=[...]) -> [r_1, ..., r_N]

What a score is, per kind (RLHF book ch. 5 "inference aggregation"):
  bt   the scalar head at the completion's last token (its end-of-turn/EOS);
  orm  p(correct) = σ(logit) at the completion's last token (Cobbe et al. 2021 use the final token);
  prm  min over steps of p(step label = +1), steps = lines of the completion ("fail fast").

Prompts may be raw (`12+34=`, or message lists) or already rendered with the chat template (what
the rollout engine reports): a prompt that ends with the template's generation prompt is used as is.
Finished completions get the EOS appended as at generation; truncated ones (column `truncated`) are
scored without it, or get `truncated_reward` when that is set (spec §8: do not score a truncated
response as if complete).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from lmrl.data.chat import encode_prompt, render_prompt
from lmrl.data.preference_parsing import STEP_SEPARATOR
from lmrl.data.preference_tokens import Tokenized, collate_sequences, step_positions
from lmrl.models.placement import model_device, to_device
from lmrl.models.precision import autocast
from lmrl.models.reward import RewardModel, last_token_index
from lmrl.models.setup import ModelSetup
from lmrl.rewards.types import RewardFn

_SENTINEL = "\x00lmrl-prompt\x00"


def _generation_suffix(tokenizer: Any) -> str:
    """Text the chat template appends to a user message to ask for a reply (ChatML: im_end, im_start assistant)."""
    rendered = render_prompt(tokenizer, _SENTINEL)
    return rendered[rendered.index(_SENTINEL) + len(_SENTINEL) :]


def tokenize_for_scoring(
    tokenizer: Any, prompt: str | list, completion: str, chat: bool, finished: bool = True
) -> Tokenized:
    """Token ids as the policy produced them: the rendered prompt, the completion, then EOS if it finished."""
    if chat and isinstance(prompt, str) and prompt.endswith(_generation_suffix(tokenizer)):
        # already rendered (rollout engines report rendered prompts)
        prompt_ids = tuple(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    else:
        prompt_ids = tuple(encode_prompt(tokenizer, prompt, chat))  # as training tokenized it
    completion_ids = list(tokenizer(completion, add_special_tokens=False)["input_ids"])
    if finished and tokenizer.eos_token_id is not None:
        completion_ids.append(tokenizer.eos_token_id)
    if not completion_ids:
        completion_ids = [tokenizer.eos_token_id if tokenizer.eos_token_id is not None else tokenizer.pad_token_id]
    return Tokenized(prompt_ids, tuple(completion_ids), (1,) * len(completion_ids))


@torch.no_grad()
def score_tokenized(
    model: RewardModel,
    items: Sequence[Tokenized],
    pad_id: int,
    dtype: torch.dtype | None,
    steps: Sequence[Sequence[int]] | None = None,
) -> torch.Tensor:
    """(N,) scores of tokenized prompt+completions (see the module docstring for each kind).

    `steps` (PRM only): per item, the indices in `completion_ids` of the tokens that end each step.
    """
    device = model_device(model)
    batch = to_device(collate_sequences(items, pad_id), device)
    with autocast(device.type, dtype):
        out = model(batch["input_ids"], batch["attention_mask"])  # (N, L, C)
    if model.kind != "prm":
        last = out[..., 0].gather(1, last_token_index(batch["attention_mask"])[:, None]).squeeze(1)  # (N,)
        return last if model.kind == "bt" else torch.sigmoid(last)
    if steps is None:
        raise ValueError("score_tokenized: a process reward model needs the step positions of every item.")
    probs = out.softmax(dim=-1)[..., 2]  # (N, L): p(step label +1)
    scores = []
    for b, (item, positions) in enumerate(zip(items, steps)):
        idx = torch.tensor([len(item.prompt_ids) + p for p in positions], dtype=torch.long)
        scores.append(probs[b, idx].min() if len(positions) else torch.tensor(0.0))
    return torch.stack(scores)


def score_texts(
    model: RewardModel,
    tokenizer: Any,
    prompts: Sequence[Any],
    completions: Sequence[str],
    batch_size: int = 32,
    dtype: torch.dtype | None = None,
    finished: Sequence[bool] | None = None,
) -> list[float]:
    """Reward-model scores of prompt/completion texts, `batch_size` sequences per forward."""
    finished = [True] * len(completions) if finished is None else list(finished)
    scores: list[float] = []
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(completions), batch_size):
            chunk = range(start, min(start + batch_size, len(completions)))
            texts = [_normalize_steps(completions[i]) if model.kind == "prm" else completions[i] for i in chunk]
            items = [
                tokenize_for_scoring(tokenizer, prompts[i], t, model.chat, finished[i]) for i, t in zip(chunk, texts)
            ]
            steps = None
            if model.kind == "prm":
                steps = [
                    step_positions(tokenizer, item, t.split(STEP_SEPARATOR)) if t else []
                    for item, t in zip(items, texts)
                ]
            scores += score_tokenized(model, items, tokenizer.pad_token_id, dtype, steps).tolist()
    finally:
        model.train(was_training)
    return scores


def _normalize_steps(completion: str) -> str:
    """A PRM completion as its non-empty stripped lines joined by STEP_SEPARATOR (one step per line)."""
    return STEP_SEPARATOR.join(s.strip() for s in completion.split(STEP_SEPARATOR) if s.strip())


def reward_model_reward(
    path: str, batch_size: int = 32, precision: str = "auto", truncated_reward: float | None = None
) -> RewardFn:
    """`model:PATH` reward: r_i = the reward model's score of (prompt_i, completion_i) (module docstring).

    Options: `batch_size` sequences per forward, `precision` (auto|bf16|fp32), `truncated_reward`
    (a fixed reward for truncated completions; None scores them without EOS).
    """
    setup = ModelSetup(precision=precision)
    model, tokenizer = setup.reward_model(path)
    dtype = setup.dtype

    def reward_model(prompts: Sequence[Any], completions: Sequence[str], **columns: Any) -> list[float]:
        truncated = list(columns.get("truncated") or [False] * len(completions))
        scores = score_texts(model, tokenizer, prompts, completions, batch_size, dtype, [not t for t in truncated])
        if truncated_reward is not None:
            scores = [float(truncated_reward) if t else s for s, t in zip(scores, truncated)]
        return scores

    return reward_model

"""What both engines share around their own sampling loop: the tokenizer's pad and stop ids, the checks of a request,
left padding, and the one `RolloutBatch` layout (`assemble_batch`), so `HFEngine` and `VLLMEngine` return the same
tensors and texts for the same tokens."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from lmrl.rollout.engines.stop_strings import StopStringMatcher
from lmrl.rollout.types import RolloutBatch, SamplingParams


def pad_token_id(tokenizer) -> int:
    """The tokenizer's pad id, else its eos id, else 0 (padding is always masked, so any id works)."""
    for tid in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if tid is not None:
            return int(tid)
    return 0


def stop_token_ids(tokenizer, params: SamplingParams, model=None) -> tuple[int, ...]:
    """params.stop_token_ids, or when it is None the tokenizer's eos id and every id of the model's
    ``generation_config.eos_token_id`` (an int or a list: Llama 3's ``<|eot_id|>``, Gemma's ``<end_of_turn>``), as
    transformers' ``generate`` stops (every engine stops the same way)."""
    if params.stop_token_ids is not None:
        return params.stop_token_ids
    ids = [tokenizer.eos_token_id]
    generation_config = getattr(model, "generation_config", None)  # a transformers model's; None for others
    model_eos = getattr(generation_config, "eos_token_id", None)
    ids += list(model_eos) if isinstance(model_eos, (list, tuple)) else [model_eos]
    return tuple(dict.fromkeys(int(i) for i in ids if i is not None))


def check_request(engine: str, prompt_ids, params: SamplingParams, n: int, vocab: int) -> None:
    """ValueError naming ``engine`` (e.g. "HFEngine") for a request no engine serves: not a `SamplingParams`, n < 1, no
    prompt, an empty prompt, or a token id outside the model's vocabulary of ``vocab`` ids. Each engine checks the
    lengths its own context allows after this."""
    if not isinstance(params, SamplingParams):
        raise ValueError(f"{engine}.generate takes a SamplingParams, got {type(params).__name__}.")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"{engine}.generate: n (completions per prompt) must be an int >= 1, got {n!r}.")
    if not isinstance(prompt_ids, (list, tuple)) or len(prompt_ids) == 0:
        raise ValueError(f"{engine}.generate: prompt_ids must be a non-empty list of token-id lists, one per prompt.")
    for i, prompt in enumerate(prompt_ids):
        if not isinstance(prompt, (list, tuple)) or len(prompt) == 0:
            raise ValueError(
                f"{engine}.generate: prompt {i} is empty or not a list of token ids; every prompt needs at "
                "least one token (render a chat template or add a BOS token)."
            )
        if any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab for t in prompt):
            raise ValueError(
                f"{engine}.generate: prompt {i} has token ids outside [0, {vocab}) (the model's vocabulary); "
                "check that the prompts were tokenized with this model's tokenizer."
            )


def left_pad(prompt_ids: Sequence[Sequence[int]], pad: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ids (B, P) and attention mask (B, P), P = longest prompt."""
    width = max(len(p) for p in prompt_ids)
    ids = torch.full((len(prompt_ids), width), pad, dtype=torch.long)
    mask = torch.zeros(len(prompt_ids), width, dtype=torch.long)
    for i, prompt in enumerate(prompt_ids):
        if len(prompt):
            ids[i, width - len(prompt) :] = torch.as_tensor(prompt, dtype=torch.long)
            mask[i, width - len(prompt) :] = 1
    return ids.to(device), mask.to(device)


def assemble_batch(
    tokenizer,
    prompt_ids: list[list[int]],
    prompt_texts: list[str] | None,
    completion_ids: torch.Tensor,
    sampler_logp: torch.Tensor,
    lengths: torch.Tensor,
    truncated: torch.Tensor,
    n: int,
    matcher: StopStringMatcher | None,
    device: torch.device,
) -> RolloutBatch:
    """The `RolloutBatch` of n completions of each of ``prompt_ids`` (prompt-major), on ``device``.

    completion_ids, sampler_logp: (N, T) sampled tokens and their log-probs, N = len(prompt_ids) * n; lengths (N,):
    each row's real tokens (the rest becomes padding: the pad id, log-prob 0, mask 0; columns past the longest row
    are dropped); truncated (N,) bool: the row hit max_new_tokens. Completions are decoded without special tokens
    and cut before the first stop string (``matcher``); prompts are ``prompt_texts``, else decoded with them."""
    pad = pad_token_id(tokenizer)
    columns = torch.arange(completion_ids.shape[1], device=completion_ids.device)
    completion_mask = (columns[None, :] < lengths[:, None].to(completion_ids.device)).float()  # (N, T)
    width = int(lengths.max())
    completion_ids = completion_ids.masked_fill(completion_mask == 0, pad)[:, :width]
    sampler_logp = (sampler_logp * completion_mask)[:, :width]
    completion_mask = completion_mask[:, :width]
    texts = tokenizer.batch_decode(
        [row[:k] for row, k in zip(completion_ids.tolist(), lengths.tolist())], skip_special_tokens=True
    )
    if matcher is not None:
        texts = [matcher.cut(t)[0] for t in texts]
    if prompt_texts is None:
        prompt_texts = tokenizer.batch_decode([list(p) for p in prompt_ids], skip_special_tokens=False)
    ids, mask = left_pad(prompt_ids, pad, device)  # (B, P) each
    truncated = truncated.to(device)
    return RolloutBatch(
        prompt_ids=ids.repeat_interleave(n, dim=0),
        prompt_mask=mask.repeat_interleave(n, dim=0),
        completion_ids=completion_ids.to(device),
        completion_mask=completion_mask.to(device),
        sampler_logp=sampler_logp.to(device),
        truncated=truncated,
        finish_reason=["length" if t else "stop" for t in truncated.tolist()],
        prompts=[text for text in prompt_texts for _ in range(n)],
        completions=texts,
        group_size=n,
    )

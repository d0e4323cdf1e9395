"""Peers' text rollouts as a `RolloutBatch` of this node's tokens, and joining batches of ragged groups.

SAPO (arXiv 2509.08721, section 2) shares rollouts as decoded text; a receiver
"re-tokenizes with its own tokenizer" and treats them as its own samples. Here
a question becomes ``render_prompt(tokenizer, question)`` (the node's chat
template, exactly as for its own questions) and a completion becomes its tokens
plus the node's EOS, as if the node had sampled it and stopped. A completion of
``max_new_tokens`` tokens or more is cut to ``max_new_tokens`` and marked
truncated (no EOS), like a sample that hit the length cap; its text becomes the
decoded kept tokens, so the verifier scores what is trained on.

Peers' text is data, never control: a group whose question or completions contain one
of this tokenizer's special-token strings (``<|im_end|>``, ``</s>``, ...) would
tokenize into control tokens, so `has_special_tokens` finds them and the node drops
the group (counted as ``swarm/groups/peer_special_tokens``).

Payloads carry no finish reasons, so a completion that the peer truncated at a
shorter cap than ours still gets an EOS here. `sampler_logp` is left 0: the node
fills in its own log-probs (`with_sampler_logp`), so the importance weight
pi_learner / pi_sampler of a peer row is 1 ("on-policy" as in the paper).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from lmrl.data.chat import has_special_tokens, render_prompt, special_strings  # noqa: F401 - re-exported
from lmrl.rollout.types import RolloutBatch


@dataclasses.dataclass(frozen=True)
class TokenizedGroup:
    """One question and its completions in this node's tokens (unpadded)."""

    prompt_text: str
    prompt_ids: list[int]
    completion_ids: list[list[int]]
    completions: list[str]
    """Completion texts as scored: the original text, or the decoded kept tokens when truncated."""
    truncated: list[bool]

    @property
    def size(self) -> int:
        return len(self.completion_ids)


def tokenize_group(tokenizer, question: str, completions: Sequence[str], max_new_tokens: int) -> TokenizedGroup:
    """Re-tokenize a peer's question and completions with this node's tokenizer (see the module docstring)."""
    return tokenize_groups(tokenizer, [(question, completions)], max_new_tokens)[0]


def tokenize_groups(
    tokenizer, groups: Sequence[tuple[str, Sequence[str]]], max_new_tokens: int
) -> list[TokenizedGroup]:
    """`tokenize_group` for many (question, completions) pairs, with two batched tokenizer calls."""
    if max_new_tokens < 1:
        raise ValueError(f"tokenize_group: max_new_tokens must be >= 1, got {max_new_tokens}.")
    if any(not completions for _, completions in groups):
        raise ValueError("tokenize_group: a question group needs at least one completion.")
    if not groups:
        return []
    prompt_texts = [render_prompt(tokenizer, question) for question, _ in groups]
    prompt_ids = tokenizer(prompt_texts, add_special_tokens=False)["input_ids"]
    flat = [text for _, completions in groups for text in completions]
    flat_ids = iter(tokenizer(flat, add_special_tokens=False)["input_ids"])
    eos = tokenizer.eos_token_id
    out = []
    for prompt_text, ids_of_prompt, (_, completions) in zip(prompt_texts, prompt_ids, groups):
        all_ids, texts, truncated = [], [], []
        for text in completions:
            ids = list(next(flat_ids))
            if len(ids) >= max_new_tokens:  # the cap is reached before any stop: truncated, as the engine marks it
                ids = ids[:max_new_tokens]
                text = tokenizer.decode(ids, skip_special_tokens=True)
                truncated.append(True)
            else:
                ids = ids + ([int(eos)] if eos is not None else [])
                truncated.append(False)
            all_ids.append(ids)
            texts.append(text)
        out.append(TokenizedGroup(prompt_text, list(ids_of_prompt), all_ids, texts, truncated))
    return out


def groups_to_batch(groups: Sequence[TokenizedGroup], pad_id: int) -> RolloutBatch:
    """A prompt-major `RolloutBatch` of the groups' rows (prompts left-padded, completions right-padded).

    group_size is the common group size when all groups share one, else 1 (ragged groups;
    the caller keeps the sizes). sampler_logp is 0 (see `with_sampler_logp`)."""
    if not groups:
        raise ValueError("groups_to_batch: no groups given; check for an empty selection before building a batch.")
    prompts = [g.prompt_ids for g in groups for _ in range(g.size)]
    completions = [ids for g in groups for ids in g.completion_ids]
    n = len(completions)
    p = max(len(x) for x in prompts)
    t = max(1, max(len(x) for x in completions))
    prompt_ids = torch.full((n, p), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((n, p), dtype=torch.long)
    completion_ids = torch.full((n, t), pad_id, dtype=torch.long)
    completion_mask = torch.zeros((n, t), dtype=torch.float32)
    for i, (pr, co) in enumerate(zip(prompts, completions)):
        if pr:
            prompt_ids[i, p - len(pr) :] = torch.tensor(pr)  # left padding, as the engine does
            prompt_mask[i, p - len(pr) :] = 1
        if co:
            completion_ids[i, : len(co)] = torch.tensor(co)
            completion_mask[i, : len(co)] = 1.0
    truncated = [tr for g in groups for tr in g.truncated]
    sizes = {g.size for g in groups}
    return RolloutBatch(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        sampler_logp=torch.zeros((n, t), dtype=torch.float32),
        truncated=torch.tensor(truncated, dtype=torch.bool),
        finish_reason=["length" if tr else "stop" for tr in truncated],
        prompts=[g.prompt_text for g in groups for _ in range(g.size)],
        completions=[text for g in groups for text in g.completions],
        group_size=sizes.pop() if len(sizes) == 1 else 1,
    )


def with_sampler_logp(batch: RolloutBatch, logp: torch.Tensor) -> RolloutBatch:
    """`batch` with its sampler log-probs replaced by `logp` (N, T), zeroed on padding."""
    if tuple(logp.shape) != tuple(batch.sampler_logp.shape):
        raise ValueError(
            f"with_sampler_logp: logp has shape {tuple(logp.shape)}, the batch {tuple(batch.sampler_logp.shape)}."
        )
    return dataclasses.replace(batch, sampler_logp=logp.detach().float() * batch.completion_mask)


def concat_batches(batches: Sequence[RolloutBatch], pad_id: int) -> RolloutBatch:
    """Rows of `batches` in order, re-padded to a common width (prompts on the left, completions on the right).

    group_size is the common group size when every batch has the same one, else 1."""
    batches = [b for b in batches if len(b)]
    if not batches:
        raise ValueError("concat_batches: every batch is empty; check for an empty training set first.")
    p = max(b.prompt_ids.shape[1] for b in batches)
    t = max(b.completion_ids.shape[1] for b in batches)

    def left(x: torch.Tensor, width: int, value: float) -> torch.Tensor:  # (n, w) -> (n, width)
        return torch.nn.functional.pad(x, (width - x.shape[1], 0), value=value)

    def right(x: torch.Tensor, width: int, value: float) -> torch.Tensor:
        return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value)

    sizes = {b.group_size for b in batches}
    return RolloutBatch(
        prompt_ids=torch.cat([left(b.prompt_ids, p, pad_id) for b in batches]),
        prompt_mask=torch.cat([left(b.prompt_mask, p, 0) for b in batches]),
        completion_ids=torch.cat([right(b.completion_ids, t, pad_id) for b in batches]),
        completion_mask=torch.cat([right(b.completion_mask, t, 0.0) for b in batches]),
        sampler_logp=torch.cat([right(b.sampler_logp, t, 0.0) for b in batches]),
        truncated=torch.cat([b.truncated for b in batches]),
        finish_reason=[r for b in batches for r in b.finish_reason],
        prompts=[x for b in batches for x in b.prompts],
        completions=[x for b in batches for x in b.completions],
        group_size=sizes.pop() if len(sizes) == 1 else 1,
    )

"""`openai_judge`: lmrl's LLM judges (`lmrl.rewards.judge`) on any OpenAI-compatible chat endpoint.

The prompts, the parsing and the scores are those of the local `rubric` and `judge` rewards; only the text
generation moves: each judgement is one POST to ``<url>/v1/chat/completions`` (temperature 0, `concurrency`
requests at a time, `timeout_s`/`retries`/`backoff_s` as for reward servers, `lmrl.rewards.remote`).

    rewards: [openai_judge]
    reward_kwargs: {openai_judge: {url: http://127.0.0.1:8000, model: qwen2.5-7b-instruct, api_key_env: OPENAI_API_KEY}}

kind="rubric" (default): r_i = the weighted rubric score of `criteria` (or the `rubric` column), in [0, 1].
kind="pairwise": r_i = 1 / 0.5 / 0 as the judge prefers completion_i / neither / the `reference` column's answer.
An unparsed reply gets `fallback` (default 0 for rubric, 0.5 for pairwise) and counts in
`reward/openai_judge/parse_failures`; an endpoint that still fails after its retries raises (a reward error).
"""

from __future__ import annotations

from typing import Any

from lmrl.rewards.judge import PairwiseJudge, RubricJudge, verdict_reward
from lmrl.rewards.judge_text import PAIRWISE_PROMPT, RUBRIC_PROMPT
from lmrl.rewards.registry import register_reward
from lmrl.rewards.remote import chat_generator
from lmrl.rewards.types import RewardFn

KINDS = ("rubric", "pairwise")


@register_reward("openai_judge")
def make_openai_judge(
    url: str,
    model: str,
    kind: str = "rubric",
    template: str | None = None,
    criteria: Any = None,
    reference: str = "chosen",
    swap: bool = True,
    max_score: float = 10,
    fallback: float | None = None,
    api_key_env: str | None = None,
    max_tokens: int = 256,
    timeout_s: float = 60.0,
    retries: int = 2,
    backoff_s: float = 0.5,
    concurrency: int = 8,
) -> RewardFn:
    """`openai_judge`: the `rubric` (kind="rubric") or `judge` (kind="pairwise") reward with its judgements from
    the chat endpoint `url` serving `model`; `template` replaces the judge prompt (same placeholders)."""
    if kind not in KINDS:
        raise ValueError(f"openai_judge: kind must be one of {KINDS}, got {kind!r}.")
    generate = chat_generator(
        url,
        model,
        api_key_env=api_key_env,
        max_tokens=max_tokens,
        timeout_s=timeout_s,
        retries=retries,
        backoff_s=backoff_s,
        concurrency=concurrency,
    )
    if kind == "rubric":
        rubric = RubricJudge(
            None,
            None,
            criteria,
            template or RUBRIC_PROMPT,
            max_score=max_score,
            fallback=0.0 if fallback is None else fallback,
            generate=generate,
        )
        rubric.batch_only = True  # an endpoint failure is not located by re-sending single samples
        return rubric
    pairwise = PairwiseJudge(None, None, template or PAIRWISE_PROMPT, swap, generate=generate)
    openai_judge = verdict_reward(pairwise, reference, 0.5 if fallback is None else fallback, "openai_judge")
    openai_judge.batch_only = True
    return openai_judge

"""`gold`: the built-in preference task's hidden gold score as a reward (`lmrl.data.preference_builtin.gold_score`).

    g = [v = a] + 1/(1 + |v − a|) − 0.05·e    (v: last integer of the completion, a: the answer, e: other chars)
    g = −1 − 0.05·e                           (no integer)

A dense, exactly known objective for online DPO and RL on `builtin:prefs` or `task:arithmetic` prompts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lmrl.rewards.columns import as_meta
from lmrl.rewards.registry import RewardFn, register_reward


@register_reward("gold")
def make_gold_reward() -> RewardFn:
    """`gold`: r_i = gold_score(prompt_i, completion_i, meta_i); the answer comes from `meta["answer"]`, else the
    `answer` column, else the value of the arithmetic prompt."""

    def gold(prompts: Sequence[Any], completions: Sequence[str], **columns: Any) -> list[float]:
        from lmrl.data.preference_builtin import gold_score  # data layer, imported on first use
        from lmrl.rewards.judge_text import question_text

        n = len(completions)
        metas = [as_meta(m, "gold") for m in (columns.get("meta") or [None] * n)]
        answers = columns.get("answer") or [None] * n
        out = []
        for prompt, completion, meta, answer in zip(prompts, completions, metas, answers):
            if "answer" not in meta and answer is not None:
                meta = {**meta, "answer": int(answer)}
            out.append(gold_score(question_text(prompt), completion, meta))
        return out

    return gold

"""Language Self-Play's environment: the Challenger's prompt, the check of its queries, and what to watch.

The Challenger writes a query from the challenger prompt <cp> (``challenger_text``); the environment checks it
(``QUERY_CHECKERS[verifier]``): a valid query becomes a ``Query`` (what the Solver sees and the reward columns
that come with it, e.g. the true answer of an arithmetic problem), a malformed one is None and is not answered.
``query_metrics`` watches the queries for degeneration. The trainer is `lmrl.trainers.selfplay.trainer`.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lmrl.data.tasks.expr import evaluate as evaluate_expression

if TYPE_CHECKING:  # (torch: the selfplay config imports this module and checks without torch, `lmrl.cli`)
    from lmrl.rollout.types import RolloutBatch

CHALLENGER_PROMPTS = {
    "lsp": """Background: a language task is an (input, output) tuple. The input is what a user gives a language agent; the output is the agent's reply.

Request: generate ONE valid input for the task '{task}'. It will be passed to another language agent. The input may be easy, intermediate, hard or noisy: it should stress-test the agent.

Details: copy the template between [Start Generation] and [End Generation] (without these tags) and fill in its {} placeholders.
[Start Generation]
{template}
[End Generation]

Final remarks: do not write the output, hints or anything that gives it away. Do not ask for actions a language agent cannot perform. Stop as soon as the template is filled. Follow the template strictly, unless the task and template are None or empty: then use your best judgement.""",
    "short": "Write one {task} problem like {template}",
}
"""Named challenger prompts: ``lsp`` paraphrases the paper's Box 1; ``short`` suits built-in char models."""


@dataclasses.dataclass(frozen=True)
class Query:
    """A valid Challenger query: what the Solver sees, the reward columns it comes with, numbers to log."""

    text: str
    columns: dict[str, Any]
    stats: dict[str, float]


def open_query(text: str) -> Query | None:
    """Any non-empty text is a query (generation tags the model copied are removed)."""
    text = text.replace("[Start Generation]", "").replace("[End Generation]", "").strip()
    return Query(text, {}, {}) if text else None


def arithmetic_query(
    text: str, max_digits: int = 3, max_operands: int = 3, ops: str = "+-", negative: bool = True, prefix: str = ""
) -> Query | None:
    """An integer expression such as ``12+34=`` (spaces and the final ``=`` optional), or None.

    Operands: 2..max_operands non-negative integers of at most max_digits digits, no leading zeros;
    operators among ``ops``; no parentheses or unary minus; the value must be an integer (exact
    division). The answer comes from ``lmrl.data.tasks.expr.evaluate`` (an ast whitelist).
    ``prefix``: an instruction the query must start with, kept in what the Solver sees, e.g. reasoning-gym
    chain_sum's "State the final answer to the following arithmetic problem: " (then the query is the prefix and
    the expression as written, ``=`` appended if missing: the format of the ``rg:chain_sum`` rows).
    """
    text = text.strip()
    if not text.startswith(prefix.strip()):
        return None
    written = text[len(prefix.strip()) :].strip()
    expr = written.removesuffix("=").replace(" ", "")
    if not re.fullmatch(r"[0-9+\-*/]+", expr):
        return None
    numbers = re.findall(r"\d+", expr)
    bad_number = any(len(x) > max_digits or (len(x) > 1 and x[0] == "0") for x in numbers)  # too long, leading 0
    if not 2 <= len(numbers) <= max_operands or bad_number:
        return None
    result = evaluate_expression(expr, ops)
    if result is None or result[0].denominator != 1 or (result[0] < 0 and not negative):
        return None
    stats = {"operands": float(len(numbers)), "max_digits": float(max(map(len, numbers)))}
    shown = f"{prefix}{written.removesuffix('=').rstrip()} =" if prefix else expr + "="
    return Query(shown, {"task": "arithmetic", "answer": str(int(result[0])), "meta": {"expression": expr}}, stats)


QUERY_CHECKERS: dict[str, Callable[..., Query | None]] = {"none": open_query, "arithmetic": arithmetic_query}
"""``verifier`` name -> checker(text, **query_args); the config checks ``query_args`` against its signature."""


def challenger_text(config) -> str:
    """The challenger prompt <cp> of a `SelfPlayConfig`, {task} and {template} filled in (empty means None, as in
    the paper)."""
    prompt = CHALLENGER_PROMPTS.get(config.challenger_prompt, config.challenger_prompt)
    return prompt.replace("{task}", config.task or "None").replace("{template}", config.template or "None")


def query_metrics(batch: RolloutBatch, queries: list[Query | None]) -> dict[str, float]:
    """Degeneration watch: malformed share, truncation, diversity and length of the Challenger's queries."""
    texts = [t.strip() for t in batch.completions]
    grams = [t[i : i + 3] for t in texts for i in range(max(0, len(t) - 2))]
    valid = [q for q in queries if q is not None]
    metrics = {
        "challenger/malformed_frac": 1 - len(valid) / len(queries),
        "challenger/truncated_frac": batch.truncated.float().mean().item(),
        "challenger/distinct_frac": len(set(texts)) / len(texts),
        "challenger/distinct_3gram_frac": len(set(grams)) / max(1, len(grams)),
        "challenger/query_len": sum(map(len, texts)) / len(texts),
    }
    for key in valid[0].stats if valid else ():
        metrics[f"challenger/{key}_mean"] = sum(q.stats[key] for q in valid) / len(valid)
    return metrics

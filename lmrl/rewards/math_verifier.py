"""`math`: a verifiable math reward via the `math-verify` library.

r_i = 1 if verify(parse(gold_i), parse(extract(completion_i))) else 0
(RLVR, RLHF book Ch. 7: "regex-extract the answer and give 1 for a match, 0 otherwise").

extract(): the content of the last complete `\\boxed{...}` if any, else the last
number in the text (integers, decimals, `1,000`-style thousands, `a/b` fractions);
an empty box, or no box and no number, is "no answer" (0.0).
The gold answer is parsed as given (e.g. `0.5`, `1/2`, `\\frac{1}{2}`); if that finds
nothing it is parsed again inside `$...$` (so bare LaTeX such as `\\sqrt{2}` works).

math-verify bounds parsing and comparison with `signal.alarm`, which only works in the
main thread; elsewhere (trainer worker threads) the timeout is disabled. A math-verify
exception or timeout gives 0.0 and is counted in `last_stats["errors"]`.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from typing import Any

from lmrl.rewards.columns import get_column
from lmrl.rewards.registry import register_reward

try:  # only this reward needs math-verify: the rest of lmrl (every trainer) imports without it
    from math_verify import parse, verify
    from math_verify.errors import TimeoutException
except ImportError as _missing:
    parse = verify = None
    _IMPORT_ERROR: ImportError | None = _missing

    class TimeoutException(BaseException):  # stands in for math-verify's in `except` clauses; never raised
        pass
else:
    _IMPORT_ERROR = None


def require_math_verify() -> None:
    """Raise an ImportError naming the fix when math-verify is not installed."""
    if _IMPORT_ERROR is not None:
        raise ImportError(
            "the `math` reward needs math-verify, which is not installed. Fix: pip install 'math-verify>=0.7'."
        ) from _IMPORT_ERROR


_BOXED = "\\boxed"
_NUMBER = re.compile(r"-?(?:\d+(?:,\d{3})*(?:\.\d+)?(?:/\d+)?|\.\d+)")


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` whose braces balance, or None."""
    start = text.rfind(_BOXED)
    while start != -1:
        i = start + len(_BOXED)
        while i < len(text) and text[i] == " ":
            i += 1
        if i < len(text) and text[i] == "{":
            depth = 0
            for j in range(i, len(text)):
                depth += {"{": 1, "}": -1}.get(text[j], 0)
                if depth == 0:
                    return text[i + 1 : j]
        start = text.rfind(_BOXED, 0, start)
    return None


def extract_answer(completion: str) -> str | None:
    """The answer text to parse: `\\boxed{content}` of the last box, else the last number, else None."""
    boxed = last_boxed(completion)
    if boxed is not None:
        return _BOXED + "{" + boxed + "}" if boxed.strip() else None
    numbers = _NUMBER.findall(completion)
    return numbers[-1].replace(",", "") if numbers else None


def _timeout_s(timeout_s: int | None) -> int | None:
    # signal.alarm raises ValueError outside the main thread: run without a timeout there.
    return timeout_s if threading.current_thread() is threading.main_thread() else None


def math_score(completion: str, gold: str, timeout_s: int | None = 5) -> tuple[float, str]:
    """(reward, status) for one sample; status is "ok", "no_answer" or "error: <why>". Never raises (except
    ImportError when math-verify is not installed)."""
    require_math_verify()
    timeout = _timeout_s(timeout_s)
    try:
        gold_parsed = parse(gold, parsing_timeout=timeout, raise_on_error=True)
        if not gold_parsed:
            gold_parsed = parse(f"${gold}$", parsing_timeout=timeout, raise_on_error=True)
        if not gold_parsed:
            return 0.0, f"error: gold answer {gold[:100]!r} cannot be parsed"
        answer = extract_answer(completion)
        if answer is None:
            return 0.0, "no_answer"
        pred = parse(answer, parsing_timeout=timeout, raise_on_error=True)
        if not pred:
            return 0.0, "no_answer"
        ok = verify(gold_parsed, pred, timeout_seconds=timeout, raise_on_error=True)
        return float(bool(ok)), "ok"
    except (Exception, TimeoutException) as err:  # TimeoutException is a BaseException
        return 0.0, f"error: {type(err).__name__}: {err}"


class MathReward:
    """Reward function object; `last_stats` holds per-call counts `errors` and `no_answer`."""

    __name__ = "math"

    def __init__(self, timeout_s: int | None = 5) -> None:
        self.timeout_s = timeout_s
        self.last_stats: dict[str, float] = {}

    def __call__(self, prompts: Sequence[str], completions: Sequence[str], **columns: Any) -> list[float]:
        answers = get_column(columns, "answer", len(completions), "math", "It holds the gold final answer.")
        rewards, errors, no_answer = [], 0, 0
        for completion, gold in zip(completions, answers):
            reward, status = math_score(str(completion), str(gold), self.timeout_s)
            rewards.append(reward)
            errors += status.startswith("error")
            no_answer += status == "no_answer"
        self.last_stats = {"errors": float(errors), "no_answer": float(no_answer)}
        return rewards


@register_reward("math")
def make_math_reward(timeout_s: int | None = 5) -> MathReward:
    """`math`: 1.0 if the boxed/last-number answer equals `answer` under math-verify, else 0.0.

    timeout_s: math-verify's per-parse/per-comparison limit in the main thread (None: no limit).
    """
    if timeout_s is not None and (not isinstance(timeout_s, int) or timeout_s <= 0):
        raise ValueError(f"Reward 'math': timeout_s must be a positive integer of seconds or None, got {timeout_s!r}.")
    require_math_verify()
    return MathReward(timeout_s)

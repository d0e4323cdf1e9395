"""`code`: run a completion's code against unit tests in the sandbox (RLHF book ch. 7, code verifiers)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from lmrl.rewards.columns import as_meta, get_column
from lmrl.rewards.registry import RewardFn, register_reward
from lmrl.sandbox import SandboxLimits, extract_code, require_isolation, run_tests


@register_reward("code")
def make_code_reward(
    mode: str = "all", timeout_s: float = 5.0, memory_mb: int = 256, sandbox: str | None = None
) -> RewardFn:
    """`code`: r_i = 1 if every test passes (mode="all", all-pass gating) or passed/total (mode="fraction",
    partial credit). The code is the completion's last ```python block (else the whole completion); the tests
    are Python statements (`assert f(2) == 4`) from the `tests` column, or `meta["tests"]` (the built-in
    `code` task). Each completion runs in its own sandbox (lmrl.sandbox: namespaces, time, memory, no network) and
    the tests are judged outside it (docs/security.md). `sandbox: none` opts into the unisolated mode (warns);
    a machine that cannot isolate fails here, at start-up, with the fix. Expected values that are not literals
    (`== math.factorial(3)`, `== EXPECTED` with `EXPECTED` bound by the `test_setup` column or
    meta["test_setup"], trusted code of the dataset) are computed in a second sandbox that never loads the
    completion's code."""
    if mode not in ("all", "fraction"):
        raise ValueError(f"Reward 'code': mode must be 'all' or 'fraction', got {mode!r}.")
    extra = {"isolation": sandbox} if sandbox is not None else {}
    limits = SandboxLimits(timeout_s=timeout_s, cpu_s=max(1, int(timeout_s)), memory_mb=memory_mb, **extra)
    require_isolation(limits.isolation)

    def code_reward(prompts: Sequence[str], completions: Sequence[str], **columns: Any) -> list[float]:
        n = len(completions)
        if columns.get("tests") is not None:
            tests = [json.loads(t) if isinstance(t, str) else t for t in get_column(columns, "tests", n, "code")]
            setups = [""] * n
        else:
            hint = "It holds each sample's unit tests: a `tests` column or meta['tests']."
            metas = [as_meta(m) for m in get_column(columns, "meta", n, "code", hint)]
            tests = [m.get("tests") for m in metas]
            setups = [m.get("test_setup") or "" for m in metas]
        if columns.get("test_setup") is not None:
            setups = [s or "" for s in get_column(columns, "test_setup", n, "code")]
        rewards = []
        for completion, cases, setup in zip(completions, tests, setups):
            if not cases:
                raise ValueError("Reward 'code': a sample has no tests; every row needs at least one test statement.")
            passed, total, _ = run_tests(extract_code(completion), list(cases), limits, setup=setup)
            rewards.append(float(passed == total) if mode == "all" else passed / total)
        return rewards

    code_reward.__name__ = "code"
    return code_reward

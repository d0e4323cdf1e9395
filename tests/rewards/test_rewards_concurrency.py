"""RewardSet options: `reward_workers` (functions called concurrently, async ones awaited) and
`reward_normalize` (per-function standardisation before the weighted sum)."""

import asyncio
import math
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from lmrl.config import RewardSection
from lmrl.config_base import ConfigError
from lmrl.rewards import RewardError, RewardSet

PROMPTS = ["p0", "p1", "p2", "p3"]
COMPLETIONS = ["a", "bb", "ccc", "dddd"]
SLEEP = 0.3


def slow_length(completions, **kwargs):
    time.sleep(SLEEP)
    return [float(len(c)) for c in completions]


async def slow_async_parity(completions, **kwargs):
    await asyncio.sleep(SLEEP)
    return [float(len(c) % 2) for c in completions]


def boom(completions, **kwargs):
    raise ZeroDivisionError("division by zero")


def timed(rs):
    start = time.perf_counter()
    result = rs.compute(PROMPTS, COMPLETIONS)
    return result, time.perf_counter() - start


def test_two_workers_run_the_functions_at_once():
    """Each function waits at a barrier for the other: only two functions running at the same time get past it
    (run one after the other, the first would wait out the timeout). No wall-clock assertion: load-independent."""
    barrier = threading.Barrier(2, timeout=30)

    def meets(name, value):
        def fn(completions, **kwargs):
            barrier.wait()
            return [value] * len(completions)

        fn.__name__ = name
        return fn

    result = RewardSet([meets("a", 1.0), meets("b", 2.0)], reward_workers=2).compute(PROMPTS, COMPLETIONS)
    assert result.total.tolist() == [3.0] * len(COMPLETIONS) and not barrier.broken


def test_two_workers_give_the_serial_results_in_row_order():
    serial, _ = timed(RewardSet([slow_length, slow_async_parity], [1.0, 0.5]))
    parallel, _ = timed(RewardSet([slow_length, slow_async_parity], [1.0, 0.5], reward_workers=2))
    # lengths [1, 2, 3, 4] + 0.5 * parity [1, 0, 1, 0] = [1.5, 2, 3.5, 4], in row order
    torch.testing.assert_close(parallel.total, torch.tensor([1.5, 2.0, 3.5, 4.0]), rtol=0, atol=0)
    torch.testing.assert_close(parallel.total, serial.total, rtol=0, atol=0)
    assert list(parallel.components) == ["slow_length", "slow_async_parity"]
    assert parallel.metrics == serial.metrics


def test_an_async_function_is_awaited_serially_too():
    total, _, _ = RewardSet([slow_async_parity]).compute(PROMPTS, COMPLETIONS)
    assert total.tolist() == [1.0, 0.0, 1.0, 0.0]


def test_async_function_called_from_running_event_loop():
    async def main():
        return RewardSet([slow_async_parity]).compute(PROMPTS, COMPLETIONS).total.tolist()

    assert asyncio.run(main()) == [1.0, 0.0, 1.0, 0.0]


@pytest.mark.parametrize("workers", [1, 2])
def test_failures_keep_the_policy_with_workers(workers):
    rs = RewardSet([slow_length, boom], reward_workers=workers, max_skipped_steps=2)
    with pytest.raises(RewardError, match="'boom' failed on sample 0 of 4.*ZeroDivisionError") as err:
        rs.compute(PROMPTS, COMPLETIONS)
    assert err.value.skippable and rs.errors == 1
    with pytest.raises(RewardError) as err:
        rs.compute(PROMPTS, COMPLETIONS)
    assert not err.value.skippable and rs.errors == 2  # max_skipped_steps in a row stop the run
    stop = RewardSet([boom, slow_length], reward_workers=workers, on_reward_error="stop")
    with pytest.raises(RewardError, match="'boom'") as err:
        stop.compute(PROMPTS, COMPLETIONS)
    assert not err.value.skippable and stop.errors == 1


def test_normalize_standardises_each_function_before_the_weights():
    def a(completions, **kwargs):
        return [1.0, 2.0, 3.0, 4.0]

    def b(completions, **kwargs):
        return [10.0, 10.0, 0.0, 0.0]

    rs = RewardSet([a, b], [1.0, 0.5], reward_normalize=True)
    total, components, metrics = rs.compute(PROMPTS, COMPLETIONS)
    # a: mean 2.5, population std sqrt((2.25 + 0.25 + 0.25 + 2.25) / 4) = sqrt(1.25) -> z = [-1.5, -.5, .5, 1.5] / sqrt(1.25)
    # b: mean 5, std 5 -> z = [1, 1, -1, -1] (times 5 / (5 + 1e-6))
    s = math.sqrt(1.25) + 1e-6
    zb = 5 / (5 + 1e-6)
    expected = [-1.5 / s + 0.5 * zb, -0.5 / s + 0.5 * zb, 0.5 / s - 0.5 * zb, 1.5 / s - 0.5 * zb]
    torch.testing.assert_close(total, torch.tensor(expected), rtol=0, atol=1e-6)
    # the components and their metrics stay unnormalised
    assert components["b"].tolist() == [10.0, 10.0, 0.0, 0.0] and metrics["reward/b/mean"] == 5.0
    assert metrics["reward/mean"] == pytest.approx(0.0, abs=1e-6)


def test_normalize_a_constant_reward_adds_zero():
    rs = RewardSet([lambda completions, **kw: [3.0] * len(completions)], reward_normalize=True)
    assert rs.compute(PROMPTS, COMPLETIONS).total.tolist() == [0.0] * 4


def test_config_keys_and_from_config():
    section = RewardSection(reward_workers=2, reward_normalize=True)
    assert section.reward_workers == 2 and section.reward_normalize
    assert RewardSection().reward_workers == 1 and not RewardSection().reward_normalize
    with pytest.raises(ConfigError, match="reward_workers"):
        RewardSection(reward_workers=0)
    config = SimpleNamespace(
        rewards=["exact_match"],
        reward_weights=[],
        reward_kwargs={},
        on_reward_error="stop",
        max_skipped_steps=3,
        reward_workers=4,
        reward_normalize=True,
    )
    rs = RewardSet.from_config(config)
    assert (rs.reward_workers, rs.reward_normalize, rs.on_reward_error, rs.max_skipped_steps) == (4, True, "stop", 3)
    with pytest.raises(ValueError, match="reward_workers"):
        RewardSet(["exact_match"], reward_workers=0)

"""Language Self-Play advantages (lmrl.algorithms.selfplay) against values computed by hand.

Hand batch (N=3 queries, G=2 answers each, prompt-major):
    task rewards r  = [1, 0 | 1, 1 | 0, 0]
    self-rewards rq = [3, 5 | 7, 1 | 0, 2]   (7-point quality scores, LSP only)
"""

import random

import pytest
import torch

from lmrl.algorithms.selfplay import (
    challenger_advantages,
    challenger_rewards,
    query_values,
    selfplay_advantages,
    solver_advantages,
)

D = torch.float64
R = torch.tensor([1, 0, 1, 1, 0, 0], dtype=D)
RQ = torch.tensor([3, 5, 7, 1, 0, 2], dtype=D)


def test_lsp_zero_by_hand():
    # V(q) = [(1+0)/2, (1+1)/2, (0+0)/2] = [0.5, 1, 0]; batch mean V = 1.5/3 = 0.5
    # A_Ch = V - V(q_i) (eq. 3) = [0.5-0.5, 0.5-1, 0.5-0] = [0, -0.5, 0.5]
    # A_Sol = r - V(q_i) = [1-.5, 0-.5, 1-1, 1-1, 0-0, 0-0] = [0.5, -0.5, 0, 0, 0, 0]
    out = selfplay_advantages(R, 2)
    torch.testing.assert_close(out.query_values, torch.tensor([0.5, 1.0, 0.0], dtype=D), rtol=0, atol=1e-12)
    torch.testing.assert_close(out.challenger_rewards, torch.tensor([-0.5, -1.0, 0.0], dtype=D), rtol=0, atol=1e-12)
    torch.testing.assert_close(out.challenger, torch.tensor([0.0, -0.5, 0.5], dtype=D), rtol=0, atol=1e-12)
    torch.testing.assert_close(out.solver, torch.tensor([0.5, -0.5, 0, 0, 0, 0], dtype=D), rtol=0, atol=1e-12)


def test_lsp_with_self_reward_by_hand():
    # s = r + rq = [4, 5 | 8, 2 | 0, 2]; group means [4.5, 5, 1]
    # A_Sol (baseline mean s) = [4-4.5, 5-4.5, 8-5, 2-5, 0-1, 2-1] = [-0.5, 0.5, 3, -3, -1, 1]
    # V_Q = [(3+5)/2, (7+1)/2, (0+2)/2] = [4, 4, 1]; c = -V + V_Q = [-0.5+4, -1+4, 0+1] = [3.5, 3, 1]
    # mean c = 7.5/3 = 2.5; A_Ch = [1, 0.5, -1.5]
    out = selfplay_advantages(R, 2, RQ)
    torch.testing.assert_close(out.solver, torch.tensor([-0.5, 0.5, 3, -3, -1, 1], dtype=D), rtol=0, atol=1e-12)
    torch.testing.assert_close(out.challenger_rewards, torch.tensor([3.5, 3.0, 1.0], dtype=D), rtol=0, atol=1e-12)
    torch.testing.assert_close(out.challenger, torch.tensor([1.0, 0.5, -1.5], dtype=D), rtol=0, atol=1e-12)


def test_solver_baseline_without_self_reward_by_hand():
    # baseline "task": b_i = V(q_i) = [0.5, 1, 0]; A = s - b = [4-.5, 5-.5, 8-1, 2-1, 0-0, 2-0]
    got = solver_advantages(R, 2, RQ, baseline="task")
    torch.testing.assert_close(got, torch.tensor([3.5, 4.5, 7, 1, 0, 2], dtype=D), rtol=0, atol=1e-12)


def test_std_scaling_by_hand():
    # one query, G=3, s = [1, 2, 6]: mean 3, deviations [-2, -1, 3], sum of squares 14,
    # unbiased var 14/2 = 7, std 2.6457513; A = [-2, -1, 3] / 2.6457513 = [-0.7559289, -0.3779645, 1.1338934]
    got = solver_advantages(torch.tensor([1.0, 2.0, 6.0], dtype=D), 3, scale="std", eps=0.0)
    torch.testing.assert_close(got, torch.tensor([-0.7559289, -0.3779645, 1.1338934], dtype=D), rtol=0, atol=1e-7)
    # challenger c = [3.5, 3, 1]: mean 2.5, deviations [1, .5, -1.5], sum sq 3.5, var 1.75, std 1.3228757
    got = challenger_advantages(torch.tensor([3.5, 3.0, 1.0], dtype=D), scale="std", eps=0.0)
    torch.testing.assert_close(got, torch.tensor([0.7559289, 0.3779645, -1.1338934], dtype=D), rtol=0, atol=1e-7)
    # eps enters the denominator: std 2.6457513 + 0.5 -> -2 / 3.1457513 = -0.6357782
    got = solver_advantages(torch.tensor([1.0, 2.0, 6.0], dtype=D), 3, scale="std", eps=0.5)
    assert got[0].item() == pytest.approx(-0.6357782, abs=1e-7)


def test_malformed_queries_get_the_fixed_reward_and_share_the_baseline():
    # N=4 written, valid = [T, F, T, F]; rewards of the 2 answered: [1, 0 | 0, 0]; LSP-Zero
    # V = [0.5, 0]; c = [-0.5, m, 0, m] with m = -1 -> mean (-0.5-1+0-1)/4 = -0.625
    # A_Ch = c + 0.625 = [0.125, -0.375, 0.625, -0.375]; A_Sol = [0.5, -0.5, 0, 0]
    valid = torch.tensor([True, False, True, False])
    out = selfplay_advantages(torch.tensor([1, 0, 0, 0], dtype=D), 2, valid=valid, malformed_reward=-1.0)
    torch.testing.assert_close(
        out.challenger, torch.tensor([0.125, -0.375, 0.625, -0.375], dtype=D), rtol=0, atol=1e-12
    )
    torch.testing.assert_close(out.solver, torch.tensor([0.5, -0.5, 0, 0], dtype=D), rtol=0, atol=1e-12)
    # malformed_reward = -3: c = [-0.5, -3, 0, -3], mean -1.625, A_Ch = [1.125, -1.375, 1.625, -1.375]
    out = selfplay_advantages(torch.tensor([1, 0, 0, 0], dtype=D), 2, valid=valid, malformed_reward=-3.0)
    torch.testing.assert_close(
        out.challenger, torch.tensor([1.125, -1.375, 1.625, -1.375], dtype=D), rtol=0, atol=1e-12
    )


def test_all_queries_malformed_gives_zero_challenger_advantage_and_no_solver_rows():
    out = selfplay_advantages(torch.zeros(0), 4, valid=torch.tensor([False, False, False]))
    assert out.solver.shape == (0,) and out.query_values.shape == (0,)
    torch.testing.assert_close(out.challenger, torch.zeros(3), rtol=0, atol=0)
    torch.testing.assert_close(out.challenger_rewards, torch.full((3,), -1.0), rtol=0, atol=0)


def test_pieces_match_a_loop_reference_on_random_batches():
    rng = random.Random(0)
    for _ in range(20):
        n, g = rng.randint(1, 5), rng.randint(1, 4)
        r = [rng.choice([0.0, 1.0, rng.uniform(-2, 2)]) for _ in range(n * g)]
        q = [float(rng.randint(0, 7)) for _ in range(n * g)]
        s = [a + b for a, b in zip(r, q)]
        sol, ch = [], []
        for i in range(n):
            group = s[i * g : (i + 1) * g]
            sol += [x - sum(group) / g for x in group]
            ch.append(-sum(r[i * g : (i + 1) * g]) / g + sum(q[i * g : (i + 1) * g]) / g)
        ch_adv = [c - sum(ch) / n for c in ch]
        out = selfplay_advantages(torch.tensor(r, dtype=D), g, torch.tensor(q, dtype=D))
        torch.testing.assert_close(out.solver, torch.tensor(sol, dtype=D), rtol=0, atol=1e-12)
        torch.testing.assert_close(out.challenger, torch.tensor(ch_adv, dtype=D), rtol=0, atol=1e-12)
        torch.testing.assert_close(
            challenger_rewards(torch.tensor(r, dtype=D), g, torch.tensor(q, dtype=D)),
            torch.tensor(ch, dtype=D),
            rtol=0,
            atol=1e-12,
        )


def test_query_values_and_challenger_rewards_are_means_over_the_group():
    torch.testing.assert_close(query_values(R, 3), torch.tensor([2 / 3, 1 / 3], dtype=D), rtol=0, atol=1e-12)
    # G=3 groups: r [1,0,1 | 1,0,0], rq [3,5,7 | 1,0,2] -> c = [-2/3 + 5, -1/3 + 1]
    torch.testing.assert_close(challenger_rewards(R, 3, RQ), torch.tensor([13 / 3, 2 / 3], dtype=D), rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: solver_advantages(R, 4), "cannot be split into groups of G=4"),
        (lambda: solver_advantages(R.view(3, 2), 2), "must be a 1-D tensor"),
        (lambda: solver_advantages(torch.tensor([1.0, float("nan")]), 2), "NaN or inf"),
        (lambda: solver_advantages(R, 2, RQ[:4]), "self_rewards"),
        (lambda: solver_advantages(R, 2, baseline="mean"), "baseline"),
        (lambda: solver_advantages(R, 1, scale="std"), "G >= 2"),
        (lambda: solver_advantages(R, 2, scale="group"), "scale"),
        (lambda: challenger_advantages(torch.tensor([1.0]), scale="std"), "N >= 2"),
        (lambda: challenger_advantages(torch.zeros(0)), "non-empty"),
        (lambda: selfplay_advantages(R, 2, valid=torch.tensor([True, False, True])), "valid queries"),
        (lambda: selfplay_advantages(R, 2, valid=torch.tensor([1, 1, 1])), "bool tensor"),
    ],
)
def test_bad_input_is_refused_with_a_clear_message(call, message):
    with pytest.raises(ValueError, match=message):
        call()

"""The registry contract: entries declare their options and traits, callers hand over every option they have and
each entry gets its own, and aggregation owns the global normaliser (so no caller branches on an entry's name)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from lmrl.algorithms import ADVANTAGES, AGGREGATIONS, POLICY_LOSSES, Registry, aggregate, global_share


def test_traits_and_own_options_come_from_the_entry():
    reg = Registry("thing")

    @reg.register("a", scales_by_advantage=True)
    def _a(x, *, clip_low=0.2):
        """a."""

    @reg.register("b")
    def _b(x):
        """b."""

    assert reg.trait("a", "scales_by_advantage") is True and reg.trait("b", "scales_by_advantage", False) is False
    assert reg.own_options("a", {"clip_low": 0.1, "scale": "batch"}) == {"clip_low": 0.1}
    assert reg.own_options("b", {"clip_low": 0.1}) == {}
    with pytest.raises(ValueError, match="Unknown thing 'c'"):
        reg.trait("c", "x")


def test_the_built_in_entries_declare_what_callers_read():
    assert all(POLICY_LOSSES.trait(name, "scales_by_advantage") for name in POLICY_LOSSES)
    assert ADVANTAGES.own_options("grpo", {"scale": "batch"}) == {"scale": "batch"}
    assert ADVANTAGES.own_options("rloo", {"scale": "batch"}) == {}
    assert POLICY_LOSSES.own_options("pg", {"clip_low": 0.2, "clip_high": 0.3}) == {}
    assert POLICY_LOSSES.own_options("ppo", {"clip_low": 0.2, "clip_high": 0.3}) == {"clip_low": 0.2, "clip_high": 0.3}
    assert {AGGREGATIONS.trait(name, "unit") for name in AGGREGATIONS} <= {"tokens", "rows"}


@pytest.mark.parametrize("mode", list(AGGREGATIONS))
def test_parts_weighted_by_their_global_share_add_up_to_the_whole_batchs_aggregate(mode):
    torch.manual_seed(0)
    x = torch.randn(6, 5)  # (N, T) per-token losses
    lengths = torch.tensor([5, 1, 3, 0, 2, 4])  # row 3 has no trained token (a dropped group's row)
    mask = (torch.arange(5)[None, :] < lengths[:, None]).float()
    tokens, rows = mask.sum(), (mask.sum(1) > 0).sum().float()
    parts = [torch.tensor([0, 1]), torch.tensor([2, 3]), torch.tensor([4, 5])]
    total = sum(global_share(mode, mask[i], tokens, rows) * aggregate(x[i], mask[i], mode, max_len=5) for i in parts)
    # the whole batch's aggregate over its trained rows; by hand for each mode
    m = mask.bool()
    by_hand = {
        "token_mean": (x * mask).sum() / mask.sum(),
        "seq_mean": ((x * mask).sum(1)[m.any(1)] / mask.sum(1)[m.any(1)]).sum() / rows,
        "seq_sum_norm": (x * mask).sum() / 5 / rows,
    }[mode]
    torch.testing.assert_close(total, by_hand)


def test_preference_losses_declare_what_the_trainer_provides():
    from lmrl.algorithms import PREFERENCE_LOSSES

    traits = {
        name: {
            k
            for k in ("unpaired", "needs_scores", "running_delta", "reference_free")
            if PREFERENCE_LOSSES.trait(name, k, False)
        }
        for name in PREFERENCE_LOSSES
    }
    assert traits["kto"] == {"unpaired"} and traits["odpo"] == {"needs_scores"} and traits["bco"] == {"running_delta"}
    assert traits["simpo"] == traits["orpo"] == {"reference_free"} and traits["dpo"] == set()


def test_running_delta_is_the_mean_of_beta_u_over_chosen_and_rejected():
    from lmrl.algorithms import RunningDelta

    delta = RunningDelta()
    batch = {
        "chosen": torch.tensor([1.0, 2.0, 9.0]),
        "ref_chosen": torch.tensor([0.5, 0.5, 0.0]),
        "rejected": torch.tensor([0.0, 1.0, 9.0]),
        "ref_rejected": torch.tensor([1.0, 0.0, 0.0]),
    }
    delta.update(batch, beta=0.1, rows=2)  # the third pair is padding
    # u: chosen 0.5, 1.5; rejected -1.0, 1.0 -> beta * sum = 0.2 over 4 completions
    assert delta.state_dict() == pytest.approx((0.2, 4)) and delta.value == pytest.approx(0.05)
    assert RunningDelta(*delta.state_dict()).value == pytest.approx(0.05)


NAMED_ELSEWHERE = {"lmrl/rewards/reward_model.py": "model.kind"}
"""Comparisons allowed to meet an entry's name, by file and subject: a reward model's head kind
(`lmrl.models.reward.KINDS`: bt, orm, prm) shares its name with the loss that trains that head."""


def registry_name_tests(path: Path, root: Path) -> list[str]:
    """Comparisons in ``path`` of a value with a registry entry's name (`x == "grpo"`, `x in ("dpo", "ipo")`)."""
    from lmrl.algorithms import ADVANTAGES, POLICY_LOSSES, PREFERENCE_LOSSES, REWARD_MODEL_LOSSES

    names = set(ADVANTAGES) | set(POLICY_LOSSES) | set(PREFERENCE_LOSSES) | set(REWARD_MODEL_LOSSES)
    file = path.relative_to(root).as_posix()
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        values = [c.value for c in operands if isinstance(c, ast.Constant)]
        values += [
            e.value
            for c in node.comparators
            if isinstance(c, (ast.Tuple, ast.List, ast.Set))
            for e in c.elts
            if isinstance(e, ast.Constant)
        ]
        subjects = {ast.unparse(c) for c in operands if not isinstance(c, (ast.Constant, ast.Tuple, ast.List, ast.Set))}
        if any(v in names for v in values) and NAMED_ELSEWHERE.get(file) not in subjects:
            found.append(f"{file}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_name_scan_finds_a_comparison_with_an_entry(tmp_path):
    (tmp_path / "lmrl").mkdir()
    module = tmp_path / "lmrl" / "m.py"
    module.write_text('def f(config):\n    return config.loss in ("dpo", "other") or config.advantage == "rloo"\n')
    assert len(registry_name_tests(module, tmp_path)) == 2


def test_no_module_tests_a_registry_entrys_name():
    """Every module of lmrl (the registries themselves included): callers read an entry's traits and options."""
    root = Path(__file__).resolve().parents[2]
    found = [hit for path in sorted((root / "lmrl").rglob("*.py")) for hit in registry_name_tests(path, root)]
    assert found == []


def test_reward_model_losses_declare_their_data_and_head():
    from lmrl.algorithms import REWARD_MODEL_LOSSES
    from lmrl.models.reward import KINDS

    for name in REWARD_MODEL_LOSSES:
        assert REWARD_MODEL_LOSSES.trait(name, "data") in ("ranked", "labelled", "steps")
        assert REWARD_MODEL_LOSSES.trait(name, "head") in KINDS
    assert REWARD_MODEL_LOSSES.trait("plackett_luce", "listwise") and REWARD_MODEL_LOSSES.trait("bt", "margin")

"""The train-inference correction keys of `lmrl rl` (docs/async.md): refused with the fix when they do not fit,
carried to the policy loss as they are, and logged by a run."""

import pytest

from lmrl.config import ConfigError
from lmrl.models.forward_plan import ForwardPlan
from lmrl.tracking import read_jsonl
from lmrl.trainers import update as rl_update
from lmrl.trainers.rl import trainer as online
from tests.trainers.test_online import rl_config


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["tis_cap=null", "is_level=sequence"], r"is_level shape the importance weight.*Fix: tis_cap=2.0"),
        (["tis_cap=null", "is_mode=mask"], "is_mode shape the importance weight"),
        (["tis_cap=0"], "tis_cap is an upper bound.*must be > 0"),
        (["is_low=0.5"], r"is_low=0.5 is the lower end.*is_mode=truncate.*Fix: is_mode=mask"),
        (["is_mode=mask", "is_low=3.0"], r"must be in \[0, tis_cap=2.0\]"),
        (["offpolicy_mask_threshold=0"], "offpolicy_mask_threshold is a mean log-ratio.*Fix: e.g. 0.5"),
        (["is_level=seq"], "is_level"),
        (["offpolicy_mask_rows=positive"], "offpolicy_mask_rows"),
    ],
)
def test_bad_correction_keys_are_refused_with_the_fix(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        rl_config(tmp_path, "grpo", *overrides)


def test_the_keys_reach_the_loss_and_tis_cap_alone_is_the_token_truncated_default(tmp_path):
    options = rl_update.UpdateOptions.from_config(rl_config(tmp_path, "grpo"), ForwardPlan())
    assert {k: options.loss.options[k] for k in rl_update.CORRECTION_KEYS} == {
        "tis_cap": 2.0,
        "is_level": "token",
        "is_mode": "truncate",
        "is_low": None,
        "offpolicy_mask_threshold": None,
        "offpolicy_mask_rows": "all",
    }
    config = rl_config(
        tmp_path,
        "grpo",
        "is_level=geometric",
        "is_mode=mask",
        "tis_cap=1.01",
        "is_low=0.99",
        "offpolicy_mask_threshold=0.5",
        "offpolicy_mask_rows=negative",
    )
    options = rl_update.UpdateOptions.from_config(config, ForwardPlan())
    assert {k: options.loss.options[k] for k in rl_update.CORRECTION_KEYS} == {
        "tis_cap": 1.01,
        "is_level": "geometric",
        "is_mode": "mask",
        "is_low": 0.99,
        "offpolicy_mask_threshold": 0.5,
        "offpolicy_mask_rows": "negative",
    }


def test_a_run_logs_the_weights_and_masks(tmp_path):
    online.train(
        rl_config(
            tmp_path,
            "grpo",
            "max_steps=2",
            "is_level=sequence",
            "is_mode=mask",
            "offpolicy_mask_threshold=0.5",
            "skip_zero_advantage=false",
        )
    )
    rows = [r for r in read_jsonl(tmp_path / "grpo" / "metrics.jsonl") if "loss/policy" in r]
    assert len(rows) == 2
    for row in rows:  # one process, engine=hf: the sampler's and the learner's log-probs agree, nothing is masked
        assert row["policy/tis_masked_frac"] == 0.0 and row["policy/offpolicy_masked_frac"] == 0.0
        assert row["policy/tis_weight_max"] == pytest.approx(1.0, abs=1e-3) and row["policy/tis_clip_frac"] == 0.0

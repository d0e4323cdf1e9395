"""`report_to` trackers install by name (issue 47): `pip install 'lmrl[tracking]'` gives tensorboard and wandb, and a
missing one says which extra installs it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from lmrl.config import ConfigError, TrainConfig, load_config
from lmrl.tracking import TRACKER_EXTRAS, Tracker

ROOT = Path(__file__).resolve().parents[2]


def test_the_tracking_extra_installs_tensorboard_and_wandb():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for name, extra in TRACKER_EXTRAS.items():
        assert any(req.split(">")[0].split("=")[0].split("[")[0] == name for req in extras[extra]), (name, extra)
    assert {"tensorboard", "wandb"} <= set(TRACKER_EXTRAS)
    assert "pip install 'lmrl[tracking]'" in (ROOT / "README.md").read_text()


def test_a_missing_tracker_names_the_extra(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # an import of it raises ImportError
    monkeypatch.setitem(sys.modules, "wandb", None)
    tracker = Tracker(tmp_path, total_steps=1, report_to=["tensorboard", "wandb"])
    tracker.close()
    out = capsys.readouterr().out.replace("\n", " ")
    assert "report_to: 'tensorboard' is not installed (pip install 'lmrl[tracking]'" in out
    assert "report_to: 'wandb' is not installed (pip install 'lmrl[tracking]'" in out
    assert tracker.backends == []


def test_trls_report_to_none_is_no_tracker():
    assert load_config(TrainConfig, None, ["report_to=none"]).report_to == []
    assert load_config(TrainConfig, None, ["report_to=[none]"]).report_to == []
    with pytest.raises(ConfigError, match="names its trackers"):
        load_config(TrainConfig, None, ["report_to=all"])

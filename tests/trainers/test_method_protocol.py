"""Every method class has every member `loop.run` reads (`loop.Method`), the optional ones from `MethodDefaults`,
and none inherits behaviour from another method."""

from __future__ import annotations

import inspect

import pytest

from lmrl.swarm.cli import JoinedNode
from lmrl.trainers import loop
from lmrl.trainers.distill import trainer as distill
from lmrl.trainers.dpo import online as online_dpo
from lmrl.trainers.dpo import trainer as preference
from lmrl.trainers.pretrain import trainer as pretrain
from lmrl.trainers.reward import trainer as reward
from lmrl.trainers.rl import trainer as online
from lmrl.trainers.selfplay import trainer as selfplay
from lmrl.trainers.sft_method import SFT

METHODS = [
    SFT,
    distill.Distill,
    preference.DPO,
    online_dpo.OnlineDPO,
    reward.RewardModelTraining,
    pretrain.Pretrain,
    selfplay.SelfPlay,
    online.OnlineRL,
    JoinedNode,
]
REQUIRED = ("step", "evaluate")


def members(proto) -> set[str]:
    return {name for name in vars(proto) if not name.startswith("_")} | set(getattr(proto, "__annotations__", {}))


@pytest.mark.parametrize("cls", METHODS, ids=lambda c: c.__name__)
def test_every_method_has_the_protocols_members_and_only_defaults_as_a_base(cls):
    assert cls.__bases__ == (loop.MethodDefaults,), f"{cls.__name__} inherits {cls.__bases__}"
    instance_only = {"model", "tokenizer", "optimizer", "scheduler"}  # set by each constructor
    missing = [m for m in members(loop.Method) - instance_only if not hasattr(cls, m)]
    missing += [m for m in REQUIRED + ("describe",) if m not in vars(cls)]
    assert missing == [], f"{cls.__name__} lacks {missing}"
    for name in ("start", "stop", "close", "state_dict", "load_state_dict", "evaluate", "step"):
        params = list(inspect.signature(getattr(cls, name)).parameters)
        assert params[0] == "self", f"{cls.__name__}.{name}"

"""The sampler protocol (`lmrl.rollout.protocol`): every engine and group sampler has its members, the engine table
matches the config's choices, no trainer probes what an engine can do, and the RL loop syncs the sampler with the
weights' version before every rollout, resumed runs included."""

from __future__ import annotations

import ast
import inspect
import typing
from pathlib import Path

import pytest

from lmrl.rollout import protocol
from lmrl.rollout.engines.factory import ENGINES
from lmrl.rollout.engines.hf import HFEngine
from lmrl.rollout.engines.section import EngineSection
from lmrl.rollout.engines.vllm.engine import VLLMEngine
from lmrl.rollout.samplers.episodes import EpisodeGroups
from lmrl.rollout.samplers.groups import LocalGroups
from lmrl.rollout.samplers.ray import RayRollouts
from lmrl.rollout.samplers.server_ahead import ServerAhead
from lmrl.trainers.rl import trainer as online

sys_path = Path(__file__).resolve().parents[1] / "trainers"
LMRL = Path(online.__file__).resolve().parents[1]


def methods(proto) -> dict[str, list[str]]:
    """The protocol's methods and their parameter names (self excluded)."""
    return {
        name: list(inspect.signature(fn).parameters)[1:]
        for name, fn in vars(proto).items()
        if inspect.isfunction(fn) and not name.startswith("_")
    }


@pytest.mark.parametrize(
    "cls, proto",
    [
        (HFEngine, protocol.Engine),
        (VLLMEngine, protocol.Engine),
        (LocalGroups, protocol.GroupSampler),
        (EpisodeGroups, protocol.GroupSampler),
        (RayRollouts, protocol.GroupSampler),
        (ServerAhead, protocol.GroupSampler),
    ],
)
def test_every_sampler_has_the_protocols_methods_with_its_parameters(cls, proto):
    for name, params in methods(proto).items():
        fn = getattr(cls, name, None)
        assert callable(fn), f"{cls.__name__} lacks {name}"
        assert list(inspect.signature(fn).parameters)[1 : 1 + len(params)] == params, f"{cls.__name__}.{name}"


def test_the_sampler_table_has_an_entry_for_every_config_it_names():
    from lmrl.config import load_config
    from lmrl.rollout.samplers.factory import SAMPLERS, sampler_name
    from lmrl.trainers.rl.config import RLConfig

    overrides = {
        "local": [],
        "ray": ["placement=ray"],
        "episodes": ["tools=[calculator]"],
        "server_ahead": ["engine=vllm", "vllm_servers=[http://127.0.0.1:1]", "async_steps=1"],
    }
    named = {name: sampler_name(load_config(RLConfig, None, keys)) for name, keys in overrides.items()}
    assert named == {name: name for name in overrides} and set(SAMPLERS) == set(named)


def test_the_engine_table_names_exactly_the_configs_choices():
    choices = typing.get_args(typing.get_type_hints(EngineSection)["engine"])
    assert set(ENGINES) == set(choices)


def test_no_trainer_probes_an_engine_or_hooks_an_optimizer():
    probes = []
    for path in LMRL.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("hasattr", "getattr"):
                subject = ast.unparse(node.args[0]) if node.args else ""
                if subject.rpartition(".")[2] in ("engine", "sampler", "driver"):  # the object itself, probed
                    probes.append(f"{path.relative_to(LMRL)}: {ast.unparse(node)}")
            if isinstance(node, ast.Attribute) and node.attr == "register_step_post_hook":
                probes.append(f"{path.relative_to(LMRL)}: an optimizer hook")
    assert probes == []


def test_the_rl_loop_syncs_the_sampler_with_each_steps_version_resumed_too(tmp_path, monkeypatch):
    import sys

    sys.path.insert(0, str(sys_path))
    from test_online import rl_config  # the tiny GRPO run of tests/trainers/test_online.py

    versions = []
    real_sync = HFEngine.sync

    def sync(self, model, version):
        versions.append(version)
        real_sync(self, model, version)

    monkeypatch.setattr(HFEngine, "sync", sync)
    online.train(rl_config(tmp_path, "grpo", "max_steps=3", "save_every=2"))
    assert versions == [0, 1, 2]
    versions.clear()
    online.train(rl_config(tmp_path, "grpo", "max_steps=5", "save_every=2", "resume=true"))
    assert versions == [3, 4]  # resumed after step 3 (the last checkpoint): the restored weights are version 3

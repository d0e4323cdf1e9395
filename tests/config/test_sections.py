"""Typed sections inside, flat keys outside: every shipped recipe loads, round-trips through its flat dict, and each
of its section views holds exactly that section's keys with the flat values; the rules table is well formed."""

import dataclasses
import typing

import pytest

from lmrl.config import RECIPES_DIR, Section, from_dict, load_config, to_dict
from lmrl.config_rules import RULES, broken_rule, has, parse, shown, values

VERB_OF_FOLDER = {"rejection": "rejection-sampling"}  # otherwise a recipe folder is named after its verb


def verb_configs() -> dict[str, type]:
    from lmrl.cli import VERBS, _config_class

    return {verb: _config_class(spec) for verb, spec in VERBS.items() if spec.config}


def views(cls: type) -> dict[str, type]:
    """The section views of a config class: its properties that return a `Section`, by name."""
    found = {}
    for name in dir(cls):
        prop = getattr(cls, name, None)
        if isinstance(prop, property) and str(prop.fget.__annotations__.get("return")).endswith("Section"):
            returns = typing.get_type_hints(prop.fget).get("return")
            if isinstance(returns, type) and issubclass(returns, Section):
                found[name] = returns
    return found


def defaults(cls: type):
    """A config of ``cls`` holding its defaults, unchecked (some verbs need a key set, e.g. distill's teacher)."""
    config = object.__new__(cls)
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        object.__setattr__(config, f.name, default)
    return config


def recipes() -> list:
    return sorted(RECIPES_DIR.rglob("*.yaml"))


@pytest.mark.parametrize("path", recipes(), ids=lambda p: str(p.relative_to(RECIPES_DIR)))
def test_a_shipped_recipe_round_trips_and_its_sections_are_its_flat_keys(path):
    from lmrl.cli import VERBS, _config_class

    config_cls = _config_class(VERBS[VERB_OF_FOLDER.get(path.parent.name, path.parent.name)])
    config = load_config(config_cls, str(path))
    flat = to_dict(config)
    assert from_dict(config_cls, flat) == config  # what config.yaml holds builds the same config (resume)
    assert views(config_cls), f"{config_cls.__name__} has no section views"
    for name, section in views(config_cls).items():
        view = getattr(config, name)
        assert type(view) is section, name
        keys = [f.name for f in dataclasses.fields(section)]
        assert dataclasses.asdict(view) == {key: flat[key] for key in keys}, name


def test_every_verb_config_has_its_sections_and_no_view_is_named_like_a_key():
    for verb, cls in verb_configs().items():
        named = views(cls)
        assert not {f.name for f in dataclasses.fields(cls)} & set(named), verb
        for base in cls.__mro__[1:]:
            own_keys = [k for k in base.__dict__.get("__annotations__", {}) if k in base.__dataclass_fields__]
            if issubclass(base, Section) and "title" in base.__dict__ and len(own_keys) > 1:
                assert any(issubclass(view, base) for view in named.values()), f"{verb}: no view of {base.__name__}"


def test_every_rule_reads_keys_some_verb_has_and_its_message_formats():
    configs = {verb: defaults(cls) for verb, cls in verb_configs().items()}
    for r in RULES:
        conditions = (*r.when, *r.needs, *r.excludes)
        for condition in conditions:
            parse(condition)
        applies = [c for c in configs.values() if all(has(c, w) for w in r.when)]
        assert applies, f"no verb has the keys of {r.when}"
        for config in applies:
            key = parse((r.needs + r.excludes)[0])[0]
            if has(config, key):
                assert r.message.format(got=shown(config, key), keys=key, **values(config))


def test_a_rule_reads_a_key_the_config_lacks_as_no_conflict():
    from lmrl.trainers.sft.config import SFTConfig

    config = SFTConfig()
    assert not has(config, "engine=vllm") and has(config, "grad_accum=1")
    assert broken_rule(config) is None


@pytest.mark.parametrize(
    "overrides, message",
    [  # the exclusions that were written from two sides (check_ray and check_async_servers) read from one rule
        (
            ["placement=ray", "curriculum=[0.1,0.9]"],
            r"sample ahead in the fixed data order.*got curriculum=\[0.1, 0.9\]",
        ),
        (["async_steps=1", "engine=vllm", "vllm_server=a:1", "curriculum=[0.1,0.9]"], "sample ahead in the fixed data"),
        (["placement=ray", "tools=[calculator]"], "single-turn .*got multi_turn=true"),
        (["placement=ray", "dynamic_sampling=refill"], "refill .*which placement=ray cannot serve"),
        (["async_steps=1", "engine=vllm", "vllm_server=a:1", "dynamic_sampling=refill"], "which async_steps=1 cannot"),
    ],
)
def test_one_rule_refuses_an_exclusion_from_each_side(tmp_path, overrides, message):
    from lmrl.trainers.rl.config import RLConfig

    with pytest.raises(Exception, match=message):
        load_config(RLConfig, None, [f"output_dir={tmp_path}", *overrides])

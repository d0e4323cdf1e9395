"""Config loading: recipes, overrides, type coercion and the error messages users see."""

import dataclasses

import pytest

from lmrl.config import ConfigError, TrainConfig, describe, load_config, parse_overrides, resolve_recipe, RECIPES_DIR


def test_overrides_parse_yaml_scalars_and_dotted_keys():
    assert parse_overrides(["lr=1e-4", "resume=true", "task_args.digits=3", "report_to=[wandb]", "tokenizer=null"]) == {
        "lr": "1e-4",  # YAML 1.1 reads 1e-4 (no dot) as a string; coerce() turns it into a float
        "resume": True,
        "task_args": {"digits": 3},
        "report_to": ["wandb"],
        "tokenizer": None,
    }


def test_load_config_coerces_types():
    config = load_config(TrainConfig, None, ["lr=1e-4", "max_steps=5.0", "model_args.hidden_size=64", "report_to=tensorboard"])
    assert config.lr == pytest.approx(1e-4) and isinstance(config.lr, float)
    assert config.max_steps == 5 and isinstance(config.max_steps, int)
    assert config.model_args == {"hidden_size": 64}
    assert config.report_to == ["tensorboard"]


def test_recipe_then_overrides(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("lr: 0.01\nmax_steps: 7\nmodel_args: {hidden_size: 32, num_hidden_layers: 2}\n")
    config = load_config(TrainConfig, str(recipe), ["max_steps=9", "model_args.hidden_size=16"])
    assert (config.lr, config.max_steps) == (0.01, 9)
    assert config.model_args == {"hidden_size": 16, "num_hidden_layers": 2}  # deep merge keeps the sibling key


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["lrr=1"], "Unknown config key 'lrr' for TrainConfig. Did you mean 'lr'?"),
        (["lr=abc"], "'lr' must be a number, got 'abc'."),
        (["precision=bf17"], "Did you mean 'bf16'?"),
        (["max_steps=0"], "'max_steps' must be > 0"),
        (["resume=maybe"], "'resume' must be true or false"),
        (["report_to=[tensorbord]"], "Did you mean 'tensorboard'?"),
        (["max_steps"], "is not of the form key=value"),
    ],
)
def test_bad_keys_and_values_name_the_key_and_the_fix(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        load_config(TrainConfig, None, overrides)


def test_unknown_recipe_lists_shipped_ones():
    with pytest.raises(ConfigError, match="Shipped recipes: .*sft/tiny_arithmetic"):
        resolve_recipe("sft/tiny_arithmetc")


def test_every_shipped_recipe_loads_into_its_config():
    from lmrl.cli import VERBS, _target

    verb_of_folder = {"rejection": "rejection-sampling"}  # otherwise a recipe folder is named after its verb
    recipes = sorted(RECIPES_DIR.rglob("*.yaml"))
    assert recipes, "no shipped recipes found"
    for path in recipes:
        verb = verb_of_folder.get(path.parent.name, path.parent.name)
        assert verb in VERBS, f"recipe folder {path.parent.name!r} names no verb of {sorted(VERBS)}"
        config_cls, _ = _target(VERBS[verb])
        config = load_config(config_cls, str(path))
        assert dataclasses.is_dataclass(config)


def test_describe_lists_every_field_with_help():
    text = describe(TrainConfig)
    for f in dataclasses.fields(TrainConfig):
        assert f"  {f.name} (" in text
        assert f.metadata.get("help"), f"field {f.name} has no help text"

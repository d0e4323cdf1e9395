"""Config loading: recipes, overrides, type coercion and the error messages users see."""

import dataclasses

import pytest

from lmrl.config import RECIPES_DIR, ConfigError, TrainConfig, describe, load_config, parse_overrides, resolve_recipe


def test_overrides_parse_yaml_scalars_and_dotted_keys():
    assert parse_overrides(["lr=1e-4", "resume=true", "task_args.digits=3", "report_to=[wandb]", "tokenizer=null"]) == {
        "lr": "1e-4",  # YAML 1.1 reads 1e-4 (no dot) as a string; coerce() turns it into a float
        "resume": True,
        "task_args": {"digits": 3},
        "report_to": ["wandb"],
        "tokenizer": None,
    }


def test_load_config_coerces_types():
    config = load_config(
        TrainConfig, None, ["lr=1e-4", "max_steps=5.0", "model_args.hidden_size=64", "report_to=tensorboard"]
    )
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
    from lmrl.cli import VERBS, _config_class

    verb_of_folder = {"rejection": "rejection-sampling"}  # otherwise a recipe folder is named after its verb
    recipes = sorted(RECIPES_DIR.rglob("*.yaml"))
    assert recipes, "no shipped recipes found"
    for path in recipes:
        verb = verb_of_folder.get(path.parent.name, path.parent.name)
        assert verb in VERBS, f"recipe folder {path.parent.name!r} names no verb of {sorted(VERBS)}"
        config_cls = _config_class(VERBS[verb])
        config = load_config(config_cls, str(path))
        assert dataclasses.is_dataclass(config)


def test_describe_lists_every_field_with_help():
    text = describe(TrainConfig)
    for f in dataclasses.fields(TrainConfig):
        assert f"  {f.name} (" in text
        assert f.metadata.get("help"), f"field {f.name} has no help text"


# --- TRL / HF names ---------------------------------------------------------------------------------------------


def test_trl_names_are_read_as_lmrl_keys_with_a_notice():
    from lmrl.trainers.rl.config import RLConfig

    notices = []
    from lmrl.config import from_dict

    config = from_dict(
        RLConfig,
        {
            "learning_rate": "2e-5",
            "num_generations": 4,
            "max_completion_length": 64,
            "gradient_accumulation_steps": 2,
            "beta": 0.05,
            "max_grad_norm": 0.5,
            "warmup_steps": 3,
            "lr_scheduler_type": "constant_with_warmup",
        },
        notify=notices.append,
    )
    assert (config.lr, config.samples_per_prompt, config.max_new_tokens, config.grad_accum) == (2e-5, 4, 64, 2)
    assert (config.kl_coef, config.max_grad_norm, config.warmup_steps, config.lr_schedule) == (0.05, 0.5, 3, "constant")
    assert "note: 'num_generations' is read as lmrl's 'samples_per_prompt' (samples_per_prompt=4)" in notices
    assert len(notices) == 6  # max_grad_norm and warmup_steps are lmrl's own names


def test_beta_stays_dpos_own_key():
    from lmrl.trainers.dpo.config import DPOConfig

    assert load_config(DPOConfig, None, ["beta=0.3"]).beta == 0.3


def test_an_alias_on_the_command_line_overrides_the_recipes_key(tmp_path):
    from lmrl.trainers.rl.config import RLConfig

    recipe = tmp_path / "r.yaml"
    recipe.write_text("samples_per_prompt: 8\nlr: 0.01\n")
    config = load_config(RLConfig, str(recipe), ["num_generations=4", "learning_rate=0.002"])
    assert (config.samples_per_prompt, config.lr) == (4, 0.002)


def test_alias_and_key_in_one_layer_is_an_error():
    from lmrl.trainers.rl.config import RLConfig

    with pytest.raises(ConfigError, match="Both 'num_generations' .* and 'samples_per_prompt' are set"):
        load_config(RLConfig, None, ["num_generations=4", "samples_per_prompt=8"])


def test_a_typo_of_a_trl_name_suggests_the_lmrl_key():
    with pytest.raises(ConfigError, match="Did you mean 'lr'\\? \\('learning_rate' in TRL\\)"):
        load_config(TrainConfig, None, ["lerning_rate=1e-3"])

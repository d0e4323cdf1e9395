"""TRL's and transformers' names (issue 47): every field of TRL's SFTConfig, GRPOConfig and DPOConfig is an lmrl key of
the same name, an alias, refused with lmrl's equivalent, or said to have none; never a look-alike suggestion."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
from pathlib import Path

import pytest

from lmrl.cli import VERBS, _config_class, parse
from lmrl.config import (
    ALIAS_VALUES,
    ALIASES,
    AS_LMRL_DOES,
    NO_EQUIVALENT,
    REFUSED,
    TRL_BOOLS,
    ConfigError,
    load_config,
)
from lmrl.trainers.dpo.config import DPOConfig
from lmrl.trainers.rl.config import RLConfig
from lmrl.trainers.sft.config import SFTConfig

ROOT = Path(__file__).resolve().parents[2]
LMRL_KEYS = {f.name for verb in VERBS.values() for f in dataclasses.fields(_config_class(verb))}


def _fields(module: str, name: str) -> dict[str, str]:
    """A dataclass's fields and their annotations, read from its source (importing trl takes seconds)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        pytest.skip(f"{module} is not installed")
    tree = ast.parse(Path(spec.origin).read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name)
    return {
        n.target.id: ast.unparse(n.annotation)
        for n in cls.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    }


def trl_fields() -> dict[str, str]:
    names = {**_fields("transformers.training_args", "TrainingArguments")}
    for module, name in (
        ("trl.trainer.base_config", "_BaseConfig"),
        ("trl.trainer.sft_config", "SFTConfig"),
        ("trl.trainer.grpo_config", "GRPOConfig"),
        ("trl.trainer.dpo_config", "DPOConfig"),
    ):
        names.update(_fields(module, name))
    return names


def test_every_trl_name_is_accounted_for():
    names = trl_fields()
    assert {"per_device_train_batch_size", "num_generations", "packing", "loss_type", "bf16"} <= set(names)
    unaccounted = [n for n in names if n not in LMRL_KEYS | set(ALIASES) | set(REFUSED) | NO_EQUIVALENT]
    assert not unaccounted, f"TRL names with no entry in lmrl/config_trl.py: {unaccounted}"
    assert not NO_EQUIVALENT & (set(ALIASES) | set(REFUSED) | LMRL_KEYS)
    assert set(AS_LMRL_DOES) <= set(REFUSED)  # any other value is refused with the explanation
    assert set(ALIASES) & set(REFUSED) == {"loss_type"}  # DPO's loss; explained everywhere else
    bools = {n for n, annotation in names.items() if annotation.startswith("bool")}
    assert bools & (set(ALIASES) | set(REFUSED)) == TRL_BOOLS & set(names)  # `--bf16` alone is bf16=true


def test_every_alias_reads_as_an_lmrl_key():
    for alias, name in ALIASES.items():
        assert name in LMRL_KEYS, (alias, name)
    cases = {
        ("rl", "bf16=true"): ("precision", "bf16"),
        ("rl", "bf16=false"): ("precision", "fp32"),
        ("rl", "use_vllm=true"): ("engine", "vllm"),
        ("rl", "scale_rewards=false"): ("adv_scale", "none"),
        ("rl", "scale_rewards=batch"): ("adv_scale", "batch"),
        ("rl", "delta=4.0"): ("clip_delta", 4.0),
        ("rl", "mask_truncated_completions=true"): ("mask_truncated", True),
        ("rl", "entropy_coef_delta=0.01"): ("entropy_coef_step", 0.01),
        ("rl", "vllm_importance_sampling_clip_max=3"): ("tis_cap", 3.0),
        ("rl", "use_cpu=true"): ("device", "cpu"),
        ("sft", "greater_is_better=false"): ("keep_best_mode", "min"),
        ("sft", "overwrite_output_dir=true"): ("overwrite", True),
        ("dpo", "loss_type=sigmoid"): ("loss", "dpo"),
        ("dpo", "loss_type=[sigmoid]"): ("loss", "dpo"),
        ("dpo", "loss_type=[sigmoid,sft]"): ("loss", "dpo_nll"),
        ("dpo", "loss_type=ipo"): ("loss", "ipo"),
        ("dpo", "precompute_ref_log_probs=false"): ("precompute_ref", False),
        ("pretrain", "dataset_text_field=content"): ("text_column", "content"),
    }
    for (verb, override), (key, value) in cases.items():
        assert getattr(parse([verb, override]), key) == value, override
    assert set(ALIAS_VALUES) <= set(ALIASES)


def test_trl_switches_work_as_bare_flags_and_notes_say_what_they_became(capsys):
    config = parse(["rl", "--bf16", "--use_vllm", "--mask_truncated_completions", "--scale_rewards", "none"])
    assert (config.precision, config.engine, config.mask_truncated, config.adv_scale) == ("bf16", "vllm", True, "none")
    err = capsys.readouterr().err
    assert "note: 'bf16' is read as lmrl's 'precision' (precision=bf16)" in err
    assert "note: 'use_vllm' is read as lmrl's 'engine' (engine=vllm)" in err


@pytest.mark.parametrize(
    ("verb", "override", "explains", "not_suggested"),
    [
        ("rl", "per_device_train_batch_size=8", "prompts_per_step prompts x samples_per_prompt", "ptx_batch_size"),
        ("sft", "per_device_train_batch_size=8", "batch_size=N is TRL's per_device_train_batch_size x", "Did you"),
        ("rl", "num_train_epochs=3", "max_steps=N", "ppo_epochs"),
        ("sft", "scale_rewards=false", "TRL's name for lmrl's 'adv_scale'", "'rewards'"),
        ("sft", "packing=true", "max_tokens_per_microbatch=N", "Did you"),
        ("sft", "fp16=true", "precision=bf16", "Did you"),
        ("rl", "loss_type=dr_grpo", "algorithm=dr_grpo", "Did you"),
        ("sft", "loss_type=nll", "NLL", "Did you"),
        ("rl", "importance_sampling_level=sequence", "algorithm=gspo", "is_level'?"),
        ("sft", "adam_beta2=0.95", "adam_betas=[BETA1,BETA2]", "Did you"),
        ("rl", "warmup_ratio=0.1", "warmup_steps=N", "Did you"),
        ("rl", "eval_strategy=steps", "eval_every=N", "Did you"),
        ("rl", "trust_remote_code=true", "no equivalent", "Did you"),
        ("rl", "num_generations_eval=4", "no equivalent", "Did you"),
        ("reward", "loss_type=sigmoid", "in `lmrl dpo` it is loss=NAME", "Did you"),
    ],
)
def test_a_name_of_another_meaning_is_refused_with_lmrls_equivalent(verb, override, explains, not_suggested):
    with pytest.raises(ConfigError) as exc:
        parse([verb, override])
    assert explains in str(exc.value)
    assert not_suggested not in str(exc.value)


def test_a_trl_setting_that_is_what_lmrl_does_is_accepted_with_a_note(capsys):
    assert parse(["sft", "packing=false", "--completion_only_loss", "assistant_only_loss=true"]) == SFTConfig()
    assert "note: 'packing=false' is what lmrl does anyway (ignored)" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="'packing' \\(TRL/transformers\\) is not an lmrl key"):
        load_config(SFTConfig, None, ["packing=true"])


def test_typos_still_get_the_closest_key():
    with pytest.raises(ConfigError, match="Did you mean 'samples_per_prompt'\\? \\('num_generations' in TRL\\)"):
        load_config(RLConfig, None, ["num_generation=4"])
    with pytest.raises(ConfigError, match="Did you mean 'ptx_batch_size'"):
        load_config(RLConfig, None, ["ptx_batchsize=4"])  # a typo of the key itself, not TRL's name
    assert load_config(DPOConfig, None, ["beta=0.2"]).beta == 0.2  # DPO's own beta, not kl_coef


def test_the_guide_lists_every_alias_and_refusal():
    guide = (ROOT / "docs" / "guide.md").read_text()
    table = guide[guide.index("### TRL's names") :]
    for name in [*ALIASES, *REFUSED]:
        assert f"`{name}`" in table, name

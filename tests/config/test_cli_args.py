"""How `lmrl <verb> ...` reads its line (issue 47): overrides anywhere, as ``key=value``, ``--key value`` or
``--key=value`` (TRL and HF scripts take their arguments that way), bare switches, and algorithm names typed as verbs."""

from __future__ import annotations

import pytest

from lmrl.cli import ALGORITHM_VERBS, RL_ALGORITHMS, main, parse
from lmrl.config import ConfigError


def test_overrides_go_before_and_after_the_recipe():
    after = parse(["sft", "--config", "sft/tiny_arithmetic", "lr=0.002", "max_steps=7"])
    before = parse(["sft", "lr=0.002", "--config", "sft/tiny_arithmetic", "max_steps=7"])
    assert (after.lr, after.max_steps, after.output_dir) == (0.002, 7, "runs/sft-tiny-arithmetic")
    assert before == after


def test_dash_dash_key_value_and_key_equals_value_are_the_same_override():
    plain = parse(["sft", "lr=0.002", "max_steps=7", "task_args.digits=3"])
    for argv in (
        ["sft", "--lr", "0.002", "--max_steps", "7", "--task_args.digits", "3"],
        ["sft", "--lr=0.002", "--max-steps=7", "--task_args.digits=3"],
        ["sft", "--lr", "0.002", "max_steps=7", "--task_args.digits=3"],
    ):
        assert parse(argv) == plain, argv
    assert parse(["sft", "--lr", "-1e-3", "lr=0.002"]).lr == 0.002  # a negative number is a value, not a flag
    assert parse(["sft", "--config=sft/tiny_arithmetic"]) == parse(["sft", "-c", "sft/tiny_arithmetic"])


def test_a_bare_flag_is_true_only_for_a_switch():
    config = parse(["sft", "--gradient_checkpointing", "--overwrite", "false", "--resume", "max_steps=3"])
    assert (config.gradient_checkpointing, config.overwrite, config.resume, config.max_steps) == (True, False, True, 3)
    assert parse(["rl", "--bf16", "--use_vllm"]).precision == "bf16"  # TRL's switches, read as lmrl's keys
    assert parse(["rl", "--use_vllm"]).engine == "vllm"
    with pytest.raises(ConfigError, match="'--lr' needs a value: --lr VALUE or lr=VALUE"):
        parse(["sft", "--lr"])
    with pytest.raises(ConfigError, match="'--model' needs a value"):
        parse(["sft", "--model", "max_steps=3"])  # the next word is an override of its own
    with pytest.raises(ConfigError, match="Unknown config key 'bogus'"):
        parse(["sft", "--bogus"])


def test_swarm_sim_takes_overrides_after_its_recipe():
    config = parse(["swarm", "sim", "--config", "swarm/tiny_sim", "local=4", "external=4"])
    assert (config.mode, config.local, config.external) == ("sim", 4, 4)
    assert parse(["swarm", "--config", "swarm/tiny_sim", "join", "local=2", "external=6"]).mode == "join"
    with pytest.raises(ConfigError, match="one mode, sim or join"):
        parse(["swarm", "join", "--config", "swarm/tiny_sim", "sim"])


def test_report_takes_its_runs_anywhere(tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    assert parse(["report", a, "--output_file", str(tmp_path / "r.html"), b]).runs == [a, b]


def test_an_algorithm_typed_as_a_verb_points_to_its_verb(capsys):
    for argv, hint in (
        (["grpo", "--config", "rl/tiny_arithmetic_grpo"], "use `lmrl rl algorithm=grpo`"),
        (["ppo"], "use `lmrl rl algorithm=ppo`"),
        (["dapo", "lr=1e-5"], "`lmrl rl algorithm=dapo lr=1e-5`"),
        (["ipo"], "use `lmrl dpo loss=ipo`"),
    ):
        assert main(argv) == 2
        assert hint in capsys.readouterr().err, argv
    with pytest.raises(SystemExit) as exc:
        main(["nonsense"])
    assert exc.value.code == 2 and "invalid choice: 'nonsense'" in capsys.readouterr().err


def test_the_algorithm_verbs_are_lmrl_rls_algorithms():
    from lmrl.trainers.rl.config import ALGORITHMS

    assert set(RL_ALGORITHMS) == set(ALGORITHMS)
    assert {name for name, (verb, _) in ALGORITHM_VERBS.items() if verb == "rl"} == set(ALGORITHMS)


def test_a_bad_command_line_exits_2_with_the_fix(capsys):
    assert main(["sft", "--config"]) == 2
    assert "'--config' needs a recipe" in capsys.readouterr().err
    assert main(["sft", "--max_steps"]) == 2
    assert "'--max_steps' needs a value" in capsys.readouterr().err

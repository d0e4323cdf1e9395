"""Run directories written the way trainers write them, with known numbers, for report and dashboard tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.helpers import ONE_LAYER, RL_SMOKE

REWARDS = [0.1, 0.25, 0.4, 0.55, 0.61]
KLS = [0.0, 0.02, 0.05, 0.11, 0.2]
EVAL_ACC = {0: 0.12, 4: 0.345}
NAMES = {"loss": "loss", "kl": "kl"}
OLD_NAMES = {"loss": "loss", "kl": "kl"}
"""The step metrics of `write_rl_run` under their current names and under the names of runs written earlier."""


def write_rl_run(path: Path, lr: float = 1e-3, corrupt: bool = True, old_names: bool = False) -> Path:
    """A GRPO-like run: 5 steps of reward/kl/loss, evaluations at 0 and 4, samples, an eval file, checkpoints.
    ``old_names``: the metric names runs had before docs/metrics.md's namespaces (``loss``, ``kl``, ``lr``, ...)."""
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(
        yaml.safe_dump(
            {"model": "builtin:tiny", "algorithm": "grpo", "lr": lr, "max_steps": 4, "dataset": "task:arithmetic"}
        )
    )
    lines = [json.dumps({"step": 0, "eval/accuracy": EVAL_ACC[0]})]
    for step, (reward, kl) in enumerate(zip(REWARDS, KLS)):
        if step:
            names = OLD_NAMES if old_names else NAMES
            lines.append(
                json.dumps(
                    {
                        "step": step,
                        names["loss"]: 1.0 / step,
                        "reward/mean": reward,
                        names["kl"]: kl,
                        "time_s": step * 1.5,
                    }
                )
            )
    if corrupt:
        lines.insert(2, '{"step": 2, "loss": ')  # a corrupt line: skipped and counted
    lines.append(json.dumps({"step": 4, "eval/accuracy": EVAL_ACC[4]}))
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    samples = [
        {"step": 4, "prompt": "12+34=", "completion": "46", "reward": 1.0, "rewards/task": 1.0},
        {"step": 4, "prompt": "7-9=", "completion": "-3", "reward": 0.0, "rewards/task": 0.0},
    ]
    (path / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    (path / "evals").mkdir()
    (path / "evals" / "task_arithmetic.json").write_text(
        json.dumps(
            {
                "model": str(path / "final"),
                "dataset": "task:arithmetic",
                "metrics": {"accuracy": 0.345, "pass@4": 0.6125},
            }
        )
    )
    (path / "checkpoints" / "step-4").mkdir(parents=True)
    (path / "checkpoints" / "step-4" / "model.safetensors").write_bytes(b"\0" * 2_000_000)
    (path / "final").mkdir()
    return path


def write_swarm_run(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump({"mode": "sim", "nodes": 2, "max_steps": 3}))
    (path / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "reward/mean": 0.1 * s}) + "\n" for s in (1, 2, 3))
    )
    for n, (accepted, skipped) in enumerate([(7, 1), (5, 3)]):
        node = path / "nodes" / f"node-{n}"
        node.mkdir(parents=True)
        node.joinpath("metrics.jsonl").write_text(
            "".join(
                json.dumps(
                    {
                        "step": s,
                        "reward/mean": 0.2 * s + n,
                        "reward/cumulative": 0.5 * s,
                        "swarm/accepted": accepted * s,
                        "swarm/skipped": skipped * s,
                    }
                )
                + "\n"
                for s in (1, 2, 3)
            )
        )
    return path


@pytest.fixture
def rl_run(tmp_path: Path) -> Path:
    return write_rl_run(tmp_path / "runs" / "grpo-a")


@pytest.fixture
def runs_dir(tmp_path: Path) -> Path:
    write_rl_run(tmp_path / "runs" / "grpo-a")
    write_swarm_run(tmp_path / "runs" / "swarm-sim")
    return tmp_path / "runs"


REAL_RL_ARGS = [
    "precision=fp32",
    *ONE_LAYER,
    *RL_SMOKE,
    "eval_every=2",
    "max_steps=3",
    "log_every=1",
    "lr=1e-4",
    "lr_schedule=constant",
    "warmup_steps=0",
    "kl_coef=0.01",
    "check_contamination=false",
]
GARBAGE = [
    '{"step": 4, "loss": NaN, "reward/mean": NaN}',  # bare NaN: Python reads it, strict JSON does not
    '{"step": "four", "loss": 1.0}',
    '{"step": 4.5, "loss": 1.0}',
    '{"loss": 2.0}',
    "[1, 2]",
    "not json",
]
GARBAGE_SKIPPED = 5  # every line but the NaN one (a valid record with an integer step)
CUT_LINE = '{"step": 6, "loss": 0.'


@pytest.fixture(scope="session")
def real_rl_run(tmp_path_factory) -> Path:
    """A real 3-step GRPO run of a tiny model (a few seconds): metrics.jsonl as the trainer writes it."""
    from lmrl import cli

    out = tmp_path_factory.mktemp("real") / "grpo-real"
    assert cli.main(["rl", f"output_dir={out}", *REAL_RL_ARGS]) == 0
    return out


@pytest.fixture
def garbled_rl_run(real_rl_run: Path, tmp_path: Path) -> Path:
    """A copy of the real run with garbage appended to metrics.jsonl: NaN, non-integer steps, a cut last line."""
    import shutil

    run = tmp_path / "runs" / "grpo-garbled"
    shutil.copytree(real_rl_run, run, ignore=shutil.ignore_patterns("checkpoints", "final", "plots"))
    with (run / "metrics.jsonl").open("a") as f:
        f.write("\n".join(GARBAGE) + "\n" + CUT_LINE)
    return run


LONG_PROMPT = (
    "<|im_start|>system\nPlease reason step by step, and put your final answer within \\boxed{}.<|im_end|>\n"
    "<|im_start|>user\n" + "How many apples are left after a long story? " * 20 + "<|im_end|>\n<|im_start|>assistant\n"
)


@pytest.fixture
def long_named_runs(real_rl_run: Path, tmp_path: Path) -> list[Path]:
    """Two copies of the real run under long names, one with a long chat prompt and a 3000-character completion in
    its samples: what makes a runs table or a samples table wider than a window."""
    import shutil

    runs = []
    for seed in (1, 2):
        run = tmp_path / "runs" / "experiments" / "zero-rl-smollm2-135m-instruct-r1-template" / f"seed-{seed}"
        shutil.copytree(real_rl_run, run, ignore=shutil.ignore_patterns("checkpoints", "plots"))
        runs.append(run)
    with (runs[0] / "samples.jsonl").open("a") as f:
        f.write(json.dumps({"step": 3, "prompt": LONG_PROMPT, "completion": "x" * 3000, "task": 0.0, "reward": 0.0}))
        f.write("\n")
    return runs

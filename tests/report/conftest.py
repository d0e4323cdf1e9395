"""Run directories written the way trainers write them, with known numbers, for report and dashboard tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

REWARDS = [0.1, 0.25, 0.4, 0.55, 0.61]
KLS = [0.0, 0.02, 0.05, 0.11, 0.2]
EVAL_ACC = {0: 0.12, 4: 0.345}


def write_rl_run(path: Path, lr: float = 1e-3, corrupt: bool = True) -> Path:
    """A GRPO-like run: 5 steps of reward/kl/loss, evaluations at 0 and 4, samples, an eval file, checkpoints."""
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump({"model": "builtin:tiny", "algorithm": "grpo", "lr": lr,
                                                      "max_steps": 4, "dataset": "task:arithmetic"}))
    lines = [json.dumps({"step": 0, "eval/accuracy": EVAL_ACC[0]})]
    for step, (reward, kl) in enumerate(zip(REWARDS, KLS)):
        if step:
            lines.append(json.dumps({"step": step, "loss": 1.0 / step, "reward/mean": reward, "kl": kl,
                                     "time_s": step * 1.5}))
    if corrupt:
        lines.insert(2, '{"step": 2, "loss": ')  # a corrupt line: skipped and counted
    lines.append(json.dumps({"step": 4, "eval/accuracy": EVAL_ACC[4]}))
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    samples = [{"step": 4, "prompt": "12+34=", "completion": "46", "reward": 1.0, "rewards/task": 1.0},
               {"step": 4, "prompt": "7-9=", "completion": "-3", "reward": 0.0, "rewards/task": 0.0}]
    (path / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    (path / "evals").mkdir()
    (path / "evals" / "task_arithmetic.json").write_text(json.dumps(
        {"model": str(path / "final"), "dataset": "task:arithmetic", "metrics": {"accuracy": 0.345, "pass@4": 0.6125}}))
    (path / "checkpoints" / "step-4").mkdir(parents=True)
    (path / "checkpoints" / "step-4" / "model.safetensors").write_bytes(b"\0" * 2_000_000)
    (path / "final").mkdir()
    return path


def write_swarm_run(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump({"mode": "sim", "nodes": 2, "max_steps": 3}))
    (path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward/mean": 0.1 * s}) + "\n"
                                                for s in (1, 2, 3)))
    for n, (accepted, skipped) in enumerate([(7, 1), (5, 3)]):
        node = path / "nodes" / f"node-{n}"
        node.mkdir(parents=True)
        node.joinpath("metrics.jsonl").write_text("".join(json.dumps(
            {"step": s, "reward/mean": 0.2 * s + n, "cumulative_reward": 0.5 * s, "swarm/accepted": accepted * s,
             "swarm/skipped": skipped * s}) + "\n" for s in (1, 2, 3)))
    return path


@pytest.fixture
def rl_run(tmp_path: Path) -> Path:
    return write_rl_run(tmp_path / "runs" / "grpo-a")


@pytest.fixture
def runs_dir(tmp_path: Path) -> Path:
    write_rl_run(tmp_path / "runs" / "grpo-a")
    write_swarm_run(tmp_path / "runs" / "swarm-sim")
    return tmp_path / "runs"

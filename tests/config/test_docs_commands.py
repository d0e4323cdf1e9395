"""Every `lmrl ...` command that README.md's "What works today" block shows, and the command `lmrl demo` suggests at
its end, runs as written (issue 47: `lmrl swarm sim --config swarm/tiny_sim local=4 external=4` was refused).

Each one is read by the CLI's own path (`lmrl.cli.parse`: the line split as `lmrl` splits it, the recipe and overrides
loaded and checked); a few run for real, one step on the tiny models, in the order the README gives them."""

from __future__ import annotations

import ast
import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lmrl.cli import main, parse

ROOT = Path(__file__).resolve().parents[2]


def readme_commands() -> list[str]:
    """The `lmrl ...` lines of the bash block under README.md's "## What works today", comments stripped."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## What works today") :]
    section = section[: section.index("\n## ", 3)]
    block = section[section.index("```bash") + len("```bash") :]
    block = block[: block.index("```")]
    lines = [re.split(r"\s+#\s", line)[0].strip() for line in block.splitlines()]
    return [line for line in lines if line.startswith("lmrl ")]


def demo_command(final: str = "runs/demo/rl/final") -> str:
    """The 'Try: lmrl ...' line `lmrl demo` prints, with its model path (an f-string in lmrl/demo.py)."""
    tree = ast.parse((ROOT / "lmrl" / "demo.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else final for v in node.values)
            if "lmrl " in text and text.lstrip().startswith("Try:"):
                return text.split("Try:", 1)[1].strip()
    raise AssertionError("lmrl/demo.py prints no 'Try: lmrl ...' line")


COMMANDS = readme_commands() + [demo_command()]


def test_the_readme_block_is_found():
    assert len(readme_commands()) >= 15
    assert "lmrl swarm sim --config swarm/tiny_sim local=4 external=4" in readme_commands()
    assert demo_command().startswith("lmrl generate model=runs/demo/rl/final prompts=")


@pytest.mark.parametrize("command", COMMANDS)
def test_every_readme_command_parses_as_written(command, capsys):
    argv = shlex.split(command)[1:]
    if "--help-config" in argv:
        assert main(argv) == 0
        assert "Config keys of" in capsys.readouterr().out
        return
    config = parse(argv)  # raises ConfigError with the key and the fix for anything the CLI would refuse
    assert config is not None


RUN = """
import json, shlex, sys, time
from lmrl.cli import main
out = []
for command, extra in json.loads(sys.argv[1]):
    start = time.time()
    rc = main(shlex.split(command)[1:] + shlex.split(extra))
    out.append([command, rc, round(time.time() - start, 1)])
print("RESULT" + json.dumps(out))
"""

REAL = [
    # (the command as README.md writes it, what the test adds: one step, a few held-out rows)
    ("lmrl sft --config sft/tiny_arithmetic", "max_steps=1 eval_rows=4 num_samples=2"),
    ("lmrl generate model=runs/sft-tiny-arithmetic/final prompts='[\"23+45=\"]' n=4 temperature=0.8", ""),
    ("lmrl eval model=runs/sft-tiny-arithmetic/final metrics=[accuracy,pass@8,maj@8,avg@8]", "rows=4"),
    ("lmrl report runs/sft-tiny-arithmetic", ""),
    ("lmrl swarm sim --config swarm/tiny_sim local=4 external=4", "max_steps=1 warm_start_steps=1 output_dir=runs/sw"),
]


def test_a_few_readme_commands_run_for_one_step(tmp_path):
    """In a fresh folder, in the README's order: the SFT run that generate, eval and report read from."""
    for command, _ in REAL:
        assert command in COMMANDS, command  # still the README's words
    start = time.time()
    proc = subprocess.run(
        [sys.executable, "-c", RUN, json.dumps(REAL)], capture_output=True, text=True, cwd=tmp_path, timeout=600
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT")), None)
    assert line, proc.stdout[-3000:] + proc.stderr[-3000:]
    for command, rc, seconds in json.loads(line[len("RESULT") :]):
        assert rc == 0, (command, proc.stdout[-3000:])
        print(f"{seconds:6.1f} s  {command}")
    print(f"{time.time() - start:6.1f} s  in all")
    assert "Loading weights" not in proc.stdout + proc.stderr  # transformers' bars are quiet in lmrl's CLI
    assert "step 1/1  loss=" in proc.stdout and "step 1/1  eval/accuracy=" in proc.stdout  # the console's history
    assert (tmp_path / "runs/sft-tiny-arithmetic/final").is_dir()
    assert (tmp_path / "runs/sft-tiny-arithmetic/report.html").is_file()
    assert (tmp_path / "runs/sw").is_dir()

"""Every `lmrl ...` command that README.md's "What works today" block shows, and the command `lmrl demo` suggests at
its end, runs as written (issue 47: `lmrl swarm sim --config swarm/tiny_sim local=4 external=4` was refused).

Each one is read by the CLI's own path (`lmrl.cli.parse`: the line split as `lmrl` splits it, the recipe and overrides
loaded and checked); a few run for real, one step on the tiny models, in the order the README gives them."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lmrl.cli import main, parse
from lmrl.config import load_config
from lmrl.data.tasks import split_of
from lmrl.demo import DemoConfig, next_command
from lmrl.trainers.sft.config import SFTConfig

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
    """The 'Try: lmrl ...' line `lmrl demo` prints after its default recipes, with its model path."""
    sft_config = load_config(SFTConfig, DemoConfig().sft_recipe, [])
    return next_command(Path(final), sft_config)


COMMANDS = readme_commands() + [demo_command()]


def test_the_readme_block_is_found():
    assert len(readme_commands()) >= 15
    assert "lmrl swarm sim --config swarm/tiny_sim local=4 external=4" in readme_commands()
    assert demo_command().startswith("lmrl generate model=runs/demo/rl/final prompts=")


def test_the_demo_suggests_prompts_the_model_was_trained_on():
    """Held-out 2-digit additions, as the demo's SFT and GRPO stages train and measure (issue 47: it asked `3+5=` and
    `7-9=` of a model that had only seen 2-digit sums)."""
    words = dict(w.split("=", 1) for w in shlex.split(demo_command())[2:])
    prompts = json.loads(words["prompts"])
    assert len(prompts) == 3 and words["temperature"] == "0"
    for prompt in prompts:
        assert re.fullmatch(r"\d{1,2}\+\d{1,2}=", prompt) and split_of(prompt) == "test", prompt


@pytest.mark.parametrize("command", COMMANDS)
def test_every_readme_command_parses_as_written(command, capsys):
    argv = shlex.split(command)[1:]
    if "--help-config" in argv:
        assert main(argv) == 0
        assert "Config keys of" in capsys.readouterr().out
        return
    config = parse(argv)  # raises ConfigError with the key and the fix for anything the CLI would refuse
    assert config is not None


PLACEHOLDER = re.compile(r"=([A-Z][A-Z_:]*|S|N)$|<|\.\.\.")
"""Words of a docs command to be filled in (``seed=S``, ``judge=PATH``, ``<run>``, ``...``)."""


def docs_commands() -> list[tuple[str, str]]:
    """(file, command) for every `lmrl <verb> ...` in a code block of docs/*.md and README.md."""
    out = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for block in re.findall(r"```[a-z]*\n(.*?)```", path.read_text(), re.S):
            out += [(str(path.relative_to(ROOT)), command) for command in block_commands(block)]
    return out


def recipe_commands() -> list[tuple[str, str]]:
    """(recipe, command) for every `lmrl <verb> ...` of a shipped recipe's header (its comment lines before the
    first key), `.venv/bin/lmrl` read as `lmrl`."""
    out = []
    for path in sorted((ROOT / "lmrl" / "recipes").rglob("*.yaml")):
        header = []
        for line in path.read_text().splitlines():
            if not line.startswith("#"):
                break
            header.append(line[1:].strip().replace(".venv/bin/lmrl ", "lmrl "))
        out += [(str(path.relative_to(ROOT)), command) for command in block_commands("\n".join(header))]
    return out


def block_commands(block: str) -> list[str]:
    """Every `lmrl <verb> ...` of a block of shell lines: continued lines joined, a `$ ` prompt dropped, shell lists
    (`a & b`) split; not the commands shown failing (the next line is `error:`) nor those with words to fill in."""
    out = []
    lines = block.replace("\\\n", " ").splitlines()
    for i, line in enumerate(lines):
        line = re.split(r"\s+#\s", line.strip().removeprefix("$ "))[0]
        following = next((x.strip() for x in lines[i + 1 :] if x.strip()), "")
        if not line.startswith("lmrl ") or following.startswith("error:"):
            continue
        for words in shell_commands(line):
            if words[0] == "lmrl" and len(words) > 1 and not any(PLACEHOLDER.search(w) for w in words):
                out.append(shlex.join(words))
    return out


def shell_commands(line: str) -> list[list[str]]:
    """The words of each command of a shell line: ``a & b`` and ``a | b`` are two (quotes kept together)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars="&;|")
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    for token in lexer:
        if set(token) <= set("&;|"):
            commands.append([])
        else:
            commands[-1].append(token)
    return [c for c in commands if c]


def test_every_docs_command_parses_as_written(capsys):
    """Every command of the docs reads as the CLI reads it; the only failure allowed is a data file of the user's own
    (`dataset=prefs.jsonl`) that this checkout does not have."""
    commands = docs_commands()
    assert len(commands) > 80
    failures = parse_failures(commands)
    capsys.readouterr()
    assert not failures, "\n".join(failures)


def test_every_recipe_header_command_parses_as_written(capsys):
    """A recipe's header shows every step it needs as an `lmrl` command that reads as written (issue 47: the DPO
    recipes' data was made by `python -m lmrl.data.preference ...`, now `lmrl prefs ...` and `sft/tiny_prefs`)."""
    commands = recipe_commands()
    assert len(commands) > 40
    assert ("lmrl/recipes/dpo/tiny_prefs.yaml", "lmrl sft --config sft/tiny_prefs") in commands
    failures = parse_failures(commands)
    capsys.readouterr()
    assert not failures, "\n".join(failures)
    for path in (ROOT / "lmrl" / "recipes").rglob("*.yaml"):
        assert "python -m lmrl" not in path.read_text(), path  # a preparation step is an lmrl verb


def parse_failures(commands: list[tuple[str, str]]) -> list[str]:
    """Each command the CLI would refuse, with where it is written and why."""
    from lmrl.cli import VERBS

    failures = []
    for where, command in commands:
        argv = shlex.split(command)[1:]
        if argv[0] not in VERBS:
            failures.append(f"{where}: {command}: no verb '{argv[0]}'")
            continue
        try:
            if "--help-config" in argv:
                assert main(argv) == 0
            else:
                parse(argv)
        except Exception as exc:  # noqa: BLE001 - every failure is listed
            if "not found (working directory" not in str(exc):
                failures.append(f"{where}: {command}\n  -> {exc}")
    return failures


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
    ("lmrl report runs/sft-tiny-arithmetic", ""),
    ("lmrl swarm sim --config swarm/tiny_sim local=4 external=4", "max_steps=1 warm_start_steps=1 output_dir=runs/sw"),
]


def test_a_few_readme_commands_run_for_one_step(tmp_path):
    """In a fresh folder, in the README's order: the SFT run that generate and report read from, and the swarm
    simulation (the command of issue 47). About 20 s on 2 quiet cores (`lmrl eval`, 7 s more, is left to the parse
    test: the default suite is near its 10-minute line)."""
    for command, _ in REAL:
        assert command in COMMANDS, command  # still the README's words
    proc = run_in_order(REAL, tmp_path)
    assert "Loading weights" not in proc.stdout + proc.stderr  # transformers' bars are quiet in lmrl's CLI
    assert "step 1/1  loss=" in proc.stdout and "step 1/1  eval/accuracy=" in proc.stdout  # the console's history
    assert (tmp_path / "runs/sft-tiny-arithmetic/final").is_dir()
    assert (tmp_path / "runs/sft-tiny-arithmetic/report.html").is_file()
    assert (tmp_path / "runs/sw").is_dir()


def run_in_order(commands: list[tuple[str, str]], folder: Path) -> subprocess.CompletedProcess:
    """Run (command, what the test adds) in one child process in `folder`, in order; each must exit 0."""
    start = time.time()
    proc = subprocess.run(
        [sys.executable, "-c", RUN, json.dumps(commands)], capture_output=True, text=True, cwd=folder, timeout=600
    )
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT")), None)
    assert line, proc.stdout[-3000:] + proc.stderr[-3000:]
    for command, rc, seconds in json.loads(line[len("RESULT") :]):
        assert rc == 0, (command, proc.stdout[-3000:])
        print(f"{seconds:6.1f} s  {command}")
    print(f"{time.time() - start:6.1f} s  in all")
    return proc


@pytest.mark.slow
def test_the_dpo_recipe_runs_as_its_header_writes_it(tmp_path):
    """dpo/tiny_prefs's header in a fresh folder, in order, one step each: its data (`lmrl prefs`, which replaced
    `python -m lmrl.data.preference`), the reference policy (`sft/tiny_prefs`) and DPO. About 15 s of CPU."""
    commands = [c for where, c in recipe_commands() if where == "lmrl/recipes/dpo/tiny_prefs.yaml"]
    assert [c.split()[1] for c in commands] == ["prefs", "sft", "dpo"]
    one_step = {"prefs": "", "sft": "max_steps=1", "dpo": "max_steps=1 eval_rows=4 eval_samples=2"}
    run_in_order([(c, one_step[c.split()[1]]) for c in commands], tmp_path)
    assert len((tmp_path / "runs/prefs_sft.jsonl").read_text().splitlines()) == 2000
    assert (tmp_path / "runs/sft-tiny-prefs/final").is_dir() and (tmp_path / "runs/dpo-tiny-prefs/final").is_dir()

"""``lmrl <verb> [--config RECIPE] [key=value ...]``.

Every verb takes a recipe (a YAML path or a shipped recipe name) and overrides of
any config key; ``--help-config`` lists the keys with their defaults and meaning.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import pickle
import re
import shlex
import sys
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lmrl.config import ALIASES, REFUSED, TRL_BOOLS, ConfigError, describe, load_config
from lmrl.config_base import pickled_weights_message
from lmrl.data.loading import check_sources
from lmrl.parallel.launch import launch, should_launch
from lmrl.trainers.ckpt_world import check_resume_world


@dataclass(frozen=True)
class Verb:
    help: str
    module: str  # module with the run function
    config: str  # the config dataclass, in `config_module`
    run: str
    positional: str | None = None  # config key that takes the bare arguments (`lmrl report RUN1 RUN2`)
    config_module: str = ""  # a light module (no torch) holding the config; "": `module`


VERBS: dict[str, Verb] = {
    "demo": Verb(
        "built-in tiny model end to end on CPU: SFT then GRPO, with held-out accuracy", "lmrl.demo", "DemoConfig", "run"
    ),
    "sft": Verb(
        "supervised fine-tuning on chat or prompt/completion data",
        "lmrl.trainers.sft.trainer",
        "SFTConfig",
        "train",
        config_module="lmrl.trainers.sft.config",
    ),
    "rl": Verb(
        "online RL: grpo, rloo, reinforce, ppo, dr_grpo, dapo, gspo, cispo",
        "lmrl.trainers.rl.trainer",
        "RLConfig",
        "train",
        config_module="lmrl.trainers.rl.config",
    ),
    "reward": Verb(
        "reward models: Bradley-Terry, K-wise, Plackett-Luce, ORM, PRM; mode=score scores a file",
        "lmrl.trainers.reward.trainer",
        "RewardConfig",
        "train",
        config_module="lmrl.trainers.reward.config",
    ),
    "dpo": Verb(
        "direct alignment: dpo, cdpo, ipo, simpo, orpo, kto, dpo_nll, ...; online=true samples and labels pairs each step",
        "lmrl.trainers.dpo.trainer",
        "DPOConfig",
        "train",
        config_module="lmrl.trainers.dpo.config",
    ),
    "distill": Verb(
        "distillation from a frozen teacher: offline KD (forward KL) and on-policy (reverse KL on the student's samples)",
        "lmrl.trainers.distill.trainer",
        "DistillConfig",
        "train",
        config_module="lmrl.trainers.distill.config",
    ),
    "rejection-sampling": Verb(
        "rejection sampling: N samples per prompt, scored, best per prompt or global top-K, then SFT",
        "lmrl.trainers.rejection.trainer",
        "RejectionConfig",
        "train",
        config_module="lmrl.trainers.rejection.config",
    ),
    "swarm": Verb(
        "decentralized RL sharing rollouts: 'lmrl swarm sim ...' (N nodes here) or 'lmrl swarm join ...'",
        "lmrl.swarm.cli",
        "SwarmConfig",
        "run",
        config_module="lmrl.swarm.config",
    ),
    "cai": Verb(
        "Constitutional AI data: mode=revise (critique-and-revise SFT rows) or mode=label (AI-feedback preference pairs)",
        "lmrl.cai",
        "CAIConfig",
        "run",
    ),
    "prefs": Verb(
        "built-in preference data as JSONL: builtin:prefs-sft (SFT rows for a DPO reference policy), prefs, orm, prm",
        "lmrl.data.preference_export",
        "PrefsConfig",
        "run",
        positional="source",
    ),
    "pretrain": Verb(
        "pretraining from scratch: cross-entropy or avatarl (RL with a frozen CE critic)",
        "lmrl.trainers.pretrain.trainer",
        "PretrainConfig",
        "train",
        config_module="lmrl.trainers.pretrain.config",
    ),
    "selfplay": Verb(
        "Language Self-Play: data-free RL, one model as Challenger and Solver (lsp_zero, lsp)",
        "lmrl.trainers.selfplay.trainer",
        "SelfPlayConfig",
        "train",
        config_module="lmrl.trainers.selfplay.config",
    ),
    "generate": Verb(
        "sample completions from a model or checkpoint",
        "lmrl.generate",
        "GenerateConfig",
        "run",
        config_module="lmrl.rollout.generate_config",
    ),
    "eval": Verb(
        "evaluate a model: accuracy, pass@k, maj@k, avg@k, pass^k, reward, judge win rate, loglik; table + JSON",
        "lmrl.eval.cli",
        "EvalConfig",
        "run",
    ),
    "filter": Verb(
        "offline difficulty filter: N samples per prompt, keep prompts whose pass rate is in [min_pass, max_pass], write JSONL",
        "lmrl.eval.difficulty",
        "FilterConfig",
        "run",
    ),
    "decontaminate": Verb(
        "n-gram overlap (default 8) between training data and an evaluation set",
        "lmrl.eval.cli",
        "DecontamConfig",
        "decontaminate",
    ),
    "vllm-serve": Verb(
        "vLLM as a server for trainers elsewhere (engine=vllm vllm_server=host:port); weights pushed to it",
        "lmrl.rollout.engines.vllm.server",
        "VLLMServeConfig",
        "run",
    ),
    "report": Verb(
        "self-contained HTML report of one run or a comparison: lmrl report RUN [RUN...]",
        "lmrl.report.html",
        "ReportConfig",
        "run",
        positional="runs",
    ),
    "dashboard": Verb(
        "local web dashboard of every run under a directory, live: lmrl dashboard RUNS_DIR",
        "lmrl.report.dashboard",
        "DashboardConfig",
        "run",
        positional="runs_dir",
    ),
}

USER_ERRORS = (ConfigError, ValueError, FileNotFoundError, FileExistsError, KeyError)


def build_parser() -> argparse.ArgumentParser:
    """The help of `lmrl` and `lmrl <verb>` (the arguments themselves are read by `parse_command_line`)."""
    parser = argparse.ArgumentParser(
        prog="lmrl",
        description="Reinforcement learning for language models, end to end.",
        epilog="Example: lmrl sft --config sft/tiny_arithmetic max_steps=100 lr=3e-4",
    )
    sub = parser.add_subparsers(dest="verb", metavar="<verb>")
    for name, verb in VERBS.items():
        p = sub.add_parser(
            name,
            help=verb.help,
            description=verb.help,
            epilog="Overrides go anywhere on the line, as key=value, --key value or --key=value (a bare --flag sets a "
            "true/false key to true).",
        )
        p.add_argument("--config", "-c", metavar="RECIPE", help="YAML recipe: a path or a shipped recipe name")
        p.add_argument("--help-config", action="store_true", help="list every config key with its default and meaning")
        p.add_argument("overrides", nargs="*", metavar="key=value", help="override any config key")
    return parser


RL_ALGORITHMS = ("reinforce", "rloo", "grpo", "dr_grpo", "dapo", "gspo", "cispo", "ppo", "reinforce_pp")
"""`lmrl rl`'s algorithm names (`lmrl.trainers.rl.config.ALGORITHMS`, not imported here: a test checks them)."""

ALGORITHM_VERBS = {
    **{name: ("rl", f"algorithm={name}") for name in RL_ALGORITHMS},
    **{name: ("dpo", f"loss={name}") for name in ("ipo", "cdpo", "simpo", "orpo", "kto", "dpo_nll", "bco", "cal_dpo")},
    "sapo": ("swarm", "sim"),
    "lsp": ("selfplay", "variant=lsp"),
    "avatarl": ("pretrain", "objective=avatarl"),
}
"""Names users type as a verb (`lmrl grpo ...`, as TRL's `trl grpo`) that are a setting of another verb."""


@dataclass
class Command:
    """`lmrl <verb> ...` read: the recipe, --help-config and the overrides as ``key=value`` strings."""

    verb: str
    recipe: str | None = None
    help_config: bool = False
    overrides: list[str] = dataclasses.field(default_factory=list)


def algorithm_verb_message(argv: list[str]) -> str | None:
    """`lmrl grpo --config x`: the command to type instead (`lmrl rl algorithm=grpo --config x`), or None."""
    if not argv or argv[0] not in ALGORITHM_VERBS:
        return None
    verb, setting = ALGORITHM_VERBS[argv[0]]
    command = shlex.join(["lmrl", verb, setting, *argv[1:]])
    return f"'{argv[0]}' is not a verb but a setting of 'lmrl {verb}': use `lmrl {verb} {setting}`, here `{command}`."


OVERRIDE = re.compile(r"[A-Za-z_][\w.-]*=")


def _flag_keys(config_cls: type) -> tuple[set[str], set[str]]:
    """The config's keys (with the TRL names it accepts), and those of them that are true/false switches (a bare
    ``--resume`` is ``resume=true``)."""
    hints = typing.get_type_hints(config_cls)
    keys = {f.name for f in dataclasses.fields(config_cls) if f.init}
    flags = {k for k in keys if hints[k] is bool}
    for alias, name in ALIASES.items():
        if name in keys and alias not in keys:
            keys.add(alias)
            if alias in TRL_BOOLS or name in flags:
                flags.add(alias)
    keys |= set(REFUSED)
    flags |= set(REFUSED) & TRL_BOOLS
    return keys, flags


def parse_command_line(argv: list[str], config_cls: type) -> Command:
    """``lmrl <verb> [--config RECIPE] [key=value | --key value | --key=value ...]`` in any order.

    ``--key value`` and ``--key=value`` are ``key=value`` (the way TRL and HF scripts take their arguments); a bare
    ``--key`` followed by another flag or by nothing is ``key=true`` for a true/false key, and an error for any
    other key (which needs a value).
    """
    command = Command(verb=argv[0])
    keys, flags = _flag_keys(config_cls)
    rest = argv[1:]
    i = 0
    while i < len(rest):
        token = rest[i]
        i += 1
        name, eq, value = token.partition("=")
        if name in ("--config", "-c"):
            if eq:
                command.recipe = value
            elif i < len(rest) and not rest[i].startswith("-"):
                command.recipe = rest[i]
                i += 1
            else:
                raise ConfigError(f"'{name}' needs a recipe: {name} sft/tiny_arithmetic or {name} path/to/recipe.yaml.")
        elif name in ("--help-config", "--help_config") and not eq:
            command.help_config = True
        elif token.startswith("--") and len(name) > 2:
            key = name[2:].replace("-", "_")
            following = rest[i] if i < len(rest) else None
            if eq:
                command.overrides.append(f"{key}={value}")
            elif key.split(".")[0] in flags:
                if following is not None and following.lower() in ("true", "false"):
                    command.overrides.append(f"{key}={following}")
                    i += 1
                else:
                    command.overrides.append(f"{key}=true")
            elif following is None or following.startswith("--") or _names_a_key(following, keys):
                if key.split(".")[0] not in keys:
                    command.overrides.append(f"{key}=true")  # the unknown-key message, with its suggestion
                else:
                    raise ConfigError(f"'--{key}' needs a value: --{key} VALUE or {key}=VALUE.")
            else:
                command.overrides.append(f"{key}={following}")
                i += 1
        else:
            command.overrides.append(token)
    return command


def _names_a_key(token: str, keys: set[str]) -> bool:
    """``max_steps=3`` after ``--model``: an override of its own, not the model's name."""
    match = OVERRIDE.match(token)
    return bool(match) and token.split("=", 1)[0].split(".")[0].replace("-", "_") in keys


def _config_class(verb: Verb) -> type:
    return getattr(importlib.import_module(verb.config_module or verb.module), verb.config)


def _run_function(verb: Verb) -> Callable:
    """Imported only once the config checked: the trainers import torch and transformers (seconds), which a typo in
    a key or a path should not wait for."""
    return getattr(importlib.import_module(verb.module), verb.run)


def quiet_third_party_bars() -> None:
    """transformers' "Loading weights" bars (one per model a verb loads, each left in the scrollback) off, in lmrl's
    CLI only: lmrl's own bar shows the run. Downloads from the Hub keep theirs (a first download takes minutes)."""
    if "transformers" not in sys.modules:  # report, dashboard: nothing loads weights
        return
    import huggingface_hub.utils as hub
    from transformers.utils import logging

    logging.disable_progress_bar()
    if not os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS"):
        hub.enable_progress_bars()


STOP_ERRORS = {
    "lmrl.trainers.common": "TrainingStopped",
    "lmrl.rollout.samplers.ray": "WorkersFailed",
    "lmrl.rollout.engines.vllm.client": "VLLMServerError",
    "lmrl.swarm.hivemind_transport": "SwarmStartupError",
}
"""Errors that stop a started run (exit 1, "Training stopped"), by module: a run that raises one has imported it."""


def stop_errors() -> tuple[type, ...]:
    """The `STOP_ERRORS` classes of the modules already imported (a config error imports none of them)."""
    return tuple(getattr(sys.modules[m], name) for m, name in STOP_ERRORS.items() if m in sys.modules)


def use_working_directory() -> None:
    """Modules in the current folder import (``rewards=[my_rewards:f]``, ``env=my_envs:make``), as with `python -m
    lmrl`: the `lmrl` script's own folder is first on sys.path, not the current one."""
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def command_overrides(args: Command) -> list[str]:
    """The overrides of a command with its bare words read: `lmrl swarm sim` is ``mode=sim``, and
    `lmrl report runs/a runs/b` is ``runs=[runs/a, runs/b]``."""
    overrides = [f"mode={o}" if args.verb == "swarm" and o in ("sim", "join") else o for o in args.overrides]
    modes = [o for o in args.overrides if args.verb == "swarm" and o in ("sim", "join")]
    if len(modes) > 1:
        raise ConfigError(f"'lmrl swarm' takes one mode, sim or join; got {' and '.join(modes)}.")
    positional = VERBS[args.verb].positional
    if positional:
        bare = [o for o in overrides if "=" not in o]
        overrides = [o for o in overrides if "=" in o]
        if bare:
            overrides.append(f"{positional}={json.dumps(bare if len(bare) > 1 or positional == 'runs' else bare[0])}")
    return overrides


def parse(argv: list[str]) -> Any:
    """The config that `lmrl ARGV` would run, loaded and checked as `main` does it, without running it (the docs
    test reads every command of README.md through here)."""
    args = parse_command_line(argv, _config_class(VERBS[argv[0]]))
    return load_config(_config_class(VERBS[args.verb]), args.recipe, command_overrides(args))


def main(argv: list[str] | None = None) -> int:
    use_working_directory()
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    if not argv or argv[0] in ("-h", "--help"):
        parser.print_help()
        return 0
    if argv[0] not in VERBS:
        message = algorithm_verb_message(argv)
        if message:
            print(f"lmrl: error: {message}", file=sys.stderr)
            return 2
        parser.parse_args(argv[:1])  # argparse's "invalid choice", with the verbs (exits 2)
    if any(token in ("-h", "--help") for token in argv[1:]):
        parser.parse_args([argv[0], "--help"])  # the verb's help (exits 0)
    config_cls = _config_class(VERBS[argv[0]])
    try:
        args = parse_command_line(argv, config_cls)
    except ConfigError as exc:
        print(f"lmrl {argv[0]}: error: {exc}", file=sys.stderr)
        return 2
    if args.help_config:
        print(f"Config keys of 'lmrl {args.verb}':\n{describe(config_cls)}")
        return 0
    from rich.markup import escape

    from lmrl.notices import print_as_one_line
    from lmrl.tracking import console

    print_as_one_line(lambda text: console.print(f"[yellow]{escape(text)}"))
    config = None
    try:
        overrides = command_overrides(args)
        config = load_config(config_cls, args.recipe, overrides)
        check_sources(config)  # a missing or unreadable data path: now, before the trainer's heavy imports
        check_resume_world(config)  # a checkpoint of another number of processes: before torchrun starts ranks
        if should_launch(config):  # nproc=N: the same command as N torchrun processes
            return launch(config.nproc, argv)
        run = _run_function(VERBS[args.verb])
        quiet_third_party_bars()
        run(config)
    except Exception as exc:
        if isinstance(exc, stop_errors()):
            console.print(f"[bold red]Training stopped:[/] {escape(str(exc))}")
            return 1
        if isinstance(exc, pickle.UnpicklingError) and not os.environ.get("LMRL_DEBUG"):
            exc = ValueError(pickled_weights_message(config))  # a model folder with only a pickle in it
        if not isinstance(exc, USER_ERRORS) or os.environ.get("LMRL_DEBUG"):
            raise
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        # escaped: messages quote configs and samples such as `rewards: [task, format]`, which Rich reads as markup
        console.print(f"[bold red]error:[/] {escape(str(message))}\n(set LMRL_DEBUG=1 for the traceback)")
        return 2
    except KeyboardInterrupt:
        console.print("[yellow]Interrupted. resume=true continues from the newest checkpoint.")
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())

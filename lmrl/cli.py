"""``lmrl <verb> [--config RECIPE] [key=value ...]``.

Every verb takes a recipe (a YAML path or a shipped recipe name) and overrides of
any config key; ``--help-config`` lists the keys with their defaults and meaning.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

from lmrl.config import ConfigError, describe, load_config
from lmrl.parallel.launch import launch, should_launch


@dataclass(frozen=True)
class Verb:
    help: str
    module: str  # module with a ``Config`` dataclass path and a run function
    config: str
    run: str
    positional: str | None = None  # config key that takes the bare arguments (`lmrl report RUN1 RUN2`)


VERBS: dict[str, Verb] = {
    "demo": Verb("built-in tiny model end to end on CPU: SFT then GRPO, with held-out accuracy", "lmrl.demo", "DemoConfig", "run"),
    "sft": Verb("supervised fine-tuning on chat or prompt/completion data", "lmrl.trainers.sft", "SFTConfig", "train"),
    "rl": Verb("online RL: grpo, rloo, reinforce, ppo, dr_grpo, dapo, gspo, cispo", "lmrl.trainers.online", "RLConfig", "train"),
    "reward": Verb("reward models: Bradley-Terry, K-wise, Plackett-Luce, ORM, PRM; mode=score scores a file", "lmrl.trainers.reward", "RewardConfig", "train"),
    "dpo": Verb("direct alignment: dpo, cdpo, ipo, simpo, orpo, kto, dpo_nll, ...; online=true samples and labels pairs each step", "lmrl.trainers.preference", "DPOConfig", "train"),
    "distill": Verb("distillation from a frozen teacher: offline KD (forward KL) and on-policy (reverse KL on the student's samples)", "lmrl.trainers.distill", "DistillConfig", "train"),
    "rejection-sampling": Verb("rejection sampling: N samples per prompt, scored, best per prompt or global top-K, then SFT", "lmrl.trainers.rejection", "RejectionConfig", "train"),
    "swarm": Verb("decentralized RL sharing rollouts: 'lmrl swarm sim ...' (N nodes here) or 'lmrl swarm join ...'", "lmrl.swarm.cli", "SwarmConfig", "run"),
    "cai": Verb("Constitutional AI data: mode=revise (critique-and-revise SFT rows) or mode=label (AI-feedback preference pairs)",
                "lmrl.cai", "CAIConfig", "run"),
    "pretrain": Verb("pretraining from scratch: cross-entropy or avatarl (RL with a frozen CE critic)", "lmrl.trainers.pretrain", "PretrainConfig", "train"),
    "selfplay": Verb("Language Self-Play: data-free RL, one model as Challenger and Solver (lsp_zero, lsp)", "lmrl.trainers.selfplay", "SelfPlayConfig", "train"),
    "generate": Verb("sample completions from a model or checkpoint", "lmrl.generate", "GenerateConfig", "run"),
    "eval": Verb("evaluate a model: accuracy, pass@k, maj@k, avg@k, pass^k, reward, judge win rate, loglik; table + JSON",
                 "lmrl.eval.cli", "EvalConfig", "run"),
    "filter": Verb("offline difficulty filter: N samples per prompt, keep prompts whose pass rate is in [min_pass, max_pass], write JSONL",
                   "lmrl.eval.difficulty", "FilterConfig", "run"),
    "decontaminate": Verb("n-gram overlap (default 8) between training data and an evaluation set", "lmrl.eval.cli",
                          "DecontamConfig", "decontaminate"),
    "vllm-serve": Verb("vLLM as a server for trainers elsewhere (engine=vllm vllm_server=host:port); weights pushed to it",
                       "lmrl.rollout.vllm_server", "VLLMServeConfig", "run"),
    "report": Verb("self-contained HTML report of one run or a comparison: lmrl report RUN [RUN...]",
                   "lmrl.report.html", "ReportConfig", "run", positional="runs"),
    "dashboard": Verb("local web dashboard of every run under a directory, live: lmrl dashboard RUNS_DIR",
                      "lmrl.report.dashboard", "DashboardConfig", "run", positional="runs_dir"),
}

USER_ERRORS = (ConfigError, ValueError, FileNotFoundError, FileExistsError, KeyError)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lmrl",
        description="Reinforcement learning for language models, end to end.",
        epilog="Example: lmrl sft --config sft/tiny_arithmetic max_steps=100 lr=3e-4",
    )
    sub = parser.add_subparsers(dest="verb", metavar="<verb>")
    for name, verb in VERBS.items():
        p = sub.add_parser(name, help=verb.help, description=verb.help)
        p.add_argument("--config", "-c", metavar="RECIPE", help="YAML recipe: a path or a shipped recipe name")
        p.add_argument("--help-config", action="store_true", help="list every config key with its default and meaning")
        p.add_argument("overrides", nargs="*", metavar="key=value", help="override any config key")
    return parser


def _target(verb: Verb) -> tuple[type, Callable]:
    module = importlib.import_module(verb.module)
    return getattr(module, verb.config), getattr(module, verb.run)


def use_working_directory() -> None:
    """Modules in the current folder import (``rewards=[my_rewards:f]``, ``env=my_envs:make``), as with `python -m
    lmrl`: the `lmrl` script's own folder is first on sys.path, not the current one."""
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())


def main(argv: list[str] | None = None) -> int:
    use_working_directory()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.verb:
        parser.print_help()
        return 0
    config_cls, run = _target(VERBS[args.verb])
    if args.help_config:
        print(f"Config keys of 'lmrl {args.verb}':\n{describe(config_cls)}")
        return 0
    from rich.markup import escape

    from lmrl.rollout.ray import WorkersFailed
    from lmrl.rollout.vllm_client import VLLMServerError
    from lmrl.tracking import console
    from lmrl.trainers.common import TrainingStopped

    overrides = list(args.overrides)
    if args.verb == "swarm" and overrides and overrides[0] in ("sim", "join"):
        overrides[0] = f"mode={overrides[0]}"  # `lmrl swarm sim ...` reads as `mode=sim`
    positional = VERBS[args.verb].positional
    if positional:  # `lmrl report runs/a runs/b key=value` reads as `runs=[runs/a, runs/b]`
        bare = [o for o in overrides if "=" not in o]
        overrides = [o for o in overrides if "=" in o]
        if bare:
            overrides.append(f"{positional}={json.dumps(bare if len(bare) > 1 or positional == 'runs' else bare[0])}")
    try:
        config = load_config(config_cls, args.config, overrides)
        if should_launch(config):  # nproc=N: the same command as N torchrun processes
            return launch(config.nproc, sys.argv[1:] if argv is None else list(argv))
        run(config)
    except (TrainingStopped, WorkersFailed, VLLMServerError) as exc:
        console.print(f"[bold red]Training stopped:[/] {escape(str(exc))}")
        return 1
    except USER_ERRORS as exc:
        if os.environ.get("LMRL_DEBUG"):
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

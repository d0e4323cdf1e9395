"""``nproc=N``: start the same command as N processes through torchrun (``torch.distributed.run``).

    lmrl sft --config sft/tiny_arithmetic nproc=2      # is
    torchrun --standalone --nproc-per-node 2 -m lmrl sft --config sft/tiny_arithmetic nproc=2

Each child sees ``WORLD_SIZE`` and runs the verb itself (`lmrl.parallel.runtime.init`). Several machines: run
torchrun yourself with a rendezvous (docs/scale.md).
"""

from __future__ import annotations

import os
import sys

from lmrl.parallel.config import ParallelSection, env_world_size
from lmrl.parallel.parent import LAUNCHER_ENV


def should_launch(config: object) -> bool:
    """A config with ``nproc`` > 1 (`ParallelSection`), not already read in one of torchrun's processes."""
    return isinstance(config, ParallelSection) and config.nproc > 1 and env_world_size() == 1


def torchrun_args(nproc: int, argv: list[str]) -> list[str]:
    return ["--standalone", "--nproc-per-node", str(nproc), "-m", "lmrl", *argv]


def launch(nproc: int, argv: list[str]) -> int:
    """Run ``lmrl <argv>`` as ``nproc`` torchrun processes; returns 0, or 1 when a process failed (torchrun stops
    the others; the newest complete checkpoint stays, and ``resume=true`` continues from it)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    os.environ[LAUNCHER_ENV] = str(os.getpid())  # the ranks' parent: torchrun's agent runs in this process
    try:
        run(get_args_parser().parse_args(torchrun_args(nproc, argv)))
    except ChildFailedError as exc:
        failures = ", ".join(f"rank {r} exit code {f.exitcode}" for r, f in sorted(exc.failures.items()))
        print(
            f"error: a training process failed ({failures}); the others were stopped. resume=true continues "
            f"from the newest checkpoint.",
            file=sys.stderr,
        )
        return 1
    return 0

"""How many processes wrote a checkpoint, read from its layout without torch: a resume with another number of
processes is refused before any model loads (`lmrl.cli`: once, before torchrun starts its ranks), with the fix.

A single-process checkpoint holds the weights as safetensors; a multi-process one holds ``dcp/`` (the shards,
which reshard onto any number of processes > 1) and one ``rng-rank<i>.pt`` per rank (`lmrl.trainers.dist_checkpoint`).
"""

from __future__ import annotations

from pathlib import Path

from lmrl.config import ConfigError, TrainConfig
from lmrl.parallel.config import env_world_size

STATE_FILE = (
    "trainer_state.pt"  # the trainer state: a complete checkpoint has it (also lmrl.trainers.common.STATE_FILE)
)


def saved_world(checkpoint: Path) -> int:
    """1 for a single-process checkpoint; the number of ranks that wrote a multi-process one."""
    if not (checkpoint / "dcp").is_dir():
        return 1
    return max(2, len(list(checkpoint.glob("rng-rank*.pt"))))


def newest_checkpoint(run_dir: Path) -> Path | None:
    done = [p for p in (run_dir / "checkpoints").glob("step-*") if (p / STATE_FILE).exists()]
    return max(done, key=lambda p: int(p.name.split("-")[1]), default=None)


def check_world(checkpoint: Path, world: int) -> None:
    """Refuse to resume ``checkpoint`` with ``world`` processes when it was written by one and ``world`` > 1, or by
    several and ``world`` = 1."""
    saved = saved_world(checkpoint)
    if saved == 1 and world > 1:
        raise ConfigError(
            f"resume=true with {world} processes, but {checkpoint} was written by one process (its "
            "weights, no dcp/ shards). Fix: resume with nproc=1, or start a new multi-process run "
            f"from its weights: model={checkpoint} resume=false."
        )
    if saved > 1 and world == 1:
        raise ConfigError(
            f"resume=true with one process, but {checkpoint} was written by {saved} processes (dcp/ "
            f"shards). Fix: resume with nproc={saved} (any nproc > 1 reshards them), or start a new "
            f"run from final/ once it exists."
        )


def check_resume_world(config: object) -> None:
    """`check_world` for the newest checkpoint a ``resume=true`` training config would continue, with its ``nproc``."""
    if not isinstance(config, TrainConfig) or not config.resume:
        return
    checkpoint = newest_checkpoint(Path(config.output_dir))
    if checkpoint is not None:
        check_world(checkpoint, max(config.nproc, env_world_size()))

"""The scale-out keys every training verb shares (composed into `lmrl.config.TrainConfig`)."""

from __future__ import annotations

import dataclasses
import os
from typing import Literal

from lmrl.config_base import ConfigError, Section, check_at_least, field, section_view

BATCH_KEYS = ("prompts_per_step", "batch_size")  # the global batch of a step, in the first key a config has


def env_world_size() -> int:
    """``WORLD_SIZE`` of a torchrun process (1 otherwise). Here, not in `runtime`, so that configs check without
    importing torch (`lmrl.cli` answers a config error before any heavy import)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


@dataclasses.dataclass
class ParallelSection(Section):
    title = "scale-out (torch.distributed)"
    nproc: int = field(
        1,
        "processes on this machine (one per GPU); > 1 starts the run through torchrun "
        "(same as `torchrun --nproc-per-node N -m lmrl <verb> ...`)",
    )
    parallel: Literal["fsdp", "ddp"] = field(
        "fsdp",
        "with several processes: fsdp (FSDP2, parameters, gradients and "
        "optimizer state sharded) or ddp (each rank a full replica)",
    )

    sampled_key = None  # the key that sampling_shards divide, when it is not the batch (rejection: the prompts)

    def __post_init__(self) -> None:
        check_at_least(self, ("nproc",), 1)
        check_world(self, self.processes)
        check_launch(self.nproc)
        super().__post_init__()

    @property
    def processes(self) -> int:
        """The run's training processes: ``nproc``, or torchrun's ``WORLD_SIZE`` in a process it started."""
        return self.nproc if self.nproc > 1 else env_world_size()

    @property
    def distributed(self) -> ParallelSection:
        return section_view(self, ParallelSection)


def check_launch(nproc: int) -> None:
    """No more processes than this machine has GPUs (or CPU cores without one), and no torchrun variables left in
    the environment of a process torchrun did not start (its rendezvous would wait forever)."""
    if nproc > 1:  # torch only here: one process needs no device count, and a config checks without torch
        import torch

        gpus = torch.cuda.device_count()
        have, what = (gpus, "GPUs") if gpus else (os.cpu_count() or 1, "CPU cores")
        if nproc > have:
            raise ConfigError(
                f"nproc={nproc} starts {nproc} training processes, but this machine has {have} {what}; "
                f"each process holds a whole model. Fix: nproc<={have}."
            )
    if env_world_size() > 1 and "MASTER_ADDR" not in os.environ:
        raise ConfigError(
            f"WORLD_SIZE={env_world_size()} is set in the environment, but this process was not started "
            "by torchrun (no MASTER_ADDR): it would wait forever for the other processes. Fix: unset "
            "WORLD_SIZE and RANK, or start it with torchrun / nproc=N."
        )


def check_world(config: ParallelSection, world: int) -> None:
    """Every rank gets an equal share of the global batch (the first of `BATCH_KEYS` that the config has), split
    evenly into its grad_accum micro-batches and into its ``sampling_shards`` (`lmrl.parallel.shards`)."""
    keys = {f.name for f in dataclasses.fields(config)}
    key = next((k for k in BATCH_KEYS if k in keys), None)
    batch = getattr(config, key) if key else 0
    accum = config.grad_accum if "grad_accum" in keys else 1
    unit = "prompts (each rank samples whole groups)" if key == "prompts_per_step" else "examples"
    per_rank = batch // world
    if key and world > 1 and (batch % world or (key == "batch_size" and per_rank % accum)):
        need = world * (accum if key == "batch_size" else 1)
        raise ConfigError(
            f"{key}={batch} does not split over {world} processes"
            + (f" x grad_accum={accum} micro-batches" if key == "batch_size" and accum > 1 else "")
            + f": {key} is the global batch in {unit}. Fix: make {key} a multiple of {need} "
            f"(e.g. {key}={max(need, batch // need * need)}), or change nproc."
        )
    shards = (config.sampling_shards if "sampling_shards" in keys else 0) or world
    key = config.sampled_key or key
    sampled = getattr(config, key) if key else None
    if shards % world or (sampled is not None and sampled % shards):
        raise ConfigError(
            f"sampling_shards={shards} must be a multiple of the {world} processes and divide "
            f"{key}={sampled}. Fix: sampling_shards=0 (one per process), or a multiple of it."
        )

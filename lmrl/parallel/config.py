"""The scale-out keys every training verb shares (composed into `lmrl.config.TrainConfig`)."""

from __future__ import annotations

import dataclasses
import os
from typing import Literal

from lmrl.config_base import ConfigError, Section, check_at_least, field

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

    def __post_init__(self) -> None:
        check_at_least(self, ("nproc",), 1)
        check_world(self, self.nproc if self.nproc > 1 else env_world_size())
        check_launch(self.nproc)
        if max(self.nproc, env_world_size()) > 1 and getattr(self, "lora_r", 0) > 0 and self.parallel == "fsdp":
            raise ConfigError(
                "LoRA with several processes runs with parallel=ddp (the adapters are small; the frozen "
                "base is not sharded). Fix: add parallel=ddp."
            )
        super().__post_init__()


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


def check_world(config, world: int) -> None:
    """Every rank gets an equal share of the global batch, split evenly into its grad_accum micro-batches and into
    its ``sampling_shards`` (`lmrl.parallel.shards`)."""
    key = next((k for k in BATCH_KEYS if hasattr(config, k)), None)
    batch, accum = getattr(config, key) if key else 0, getattr(config, "grad_accum", 1)
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
    shards = getattr(config, "sampling_shards", 0) or world
    key = getattr(config, "sampled_key", key)  # what is sampled in shards, if not the batch (rejection: the prompts)
    sampled = getattr(config, key) if key else None
    if shards % world or (sampled is not None and sampled % shards):
        raise ConfigError(
            f"sampling_shards={shards} must be a multiple of the {world} processes and divide "
            f"{key}={sampled}. Fix: sampling_shards=0 (one per process), or a multiple of it."
        )

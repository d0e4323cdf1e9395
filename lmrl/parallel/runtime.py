"""The process group of a multi-process run and the few collectives the trainers need.

A run is distributed when it was started by ``torchrun`` (``WORLD_SIZE`` > 1 in the environment; ``nproc=N`` starts
it that way, `lmrl.parallel.launch`). Every helper is a no-op with one process, so trainers call them
unconditionally. Backend: NCCL on CUDA, gloo on CPU.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist

from lmrl.parallel.config import env_world_size  # noqa: F401 - re-exported
from lmrl.parallel.parent import die_with_parent  # noqa: F401 - re-exported; called again by init

SUMMED_METRICS = ("tokens_per_s",)  # throughput adds up over ranks; every other metric is the mean over ranks


def init(device: torch.device) -> torch.device:
    """Join the torchrun process group (once); returns this rank's device (``cuda:LOCAL_RANK`` on GPUs)."""
    if env_world_size() <= 1 or dist.is_initialized():
        return local_device(device)
    die_with_parent()
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend)
    return local_device(device)


def local_device(device: torch.device) -> torch.device:
    if device.type == "cuda" and env_world_size() > 1:
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return device


def world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def is_main() -> bool:
    return rank() == 0


def barrier() -> None:
    if world() > 1:
        dist.barrier()


def shard(items: Sequence, index: int | None = None, count: int | None = None) -> list:
    """The contiguous ``index``-th of ``count`` equal parts of ``items`` (default: this rank's part). Contiguous
    parts of a prompt-major batch are whole groups."""
    index, count = rank() if index is None else index, world() if count is None else count
    size = len(items) // count
    return list(items[index * size : (index + 1) * size])


def all_sum(value: float | torch.Tensor, op: str = "sum") -> float | torch.Tensor:
    """Sum (``op="max"``: maximum) over ranks of a float or a tensor, returned as the same kind."""
    if world() == 1:
        return value
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"  # NCCL reduces CUDA tensors only
    tensor = (
        value.detach().clone().double()
        if torch.is_tensor(value)
        else torch.tensor(float(value), dtype=torch.float64, device=device)
    )
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
    return tensor.to(value.dtype) if torch.is_tensor(value) else tensor.item()


def all_max(value: float | torch.Tensor) -> float | torch.Tensor:
    return all_sum(value, op="max")


def parts_behind(count: int) -> int:
    """How many micro-batches fewer than the rank with the most this rank has (``count`` its own): it repeats one that
    many times at loss weight 0, since every backward reduces gradients across ranks (packed micro-batches)."""
    return int(all_max(count)) - count


def all_gather(tensor: torch.Tensor) -> torch.Tensor:
    """Every rank's ``tensor`` (the same shape on each), concatenated in rank order along dim 0."""
    if world() == 1:
        return tensor
    parts = [torch.empty_like(tensor) for _ in range(world())]
    dist.all_gather(parts, tensor.contiguous())
    return torch.cat(parts)


def any_rank(flag: bool) -> bool:
    """Whether ``flag`` is true on some rank (e.g. a step every rank must skip because one rank's rewards failed)."""
    return all_sum(float(flag)) > 0


def reduce_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """Every rank's metrics, combined: the mean over the ranks that have a key (``tokens_per_s``: the sum)."""
    if world() == 1:
        return metrics
    gathered = gather_objects(metrics)
    keys = dict.fromkeys(k for m in gathered for k in m)
    out = {}
    for key in keys:
        values = [m[key] for m in gathered if key in m]
        out[key] = sum(values) if key in SUMMED_METRICS else sum(values) / len(values)
    return out


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's picklable ``obj`` (CPU tensors only), in rank order, on every rank."""
    if world() == 1:
        return [obj]
    gathered: list[Any] = [None] * world()
    dist.all_gather_object(gathered, obj)
    return gathered


def broadcast_object(obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank."""
    if world() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


@contextlib.contextmanager
def full_params(*models: torch.nn.Module) -> Iterator[None]:
    """FSDP2 models unsharded (all-gathered once, on every rank) for the duration: generation and evaluation then
    run any number of forwards with no collective, so ranks may sample different lengths or only rank 0 evaluate.
    A no-op for unsharded models."""
    from torch.distributed.fsdp import FSDPModule

    modules = [
        (m, m is not model)
        for model in models
        if model is not None
        for m in model.modules()
        if isinstance(m, FSDPModule)
    ]  # (module, reshards after forward: every one but the root)
    for module, _ in modules:
        module.set_reshard_after_forward(False, recurse=False)
        module.unshard()
    try:
        yield
    finally:
        for module, reshards in modules:
            module.reshard()
            module.set_reshard_after_forward(reshards, recurse=False)


def reshard(*models: torch.nn.Module) -> None:
    """FSDP2: every unit of ``models`` back to its shards, after a no-grad forward. The root unit keeps its parameters
    gathered after a forward for the backward that follows; when none follows, the next training backward leaves the
    root's gradients (embedding, final norm, a value head) unreduced at the optimizer step (seen with torch 2.13). A
    no-op for unsharded models."""
    from torch.distributed.fsdp import FSDPModule

    for model in models:
        for module in model.modules() if model is not None else ():
            if isinstance(module, FSDPModule):
                module.reshard()


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


class NullTracker:
    """The tracker of ranks other than 0: rank 0 alone writes metrics, samples and plots and prints."""

    def log(self, step: int, metrics: dict[str, Any]) -> None: ...

    def advance(self, step: int) -> None: ...

    def log_samples(
        self, step: int, rows: list[dict[str, Any]], title: str = "samples", held_out: bool = False
    ) -> None: ...

    def print(self, *objects: Any) -> None: ...

    def close(self) -> list:
        return []

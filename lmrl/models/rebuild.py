"""Save less for the backward: tensors autograd would keep, rebuilt from tensors it keeps anyway.

Autograd keeps what each op's backward reads. Some of those are cheap functions of tensors another op keeps already:
the input of SwiGLU's down projection is ``silu(gate) * up`` (the fused SwiGLU keeps gate and up); the bf16 input
of the q/k/v and gate/up projections is the cast of an RMSNorm's output (the fused RMSNorm keeps its input); the
o projection's bf16 input is the cast of the attention's output (the attention kernel keeps it); the fp32 values
the CPU attention reads are the cast of bf16 ones. Inside `saving_less()`, a tensor registered with
``rebuildable(t, fn, *sources)`` is saved as the recipe ``fn(*sources)`` when that costs fewer new bytes than t
itself, and rebuilt when the backward reads it: the same ops on the same inputs, so the same bits. A source that is
registered in turn is kept as its own recipe, so a chain (norm output -> its bf16 cast) keeps only its roots.

The block yields what it did, counted: ``{"rebuilt": saves replaced by a recipe, "rebuilt_bytes": the bytes the
backward does not keep}`` (the metric that says it ran is this count).
"""

from __future__ import annotations

import contextlib
import typing
import weakref
from collections.abc import Callable

import torch

__all__ = ["rebuildable", "saving_less"]

_ACTIVE: list[dict[int, Recipe]] = []  # the registry of each active `saving_less()`, innermost last


class Recipe:
    """``fn(*sources)``: each source a tensor (weakly held until a save needs it, then kept with its in-place
    version), a sub-Recipe, or any other argument."""

    __slots__ = ("fn", "sources", "name", "target", "target_version", "packed")

    def __init__(self, fn: Callable, sources: tuple, name: str, target: torch.Tensor):
        self.fn, self.sources, self.name = fn, sources, name
        self.packed: _Packed | None = None  # set when first saved
        self.target, self.target_version = weakref.ref(target), target._version

    def resolve(self) -> _Packed | None:
        """The recipe with its tensors held (and their versions noted), or None if one is gone."""
        args = []
        for source in self.sources:
            if isinstance(source, Recipe):
                source = source.resolve()
            elif isinstance(source, _Weak):
                tensor = source.ref()
                source = None if tensor is None or tensor._version != source.version else (tensor, source.version)
            if source is None:
                return None
            args.append(source)
        return _Packed(self.fn, tuple(args), self.name)


class _Weak(typing.NamedTuple):
    """A source tensor as registered: weakly held, with its in-place version then."""

    ref: weakref.ref
    version: int


class _Packed:
    """A resolved Recipe, as autograd keeps it: one per registered tensor however often it is saved (q, k and v
    save one cast), built once for the backwards that read it in a row and dropped after the last."""

    __slots__ = ("fn", "args", "name", "uses", "built")

    def __init__(self, fn: Callable, args: tuple, name: str):
        self.fn, self.args, self.name = fn, args, name
        self.uses, self.built = 0, None

    def roots(self) -> list[torch.Tensor]:
        out = []
        for arg in self.args:
            if isinstance(arg, _Packed):
                out.extend(arg.roots())
            elif isinstance(arg, tuple):
                out.append(arg[0])
        return out

    def take(self) -> torch.Tensor:
        """The tensor, for one of the saves that kept this recipe."""
        if self.built is None:
            self.built = self._build()
        built = self.built
        self.uses -= 1
        if self.uses <= 0:
            self.built = None
        return built

    def _build(self) -> torch.Tensor:
        values = []
        for arg in self.args:
            if isinstance(arg, _Packed):
                arg = arg._build()
            elif isinstance(arg, tuple):
                tensor, version = arg
                if tensor._version != version:
                    raise RuntimeError(
                        f"lmrl.models.rebuild: a tensor needed to rebuild the saved '{self.name}' for the backward "
                        "was modified by an in-place operation after the forward (as autograd refuses for any saved "
                        "tensor). Fix: do not modify the forward's tensors before the backward."
                    )
                arg = tensor
            values.append(arg)
        with torch.no_grad():
            return self.fn(*values)


def rebuildable(tensor: torch.Tensor, fn: Callable, *sources, name: str) -> torch.Tensor:
    """Register ``tensor == fn(*sources)`` (bitwise) with the innermost `saving_less()` while gradients are on;
    returns ``tensor``. Sources that are registered themselves are kept as their recipes."""
    if not _ACTIVE or not torch.is_grad_enabled() or any(s is tensor for s in sources):
        return tensor
    registry = _ACTIVE[-1]
    held = []
    for source in sources:
        if isinstance(source, torch.Tensor):
            source = _recipe_of(registry, source) or _Weak(weakref.ref(source), source._version)
        held.append(source)
    registry[id(tensor)] = Recipe(fn, tuple(held), name, tensor)
    return tensor


def _recipe_of(registry: dict[int, Recipe], tensor: torch.Tensor) -> Recipe | None:
    recipe = registry.get(id(tensor))
    ok = recipe is not None and recipe.target() is tensor and recipe.target_version == tensor._version
    return recipe if ok else None


def _storage(tensor: torch.Tensor) -> tuple[int, int]:
    storage = tensor.untyped_storage()
    return storage.data_ptr(), storage.nbytes()


def _replaced(replaced: dict[int, tuple[weakref.ref, int]], ptr: int) -> int | None:
    """The bytes a recipe saved for the storage at ``ptr``, if that storage is still the replaced tensor's (a freed
    tensor's address is reused)."""
    ref, saved = replaced.get(ptr, (None, 0))
    return saved if ref is not None and ref() is not None else None


@contextlib.contextmanager
def saving_less(observe: Callable[[torch.Tensor], None] | None = None):
    """Within the block, a save of a registered tensor keeps its recipe instead (`rebuildable`) when the recipe's
    tensors cost fewer new bytes than the tensor's storage: a storage an earlier save kept costs nothing.
    ``observe``: called with every tensor saved as itself (for memory profilers: saved-tensor hooks outside this
    block see nothing saved inside it)."""
    registry: dict[int, Recipe] = {}
    kept: set[int] = set()  # data pointers of the storages saved so far (alive until the backward)
    stats = {"rebuilt": 0, "rebuilt_bytes": 0}
    replaced: dict[int, tuple[weakref.ref, int]] = {}  # storages saved as a recipe: their tensor, the bytes saved

    def pack(tensor: torch.Tensor):
        ptr, size = _storage(tensor)
        recipe = _recipe_of(registry, tensor)
        if recipe is not None and recipe.packed is not None:  # saved again: the same recipe
            recipe.packed.uses += 1
            stats["rebuilt"] += 1
            return recipe.packed
        packed = None if recipe is None or ptr in kept else recipe.resolve()
        if packed is not None:
            roots = dict(_storage(t) for t in packed.roots())
            new = sum(nbytes for root, nbytes in roots.items() if root not in kept)
            if new < size:
                kept.update(roots)
                if _replaced(replaced, ptr) is None:  # q, k and v save one cast three times: one saving
                    replaced[ptr] = (weakref.ref(tensor), size - new)
                    stats["rebuilt_bytes"] += size - new
                stats["rebuilt"] += 1
                packed.uses, recipe.packed = 1, packed
                return packed
        kept.add(ptr)
        stats["rebuilt_bytes"] -= _replaced(replaced, ptr) or 0  # saved plainly after all: no saving
        replaced.pop(ptr, None)
        if observe is not None:
            observe(tensor)
        return tensor

    def unpack(saved):
        return saved.take() if isinstance(saved, _Packed) else saved

    _ACTIVE.append(registry)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            yield stats
    finally:
        _ACTIVE.remove(registry)

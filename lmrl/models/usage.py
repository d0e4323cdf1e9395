"""What the speed tricks really did, counted on a scoped object instead of process-wide lists read by difference.

    with counting() as usage:          # every count made inside the block, by any module, lands in `usage`
        plan.logprobs(...); loss.backward()
    usage["fused_swiglu"], usage["backward_rows_skipped"], ...

Blocks nest: a count goes to every open block, so an update's block sees its forwards' counts while a forward's own
block sees only its own. The blocks are one process-wide stack, not a context variable, because some counts are made
in autograd's backward threads (a replayed layer's backward rows on a GPU). `quiet()` hides a block from the open
ones (a start-up check's own forward is not a use).
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator

__all__ = ["Usage", "count", "counting", "quiet"]


class Usage(collections.Counter):
    """Counts by name (`collections.Counter`: a missing name is 0)."""

    def total_of(self, prefix: str) -> int:
        """The sum of every count whose name starts with ``prefix`` (e.g. "fused_": fused forwards of every kind)."""
        return sum(value for key, value in self.items() if key.startswith(prefix))


_OPEN: list[Usage] = []


def count(name: str, n: int = 1) -> None:
    """Add ``n`` to ``name`` in every open `counting` block (nothing when none is open)."""
    for usage in _OPEN:
        usage[name] += n


@contextlib.contextmanager
def counting(usage: Usage | None = None) -> Iterator[Usage]:
    """Collect every `count` made inside the block into ``usage`` (a new `Usage` by default), and yield it."""
    usage = Usage() if usage is None else usage
    _OPEN.append(usage)
    try:
        yield usage
    finally:
        del _OPEN[next(i for i, u in enumerate(_OPEN) if u is usage)]  # by identity: Counters compare by content


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Counts made inside the block go nowhere (the open blocks are hidden until it ends)."""
    hidden = _OPEN[:]
    _OPEN.clear()
    try:
        yield
    finally:
        _OPEN[:0] = hidden

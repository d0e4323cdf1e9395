"""Whether a failed write was a full disk (or a quota, a lost mount): decided by errno and free space (issue 46).

On a full disk torch.save raises `RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 576 vs
534`, with no errno and no "No space" in it; `write_failure` finds the OSError behind an exception (its causes
included), or measures the free space where it wrote, so checkpoints and `final/` fail with one paragraph.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

LOW_SPACE = 1 << 20
"""a write that failed with less than this free (bytes) where it wrote failed for a full disk"""


def free_bytes(path: str | Path) -> int | None:
    """Bytes an unprivileged write may still use on the filesystem holding `path` (its nearest existing parent)."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        st = os.statvfs(p)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def write_failure(exc: BaseException, directory: str | Path | None = None) -> OSError | None:
    """The OSError behind a failed write, or None when `exc` is not one. Decided by the exception's type and
    errno (also of its causes) and by the free space in `directory`, never by torch's wording alone: on a full
    disk torch.save raises `RuntimeError: ... unexpected pos 576 vs 534` (issue 46)."""
    seen, e = set(), exc
    while e is not None and id(e) not in seen:  # the exception, then what it was raised from or during
        if isinstance(e, OSError):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    first = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
    free = free_bytes(directory) if directory is not None else None
    if free is not None and free < LOW_SPACE:
        return OSError(errno.ENOSPC, f"No space left on device ({free:,} bytes free; {type(exc).__name__}: {first})")
    if "failed writing" in str(exc) or "file write failed" in str(exc):
        return OSError(errno.EIO, f"the write failed ({type(exc).__name__}: {first})")
    return None


def is_write_failure(exc: BaseException, directory: str | Path | None = None) -> bool:
    """Whether `exc` is a failed write (`write_failure`)."""
    return write_failure(exc, directory) is not None

"""A rank dies with its launcher: ``PR_SET_PDEATHSIG``, set at the start of the process and checked against the
launcher's pid (standard library only: `lmrl.__main__` calls it before anything heavy is imported).

The kernel sends the death signal only for a parent that dies *after* the call. A rank of ``lmrl ... nproc=N``
spends seconds importing torch; a launcher killed in that time (issue 46: 0.5 s after the ranks started) left
them as orphans (~385 MiB each, one alive after 513 s): the call came late, and its check compared the parent
with itself (the rank had already been re-parented). Now the launcher passes its pid (`LAUNCHER_ENV`), the rank
sets the signal first thing, and compares its parent with that pid after setting it.
"""

from __future__ import annotations

import os
import signal
import sys

LAUNCHER_ENV = "LMRL_LAUNCHER_PID"
"""set by `lmrl.parallel.launch` for its torchrun children: the pid their parent must have"""
PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_parent(sig: int = signal.SIGTERM) -> bool:
    """Have the kernel send ``sig`` to this process when its parent (torchrun, or ``lmrl ... nproc=N``) dies: a
    killed launcher then leaves no rank training as an orphan. Linux only (elsewhere a no-op, False). A parent that
    is already gone (not the launcher whose pid `LAUNCHER_ENV` holds, or changed during the call) stops this
    process at once. The variable is consumed, so this process's own children (a sandbox, a data worker) never
    compare their parent with the launcher."""
    import ctypes

    launcher = os.environ.pop(LAUNCHER_ENV, "")
    if not sys.platform.startswith("linux"):
        return False
    expected = int(launcher) if launcher.isdigit() else os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    if os.getppid() != expected:  # the parent died before the call took effect: no signal would come
        os.kill(os.getpid(), sig)
    return True

"""One run at a time in a run directory: ``output_dir/lmrl.lock``.

Two runs started in the same ``output_dir`` would both write ``metrics.jsonl`` and ``checkpoints/`` and leave a run
that is neither. `acquire` takes the directory for the run (rank 0 of a multi-process run: it alone writes there):

- the lock file records the owner (pid, host, start time) and is held with a POSIX record lock (``lockf``: per
  process, so not inherited by forked children, and honoured over NFS) while the run lives, so a second run is
  refused at once, naming the directory and the owner;
- a lock file left by a run that died (its pid no longer runs on this host) is stale: taken over, with a notice;
- a lock file of a run on another host (a shared filesystem) is refused: lmrl cannot tell whether that run still
  lives, so the message says which file to delete once it does not.

The run releases the lock when its tracker closes (every end of a run: success, an error, Ctrl-C) and, failing
that, at process exit; a killed process's lock is released by the kernel. (A POSIX lock is released when its
process closes *any* descriptor of the file, so this module reads the file it holds through the held descriptor.)
"""

from __future__ import annotations

import atexit
import datetime
import errno
import fcntl
import json
import os
import socket
from pathlib import Path
from typing import Any

LOCK_FILE = "lmrl.lock"


class RunDirInUse(FileExistsError):
    """Another run holds the run directory."""


class BadLockFile(FileExistsError):
    """``lmrl.lock`` is not a regular file (a symlink, a FIFO, a folder, a device): never written through."""


def _refuse(path: Path, what: str) -> BadLockFile:
    return BadLockFile(
        f"{path} is {what}, not the regular lock file lmrl writes: lmrl does not write through it (a symlink would "
        f"overwrite the file it points to). Delete {path} (nothing of the run is in it), or choose another "
        "output_dir=..."
    )


def _open_regular(path: Path) -> int:
    """``path`` opened for the lock, never through a symlink and only when it is a regular file (issue 46)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refuse(path, f"a symbolic link (to {os.readlink(path)!r})") from None
        if exc.errno == errno.EISDIR:
            raise _refuse(path, "a folder") from None
        if exc.errno in (errno.ENXIO, errno.EACCES, errno.EPERM, errno.EROFS):
            kind = _kind(path)
            if kind != "a regular file":
                raise _refuse(path, kind) from None
        raise
    kind = _kind(path, fd)
    if kind != "a regular file":
        os.close(fd)
        raise _refuse(path, kind)
    return fd


def _kind(path: Path, fd: int | None = None) -> str:
    import stat

    mode = (os.fstat(fd) if fd is not None else os.lstat(path)).st_mode
    for test, name in (
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a regular file"


class RunLock:
    """A held lock on a run directory; `release` is idempotent."""

    def __init__(self, path: Path, fd: int):
        self.path, self.fd, self.pid = path, fd, os.getpid()

    def release(self) -> None:
        if self.fd < 0 or os.getpid() != self.pid:  # a forked child never releases its parent's lock
            return
        try:
            self.path.unlink(missing_ok=True)  # unlinked while held: a waiter re-checks the inode (`acquire`)
        finally:
            os.close(self.fd)
            self.fd = -1
            HELD.pop(str(self.path), None)


HELD: dict[str, RunLock] = {}
"""The locks this process holds, by path: a run started again in this process after one that did not release
(an exception between `acquire` and the tracker) takes its own lock over."""


def owner_text(owner: dict[str, Any]) -> str:
    return f"pid {owner.get('pid')} on host {owner.get('host')!r}, started {owner.get('started', '?')}"


def read_owner(fd: int) -> dict[str, Any]:
    try:
        owner = json.loads(os.pread(fd, 65536, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return owner if isinstance(owner, dict) else {}


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def _open_locked(path: Path) -> int:
    """An fd of ``path`` holding its lock; raises `RunDirInUse` when another process holds it."""
    while True:
        fd = _open_regular(path)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except (BlockingIOError, PermissionError):  # EAGAIN or EACCES: held by another process
            owner = read_owner(fd)
            os.close(fd)
            raise RunDirInUse(
                f"output_dir '{path.parent}' is in use by another lmrl run ({owner_text(owner)}): two runs in one "
                f"directory would mix their metrics and checkpoints. Wait for it to finish or stop it, or choose "
                f"another output_dir=..."
            ) from None
        except OSError as exc:  # a filesystem without locks: the owner record below still guards the directory
            if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                os.close(fd)
                raise
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)  # the holder released (unlinked) it between our open and lock: lock the new file


def acquire(run_dir: Path, notice=print) -> RunLock:
    """Take ``run_dir`` for this process's run (see the module docstring); ``notice`` prints a stale lock's
    takeover."""
    path = Path(run_dir) / LOCK_FILE
    held = HELD.get(str(path))
    if held is not None and held.fd >= 0 and held.pid == os.getpid():
        return held
    fd = _open_locked(path)
    host = socket.gethostname()
    owner = read_owner(fd)
    pid = owner.get("pid")
    if owner and (pid, owner.get("host")) != (os.getpid(), host):
        if owner.get("host") != host:
            os.close(fd)
            raise RunDirInUse(
                f"output_dir '{run_dir}' is locked by an lmrl run on another host ({owner_text(owner)}). If that run "
                f"no longer runs, delete {path}; otherwise choose another output_dir=..."
            )
        if isinstance(pid, int) and pid_alive(pid):
            os.close(fd)
            raise RunDirInUse(
                f"output_dir '{run_dir}' is in use by another lmrl run ({owner_text(owner)}): two runs in one "
                f"directory would mix their metrics and checkpoints. Wait for it to finish or stop it (if pid {pid} "
                f"is not an lmrl run, delete {path}), or choose another output_dir=..."
            )
        notice(f"output_dir '{run_dir}': taking over the lock of a run that is gone ({owner_text(owner)}).")
    record = {"pid": os.getpid(), "host": host, "started": datetime.datetime.now().isoformat(timespec="seconds")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
    lock = HELD[str(path)] = RunLock(path, fd)
    return lock


@atexit.register
def _release_all() -> None:
    for lock in list(HELD.values()):
        lock.release()

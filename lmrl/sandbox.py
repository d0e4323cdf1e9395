"""Run untrusted Python in a subprocess with limits: the Python tool and the `code` reward share it.

    result = run_python("print(2**10)", SandboxLimits(timeout_s=5))
    result.status, result.stdout          # ("ok", "1024\\n")

Each run gets a fresh private temp directory as its working directory (deleted afterwards), an empty
environment, and these limits (the reason a run stopped is `status`):

- wall clock `timeout_s`: the whole process group is killed            -> "timeout"
- CPU time `cpu_s` (RLIMIT_CPU)                                          -> "timeout"
- address space `memory_mb` (RLIMIT_AS): allocations fail               -> "memory"
- processes: fork/spawn refused by the audit hook, and RLIMIT_NPROC = 0 where the kernel applies it
  (not inside the user namespace), with the process-group kill as the backstop -> "error"
- files written at most `max_file_bytes` each (RLIMIT_FSIZE)            -> "output_limit"
- output: stdout/stderr are cut to `max_output_chars` with a marker     -> `truncated`
- no network: a new network namespace (`unshare -rn`, loopback down) where the kernel allows it, and
  always an audit hook that refuses socket connect/bind                 -> "error" (PermissionError)
- writes outside the temp dir: refused by the audit hook                -> "error" (PermissionError)

The audit hook stops Python code, not native code that calls the OS directly (ctypes): the rlimits,
the network namespace and the process-group kill hold for both, the write rule only for Python code.
This is a guard against a policy's mistakes and reward hacks, not a security boundary for hostile
code; run that in a container or VM.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time

TRUNCATION_MARKER = "\n...[output truncated: {n} more characters]"
STATUSES = ("ok", "error", "timeout", "memory", "output_limit")

# Runs inside the sandbox before the user's code: install the audit hook, then exec the code file.
_RUNNER = r"""
import os, sys
_root = os.path.realpath(os.getcwd())
_WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
def _inside(path):
    try:
        p = os.path.realpath(os.fsdecode(path))
    except Exception:
        return False
    return p == _root or p.startswith(_root + os.sep)
def _hook(event, args):
    if event in ("socket.connect", "socket.bind", "socket.sendto", "socket.getaddrinfo"):
        raise PermissionError("sandbox: network access is disabled")
    if event == "open" and args[0] is not None and not isinstance(args[0], int):
        mode, flags = args[1], args[2]
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (flags or 0) & _WRITE
        if writing and not _inside(args[0]):
            raise PermissionError(f"sandbox: writing outside the sandbox directory is not allowed: {args[0]}")
    if event in ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.link", "os.symlink",
                 "os.truncate", "shutil.rmtree", "os.chown", "os.utime"):
        if not all(_inside(a) for a in args[:2] if isinstance(a, (str, bytes, os.PathLike))):
            raise PermissionError(f"sandbox: {event} outside the sandbox directory is not allowed")
    if event in ("os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system", "subprocess.Popen",
                 "pty.spawn"):
        raise PermissionError(f"sandbox: starting processes is not allowed ({event})")
_path = sys.argv[1]
sys.argv = sys.argv[1:]
with open(_path) as _f:
    _src = _f.read()
del _f
import traceback
sys.addaudithook(_hook)
try:
    exec(compile(_src, "<sandbox>", "exec"), {"__name__": "__main__"})
except SystemExit:
    raise
except BaseException as _e:
    traceback.print_exception(type(_e), _e, _e.__traceback__.tb_next)
    sys.exit(1)
"""


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Limits of one sandboxed run."""

    timeout_s: float = 10.0
    """wall-clock seconds before the process group is killed"""
    cpu_s: int = 10
    """CPU seconds (RLIMIT_CPU)"""
    memory_mb: int = 512
    """address-space cap in MiB (RLIMIT_AS); the interpreter itself needs ~30"""
    max_output_chars: int = 4000
    """stdout and stderr are each cut to this many characters, with a marker"""
    max_file_bytes: int = 1 << 20
    """largest file the code may write, its captured output included (RLIMIT_FSIZE)"""
    network_namespace: bool = True
    """run in a fresh network namespace (`unshare -rn`) when the kernel allows unprivileged ones"""

    def __post_init__(self) -> None:
        for name in ("timeout_s", "cpu_s", "memory_mb", "max_output_chars", "max_file_bytes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SandboxLimits.{name} must be > 0, got {getattr(self, name)!r}.")


@dataclasses.dataclass(frozen=True)
class SandboxResult:
    """What a sandboxed run printed and why it ended."""

    status: str
    """one of STATUSES: ok (exit 0), error (non-zero exit), timeout, memory, output_limit"""
    stdout: str
    stderr: str
    exit_code: int | None
    """the process's return code (negative: killed by that signal); None if it never started"""
    truncated: bool
    """stdout or stderr was cut to max_output_chars"""
    seconds: float

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def text(self) -> str:
        """stdout, then stderr, then a one-line reason when the run did not end normally (a tool's observation)."""
        parts = [self.stdout.rstrip("\n")] if self.stdout else []
        if self.stderr:
            parts.append(self.stderr.rstrip("\n"))
        if self.status != "ok" and self.status != "error":
            parts.append(f"[sandbox: {REASONS[self.status]}]")
        return "\n".join(parts)


REASONS = {
    "timeout": "killed: time limit exceeded",
    "memory": "stopped: memory limit exceeded",
    "output_limit": "killed: file/output size limit exceeded",
}


@functools.lru_cache(maxsize=1)
def network_namespace_available() -> bool:
    """Whether `unshare -rn` works here (unprivileged user + network namespaces)."""
    exe = shutil.which("unshare")
    if exe is None:
        return False
    try:
        return subprocess.run([exe, "-rn", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _set_limits(limits: SandboxLimits) -> None:
    """preexec_fn: runs in the child between fork and exec."""
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
    mem = limits.memory_mb * (1 << 20)
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits.max_file_bytes, limits.max_file_bytes))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NPROC, (0, 0))  # no fork/spawn (checked at fork, not at exec)


def _read(path: str, limit: int, tail: bool = False) -> tuple[str, bool]:
    """The first `limit` characters of a file (tail=True: the last ones, where a traceback's error is)."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        if tail and size > 4 * limit:
            f.seek(size - 4 * limit)
        data = f.read(4 * limit).decode("utf-8", errors="replace")
    rest = max(0, size - 4 * limit)
    if tail:
        if len(data) > limit:
            rest += len(data) - limit
            data = data[-limit:]
        return (TRUNCATION_MARKER.format(n=rest).strip() + "\n" + data, True) if rest else (data, False)
    if len(data) <= limit and not rest:
        return data, False
    return data[:limit] + TRUNCATION_MARKER.format(n=max(0, len(data) - limit) + rest), True


def _status(code: int | None, timed_out: bool, stderr: str) -> str:
    if timed_out or code in (-signal.SIGXCPU, -signal.SIGKILL):
        return "timeout"
    if code == -signal.SIGXFSZ or "File too large" in stderr:
        return "output_limit"
    if "MemoryError" in stderr or code == -signal.SIGSEGV and "Cannot allocate" in stderr:
        return "memory"
    return "ok" if code == 0 else "error"


def run_python(code: str, limits: SandboxLimits | None = None, args: tuple[str, ...] = (),
               env: dict[str, str] | None = None) -> SandboxResult:
    """Run `code` with the current interpreter (`-I`: isolated mode) in a fresh temp dir under `limits`;
    `env` adds environment variables to the otherwise empty environment."""
    limits = limits or SandboxLimits()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lmrl-sandbox-") as root:
        work = os.path.join(root, "work")
        io_dir = os.path.join(root, "io")
        os.mkdir(work, 0o700)
        os.mkdir(io_dir, 0o700)
        src = os.path.join(io_dir, "main.py")
        runner = os.path.join(io_dir, "runner.py")
        with open(src, "w") as f:
            f.write(code)
        with open(runner, "w") as f:
            f.write(_RUNNER)
        cmd = [sys.executable, "-I", "-B", runner, src, *args]
        if limits.network_namespace and network_namespace_available():
            cmd = [shutil.which("unshare") or "unshare", "-rn", *cmd]
        env_vars = {"PATH": "/usr/bin:/bin", "HOME": work, "TMPDIR": work, "LANG": "C.UTF-8", "PYTHONHASHSEED": "0",
               **(env or {})}
        out_path, err_path = os.path.join(io_dir, "stdout"), os.path.join(io_dir, "stderr")
        timed_out = False
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            try:
                proc = subprocess.Popen(cmd, cwd=work, env=env_vars, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                        preexec_fn=functools.partial(_set_limits, limits), start_new_session=True)
            except OSError as exc:
                return SandboxResult("error", "", f"sandbox: could not start: {exc}", None, False,
                                     time.perf_counter() - start)
            try:
                code_ = proc.wait(timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc)
                code_ = proc.wait()
            _kill_group(proc)  # anything the code left behind in its session
        stdout, t1 = _read(out_path, limits.max_output_chars)
        stderr, t2 = _read(err_path, limits.max_output_chars, tail=True)
    status = _status(code_, timed_out, stderr)
    return SandboxResult(status, stdout, stderr, code_, t1 or t2, time.perf_counter() - start)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


_PRELUDE = """
def _lmrl_harness(marker, exec_=exec, print_=print, base=BaseException):
    def report(tests):
        passed = 0
        for test in tests:
            try:
                exec_(test, globals())
                passed += 1
            except base:
                pass
        print_(marker + str(passed), flush=True)
    return report
import os as _os
_lmrl_report = _lmrl_harness(_os.environ.pop("LMRL_TESTS_MARKER", "?"))
del _lmrl_harness, _os
"""


def extract_code(completion: str) -> str:
    """The code of a completion: the last ```python (or ```) fenced block, else the whole text."""
    blocks = [b.split("\n", 1)[1] if "\n" in b else "" for b in completion.split("```")[1::2]]
    return blocks[-1] if blocks else completion


def run_tests(code: str, tests: list[str], limits: SandboxLimits | None = None) -> tuple[int, int, SandboxResult]:
    """Run `code`, then each test (a Python statement such as `assert f(2) == 4`) in the same sandboxed process.

    Returns (tests passed, tests given, the run). A test passes when it runs without raising. The count is
    printed after a random marker that reaches the process in an environment variable removed before the
    code runs, by a function that kept its own `exec`/`print`, so printing a fake count or replacing builtins
    does not pass tests (code that digs through closures could; this guards against a policy's accidents
    and naive hacks, not deliberate attacks). Code that crashes, loops or exits before the tests passes none.
    """
    if not tests:
        raise ValueError("run_tests needs at least one test statement, e.g. 'assert f(1) == 2'.")
    marker = f"@@lmrl-tests-{os.urandom(8).hex()}@@"
    program = _PRELUDE + code + f"\n_lmrl_report({list(tests)!r})\n"
    limits = limits or SandboxLimits()
    result = run_python(program, dataclasses.replace(limits, max_output_chars=max(limits.max_output_chars, 10_000)),
                        env={"LMRL_TESTS_MARKER": marker})
    for line in reversed(result.stdout.splitlines()):
        if line.startswith(marker) and line[len(marker):].isdigit():
            return min(int(line[len(marker):]), len(tests)), len(tests), result
    return 0, len(tests), result

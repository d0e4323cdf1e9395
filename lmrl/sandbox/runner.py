"""Run untrusted Python in an isolated process tree: the Python tool and the `code` reward share it.

    result = run_python("print(2**10)", SandboxLimits(timeout_s=5))
    result.status, result.stdout          # ("ok", "1024\\n")

Each execution runs in its own namespaces (`isolation="namespaces"`, the default; `lmrl.sandbox.jail` builds
them): user, mount, pid, network, ipc and uts. Its filesystem is a new root holding only read-only binds of /usr,
the interpreter and its venv, a fresh /proc of its own pid namespace, a few /dev nodes and a private, size-capped
/tmp (its working directory, gone afterwards). It runs as uid 1 (outside: nobody when lmrl runs as root) with
no capabilities, no_new_privs, rlimits and a seccomp deny-list (when libseccomp is installed). It sees no other
process, so it cannot signal or read the trainer; when its pid 1 ends, the kernel kills every process it left.
The reason a run stopped is `status`:

- wall clock `timeout_s`: pid 1 of its namespace is killed, and with it everything  -> "timeout"
- CPU time `cpu_s` (RLIMIT_CPU)                                                    -> "timeout"
- address space `memory_mb` (RLIMIT_AS), per process; `max_processes` (RLIMIT_NPROC) -> "memory" / "error"
- memory RLIMIT_AS does not see: SysV shm/msg/sem, memfds and POSIX mqueues are refused (seccomp, and the IPC
  namespace's limits set to 0); there is no /dev/shm                                 -> "error"
- files written at most `max_file_bytes` each (RLIMIT_FSIZE), /tmp at most `disk_mb` -> "output_limit"
- output: stdout/stderr are cut to `max_output_chars` with a marker               -> `truncated`
- network: an empty network namespace, and only AF_UNIX sockets (seccomp)          -> "error"
- an audit hook refuses fork/exec, sockets and writes outside /tmp first, so Python code gets a clear message.

Where the namespaces cannot be built (no user namespaces, e.g. some containers), `run_python` raises at first
use with the fix. `isolation="none"` (or the environment variable LMRL_SANDBOX=none) opts into the weaker mode
of a plain subprocess with rlimits and the audit hook, with a warning: it stops mistakes, not attacks.
docs/security.md lists what holds and the test of each.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import warnings

from lmrl.sandbox import verdict as sandbox_verdict

TRUNCATION_MARKER = "\n...[output truncated: {n} more characters]"
STATUSES = ("ok", "error", "timeout", "memory", "output_limit")

ISOLATIONS = ("namespaces", "none")
JAIL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jail.py")
SETUP_FAILED = 125


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
    """kept for compatibility: the namespace sandbox always has its own, empty network namespace"""
    max_processes: int = 8
    """processes and threads of the sandbox's user (RLIMIT_NPROC); memory_mb holds per process"""
    disk_mb: int = 64
    """size of the private /tmp (a tmpfs, in memory)"""
    isolation: str = dataclasses.field(default_factory=lambda: os.environ.get("LMRL_SANDBOX", "namespaces"))
    """"namespaces" (the default) or "none": a plain subprocess, rlimits and an audit hook only (opt-in, warns)"""
    require_seccomp: bool = False
    """fail instead of running without the seccomp filter where libseccomp is missing"""

    def __post_init__(self) -> None:
        for name in (
            "timeout_s",
            "cpu_s",
            "memory_mb",
            "max_output_chars",
            "max_file_bytes",
            "max_processes",
            "disk_mb",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"SandboxLimits.{name} must be > 0, got {getattr(self, name)!r}.")
        if self.isolation not in ISOLATIONS:
            raise ValueError(f"SandboxLimits.isolation (sandbox=) must be one of {ISOLATIONS}, got {self.isolation!r}.")


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


@functools.cache
def isolation_problem() -> str | None:
    """Why the namespace sandbox cannot run here (a trivial program fails), or None when it works."""
    result, _ = _execute("print('ok')", SandboxLimits(timeout_s=20, isolation="namespaces"), check=False)
    if result.status == "ok" and result.stdout == "ok\n":
        return None
    return (result.stderr.strip().splitlines() or [f"exit code {result.exit_code}"])[-1]


def network_namespace_available() -> bool:
    """Whether the namespace sandbox (its own network namespace among them) works here."""
    return isolation_problem() is None


def require_isolation(isolation: str) -> None:
    """Fail with the fix when the namespace sandbox cannot run here; warn once about isolation="none"."""
    if isolation == "none":
        _warn_unisolated()
        return
    problem = isolation_problem()
    if problem:
        raise RuntimeError(
            f"lmrl.sandbox: untrusted code cannot be isolated on this machine ({problem}). The sandbox needs user "
            "namespaces (sysctl kernel.unprivileged_userns_clone=1 and user.max_user_namespaces > 0; in Docker "
            "--security-opt seccomp=unconfined or a VM). Or opt into the weaker, unisolated mode for trusted code "
            "only: sandbox=none (reward_kwargs.code.sandbox, tool_kwargs.python.sandbox) or LMRL_SANDBOX=none."
        )


@functools.lru_cache(maxsize=1)
def _warn_unisolated() -> None:
    warnings.warn(
        "lmrl.sandbox: isolation='none': sampled code runs as a plain subprocess with rlimits and an audit "
        "hook only; it can read and write what this user can. Use it for trusted code only.",
        stacklevel=3,
    )


@functools.lru_cache(maxsize=1)
def _site_packages() -> list[str]:
    """The interpreter's site-packages folders: the sandboxed code may import numpy and the like."""
    import site

    return [p for p in site.getsitepackages() if os.path.isdir(p)]


@functools.lru_cache(maxsize=1)
def _binds() -> list[str]:
    """Host paths the sandbox sees read-only: the system libraries, the interpreter and its venv."""
    paths = [
        "/usr",
        "/bin",
        "/sbin",
        "/lib",
        "/lib32",
        "/lib64",
        sys.base_prefix,
        sys.base_exec_prefix,
        sys.prefix,
        os.path.dirname(os.path.dirname(os.path.realpath(sys.executable))),
    ]
    paths = sorted({os.path.realpath(p) if os.path.dirname(p) != "/" else p for p in paths if os.path.exists(p)})
    return [p for p in paths if p != "/" and not any(p.startswith(q + "/") for q in paths if q != p)]


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
    if code == -signal.SIGXFSZ or "File too large" in stderr or "No space left" in stderr:
        return "output_limit"
    if "MemoryError" in stderr or code == -signal.SIGSEGV and "Cannot allocate" in stderr:
        return "memory"
    return "ok" if code == 0 else "error"


def run_python(
    code: str, limits: SandboxLimits | None = None, args: tuple[str, ...] = (), env: dict[str, str] | None = None
) -> SandboxResult:
    """Run `code` as __main__ in a fresh sandbox under `limits`; `env` adds variables to its otherwise empty
    environment, `args` is its sys.argv[1:]."""
    return _execute(code, limits or SandboxLimits(), args, env)[0]


def _execute(
    code: str,
    limits: SandboxLimits,
    args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    calls: list[str] = (),
    check: bool = True,
    imports: list[str] = (),
) -> tuple[SandboxResult, str]:
    """One execution: the run, and the `index<TAB>repr` lines of `calls` evaluated after the code (`check`:
    first make sure the isolation works)."""
    if check:
        require_isolation(limits.isolation)
    start = time.perf_counter()
    jailed = limits.isolation == "namespaces"
    with tempfile.TemporaryDirectory(prefix="lmrl-sandbox-") as root:
        work, io_dir, new_root = (os.path.join(root, d) for d in ("work", "io", "root"))
        for d in (work, io_dir, new_root):
            os.mkdir(d, 0o700)
        files = {n: open(os.path.join(io_dir, n), "w+b") for n in ("stdout", "stderr", "results", "status")}
        fds = [files["results"].fileno()] + ([files["status"].fileno()] if jailed else [])
        cfg = {
            "isolation": limits.isolation,
            "code": code,
            "calls": list(calls),
            "imports": list(imports),
            "args": list(args),
            "fds": fds,
            "env": {
                "PATH": "/usr/bin:/bin",
                "HOME": "/tmp" if jailed else work,
                "TMPDIR": "/tmp" if jailed else work,
                "LANG": "C.UTF-8",
                "OMP_NUM_THREADS": "1",
                "OPENBLAS_NUM_THREADS": "1",
                **(env or {}),
            },
            "limits": dataclasses.asdict(limits),
            "binds": _binds(),
            "root": new_root,
            "site_packages": _site_packages(),
            "require_seccomp": limits.require_seccomp,
            "max_value_chars": sandbox_verdict.MAX_VALUE_CHARS,
        }
        cfg_path = os.path.join(io_dir, "config.json")
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)
        cmd = [sys.executable, "-I", "-S", "-B", JAIL, cfg_path]
        proc_env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}
        timed_out = False
        try:
            try:
                proc = subprocess.Popen(
                    cmd,
                    cwd=work,
                    env=proc_env,
                    stdin=subprocess.DEVNULL,
                    stdout=files["stdout"],
                    stderr=files["stderr"],
                    pass_fds=fds,
                    start_new_session=True,
                )
            except OSError as exc:
                return SandboxResult(
                    "error", "", f"sandbox: could not start: {exc}", None, False, time.perf_counter() - start
                ), ""
            try:  # jailed: the jail enforces timeout_s itself; this is the backstop
                code_ = proc.wait(timeout=limits.timeout_s + (10 if jailed else 0))
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc)
                code_ = proc.wait()
            _kill_group(proc)  # unjailed: anything the code left behind in its session
            if jailed and not timed_out:
                try:
                    status = json.loads(_tail(files["status"], 1000))
                    code_, timed_out = status["code"], status["timed_out"]
                except ValueError:  # the jail did not report: setup failed; stderr says why
                    code_ = SETUP_FAILED if code_ == 0 else code_
            values = _tail(files["results"], limits.max_file_bytes)
        finally:
            for f in files.values():
                f.close()
        stdout, t1 = _read(os.path.join(io_dir, "stdout"), limits.max_output_chars)
        stderr, t2 = _read(os.path.join(io_dir, "stderr"), limits.max_output_chars, tail=True)
    status = _status(code_, timed_out, stderr)
    return SandboxResult(status, stdout, stderr, code_, t1 or t2, time.perf_counter() - start), values


def _tail(f, limit: int) -> str:
    f.seek(0)
    return f.read(limit).decode("utf-8", errors="replace")


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def extract_code(completion: str) -> str:
    """The code of a completion: the last ```python (or ```) fenced block, else the whole text."""
    blocks = [b.split("\n", 1)[1] if "\n" in b else "" for b in completion.split("```")[1::2]]
    return blocks[-1] if blocks else completion


def run_tests(
    code: str, tests: list[str], limits: SandboxLimits | None = None, setup: str = ""
) -> tuple[int, int, SandboxResult]:
    """Run `code` in the sandbox, then judge each test (an assert such as `assert f(2) == 4`) outside it.

    Returns (tests passed, tests given, the run). The calls of the tests into the code (`f(2)`) are evaluated in
    the sandbox after the code, each returning its value as data; the assertions are evaluated here on those
    values (`lmrl.sandbox.verdict`), so the sandboxed process never sees an expected value and cannot report a
    pass: fake counts, replaced builtins, early exits, always-equal objects and loops pass nothing. Expected
    values that are not literals (`math.factorial(3)`, a name bound by `setup`, trusted code of the dataset) are
    computed in a second sandboxed process that runs `setup` and never loads `code`. A test that is not such an
    assert raises ValueError naming it.
    """
    if not tests:
        raise ValueError("run_tests needs at least one test statement, e.g. 'assert f(1) == 2'.")
    calls: list[str] = []
    refs: list[tuple[str, tuple[int, ...]]] = []
    names = sandbox_verdict.setup_names(setup)
    assertions = [sandbox_verdict.split_test(t, calls, refs, names) for t in tests]
    limits = dataclasses.replace(
        limits or SandboxLimits(), max_output_chars=max((limits or SandboxLimits()).max_output_chars, 10_000)
    )
    result, text = _execute(code, limits, calls=calls, imports=_modules(calls))
    values = sandbox_verdict.parse_values(text, len(calls))
    references = _references(setup, refs, values, limits) if refs else []
    return sum(sandbox_verdict.passes(a, values, references) for a in assertions), len(tests), result


def _modules(calls: list[str]) -> list[str]:
    """Standard-library modules the calls name (`f(math.pi)`): imported for them when the code did not."""
    import ast

    used = {n.id for c in calls for n in ast.walk(ast.parse(c, mode="eval")) if isinstance(n, ast.Name)}
    return sorted(used & sandbox_verdict.MODULES)


_REFERENCE_CACHE: dict = {}
"""expected values that use no value of the candidate, by (setup, expressions, limits): one process per test set"""


def _references(setup: str, refs: list, values: list, limits: SandboxLimits) -> list:
    """The reference expressions' values, from a sandboxed process that runs the setup, never the candidate."""
    key = (setup, tuple(refs), limits)
    if key in _REFERENCE_CACHE:
        return _REFERENCE_CACHE[key]
    program = sandbox_verdict.reference_program(setup, refs, values)
    result, text = _execute(program, limits, calls=[source for source, _ in refs])
    references = sandbox_verdict.parse_values(text, len(refs))
    if result.status == "ok" and not any(deps for _, deps in refs):
        if len(_REFERENCE_CACHE) > 256:
            _REFERENCE_CACHE.clear()
        _REFERENCE_CACHE[key] = references
    return references

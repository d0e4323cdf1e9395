"""The sandbox stops or refuses each thing it promises to, and says why."""

import os
import tempfile

import pytest

from lmrl import sandbox
from lmrl.sandbox import SandboxLimits, network_namespace_available, run_python, runner

LIMITS = SandboxLimits(timeout_s=3, cpu_s=2, memory_mb=256, max_output_chars=200)


def test_ordinary_code_runs_and_prints():
    result = run_python("import math\nprint(math.factorial(10))", LIMITS)
    assert (result.status, result.stdout, result.exit_code, result.truncated) == ("ok", "3628800\n", 0, False)


def test_an_infinite_loop_is_killed_for_time():
    result = run_python("while True:\n    pass", LIMITS)
    assert result.status == "timeout" and "time limit" in result.text()
    assert result.seconds < 6


def test_a_sleeping_program_is_killed_at_the_wall_clock_limit():
    result = run_python("import time\ntime.sleep(60)", SandboxLimits(timeout_s=1))
    assert result.status == "timeout" and result.exit_code == -9 and result.seconds < 4


def test_a_fork_bomb_is_refused():
    result = run_python("import os\nwhile True:\n    os.fork()", LIMITS)
    assert result.status == "error" and "starting processes is not allowed" in result.stderr


def test_subprocesses_are_refused():
    result = run_python("import subprocess\nsubprocess.run(['ls'])", LIMITS)
    assert result.status == "error" and "starting processes is not allowed" in result.stderr


def test_a_1gb_allocation_hits_the_memory_limit():
    result = run_python("x = bytearray(1 << 30)\nprint('allocated')", LIMITS)
    assert result.status == "memory" and "allocated" not in result.stdout and "memory limit" in result.text()


def test_a_network_connection_is_refused():
    code = "import socket\ns = socket.socket()\ns.settimeout(2)\ns.connect(('1.1.1.1', 80))\nprint('connected')"
    result = run_python(code, LIMITS)
    assert result.status == "error" and "network access is disabled" in result.stderr
    assert "connected" not in result.stdout


@pytest.mark.skipif(not network_namespace_available(), reason="no user namespaces here")
def test_the_network_namespace_has_only_loopback():
    # netlink sockets are refused (seccomp), so read the interfaces of this network namespace from /proc
    result = run_python("print(sorted(l.split(':')[0].strip() for l in open('/proc/net/dev').readlines()[2:]))", LIMITS)
    assert result.status == "ok" and result.stdout.strip() == "['lo']"


def test_a_write_outside_the_temp_dir_is_refused(tmp_path):
    target = tmp_path / "evil.txt"
    result = run_python(f"open({str(target)!r}, 'w').write('x')", LIMITS)
    assert result.status == "error" and "No such file or directory" in result.stderr  # the host's /tmp is not there
    assert not target.exists()
    result = run_python("open('/usr/evil.txt', 'w').write('x')", LIMITS)
    assert result.status == "error" and "writing outside the sandbox directory" in result.stderr


def test_deleting_outside_the_temp_dir_is_refused(tmp_path):
    victim = tmp_path / "keep.txt"
    victim.write_text("x")
    result = run_python(f"import os\nos.remove({str(victim)!r})", LIMITS)
    assert result.status == "error" and victim.exists()


def test_each_run_has_a_private_temp_dir_that_is_removed():
    before = set(os.listdir(tempfile.gettempdir()))
    first = run_python("import os\nopen('note.txt', 'w').write('hi')\nprint(os.getcwd())", LIMITS)
    second = run_python("import os\nprint(os.path.exists('note.txt'))", LIMITS)
    assert first.status == "ok" and first.stdout == "/tmp\n" and second.stdout.strip() == "False"
    assert not {n for n in set(os.listdir(tempfile.gettempdir())) - before if n.startswith("lmrl-sandbox-")}


def test_output_is_cut_with_a_marker_and_counted():
    result = run_python("print('a' * 5000)", LIMITS)
    assert result.status == "ok" and result.truncated
    assert result.stdout.startswith("a" * 200) and "[output truncated: 4801 more characters]" in result.stdout


def test_huge_files_hit_the_file_size_limit():
    result = run_python("open('big', 'wb').write(b'a' * (4 << 20))", SandboxLimits(max_file_bytes=1 << 20))
    assert result.status == "output_limit" and "size limit" in result.text()


def test_an_exception_is_an_error_with_the_traceback_of_the_code_only():
    result = run_python("def f():\n    raise ValueError('boom')\nf()", LIMITS)
    assert result.status == "error" and result.exit_code == 1
    assert "ValueError: boom" in result.stderr and "runner" not in result.stderr


def test_bad_limits_fail_clearly():
    with pytest.raises(ValueError, match="timeout_s"):
        SandboxLimits(timeout_s=0)


def test_isolation_none_is_an_opt_in_with_a_warning():
    runner._warn_unisolated.cache_clear()
    with pytest.warns(UserWarning, match="isolation='none'"):
        sandbox.require_isolation("none")
    result = run_python("print(6 * 7)", SandboxLimits(isolation="none"))
    assert result.status == "ok" and result.stdout == "42\n"
    with pytest.raises(ValueError, match="isolation"):
        SandboxLimits(isolation="docker")


def test_a_machine_without_namespaces_fails_with_the_fix(monkeypatch):
    monkeypatch.setattr(runner, "isolation_problem", lambda: "unshare: Operation not permitted")
    with pytest.raises(RuntimeError, match="sandbox=none"):
        run_python("print(1)", SandboxLimits(isolation="namespaces"))


SHM_FLOOD = """import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
libc.shmdt.argtypes = [ctypes.c_void_p]
held = 0
big = libc.shmget(0, 1 << 30, 0o1600)  # one 1 GiB segment: attaching it alone would hit RLIMIT_AS
print('one GiB segment', big, flush=True)
for _ in range(16):  # 16 x 64 MiB, each touched and detached: the segments stay, outside the address space
    shmid = libc.shmget(0, 64 << 20, 0o1600)
    addr = libc.shmat(shmid, None, 0) if shmid >= 0 else None
    if addr in (None, 2**64 - 1):
        break
    ctypes.memset(addr, 1, 64 << 20)
    libc.shmdt(addr)
    held += 64
print('held', held, flush=True)
"""
MEMFD_FLOOD = """import os
fd = os.memfd_create('grow')
for _ in range(1024):
    os.write(fd, b'x' * (1 << 20))
print('held 1024', flush=True)
"""


def _host_shmem_mib() -> int:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) >> 10 for line in f if line.startswith("Shmem:"))


@pytest.mark.skipif(not network_namespace_available(), reason="no namespace sandbox here")
def test_shared_memory_and_memfds_cannot_pass_the_memory_cap():
    # issue 46: memory_mb=128 let SysV shm hold 1 GiB of host memory (RLIMIT_AS does not see it); now refused
    import threading

    limits = SandboxLimits(timeout_s=10, cpu_s=5, memory_mb=128)
    base, peak, done = _host_shmem_mib(), [0], threading.Event()

    def watch():
        while not done.is_set():
            peak[0] = max(peak[0], _host_shmem_mib() - base)
            done.wait(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        shm = run_python(SHM_FLOOD, limits)
        memfd = run_python(MEMFD_FLOOD, limits)
    finally:
        done.set()
        watcher.join()
    assert "one GiB segment -1" in shm.stdout and "held 0" in shm.stdout, shm
    assert "held 1024" not in memfd.stdout and memfd.status != "ok", memfd
    assert peak[0] < 128, f"the host's shared memory grew by {peak[0]} MiB during the runs"

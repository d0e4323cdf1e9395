"""The sandbox's jail: run as a fresh script (`python -I -S -B jail.py CONFIG`), never imported by lmrl.

It is the trusted side of `lmrl.sandbox`, standard library only (no lmrl, no torch: it starts in ~10 ms). With
`isolation: namespaces` it builds, for one execution:

    supervisor S (real uid)  ── writes the uid/gid maps of C's user namespace (needs CAP_SETUID outside: root)
      └─ C (new user, mount, pid, net, ipc, uts namespaces)   wall-clock timeout; reports B's exit status on fd 4
           └─ B = pid 1 of the new pid namespace: mounts the new root, pivot_root, drops to uid 1 (outside:
              nobody), no_new_privs, rlimits, seccomp; then runs the untrusted code and the test calls

B's filesystem: a tmpfs root holding read-only, nosuid, nodev binds of /usr, the interpreter and its venv, and a
few /etc files; a fresh /proc (this pid namespace only, read-only); /dev with null, zero, full, random,
urandom; a private, size-capped tmpfs /tmp (the working directory). When B exits, the kernel kills every
process left in its pid namespace. With `isolation: none` the code runs in this process with rlimits and the
audit hook only (a documented weaker mode).
"""

import ctypes
import fcntl
import json
import os
import resource
import select
import signal
import sys

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = (
    1,
    2,
    4,
    8,
    32,
    4096,
    16384,
    1 << 18,
)
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 24, 38
SYSCALLS = {"x86_64": {"pivot_root": 155, "capset": 126}, "aarch64": {"pivot_root": 41, "capset": 91}}
SANDBOX_UID = 1
"""the uid the code runs as inside; outside it is NOBODY when lmrl runs as root"""
NOBODY = 65534
SETUP_FAILED = 125
ETC_FILES = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/localtime",
    "/etc/nsswitch.conf",
    "/etc/passwd",
    "/etc/group",
    "/etc/mime.types",
)
DEVICES = ("null", "zero", "full", "random", "urandom")
# Refused with EPERM (ENOSYS for clone3, so libc falls back to clone): ways to reach the kernel's less-audited
# corners or other processes. Names missing on an architecture are skipped.
DENY = tuple(
    """
ptrace process_vm_readv process_vm_writev mount umount2 pivot_root chroot unshare setns keyctl add_key
request_key bpf perf_event_open userfaultfd io_uring_setup io_uring_enter io_uring_register kexec_load
kexec_file_load init_module finit_module delete_module reboot swapon swapoff acct quotactl syslog
open_by_handle_at name_to_handle_at fsopen fsconfig fsmount fspick open_tree move_mount mount_setattr
lookup_dcookie vhangup sethostname setdomainname settimeofday clock_settime adjtimex clock_adjtime kcmp
pidfd_getfd personality uselib ioperm iopl modify_ldt
shmget shmat shmdt shmctl msgget msgsnd msgrcv msgctl semget semop semtimedop semctl ipc memfd_create memfd_secret
mq_open mq_timedsend mq_timedreceive mq_notify mq_getsetattr mq_unlink
""".split()
)
# Memory that RLIMIT_AS does not see (issue 46): System V shared memory, message queues and semaphores, POSIX
# message queues and memfds live in the kernel, not in the address space, and outlive a detach. Besides the
# seccomp rules above, the IPC namespace's own limits are set to 0 (where the kernel lets its root write them), so
# the bound holds without libseccomp too; memfds are then capped by RLIMIT_FSIZE per file and RLIMIT_NOFILE.
IPC_LIMITS = {
    "shmmni": "0",
    "shmall": "0",
    "shmmax": "0",
    "msgmni": "0",
    "msgmnb": "0",
    "sem": "0 0 0 0",
}

# Installed before the code runs: friendly refusals for Python code (the kernel refuses the rest).
_AUDIT = r"""
import os, sys
def _install(root):
    write = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    def inside(path):
        try:
            p = os.path.realpath(os.fsdecode(path))
        except Exception:
            return False
        return p == root or p.startswith(root + os.sep)
    def hook(event, args):
        if event == "socket.__new__" and args[1] != 1:  # only AF_UNIX
            raise PermissionError("sandbox: network access is disabled")
        if event in ("socket.connect", "socket.bind", "socket.sendto", "socket.getaddrinfo"):
            raise PermissionError("sandbox: network access is disabled")
        if event == "open" and args[0] is not None and not isinstance(args[0], int):
            mode, flags = args[1], args[2]
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (flags or 0) & write
            if writing and not inside(args[0]):
                raise PermissionError(f"sandbox: writing outside the sandbox directory is not allowed: {args[0]}")
        if event in ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.link", "os.symlink",
                     "os.truncate", "shutil.rmtree", "os.chown", "os.utime"):
            if not all(inside(a) for a in args[:2] if isinstance(a, (str, bytes, os.PathLike))):
                raise PermissionError(f"sandbox: {event} outside the sandbox directory is not allowed")
        if event in ("os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec", "os.system",
                     "subprocess.Popen", "pty.spawn"):
            raise PermissionError(f"sandbox: starting processes is not allowed ({event})")
    sys.addaudithook(hook)
"""

_libc = ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> int:
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")
    return ret


def _encode(text):
    return None if text is None else os.fsencode(text)


def _mount(src, target, fstype, flags, data=None) -> None:
    enc = _encode
    _check(_libc.mount(enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


def _syscall(name: str, *args) -> int:
    number = SYSCALLS.get(os.uname().machine, {}).get(name)
    if number is None:
        raise OSError(f"no {name} syscall number for {os.uname().machine}")
    return _check(_libc.syscall(ctypes.c_long(number), *args), name)


def _locked_flags(path: str) -> int:
    """The mount flags of `path` that a remount inside a user namespace must keep (the kernel locks them)."""
    f = os.statvfs(path).f_flag
    return sum(flag for st, flag in ((2, MS_NOSUID), (4, MS_NODEV), (8, MS_NOEXEC)) if f & st)


def _bind(src: str, root: str, writable: bool = False) -> None:
    target = root + src
    if os.path.isdir(src):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()
    _mount(src, target, None, MS_BIND | MS_REC)
    flags = MS_REMOUNT | MS_BIND | MS_NOSUID | _locked_flags(src) | (0 if writable else MS_RDONLY)
    _mount(None, target, None, flags | (0 if src.startswith("/dev/") else MS_NODEV))


def zero_ipc_limits() -> list[str]:
    """B, before the new /proc: set this IPC namespace's SysV limits to 0; the names that could not be set."""
    failed = []
    for name, value in IPC_LIMITS.items():
        try:
            with open(f"/proc/sys/kernel/{name}", "w") as f:
                f.write(value)
        except OSError:
            failed.append(name)
    return failed


def build_root(cfg: dict) -> None:
    """B, inside-root of the new namespaces: the new filesystem view, then pivot_root into it."""
    limits = cfg["limits"]
    root = cfg["root"]
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,nr_inodes=4096,mode=0755")
    # the private /tmp first: a venv that lives under the host's /tmp (a CI checkout) is then bound inside it
    os.makedirs(root + "/tmp")
    size = f"size={limits['disk_mb']}m,nr_inodes=4096,mode=0700,uid={SANDBOX_UID},gid={SANDBOX_UID}"
    _mount("tmpfs", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, size)
    for path in sorted(set(cfg["binds"])):
        if os.path.islink(path) and os.path.dirname(path) == "/":  # merged /usr: /bin -> usr/bin
            os.symlink(os.readlink(path), root + path)
        elif os.path.exists(path):
            _bind(path, root)
    os.makedirs(root + "/etc", exist_ok=True)
    for path in ETC_FILES:
        if os.path.isfile(path):
            _bind(path, root)
    os.makedirs(root + "/dev", exist_ok=True)
    for dev in DEVICES:
        if os.path.exists("/dev/" + dev):
            _bind("/dev/" + dev, root, writable=True)
    for name, target in (
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ):
        os.symlink(target, f"{root}/dev/{name}")
    os.makedirs(root + "/proc")
    _mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY)
    os.chdir(root)
    _syscall("pivot_root", b".", b".")  # the old root is stacked on "." and detached next
    _check(_libc.umount2(b".", MNT_DETACH), "umount old root")
    os.chdir("/")
    _mount(None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def drop_privileges(real_root: bool) -> None:
    """No capabilities left, none to gain by exec; as root outside, become uid 1 (outside: nobody)."""
    for cap in range(64):
        if _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0:
            break
    if real_root:
        os.setgroups([])
        os.setresgid(SANDBOX_UID, SANDBOX_UID, SANDBOX_UID)
        os.setresuid(SANDBOX_UID, SANDBOX_UID, SANDBOX_UID)  # from 0 to non-zero clears every capability
    else:
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
        _syscall("capset", header, (ctypes.c_uint32 * 6)())
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def set_limits(limits: dict) -> None:
    cpu = int(limits["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))  # pid 1 ignores SIGXCPU: the hard limit's SIGKILL ends it
    mem = limits["memory_mb"] << 20
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["max_file_bytes"], limits["max_file_bytes"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    resource.setrlimit(resource.RLIMIT_MSGQUEUE, (0, 0))  # POSIX message queues: kernel memory, not address space
    resource.setrlimit(resource.RLIMIT_NPROC, (limits["max_processes"], limits["max_processes"]))


def find_seccomp():
    """libseccomp through ctypes (loaded before pivot_root), or None when it is not installed."""
    try:
        return ctypes.CDLL("libseccomp.so.2")
    except OSError:
        return None


def load_seccomp(lib) -> bool:
    """A deny-list filter; False when libseccomp is missing (the namespaces, rlimits and no_new_privs still hold)."""
    if lib is None:
        return False
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.c_void_p,
    ]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]

    class Arg(ctypes.Structure):
        _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("a", ctypes.c_uint64), ("b", ctypes.c_uint64)]

    ctx = lib.seccomp_init(ctypes.c_uint32(0x7FFF0000))  # default: allow
    if not ctx:
        return False
    eperm, enosys = 0x00050000 | 1, 0x00050000 | 38

    def rule(syscall: str, action: int, *args: Arg) -> None:
        nr = lib.seccomp_syscall_resolve_name(syscall.encode())
        if nr >= 0:
            array = (Arg * len(args))(*args) if args else None
            _check(lib.seccomp_rule_add_array(ctx, action, nr, len(args), array), f"seccomp rule {syscall}")

    for syscall in DENY:
        rule(syscall, eperm)
    rule("clone3", enosys)
    rule("clone", eperm, Arg(0, 7, CLONE_NEWUSER, CLONE_NEWUSER))  # SCMP_CMP_MASKED_EQ: no new user namespace
    rule("socket", eperm, Arg(0, 1, 1, 0))  # SCMP_CMP_NE AF_UNIX: only unix sockets (inside this netns)
    rule("ioctl", eperm, Arg(1, 7, 0xFFFFFFFF, 0x5412))  # TIOCSTI: no typing into a terminal
    _check(lib.seccomp_load(ctypes.c_void_p(ctx)), "seccomp_load")
    return True


def run_code(cfg: dict, root: str) -> None:
    """Run the untrusted code as __main__, then each test call, writing `index<TAB>repr` lines to fd 3."""
    import builtins

    sys.argv = ["<sandbox>", *cfg["args"]]
    os.environ.clear()
    os.environ.update(cfg["env"])
    sys.path.extend(cfg["site_packages"])  # not site.main(): its .pth files cost ~30 ms a run
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    audit = {}
    exec(_AUDIT, audit)
    audit["_install"](root)
    try:
        exec(compile(cfg["code"], "<sandbox>", "exec"), namespace)
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001 - the code's error is its output
        import traceback

        traceback.print_exception(type(e), e, e.__traceback__.tb_next)
        sys.exit(1)
    for module in cfg.get("imports", ()):  # the tests' modules (`f(math.pi)`), where the code did not bind the name
        if module not in namespace:
            try:
                namespace[module] = __import__(module)
            except BaseException:  # noqa: BLE001 - the calls that use it fail
                pass
    for i, expr in enumerate(cfg["calls"]):
        try:
            text = repr(eval(compile(expr, "<test>", "eval"), namespace))
            text = text if len(text) <= cfg["max_value_chars"] else "!too large"
        except BaseException as e:  # noqa: BLE001 - a failing call fails its tests only
            text = "!" + type(e).__name__
        os.write(3, f"{i}\t{text}\n".encode("utf-8", "replace"))


def jailed(cfg: dict, real_root: bool) -> None:
    """B: build the view, drop everything, run the code; setup errors exit SETUP_FAILED with the reason."""
    try:
        seccomp = find_seccomp()
        zero_ipc_limits()  # best effort: seccomp refuses these calls anyway where libseccomp is installed
        build_root(cfg)
        os.chdir("/tmp")
        drop_privileges(real_root)
        _check(_libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")  # C gone: B goes too
        os.closerange(4, 1 << 16)
        set_limits(cfg["limits"])
        if not load_seccomp(seccomp) and cfg["require_seccomp"]:
            raise OSError("libseccomp is not installed (apt-get install libseccomp2), or set require_seccomp=False")
    except Exception as exc:  # noqa: BLE001 - reported to the caller, which names the fix
        os.write(2, f"sandbox: setup failed: {exc}\n".encode())
        os._exit(SETUP_FAILED)
    run_code(cfg, "/tmp")


def _run_to_exit(fn, *args) -> int:
    """Call fn; the exit status the interpreter would give (SystemExit included), output flushed."""
    code = 0
    try:
        fn(*args)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001
        import traceback

        traceback.print_exc()
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed or full stream
            pass
    return code


def child(cfg: dict, ready_w: int, go_r: int, real_root: bool) -> None:
    """C: unshare, wait for S to write the id maps, fork B (pid 1), wait for it with the wall-clock limit."""
    status_fd = 4
    try:
        _check(
            _libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS),
            "unshare",
        )
        os.write(ready_w, b"1")
        if os.read(go_r, 1) != b"1":
            raise OSError("the supervisor did not map the ids")
        pid = os.fork()
    except Exception as exc:  # noqa: BLE001
        os.write(2, f"sandbox: setup failed: {exc}\n".encode())
        os._exit(SETUP_FAILED)
    if pid == 0:
        os._exit(_run_to_exit(jailed, cfg, real_root))
    timed_out = not select.select([os.pidfd_open(pid)], [], [], cfg["limits"]["timeout_s"])[0]
    if timed_out:
        os.kill(pid, signal.SIGKILL)  # pid 1 of the namespace: every process in it dies with it
    _, status = os.waitpid(pid, 0)
    os.write(status_fd, json.dumps({"code": os.waitstatus_to_exitcode(status), "timed_out": timed_out}).encode())
    os._exit(0)


def supervise(cfg: dict) -> int:
    """S: fork C, give its user namespace uid/gid maps, wait for it."""
    real_root = os.geteuid() == 0
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        os.close(go_w)
        os._exit(_run_to_exit(child, cfg, ready_w, go_r, real_root))
    os.close(ready_w)
    os.close(go_r)
    try:
        if os.read(ready_r, 1) == b"1":
            if real_root:
                maps = {
                    "uid_map": f"0 0 1\n{SANDBOX_UID} {NOBODY} 1\n",
                    "gid_map": f"0 0 1\n{SANDBOX_UID} {NOBODY} 1\n",
                }
            else:
                with open(f"/proc/{pid}/setgroups", "w") as f:
                    f.write("deny")
                maps = {"uid_map": f"0 {os.geteuid()} 1\n", "gid_map": f"0 {os.getegid()} 1\n"}
            for name, text in maps.items():
                with open(f"/proc/{pid}/{name}", "w") as f:
                    f.write(text)
            os.write(go_w, b"1")
    except OSError as exc:
        os.write(2, f"sandbox: setup failed: cannot map user ids: {exc}\n".encode())
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def unjailed(cfg: dict) -> None:
    """isolation: none: this process, rlimits and the audit hook only."""
    set_limits({**cfg["limits"], "max_processes": resource.getrlimit(resource.RLIMIT_NPROC)[0]})
    run_code(cfg, os.path.realpath(os.getcwd()))


def main() -> None:
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in cfg["fds"]]  # the results and status files: fd 3, 4
    for fd, target in zip(moved, (3, 4)):
        os.dup2(fd, target)
        os.close(fd)
    if cfg["isolation"] == "none":
        unjailed(cfg)
        return
    os._exit(supervise(cfg))


if __name__ == "__main__":
    main()

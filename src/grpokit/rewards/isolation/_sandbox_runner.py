"""Child side of :mod:`grpokit.rewards.isolation.sandbox`: confine this process, then run untrusted code
and its tests.

Run as ``python -I -S -c <this file's source> grpokit-sandbox`` with a JSON job file on stdin (see
``sandbox._job``); imports only the standard library. Reports ``ready`` (or ``error ...``) on stderr and
``<nonce> <test index> <1|0>`` lines on stdout, both files in a directory only the parent can open.
Order matters: everything that needs root (mounts, oom score) happens first, then the switch to the sandbox
user, then resource limits, then the Python-level guards, then the untrusted code.
"""

import _posixsubprocess
import ctypes
import json
import os
import posix
import re
import resource
import signal
import socket
import stat
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC = 32, 4096, 16384
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
COMMON_MODULES = (
    "abc array bisect cmath collections copy dataclasses datetime decimal enum fractions functools heapq "
    "itertools json math numbers operator random re statistics string struct textwrap typing unicodedata"
)


LIBC = ctypes.CDLL(None, use_errno=True)


def _bytes(text):
    return None if text is None else os.fsencode(text)


def _mount(source, target, fstype, flags, data=None):
    """mount(2); raises OSError on failure."""
    if LIBC.mount(_bytes(source), _bytes(target), _bytes(fstype), flags, _bytes(data)) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno), target)


def _mount_points():
    """Mount points of this (private) mount namespace, octal escapes of /proc/self/mounts decoded."""
    points = []
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[1])
            if point not in points:
                points.append(point)
    return points


def _remount_read_only():
    """Make every mount of this namespace read-only. MS_BIND makes it a per-mount flag: the host's mounts
    (other namespace) stay writable; keeping nosuid/nodev/noexec avoids loosening anything."""
    for point in _mount_points():
        try:
            keep = os.statvfs(point).f_flag & (MS_NOSUID | MS_NODEV | MS_NOEXEC)
            _mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | keep)
        except OSError:
            pass  # e.g. a mount point hidden by another mount; its parent is read-only anyway


def _setup_filesystem(job):
    """Namespace mode: read-only filesystem, private size-limited tmpfs on /tmp, /var/tmp, /dev/shm, the
    standard library bind-mounted where the sandbox user can read it, and an empty working directory."""
    _remount_read_only()
    size = f"size={job['tmpfs_mb']}m"
    for point in ("/tmp", "/var/tmp", "/dev/shm"):
        if os.path.isdir(point):
            _mount("tmpfs", point, "tmpfs", MS_NOSUID | MS_NODEV, size + ",mode=1777")
    lib_root = "/tmp/.grpokit-lib"
    os.mkdir(lib_root, 0o755)
    for index, path in enumerate(list(sys.path)):
        if os.path.isdir(path):
            target = f"{lib_root}/{index}"
            os.mkdir(target, 0o755)
            _mount(path, target, None, MS_BIND | MS_REC)
            _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
            sys.path[index] = target
    workdir = "/tmp/work"
    os.mkdir(workdir, 0o700)
    if job["uid"] is not None and os.geteuid() == 0:
        os.chown(workdir, job["uid"], job["uid"])
    os.chdir(workdir)


def _stdlib_readable_by_others():
    """Can a different, unprivileged user traverse and read the standard library directory?"""
    path = os.path.dirname(os.__file__)
    while path and path != "/":
        if not os.stat(path).st_mode & stat.S_IXOTH:
            return False
        path = os.path.dirname(path)
    return True


def _drop_privileges(job):
    """Root only (``uid`` is None otherwise, also inside a user namespace): become ``uid`` (group ``uid``,
    no supplementary groups), so the kernel applies RLIMIT_NPROC and file permissions; then forbid
    regaining privileges (setuid binaries) and ask to be SIGKILLed if the parent dies (the credential
    change cleared that)."""
    uid = job["uid"]
    if uid is not None and os.geteuid() == 0:
        if not job["namespace"] and not _stdlib_readable_by_others():
            for name in COMMON_MODULES.split():
                __import__(name)  # the new user could not import them from a private directory
        os.setgroups([])  # a failure raises: the parent reports it, nothing runs as root by accident
        os.setgid(uid)
        os.setuid(uid)
    LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    # The "parent" of PDEATHSIG is the thread that started us; sandbox.py's caller blocks in that thread
    # until we are dead, so this fires only when the trainer itself dies.
    LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _set_limits(job):
    """Kernel resource limits (soft = hard, so the code cannot raise them again)."""

    def cap(which, value):
        resource.setrlimit(which, (value, value))

    cap(resource.RLIMIT_CPU, job["cpu_seconds"])
    cap(resource.RLIMIT_AS, job["memory_mb"] * 1024 * 1024)
    cap(resource.RLIMIT_FSIZE, job["file_size_mb"] * 1024 * 1024)
    cap(resource.RLIMIT_NOFILE, 64)
    cap(resource.RLIMIT_CORE, 0)
    cap(resource.RLIMIT_NPROC, job["nproc"])
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an oversized write fails with EFBIG instead of killing


def _install_guards():
    """Python-level speed bumps: process creation, signals, sockets and ctypes raise PermissionError.
    Not a security boundary (a determined program can reach the originals); the kernel layers are."""

    def blocked(*args, **kwargs):
        raise PermissionError("disabled in the grpokit sandbox")

    names = (
        "fork forkpty system popen kill killpg posix_spawn posix_spawnp execv execve execl execle execlp "
        "execlpe execvp execvpe spawnv spawnve spawnvp spawnvpe spawnl spawnle spawnlp spawnlpe"
    )
    for module in (os, posix):
        for name in names.split():
            if hasattr(module, name):
                setattr(module, name, blocked)
    _posixsubprocess.fork_exec = blocked
    socket.socket = socket.SocketType = socket.create_connection = socket.socketpair = blocked
    sys.modules["_socket"].socket = blocked
    for name in ("ctypes", "_ctypes"):
        sys.modules[name] = None


class _TestTimeout(BaseException):
    """Raised by the per-test alarm; a BaseException so ``except Exception`` in the code cannot swallow it."""


def _run(source, namespace, seconds, filename):
    """exec ``source`` in ``namespace`` under a SIGALRM deadline; True when it raised nothing."""

    def on_alarm(signum, frame):
        raise _TestTimeout()

    signal.signal(signal.SIGALRM, on_alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, seconds)
        exec(compile(source, filename, "exec"), namespace)
        return True
    except BaseException:
        return False
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def main():
    """Read the job, confine the process, run the code, then each test separately, reporting as we go (a
    program that raised fails every test).

    fd 2 is the status channel (``ready`` or ``error ...``), closed before the untrusted code runs so the
    code cannot fake or erase it; results go to a separate file (fd 1 at start) as ``<nonce> <index> <0|1>``.
    """
    job = json.loads(sys.stdin.read())
    report = os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    try:
        with open("/proc/self/oom_score_adj", "w") as oom:
            oom.write("1000")  # under memory pressure the kernel kills sandboxed code first
    except OSError:
        pass
    try:
        if job["namespace"]:
            _setup_filesystem(job)
        _drop_privileges(job)
        _set_limits(job)
        if job["guards"]:
            _install_guards()
    except BaseException as error:  # a broken sandbox is the trainer's problem, not a failed test
        os.write(2, f"error {type(error).__name__}: {error}\n".encode()[:4000])
        os._exit(70)
    os.write(2, b"ready\n")
    os.dup2(devnull, 2)
    nonce, tests = job.pop("nonce"), job.pop("tests")
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    # A program whose top-level code raises (an error, MemoryError at the limit, SystemExit, its deadline)
    # fails every test, as a judge scores a crashing submission; its tests are not run.
    program_ran = _run(job.pop("code"), namespace, job["timeout"], "<completion>")
    for index, test in enumerate(tests):
        passed = program_ran and _run(test, namespace, job["test_timeout"], f"<test {index}>")
        os.write(report, f"{nonce} {index} {int(passed)}\n".encode())
    os._exit(0)


if __name__ == "__main__":
    main()

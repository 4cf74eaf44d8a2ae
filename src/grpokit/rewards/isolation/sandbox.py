"""Run untrusted Python and its tests in a confined, disposable child process (Linux).

Layers, outermost first (docs/rewards.md lists what each one does and does not stop):

1. **Separate process** ``python -I -S``: isolated mode (no ``PYTHON*`` variables, no user site, script
   directory not on ``sys.path``), no ``site`` (standard library only); an **empty environment** (``env={}``);
   stdin ``/dev/null``; output to a size-limited file; in its **own session and process group**.
2. **Namespaces** (``isolation="namespace"``; chosen by ``"auto"`` when ``unshare`` works here): new network
   namespace (no interfaces but a down loopback: no network at all), PID namespace (the code sees only its own
   processes, cannot signal ours, and when its first process dies the kernel kills every process in it, even
   ones that left the process group), IPC namespace, and mount namespace in which every mount is made
   read-only and ``/tmp``, ``/var/tmp``, ``/dev/shm`` are fresh size-limited tmpfs that vanish with it; the
   working directory is an empty ``/tmp/work``. Without root it adds a user namespace, if the kernel allows.
3. **Unprivileged user**: when we are root, the child switches to ``user`` (default 65534, nobody) with no
   supplementary groups, so file permissions and RLIMIT_NPROC apply (the kernel exempts root from
   RLIMIT_NPROC), and sets ``no_new_privs`` (setuid binaries cannot give privileges back).
4. **Resource limits** (setrlimit, soft = hard): CPU seconds, address space, file size, 64 open files, no core
   dumps, RLIMIT_NPROC (counted per user, across all processes of that user), OOM score 1000.
5. **Python guards** (``python_guards=True``): ``os.fork``/``exec*``/``spawn*``/``system``/``kill``,
   ``subprocess``, sockets and ``ctypes`` raise PermissionError. A speed bump, not a boundary.
6. **Clean-up**: on exit or after ``timeout`` seconds of wall time, the PID namespace's init and the whole
   process group get SIGKILL, the temporary directory is deleted.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)
_RUNNER_SOURCE = Path(__file__).with_name("_sandbox_runner.py").read_text()
MARKER = "grpokit-sandbox"
"""Last argument of every sandbox process's command line (how tests find stray processes)."""
_MAX_REPORT_BYTES = 1 << 20


class SandboxError(RuntimeError):
    """The sandbox itself failed (could not start or confine the child): not the untrusted code's fault."""


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of one sandboxed run. Times in seconds, sizes in MiB."""

    timeout: float = 10.0
    """Wall-clock limit of the whole run (start, code, all tests); then every process is killed."""
    test_timeout: float = 3.0
    """Alarm for each test statement (SIGALRM; a test that traps it is still bounded by ``timeout``)."""
    cpu_seconds: int | None = None
    """RLIMIT_CPU per process; None: ceil(timeout)."""
    memory_mb: int = 1024
    """RLIMIT_AS per process (virtual address space)."""
    file_size_mb: int = 16
    """RLIMIT_FSIZE: largest file the code can write (also caps the report file)."""
    tmpfs_mb: int = 64
    """Size of each private tmpfs (``/tmp``, ``/var/tmp``, ``/dev/shm``) in namespace mode."""
    max_processes: int = 32
    """RLIMIT_NPROC: processes + threads of the sandbox user, all sandboxes running at once together."""
    isolation: str = "auto"
    """``"namespace"``, ``"process"`` (layers 1 and 3-6 only), or ``"auto"`` (namespace when it works)."""
    user: int | None = 65534
    """uid (and gid) to run as when we are root; None keeps root (then RLIMIT_NPROC does not apply)."""
    python_guards: bool = True
    """Install the Python-level guards of layer 5."""

    def __post_init__(self) -> None:
        if self.isolation not in ("auto", "namespace", "process"):
            raise ValueError(f"isolation must be 'auto', 'namespace' or 'process', got {self.isolation!r}")
        for name in ("timeout", "test_timeout", "memory_mb", "file_size_mb", "tmpfs_mb", "max_processes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SandboxLimits.{name} must be > 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of :func:`run_python_tests`: which tests passed, and how the run ended."""

    passed: tuple[bool, ...]
    timed_out: bool
    returncode: int | None
    isolation: str

    @property
    def fraction(self) -> float:
        """Fraction of tests passed (0.0 for no tests)."""
        return sum(self.passed) / len(self.passed) if self.passed else 0.0


def _namespace_argv() -> list[str] | None:
    """``unshare`` command prefix for layer 2, or None when unavailable (not Linux, no binary)."""
    unshare = shutil.which("unshare")
    if sys.platform != "linux" or unshare is None:
        return None
    argv = [unshare, "--net", "--pid", "--ipc", "--fork", "--kill-child", "--mount-proc"]
    if os.geteuid() != 0:
        argv[1:1] = ["--user", "--map-root-user"]
    return argv


@functools.cache
def namespaces_available() -> bool:
    """Can this process run the sandbox with namespaces? Probed once by running a trivial job."""
    if _namespace_argv() is None:
        return False
    try:
        result = _run_job("pass", ["assert True"], SandboxLimits(timeout=30.0), namespace=True)
    except (SandboxError, OSError):
        return False
    return result.passed == (True,)


def resolve_isolation(isolation: str) -> str:
    """``"auto"`` -> ``"namespace"`` if available else ``"process"``; an explicit mode is checked."""
    if isolation == "auto":
        if namespaces_available():
            return "namespace"
        _warn_process_mode()
        return "process"
    if isolation == "namespace" and not namespaces_available():
        raise SandboxError(
            "namespace isolation is unavailable (needs Linux, unshare, and root or user namespaces)"
        )
    return isolation


@functools.cache
def _warn_process_mode() -> None:
    logger.warning(
        "code sandbox: namespaces are unavailable (needs Linux, unshare, and root or user namespaces); "
        "running with process isolation only: no network or filesystem isolation beyond file permissions "
        "and Python-level guards (see docs/rewards.md)"
    )


def run_python_tests(code: str, tests: Sequence[str], limits: SandboxLimits | None = None) -> SandboxResult:
    """Run ``code``, then each test statement separately, in a fresh sandbox; report which tests passed.

    A test passes when it raises nothing. Tests share the code's global namespace, in order. Raises
    :class:`SandboxError` when the sandbox could not be set up (never for anything the code does).
    """
    limits = limits or SandboxLimits()
    mode = resolve_isolation(limits.isolation)
    return _run_job(code, list(tests), limits, namespace=mode == "namespace")


def _nproc_limit(limits: SandboxLimits) -> int:
    """RLIMIT_NPROC for the child: it counts every task of the child's real uid, so when the child keeps our
    (non-root) uid, our own current tasks are added to the allowance."""
    if os.geteuid() == 0:
        return limits.max_processes
    return _task_count(os.getuid()) + limits.max_processes


def _task_count(uid: int) -> int:
    """Number of tasks (threads included) whose real uid is ``uid``, from /proc."""
    count = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            status = Path(entry.path, "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(fields.get("Uid", "-1 0").split()[0]) == uid:
            count += int(fields.get("Threads", "1"))
    return count


def _job(code: str, tests: list[str], limits: SandboxLimits, namespace: bool, nonce: str) -> bytes:
    """The JSON job the runner reads from stdin."""
    uid = limits.user if os.geteuid() == 0 else None
    job = {
        "code": code,
        "tests": tests,
        "nonce": nonce,
        "namespace": namespace,
        "uid": uid,
        "guards": limits.python_guards,
        "timeout": limits.timeout,
        "test_timeout": limits.test_timeout,
        "cpu_seconds": limits.cpu_seconds or math.ceil(limits.timeout),
        "memory_mb": limits.memory_mb,
        "file_size_mb": limits.file_size_mb,
        "tmpfs_mb": limits.tmpfs_mb,
        "nproc": _nproc_limit(limits),
    }
    return json.dumps(job).encode()


def _run_job(code: str, tests: list[str], limits: SandboxLimits, *, namespace: bool) -> SandboxResult:
    nonce = secrets.token_hex(16)
    prefix = (_namespace_argv() or []) if namespace else []
    argv = [*prefix, sys.executable, "-I", "-S", "-c", _RUNNER_SOURCE, MARKER]
    with tempfile.TemporaryDirectory(prefix="grpokit-sandbox-") as private:  # mode 0700: only we can enter
        workdir = Path(private, "work")
        workdir.mkdir(mode=0o700)
        if os.geteuid() == 0 and limits.user is not None:
            os.chown(workdir, limits.user, limits.user)
        paths = {name: Path(private, name) for name in ("job", "report", "status")}
        paths["job"].write_bytes(_job(code, tests, limits, namespace, nonce))
        with open(paths["job"], "rb") as job, open(paths["report"], "wb") as report:
            with open(paths["status"], "wb") as status:
                proc = subprocess.Popen(
                    argv, stdin=job, stdout=report, stderr=status, cwd=workdir, env={},
                    start_new_session=True, close_fds=True,
                )  # fmt: skip
            try:
                timed_out = not _wait_unreaped(proc.pid, limits.timeout)
            finally:
                kill_process_tree(proc, namespace=namespace)
        status_text = paths["status"].read_bytes()[-4000:].decode(errors="replace")
        with open(paths["report"], "rb") as report:
            lines = report.read(_MAX_REPORT_BYTES).decode(errors="replace").splitlines()
    _check_status(status_text, timed_out)
    passed = _parse_report(lines, nonce, len(tests))
    return SandboxResult(passed, timed_out, proc.returncode, "namespace" if namespace else "process")


def _wait_unreaped(pid: int, timeout: float) -> bool:
    """Wait up to ``timeout`` s for ``pid`` to exit WITHOUT reaping it (``WNOWAIT``): while it is an
    unreaped zombie its pid, and so its process-group id, cannot be reused by an unrelated process, which
    makes the ``killpg`` that follows safe. True when it exited in time."""
    deadline = time.monotonic() + timeout
    pause = 0.001
    while True:
        if os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return True
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        time.sleep(min(pause, remaining))
        pause = min(pause * 2, 0.02)


def _check_status(status: str, timed_out: bool) -> None:
    """Raise :class:`SandboxError` unless the runner said ``ready`` before running the untrusted code."""
    if "ready" in status.splitlines():
        return
    if status.startswith("error"):
        raise SandboxError(f"the sandbox could not confine its process: {status.strip()}")
    reason = "did not start within the time limit" if timed_out else "exited before it was ready"
    raise SandboxError(f"the sandbox process {reason}: {status.strip()[-1000:]}")


def _parse_report(lines: list[str], nonce: str, num_tests: int) -> tuple[bool, ...]:
    """Test results from the runner's report; lines without our nonce (forged by the code) are ignored."""
    passed = [False] * num_tests
    for line in lines:
        parts = line.split(" ")
        if len(parts) == 3 and parts[0] == nonce and parts[1].isdigit() and int(parts[1]) < num_tests:
            passed[int(parts[1])] = parts[2] == "1"
    return tuple(passed)


def child_pids(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (from /proc)."""
    children = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
            children.append(int(entry.name))
    return children


def kill_process_tree(proc: subprocess.Popen[bytes], *, namespace: bool) -> None:
    """SIGKILL everything a sandbox started, then reap it.

    With namespaces, first the PID namespace's init (the child of ``unshare``): when it dies the kernel kills
    every process in the namespace, wherever it moved; ``unshare`` then reaps it and exits. Then the whole
    process group (the session ``start_new_session`` made; ``proc`` is still unreaped, so its id is ours).
    A process outside both cannot exist with namespaces; without them, one that called ``setsid()`` and
    escaped the group can survive (see docs/rewards.md).
    """
    if namespace:
        for pid in child_pids(proc.pid):
            _kill(os.kill, pid)
        _wait_unreaped(proc.pid, 2.0)  # unshare reaps its child and exits
    _kill(os.killpg, proc.pid)
    proc.wait()


def _kill(send: Callable[[int, int], None], target: int) -> None:
    """``send(target, SIGKILL)``, ignoring targets that are already gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        send(target, signal.SIGKILL)

"""The code sandbox against hostile programs.

Each namespace-mode test runs with the Python guards OFF, so it checks what the kernel layers (namespaces,
unprivileged user, rlimits, process-tree kill) guarantee on their own. Process-mode tests run with the guards
on: that is all process mode promises for sockets and process creation. Every test checks that no sandbox
process outlives it (``no_stray_processes``) and that the test process itself is still alive.
"""

from __future__ import annotations

import os
import secrets
import socket
import tempfile
import time
from pathlib import Path

import pytest

from grpokit.rewards.isolation.sandbox import (
    SandboxError,
    SandboxLimits,
    namespaces_available,
    run_python_tests,
)

pytestmark = [
    pytest.mark.skipif(not os.path.isdir("/proc"), reason="the sandbox needs Linux"),
    pytest.mark.usefixtures("no_stray_processes"),
]
needs_namespaces = pytest.mark.skipif(
    not hasattr(os, "geteuid") or not namespaces_available(), reason="namespaces are unavailable here"
)
TIMEOUT = 1.5
KERNEL_ONLY = SandboxLimits(timeout=TIMEOUT, test_timeout=1.0, isolation="namespace", python_guards=False)
PROCESS = SandboxLimits(timeout=TIMEOUT, test_timeout=1.0, isolation="process")
BOUND = TIMEOUT + 30.0  # the wall limit plus clean-up and start-up slack on a loaded 2-core machine


def run_bounded(code: str, tests: list[str], limits: SandboxLimits):
    start = time.monotonic()
    result = run_python_tests(code, tests, limits)
    assert time.monotonic() - start < BOUND
    return result


@pytest.fixture
def listener():
    """A TCP server on the host's loopback; yields (port, accepted) where accepted() says if anyone called."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(5)
    server.settimeout(0.2)

    def accepted() -> bool:
        try:
            connection, _ = server.accept()
        except TimeoutError:
            return False
        connection.close()
        return True

    yield server.getsockname()[1], accepted
    server.close()


@pytest.fixture
def secret_env(monkeypatch):
    value = secrets.token_hex(8)
    monkeypatch.setenv("GRPOKIT_TEST_SECRET", value)
    return value


def test_partial_credit_and_shared_namespace():
    code = "def add(a, b):\n    return a + b\ncounter = [0]\n"
    tests = ["assert add(1, 2) == 3", "assert add(1, 1) == 3", "counter[0] += 1", "assert counter == [1]"]
    result = run_bounded(code, tests, SandboxLimits(timeout=5.0))
    assert result.passed == (True, False, True, True)
    assert result.fraction == 0.75
    assert not result.timed_out


@pytest.mark.parametrize(
    "code",
    [
        "def f():\n    return 1\n1 / 0\n",
        "def f():\n    return 1\nraise SystemExit(input())\n",  # stdin is /dev/null: EOFError
        "def f():\n    return 1\nraise SystemExit(0)\n",
        "def f():\n    return 1\nraise MemoryError\n",
    ],
    ids=["ZeroDivisionError", "EOFError", "SystemExit", "MemoryError"],
)
def test_a_program_that_raises_fails_every_test(code):
    """Judged like a judge: top-level code that raises scores 0 on every test, also on tests that do not
    touch what failed (``assert True`` would otherwise keep full credit)."""
    result = run_bounded(code, ["assert f() == 1", "assert True"], SandboxLimits(timeout=5.0))
    assert result.passed == (False, False) and result.fraction == 0.0


def test_syntax_error_fails_every_test():
    assert run_bounded("def f(:\n", ["assert f() == 1", "assert True"], PROCESS).passed == (False, False)


def test_one_slow_test_does_not_hide_the_others():
    code = "def slow():\n    while True:\n        pass\n"
    result = run_bounded(
        code, ["assert 1 == 1", "slow()", "assert 2 == 2"], SandboxLimits(timeout=3.0, test_timeout=0.5)
    )
    assert result.passed == (True, False, True)


# --- hostile programs, kernel layers only (namespace mode, guards off) ------------------------------------


@needs_namespaces
@pytest.mark.parametrize(
    "code",
    [
        "while True:\n    pass",
        "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True:\n    pass",  # no alarm
        "import time\ntime.sleep(1000)",
    ],
    ids=["busy-loop", "loop-ignoring-alarm", "sleep"],
)
def test_infinite_loops_are_killed_at_the_wall_limit(code):
    result = run_bounded(code, ["assert done"], KERNEL_ONLY)
    assert result.passed == (False,)


@needs_namespaces
def test_fork_bomb_is_capped_and_every_fork_dies():
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    assert run_bounded(code, ["assert True"], KERNEL_ONLY).passed == (False,)


@needs_namespaces
@pytest.mark.skipif(os.geteuid() != 0, reason="RLIMIT_NPROC is exact only for the dedicated sandbox user")
def test_process_count_limit_holds():
    code = (
        "import os, time\n"
        "forks = 0\n"
        "while forks < 1000:\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(1000)\n"
        "    forks += 1\n"
    )
    limits = SandboxLimits(timeout=5.0, isolation="namespace", python_guards=False, max_processes=8)
    # 8 tasks for the sandbox user in all: the runner itself and at most 7 children
    assert run_bounded(code, ["assert forks <= 7", "assert forks >= 1"], limits).passed == (True, True)


@needs_namespaces
def test_daemonised_children_die_with_the_namespace():
    # setsid() leaves the process group; the PID namespace still holds the processes
    code = (
        "import os, time\n"
        "for _ in range(5):\n"
        "    if os.fork() == 0:\n"
        "        os.setsid()\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(1000)\n"
        "        os._exit(0)\n"
        "spawned = True\n"
    )
    assert run_bounded(code, ["assert spawned"], KERNEL_ONLY).passed == (True,)
    # no_stray_processes checks the grandchildren are gone


@needs_namespaces
@pytest.mark.parametrize("code", ["x = bytearray(50 * 1024**3)", "x = [1] * 10**10"], ids=["bytes", "list"])
def test_huge_allocation_fails_inside_the_sandbox(code):
    assert run_bounded(code, ["assert len(x) > 0"], KERNEL_ONLY).passed == (False,)


@needs_namespaces
def test_writes_outside_the_work_dir_never_reach_the_host(tmp_path):
    escape = Path(tempfile.gettempdir(), f"grpokit-escape-{secrets.token_hex(6)}")
    inside = tmp_path / "pwned"
    code = (
        "import os\n"
        f"open({str(escape)!r}, 'w').write('x')\n"  # /tmp inside is a private tmpfs
        "try:\n"
        f"    open({str(inside)!r}, 'w').write('x')\n"
        "except OSError:\n"
        "    pass\n"
        "open('local.txt', 'w').write('ok')\n"
    )
    tests = [f"assert open({str(inside)!r}).read() == 'x'", "assert open('local.txt').read() == 'ok'"]
    assert run_bounded(code, tests, KERNEL_ONLY).passed == (False, True)
    assert not escape.exists()
    assert not inside.exists()


@needs_namespaces
def test_filesystem_is_read_only_and_work_dir_starts_empty():
    tests = [
        "import os\nassert os.listdir('.') == []",
        "import os\nassert os.getcwd() == '/tmp/work'",
        f"open({__file__!r}, 'a').write('# pwned')",
        "open('/etc/grpokit-pwned', 'w')",
    ]
    assert run_bounded("", tests, KERNEL_ONLY).passed == (True, True, False, False)


@needs_namespaces
def test_caller_environment_is_invisible(secret_env):
    code = (
        "import os\n"
        "env = dict(os.environ)\n"
        "seen = ''\n"
        "for pid in os.listdir('/proc'):\n"
        "    try:\n"
        "        seen += open('/proc/' + pid + '/environ').read()\n"
        "    except OSError:\n"
        "        pass\n"
    )
    tests = [
        f"assert env.get('GRPOKIT_TEST_SECRET') == {secret_env!r}",
        f"assert {secret_env!r} in seen",
        "assert set(env) - {'LC_CTYPE'}",  # any variable but the one Python's locale coercion sets
    ]
    assert run_bounded(code, tests, KERNEL_ONLY).passed == (False, False, False)


@needs_namespaces
def test_no_network(listener):
    port, accepted = listener
    code = f"import socket\ns = socket.socket()\ns.settimeout(1)\ns.connect(('127.0.0.1', {port}))\nok = 1\n"
    assert run_bounded(code, ["assert ok"], KERNEL_ONLY).passed == (False,)
    assert not accepted()


@needs_namespaces
@pytest.mark.parametrize(
    "code",
    [
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)",
        "import os, signal\nos.kill(-1, signal.SIGKILL)",  # every process the sandbox user may signal
        f"import os, signal\nos.kill({os.getpid()}, signal.SIGKILL)",  # our pid: not in its namespace
    ],
    ids=["ppid", "everyone", "our-pid"],
)
def test_killing_the_parent_fails(code):
    parent = os.getpid()
    run_bounded(code, ["assert True"], KERNEL_ONLY)
    assert os.getpid() == parent  # we are still here (a SIGKILL would have ended the test run)


# --- process mode: separate process + unprivileged user + rlimits + Python guards ------------------------


def test_process_mode_blocks_fork_socket_kill_and_env(listener, secret_env):
    port, accepted = listener
    code = (
        "import os\n"
        "results = {}\n"
        "for name, action in [\n"
        "    ('fork', lambda: os.fork()),\n"
        "    ('kill', lambda: os.kill(os.getppid(), 9)),\n"
        f"    ('socket', lambda: __import__('socket').create_connection(('127.0.0.1', {port}), 1)),\n"
        "    ('subprocess', lambda: __import__('subprocess').run(['true'])),\n"
        "    ('ctypes', lambda: __import__('ctypes')),\n"
        "]:\n"
        "    try:\n"
        "        action()\n"
        "        results[name] = 'done'\n"
        "    except BaseException as error:\n"
        "        results[name] = type(error).__name__\n"
    )
    tests = [
        f"assert results[{name!r}] == 'done'" for name in ("fork", "kill", "socket", "subprocess", "ctypes")
    ]
    tests.append(f"import os\nassert os.environ.get('GRPOKIT_TEST_SECRET') == {secret_env!r}")
    result = run_bounded(code, tests, PROCESS)
    assert result.passed == (False,) * 6
    assert result.isolation == "process"
    assert not accepted()


def test_process_mode_loop_and_memory_limits():
    assert run_bounded("while True:\n    pass", ["assert True"], PROCESS).passed == (False,)
    assert run_bounded("x = bytearray(50 * 1024**3)", ["assert x"], PROCESS).passed == (False,)


@pytest.mark.skipif(os.geteuid() != 0, reason="the switch to an unprivileged user needs root")
def test_process_mode_cannot_write_to_our_files(tmp_path):
    target = tmp_path / "pwned"
    code = f"try:\n    open({str(target)!r}, 'w').write('x')\nexcept OSError:\n    pass\n"
    run_bounded(code, [], PROCESS)
    assert not target.exists()


# --- the sandbox's own integrity -----------------------------------------------------------------------


def test_forged_and_erased_reports_do_not_count():
    # the program writes fake "passed" lines to every descriptor, then truncates what it can
    code = (
        "import os\n"
        "for fd in range(3, 64):\n"
        "    for line in (b'0 0 1\\n', b'x 0 1\\n'):\n"
        "        try:\n"
        "            os.write(fd, line)\n"
        "        except OSError:\n"
        "            pass\n"
        "    try:\n"
        "        os.ftruncate(fd, 0)\n"
        "    except OSError:\n"
        "        pass\n"
        "print('0 0 1')\n"
    )
    result = run_bounded(code, ["assert False"], SandboxLimits(timeout=5.0))
    assert result.passed == (False,)  # and no SandboxError: the status channel was closed before the code ran


def test_task_count_sees_our_own_threads():
    from grpokit.rewards.isolation.sandbox import _task_count

    assert _task_count(os.getuid()) >= 1


def test_limits_are_validated():
    with pytest.raises(ValueError, match="isolation"):
        SandboxLimits(isolation="docker")
    with pytest.raises(ValueError, match="timeout"):
        SandboxLimits(timeout=0)


def test_sandbox_failure_is_an_error_not_a_zero(monkeypatch):
    import grpokit.rewards.isolation.sandbox as sandbox

    monkeypatch.setattr(sandbox, "_RUNNER_SOURCE", "raise SystemExit(3)")
    with pytest.raises(SandboxError, match="before it was ready"):
        run_python_tests("pass", ["assert True"], PROCESS)


def test_temporary_directories_are_removed():
    before = set(Path(tempfile.gettempdir()).glob("grpokit-sandbox-*"))
    run_bounded("open('f', 'w').write('x' * 1000)", ["assert True"], SandboxLimits(timeout=5.0))
    assert set(Path(tempfile.gettempdir()).glob("grpokit-sandbox-*")) <= before

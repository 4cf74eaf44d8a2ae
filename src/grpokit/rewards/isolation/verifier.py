"""math-verify in worker processes with a hard time limit per check.

math-verify guards ``parse``/``verify`` with ``signal.alarm``, which works only in a main thread and cannot
interrupt C code: ``9^{9^{9^9}}`` makes sympy build a 370-million-digit integer and no signal stops it. So
every check runs in a long-lived worker process (``_math_worker.py``); the parent waits at most ``timeout``
seconds for the answer and otherwise kills the worker (SIGKILL) and starts a fresh one. Inside the worker,
math-verify's own timeouts (which do work there) stop slow pure-Python parsing earlier, so the costly
restart is reserved for what only a kill can stop. Workers also run under an address-space limit
(``memory_mb``), so a huge intermediate value raises MemoryError instead of exhausting the machine.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import queue
import re
import select
import subprocess
import sys
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

_WORKER_SOURCE = Path(__file__).with_name("_math_worker.py").read_text()
_STARTUP_TIMEOUT_S = 120.0
_LIVE_VERIFIERS: weakref.WeakSet[MathVerifier] = weakref.WeakSet()


class _Worker:
    """One math-verify child process, spoken to in JSON lines; killed and restarted on a hard timeout."""

    def __init__(self, memory_mb: int | None) -> None:
        self.memory_mb = memory_mb
        self.proc: subprocess.Popen[bytes] | None = None
        self._buffer = b""

    def _start(self) -> None:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER_SOURCE, str(self.memory_mb or 0)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        self._buffer = b""
        if self._read_line(_STARTUP_TIMEOUT_S) != {"ready": True}:
            self.kill()
            raise RuntimeError("the math-verify worker process failed to start (is math-verify installed?)")

    def _read_line(self, timeout: float) -> dict[str, Any] | None:
        """Next JSON line from the child; None if it does not come within ``timeout`` or the child died."""
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def request(self, payload: dict[str, Any], timeout: float) -> dict[str, Any] | None:
        """Send one request; its reply, or None after a hard timeout or a crash (the child is then killed)."""
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(payload).encode() + b"\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            self.kill()
            return None
        reply = self._read_line(timeout)
        if reply is None:
            self.kill()
        return reply

    def kill(self) -> None:
        """SIGKILL the child and reap it; the next request starts a new one."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()
        self.proc = None


class MathVerifier:
    """A pool of math-verify worker processes.

    ``check(gold, answer)`` -> 1.0 (equivalent), 0.0 (not, or no decision within ``timeout`` seconds), or
    None (the gold answer does not parse). ``max_workers`` checks run at once; processes start lazily.
    """

    def __init__(self, max_workers: int = 2, memory_mb: int | None = 2048) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self.max_workers = max_workers
        self._idle: queue.SimpleQueue[_Worker] = queue.SimpleQueue()
        self._workers = [_Worker(memory_mb) for _ in range(max_workers)]
        for worker in self._workers:
            self._idle.put(worker)
        self._gold_ok: dict[str, bool | None] = {}
        self._lock = threading.Lock()
        _LIVE_VERIFIERS.add(self)

    def _call(self, payload: dict[str, Any], timeout: float) -> dict[str, Any] | None:
        worker = self._idle.get()
        try:
            return worker.request(payload, timeout)
        finally:
            self._idle.put(worker)

    def gold_parses(self, gold: str, timeout: float = 5.0) -> bool:
        """Does the gold answer parse? Cached per gold string; a timeout counts as 'does not parse'.
        A plain integer does, without asking a worker."""
        if _PLAIN_INTEGER.fullmatch(gold):
            return True
        with self._lock:
            known = self._gold_ok.get(gold)
        if known is None:
            reply = self._call({"op": "gold", "gold": gold, "timeout": _inner_timeout(timeout)}, timeout)
            known = bool(reply and reply.get("result"))
            with self._lock:
                if len(self._gold_ok) > 65536:
                    self._gold_ok.clear()
                self._gold_ok[gold] = known
        return known

    def check(self, gold: str, answer: str, timeout: float = 5.0) -> float | None:
        """1.0 / 0.0 / None (unparseable gold), deciding within about ``timeout`` seconds per step.
        Two plain integers are compared here, without a worker (:func:`integer_verdict`)."""
        quick = integer_verdict(gold, answer)
        if quick is not None:
            return quick
        if not self.gold_parses(gold, timeout):
            return None
        payload = {"op": "check", "gold": gold, "answer": answer, "timeout": _inner_timeout(timeout)}
        reply = self._call(payload, timeout)
        if reply is None or "error" in reply:
            return 0.0  # killed after the hard timeout, or the answer made math-verify fail
        return reply["result"]

    def check_many(self, pairs: list[tuple[str, str]], timeout: float = 5.0) -> list[float | None]:
        """:meth:`check` for each (gold, answer) pair, ``max_workers`` at a time, in order."""
        quick = [integer_verdict(gold, answer) for gold, answer in pairs]
        if None not in quick:  # all plain integers: no worker, no thread pool
            return quick
        if len(pairs) <= 1 or self.max_workers == 1:
            return [self.check(gold, answer, timeout) for gold, answer in pairs]
        with ThreadPoolExecutor(self.max_workers) as pool:
            return list(pool.map(lambda pair: self.check(pair[0], pair[1], timeout), pairs))

    def close(self) -> None:
        """Kill every worker process (they restart on the next check)."""
        for worker in self._workers:
            worker.kill()


_PLAIN_INTEGER = re.compile(r"\s*-?\d{1,1000}\s*")


def integer_verdict(gold: str, answer: str) -> float | None:
    """1.0 / 0.0 when both are plain integers (``-?digits``, at most 1000 digits, surrounding space allowed),
    compared by value, which is math-verify's verdict on such a pair (``"0632"`` equals ``"632"``); None
    otherwise (the pair goes to math-verify). Saves a worker round trip for integer answers (GSM8K, the
    built-in tasks)."""
    if _PLAIN_INTEGER.fullmatch(gold) and _PLAIN_INTEGER.fullmatch(answer):
        return 1.0 if int(gold) == int(answer) else 0.0
    return None


def _inner_timeout(timeout: float) -> int:
    """math-verify's own per-call limit (whole seconds, >= 1), below the hard limit where possible."""
    return max(1, math.floor(timeout / 2))


_DEFAULT: dict[tuple[int, int | None], MathVerifier] = {}
_DEFAULT_LOCK = threading.Lock()


def shared_verifier(max_workers: int | None = None, memory_mb: int | None = 2048) -> MathVerifier:
    """The process-wide verifier for these settings (default ``min(4, cpu_count)`` workers), made once."""
    workers = max_workers or max(1, min(4, os.cpu_count() or 1))
    with _DEFAULT_LOCK:
        key = (workers, memory_mb)
        if key not in _DEFAULT:
            _DEFAULT[key] = MathVerifier(workers, memory_mb)
        return _DEFAULT[key]


@atexit.register
def _close_all() -> None:
    for verifier in list(_LIVE_VERIFIERS):
        verifier.close()

"""Code execution reward: run the completion's Python against the dataset's ``tests`` column in a sandbox.

    r_i = (number of tests that pass) / (number of tests)       None when the row has no tests

The program is the completion's last fenced ``python`` block (also ``py``/``python3``), or the whole
completion when it has none. It runs once, then each test statement runs separately in the program's
namespace, so one failing assert does not hide the others (partial credit). Everything runs in
:func:`grpokit.rewards.isolation.sandbox.run_python_tests`; a batch uses a small pool of concurrent sandboxes.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from grpokit.data.chat import completion_texts
from grpokit.rewards.base import RewardFunc, column
from grpokit.rewards.isolation.sandbox import SandboxLimits, run_python_tests

_OPENER = re.compile(r"```[ \t]*(?:python3?|py)[ \t]*\n", re.IGNORECASE)


def extract_code(text: str) -> str:
    """The last fenced ``python`` code block (an unclosed final block runs to the end), else the whole text.

    One left-to-right pass: each block's closing fence is searched from its opener, so the scan is linear.
    """
    code, position = None, 0
    while (opener := _OPENER.search(text, position)) is not None:
        close = text.find("```", opener.end())
        if close < 0:  # truncated completion: the block runs to the end
            return text[opener.end() :]
        code, position = text[opener.end() : close], close + 3
    return text if code is None else code


def _as_tests(value: Any) -> list[str] | None:
    """A row's tests as a list of statements: a list as is, a JSON list string decoded, another string
    as one test; None or an empty list -> None (the reward does not apply)."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            decoded = json.loads(value)
        except ValueError:
            decoded = None
        value = decoded if isinstance(decoded, list) else [value]
    tests = [str(test) for test in value]
    return tests or None


def make_code_execution_reward(
    *,
    tests_column: str = "tests",
    max_workers: int | None = None,
    limits: SandboxLimits | None = None,
    name: str = "code_execution_reward",
    **limit_overrides: Any,
) -> RewardFunc:
    """Build ``fn(prompts, completions, completion_ids, **columns) -> list[float | None]``.

    Args:
        tests_column: dataset column with each row's test statements (list of str, or a JSON list string).
        max_workers: sandboxes run at once (default ``min(4, cpu_count)``).
        limits: :class:`SandboxLimits` (wall/CPU time, memory, processes, isolation, ...); keyword overrides
            such as ``timeout=5.0`` or ``memory_mb=512`` are applied on top.
        name: ``__name__`` of the returned function (its metric name).
    """
    sandbox_limits = replace(limits or SandboxLimits(), **limit_overrides)
    workers = max_workers or max(1, min(4, os.cpu_count() or 1))

    def score(item: tuple[str, list[str] | None]) -> float | None:
        code, tests = item
        if tests is None:
            return None
        return run_python_tests(code, tests, sandbox_limits).fraction

    def code_execution_reward(
        prompts: Sequence[Any], completions: Sequence[Any], completion_ids: Sequence[Any] = (), **kwargs: Any
    ) -> list[float | None]:
        texts = completion_texts(completions)
        tests = [_as_tests(value) for value in column(kwargs, tests_column, len(texts), name)]
        items = [(extract_code(text), row_tests) for text, row_tests in zip(texts, tests)]
        if workers == 1 or len(items) <= 1:
            return [score(item) for item in items]
        with ThreadPoolExecutor(min(workers, len(items))) as pool:
            return list(pool.map(score, items))

    code_execution_reward.__name__ = code_execution_reward.__qualname__ = name
    code_execution_reward.required_columns = (tests_column,)  # type: ignore[attr-defined]
    return code_execution_reward


code_execution_reward = make_code_execution_reward()
"""Default code reward: column ``tests``, 10 s wall time, 1 GiB, namespaces when available."""

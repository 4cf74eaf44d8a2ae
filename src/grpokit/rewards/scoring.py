"""Calling reward functions, and the failure policy: one place, so no reward can fail silently.

:func:`score_completions` calls every function with the TRL keywords ``prompts``, ``completions``,
``completion_ids``, the dataset's other columns and ``trainer_state``, and checks what comes back:

* ``None`` -> NaN in the matrix: the function does not apply to that row (skipped by the weighted sum
  :func:`grpokit.core.combine_rewards`, never counted as 0);
* a function that raises, returns a different number of values than completions, or returns NaN, +-inf or
  something that is not a real number -> :class:`RewardFunctionError` naming the function, the row and the
  value (``on_error="raise"``, the default); with ``on_error="none"`` the failure is counted instead, the
  value becomes NaN (None), and the trainer logs the count as ``rewards/<name>/failures``.

Process reward functions (step rewards, :mod:`grpokit.rewards.process_rewards`) go through the same policy
with :func:`checked_outputs`: only the check of one row's value differs.

Async reward functions (``async def``) run concurrently with ``asyncio.gather`` after the sync ones, which
run one after another in list order.

A time limit (``timeout``, the config's ``reward_timeout``) bounds every call: a call still running after
it is a failure like a raised error (a :class:`RewardTimeout`, handled by ``on_error``) and is abandoned on a
daemon thread (:mod:`grpokit.rewards.bounded`), which never keeps the process from exiting. With a limit,
sync functions run on that worker thread (torch's grad mode is carried over), so a function that sets
signal handlers (``signal.alarm``) needs ``timeout=None``.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from grpokit.core import combine_rewards
from grpokit.data.integrity import InputError
from grpokit.rewards.bounded import BoundedCaller, CallTimeout
from grpokit.rewards.reward_logs import RewardLogs

__all__ = [
    "ON_ERROR",
    "RewardFunctionError",
    "RewardTimeout",
    "call_reward_functions",
    "checked_outputs",
    "combine_rewards",
    "reward_name",
    "reward_names",
    "reward_weights",
    "score_completions",
]

logger = logging.getLogger(__name__)
ON_ERROR = ("raise", "none")


class RewardFunctionError(RuntimeError):
    """A reward function failed: it raised, returned the wrong number of values, or a bad value.

    Attributes: ``name`` (the function's metric name), ``row`` (completion index, or None when the whole
    call failed), ``value`` (the offending value, if any).
    """

    def __init__(self, name: str, message: str, row: int | None = None, value: Any = None) -> None:
        where = "" if row is None else f" at row {row}"
        super().__init__(f"reward function {name!r}{where}: {message}")
        self.name, self.row, self.value = name, row, value


class RewardTimeout(CallTimeout):
    """A reward function call ran longer than ``reward_timeout``."""


ASYNC_SLACK = 1.0
"""Seconds the whole gather of async reward functions may run past ``timeout`` (each awaitable has its own
``timeout``; this bounds a coroutine that blocks the event loop instead of awaiting)."""


def reward_name(func: Any) -> str:
    """Metric name of a reward: ``__name__`` (functions, :class:`RewardModel`: its path's base name),
    the wrapped function of a ``functools.partial``, else the class name; ``<lambda>`` becomes ``lambda``."""
    if isinstance(func, functools.partial):
        return reward_name(func.func)
    name = getattr(func, "__name__", None)
    if not isinstance(name, str) or not name:
        name = type(func).__name__
    return name.strip("<>") or "reward"


def reward_names(funcs: Sequence[Any]) -> list[str]:
    """Unique metric names in order: a repeated name gets ``_2``, ``_3`` ... (as the trainer's logging)."""
    names: list[str] = []
    for func in funcs:
        base = reward_name(func)
        name, index = base, 2
        while name in names:
            name, index = f"{base}_{index}", index + 1
        names.append(name)
    return names


def _check_value(name: str, row: int, value: Any) -> float | None:
    """One returned value as a float (None stays None); raises RewardFunctionError for anything else."""
    if value is None:
        return None
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if not isinstance(value, numbers.Real):
        raise RewardFunctionError(
            name, f"returned {_show(value)}, which is not a number (or None)", row, value
        )
    number = float(value)
    if not math.isfinite(number):
        raise RewardFunctionError(name, f"returned {number} (use None for 'does not apply')", row, value)
    return number


def _check_values(name: str, result: Any, n: int) -> list[Any]:
    """The returned collection as a list of n values; raises RewardFunctionError otherwise."""
    if isinstance(result, torch.Tensor):
        result = result.reshape(-1).tolist() if result.dim() <= 1 else result
    if isinstance(result, (str, bytes, Mapping)) or not hasattr(result, "__len__"):
        raise RewardFunctionError(name, f"returned {_show(result)}; expected a list of {n} values")
    values = list(result)
    if len(values) != n:
        raise RewardFunctionError(name, f"returned {len(values)} values for {n} completions", value=result)
    return values


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."


def _run_coroutines(coroutines: list[Any], timeout: float | None = None) -> list[Any]:
    """Await all coroutines concurrently, each within ``timeout`` seconds (None: unbounded); each result, or
    the exception it raised (a :class:`RewardTimeout` when it ran out of time)."""

    async def bounded(coroutine: Any) -> Any:
        try:
            return await asyncio.wait_for(coroutine, timeout)
        except asyncio.TimeoutError:
            raise RewardTimeout(f"no answer within reward_timeout={timeout:g} s") from None

    async def gather() -> list[Any]:
        awaited = coroutines if timeout is None else [bounded(c) for c in coroutines]
        return await asyncio.gather(*awaited, return_exceptions=True)

    if timeout is not None:  # on a worker thread, so that a coroutine blocking the event loop is bounded too
        caller = _caller(timeout + ASYNC_SLACK)
        outcome = caller.run([lambda: asyncio.run(gather())])[0]
        caller.close()
        if isinstance(outcome, RewardTimeout):
            return [RewardTimeout(f"no answer within reward_timeout={timeout:g} s")] * len(coroutines)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(gather())
    with ThreadPoolExecutor(1) as thread:  # called from inside an event loop (a notebook): use another one
        return thread.submit(asyncio.run, gather()).result()


def _caller(timeout: float) -> BoundedCaller:
    return BoundedCaller(timeout, 1, error=RewardTimeout, field="reward_timeout", name="grpokit-reward")


def _in_grad_mode(func: Callable[..., Any], kwargs: Mapping[str, Any]) -> Callable[[], Any]:
    """``func(**kwargs)`` as a call for another thread, under this thread's grad mode (torch keeps it per
    thread: a reward model called under ``no_grad`` stays so)."""
    grad = torch.is_grad_enabled()

    def call() -> Any:
        with torch.set_grad_enabled(grad):
            return func(**kwargs)

    return call


def _validate_inputs(n: int, prompts: Sequence[Any], completion_ids: Any, columns: Mapping[str, Any]) -> None:
    if len(prompts) != n:
        raise ValueError(f"{len(prompts)} prompts for {n} completions")
    if completion_ids is not None and len(completion_ids) != n:
        raise ValueError(f"{len(completion_ids)} completion_ids for {n} completions")
    for key, values in columns.items():
        if len(values) != n:
            raise ValueError(f"column {key!r} has {len(values)} values for {n} completions")


def call_reward_functions(
    funcs: Sequence[Callable[..., Any]], kwargs: Mapping[str, Any], timeout: float | None = None
) -> list[Any]:
    """Call every function with ``kwargs``: each one's result, or the exception it raised. Sync functions run
    one after another in list order, then the awaitables of async ones concurrently. ``timeout``: seconds
    each call may take (None: unbounded); a slower call's outcome is a :class:`RewardTimeout`."""
    outcomes: list[Any] = [None] * len(funcs)
    pending: dict[int, Any] = {}
    caller = None if timeout is None else _caller(timeout)
    for index, func in enumerate(funcs):
        if caller is not None:
            outcomes[index] = caller.run([_in_grad_mode(func, kwargs)])[0]
        else:
            try:
                outcomes[index] = func(**kwargs)
            except Exception as error:
                outcomes[index] = error
        if inspect.isawaitable(outcomes[index]):
            pending[index] = outcomes[index]
    if caller is not None:
        caller.close()
    for index, outcome in zip(pending, _run_coroutines(list(pending.values()), timeout)):
        outcomes[index] = outcome
    return outcomes


def checked_outputs(
    name: str, outcome: Any, n: int, check_row: Callable[[int, Any], Any], on_error: str
) -> tuple[list[Any], int]:
    """The failure policy applied to one function's ``outcome`` (its result, or the exception it raised) for
    ``n`` completions: ``(values, failures)``, one value per row as ``check_row(row, value)`` returns it.

    A raised exception or a result that is not ``n`` values fails every row; ``check_row`` raising
    :class:`RewardFunctionError` fails that row. ``on_error="raise"``: the error propagates. ``"none"``:
    a failed row's value becomes None, is logged, and is counted in ``failures``.
    """
    try:
        if isinstance(outcome, RewardTimeout):
            raise RewardFunctionError(name, str(outcome)) from outcome
        if isinstance(outcome, BaseException):
            message = f"raised {type(outcome).__name__}: {outcome}"
            raise RewardFunctionError(name, message) from outcome
        values = _check_values(name, outcome, n)
    except RewardFunctionError as error:
        if on_error == "raise":
            raise
        logger.warning("%s; all %d values of this call count as failures (None)", error, n)
        return [None] * n, n
    checked, failed = [], 0
    for row, value in enumerate(values):
        try:
            checked.append(check_row(row, value))
        except RewardFunctionError as error:
            if on_error == "raise":
                raise
            logger.warning("%s; counted as a failure (None)", error)
            checked.append(None)
            failed += 1
    return checked, failed


def score_completions(
    funcs: Sequence[Callable[..., Any]],
    prompts: Sequence[Any],
    completions: Sequence[Any],
    completion_ids: Sequence[Sequence[int]] | None = None,
    columns: Mapping[str, Sequence[Any]] | None = None,
    trainer_state: Any = None,
    on_error: str = "raise",
    timeout: float | None = None,
    reward_logs: RewardLogs | None = None,
) -> tuple[torch.Tensor, dict[str, int]]:
    """Score N completions with F reward functions, each call within ``timeout`` seconds (None: unbounded;
    a slower call is a failure under ``on_error``).

    Returns ``(rewards, failures)``: ``rewards`` is a float32 tensor [N, F] with NaN where a function
    returned None (or failed, with ``on_error="none"``); ``failures`` maps each function's unique metric name
    (:func:`reward_names`) to its number of failed values in this call (0 when all went well).
    ``reward_logs``: where the functions' ``log_metric`` / ``log_extra`` calls go (None: where nothing
    reads them, e.g. ``grpokit eval``, they are accepted and not recorded).
    """
    if on_error not in ON_ERROR:
        raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
    n, columns = len(completions), dict(columns or {})
    _validate_inputs(n, prompts, completion_ids, columns)
    names = reward_names(funcs)
    kwargs = {"prompts": prompts, "completions": completions, "completion_ids": completion_ids}
    kwargs.update(columns, trainer_state=trainer_state)
    # TRL's log_metric / log_extra keywords (grpokit.rewards.reward_logs), always passed as TRL does
    kwargs.update((reward_logs or RewardLogs()).keywords(n))
    outcomes = call_reward_functions(funcs, kwargs, timeout)
    matrix = torch.full((n, len(funcs)), math.nan, dtype=torch.float32)  # [N, F]
    failures = dict.fromkeys(names, 0)
    for index, (name, outcome) in enumerate(zip(names, outcomes)):
        values, failures[name] = checked_outputs(
            name, outcome, n, lambda row, value, name=name: _check_value(name, row, value), on_error
        )
        for row, value in enumerate(values):
            if value is not None:
                matrix[row, index] = value
    return matrix, failures


def reward_weights(weights: Sequence[float] | None, names: Sequence[str], field: str) -> list[float]:
    """One weight per reward function (default all 1.0); a length mismatch names the config ``field``."""
    if weights is None:
        return [1.0] * len(names)
    if len(weights) != len(names):
        raise InputError(
            f"GRPOConfig.{field} has {len(weights)} values but there are {len(names)} "
            f"{'process reward' if 'process' in field else 'reward'} functions ({', '.join(names)})"
        )
    return [float(w) for w in weights]

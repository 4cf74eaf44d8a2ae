"""What reward functions log besides their rewards: TRL's ``log_metric`` and ``log_extra`` keywords.

A reward function may take ``log_metric`` and ``log_extra`` (as in TRL) and call them while it scores::

    def accuracy(completions, answer, log_metric, log_extra, **kwargs):
        right = [float(c.strip() == a) for c, a in zip(completions, answer)]
        log_metric("accuracy", sum(right) / len(right))  # a metric of the step (mean over its calls)
        log_extra("answer", answer)  # a column of the step's logged completions (completions.jsonl)
        return right

``log_metric(name, value)``: a number; the step's metric ``name`` is the mean of the values logged during the
step. ``log_extra(column, values)``: one value per completion of the call, in its order; the step's logged
completions carry them under ``extra``.
"""

from __future__ import annotations

import json
import math
import numbers
import threading
from collections import defaultdict
from typing import Any

__all__ = ["RewardLogs"]


class RewardLogs:
    """The metrics and extra completion columns reward functions logged during one step (thread-safe:
    reward functions may run on worker threads). ``keywords(n)`` gives the two callables for a call that
    scores ``n`` completions; ``take()`` returns the step's logs and starts the next step."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._metrics: dict[str, list[float]] = defaultdict(list)
        self._extra: dict[str, list[Any]] = defaultdict(list)

    def keywords(self, n: int) -> dict[str, Any]:
        """``log_metric`` and ``log_extra`` for one reward call over ``n`` completions."""

        def log_metric(name: str, value: float) -> None:
            if not isinstance(name, str) or not name:
                raise ValueError(f"log_metric: the metric name must be a non-empty string, got {name!r}")
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
                raise ValueError(
                    f"log_metric({name!r}, ...): the value must be a finite number, got {value!r}"
                )
            with self._lock:
                self._metrics[name].append(float(value))

        def log_extra(column: str, values: Any) -> None:
            if not isinstance(column, str) or not column:
                raise ValueError(f"log_extra: the column name must be a non-empty string, got {column!r}")
            values = list(values)
            if len(values) != n:
                raise ValueError(
                    f"log_extra({column!r}, ...): {len(values)} values for {n} completions; "
                    "give one per completion"
                )
            try:
                json.dumps(values)
            except (TypeError, ValueError) as error:
                raise ValueError(
                    f"log_extra({column!r}, ...): the values must be JSON values (str, numbers, lists, "
                    f"dicts), for completions.jsonl: {error}"
                ) from None
            with self._lock:
                self._extra[column].extend(values)

        return {"log_metric": log_metric, "log_extra": log_extra}

    def take(self) -> tuple[dict[str, float], dict[str, list[Any]]]:
        """(each metric's mean over the step, each extra column's values in call order); then empty."""
        with self._lock:
            metrics = {name: sum(v) / len(v) for name, v in self._metrics.items()}
            extra = dict(self._extra)
            self._metrics, self._extra = defaultdict(list), defaultdict(list)
        return metrics, extra

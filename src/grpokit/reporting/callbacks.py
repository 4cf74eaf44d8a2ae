"""``GRPOTrainer(callbacks=[...])``: the ``transformers.TrainerCallback`` interface, called at the same
moments as in TRL's trainer, with transformers' own ``TrainerState`` and ``TrainerControl``.

Events: ``on_init_end``, ``on_train_begin``, ``on_step_begin``, ``on_step_end``, ``on_evaluate``
(``metrics=``), ``on_log`` (``logs=``), ``on_save``, ``on_epoch_end``, ``on_train_end``; each receives
``(args, state, control, model=, processing_class=, optimizer=, lr_scheduler=)``. One difference from TRL:
``state.global_step`` and ``state.max_steps`` count GRPO steps (grpokit's step: one generation round and
its updates), the unit of ``logging_steps``/``save_steps``/``eval_steps`` here. A callback may set
``control.should_training_stop`` (the run ends after this step, with the final model saved),
``control.should_save`` (a checkpoint now) or ``control.should_evaluate`` (an evaluation now).

The state is also ``GRPOTrainer.state`` (TRL's ``trainer.state``: ``global_step``, ``max_steps``,
``log_history``, whose last entry after ``train()`` is the run's summary with ``train_loss`` as
transformers writes it), and reward functions receive a snapshot of it as ``trainer_state`` (TRL passes the
``TrainerState``; ``trainer_state["global_step"]`` works too).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState

__all__ = ["Callbacks", "KeyedTrainerState", "TrainHistory", "run_summary"]

_EVENTS = (
    "on_init_end",
    "on_train_begin",
    "on_step_begin",
    "on_step_end",
    "on_evaluate",
    "on_log",
    "on_save",
    "on_epoch_end",
    "on_train_end",
)


class KeyedTrainerState(TrainerState):
    """transformers' ``TrainerState`` whose fields also read as keys (``state["global_step"]``), so a reward
    function written for TRL (``trainer_state.global_step``) and one indexing a dict both work."""

    def __getitem__(self, name: str) -> Any:
        try:
            return getattr(self, name)
        except AttributeError:
            raise KeyError(name) from None

    def get(self, name: str, default: Any = None) -> Any:
        return getattr(self, name, default)


class TrainHistory(list):
    """What ``GRPOTrainer.train()`` returns: the logged metrics of each logged step (a list, as grpokit
    always returned), with the fields of transformers' ``TrainOutput`` as attributes: ``global_step``,
    ``training_loss`` (the mean loss of the steps this call trained) and ``metrics`` (the run's summary:
    ``train_runtime``, ``train_steps_per_second``, ``train_loss``, ``epoch``)."""

    def __init__(self, logged: Iterable[dict[str, float]], global_step: int, metrics: dict[str, float]):
        super().__init__(logged)
        self.global_step = global_step
        self.training_loss = metrics.get("train_loss", float("nan"))
        self.metrics = metrics


def run_summary(losses: list[float], runtime: float, steps: int, epoch: float) -> dict[str, float]:
    """The summary transformers' ``Trainer`` logs when ``train()`` ends: ``train_runtime`` (s),
    ``train_steps_per_second``, ``train_loss`` (the mean loss of the ``steps`` trained, NaN steps left
    out) and ``epoch``."""
    finite = [loss for loss in losses if math.isfinite(loss)]
    return {
        "train_runtime": round(runtime, 4),
        "train_steps_per_second": round(steps / runtime, 3) if runtime > 0 else 0.0,
        "train_loss": sum(finite) / len(finite) if finite else math.nan,
        "epoch": epoch,
    }


class Callbacks:
    """The run's callbacks with the ``TrainerState`` / ``TrainerControl`` they share."""

    def __init__(self, callbacks: Iterable[Any] | None, args: Any, **objects: Any) -> None:
        """callbacks: ``TrainerCallback`` instances or classes (instantiated here); anything with some of the
        event methods works. objects: what every event receives (model, processing_class, optimizer,
        lr_scheduler)."""
        self.callbacks = [cb() if isinstance(cb, type) else cb for cb in callbacks or []]
        for cb in self.callbacks:
            if not isinstance(cb, TrainerCallback) and not any(hasattr(cb, e) for e in _EVENTS):
                raise ValueError(
                    f"callbacks: {type(cb).__name__} is not a TrainerCallback and has none of its events "
                    f"({', '.join(_EVENTS)})"
                )
        self.args = args
        self.objects = objects
        self.state = KeyedTrainerState()
        self.control = TrainerControl()

    def __bool__(self) -> bool:
        return bool(self.callbacks)

    def add(self, callback: Any) -> None:
        self.callbacks.append(callback() if isinstance(callback, type) else callback)

    def event(self, name: str, **kwargs: Any) -> TrainerControl:
        """Call ``name`` on every callback that has it, in order; a callback may return a new control."""
        for cb in self.callbacks:
            method = getattr(cb, name, None)
            if method is None:
                continue
            result = method(self.args, self.state, self.control, **self.objects, **kwargs)
            if isinstance(result, TrainerControl):
                self.control = result
        return self.control

    def begin(self, *, max_steps: int, step: int, epoch: float, logging_steps: int, is_main: bool) -> None:
        """Fill the state for the run (or its resumption) and send ``on_train_begin``."""
        self.state.max_steps = max_steps
        self.state.global_step = step
        self.state.epoch = epoch
        self.state.logging_steps = logging_steps
        self.state.is_world_process_zero = self.state.is_local_process_zero = is_main
        self.control.should_training_stop = False
        self.event("on_train_begin")

    def step_begin(self) -> None:
        self.control.should_log = self.control.should_evaluate = self.control.should_save = False
        self.event("on_step_begin")

    def step_end(self, step: int, epoch: float) -> TrainerControl:
        self.state.global_step = step
        self.state.epoch = epoch
        return self.event("on_step_end")

    def snapshot(self) -> KeyedTrainerState:
        """A copy of the state as it is now (what a reward function receives as ``trainer_state``)."""
        return copy.copy(self.state)

    def log(self, logs: dict[str, float]) -> None:
        self.state.log_history.append({**logs, "step": self.state.global_step})
        self.event("on_log", logs=logs)

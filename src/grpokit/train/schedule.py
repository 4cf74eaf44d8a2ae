"""When a run stops, logs, evaluates and saves, in GRPO steps (one generation round and its updates).

``max_steps`` counts GRPO steps, or optimizer steps with ``max_steps_unit="optimizer_steps"`` (TRL's
``global_step``; converted here once, rounding up to whole GRPO steps). An *epoch* is a pass over the
training prompts: GRPO step s ends an epoch when the prompts drawn up to it cross a multiple of the data
set's size, which is when ``eval_strategy``/``save_strategy="epoch"`` act.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from grpokit.config import BatchPlan, GRPOConfig, resolution
from grpokit.config.resolution import interval_steps

__all__ = ["RunSchedule"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunSchedule:
    """The run's length and its logging/evaluation/checkpoint steps, resolved from the config once the run's
    length is known: strategies from their sources (``config.resolution``), intervals given as a ratio of
    the run (``logging_steps=0.1``) in whole steps."""

    max_steps: int
    """GRPO steps of the run."""
    num_rows: int
    """Training prompts in one epoch."""
    prompts_per_step: int
    """Prompts drawn per GRPO step (all processes)."""
    logging_steps: int
    """Steps between logged metrics."""
    logging_first_step: bool
    """Also log step 1."""
    eval_strategy: str
    """"no", "steps" or "epoch"."""
    eval_steps: int | None
    """Steps between evaluations under "steps" (None otherwise)."""
    save_strategy: str
    """"no", "steps" or "epoch"."""
    save_steps: int
    """Steps between checkpoints under "steps" (0 otherwise)."""

    @classmethod
    def from_config(cls, args: GRPOConfig, num_rows: int, plan: BatchPlan) -> RunSchedule:
        max_steps = total_grpo_steps(args, num_rows, plan)
        eval_every, save_strategy = resolution.eval_steps(args), resolution.save_strategy(args)
        schedule = cls(
            max_steps=max_steps,
            num_rows=num_rows,
            prompts_per_step=plan.prompts,
            logging_steps=interval_steps(args.logging_steps, max_steps),
            logging_first_step=args.logging_first_step,
            eval_strategy=resolution.eval_strategy(args),
            eval_steps=None if eval_every is None else interval_steps(eval_every, max_steps),
            save_strategy=save_strategy,
            save_steps=interval_steps(args.save_steps, max_steps) if save_strategy == "steps" else 0,
        )
        schedule.warn_unreached()
        return schedule

    def warn_unreached(self) -> None:
        """Say so when an interval is longer than the run, so that it never acts (TRL's default
        ``save_steps=500`` in a 100-step run writes no checkpoint)."""
        saved = "no periodic checkpoint is written (the final model is saved either way)"
        intervals = [
            ("eval_steps", self.eval_strategy, self.eval_steps, "no evaluation runs"),
            ("save_steps", self.save_strategy, self.save_steps, saved),
        ]
        for name, strategy, every, what in intervals:
            if strategy == "steps" and every is not None and every > self.max_steps:
                logger.warning(
                    "%s=%d is longer than the run's %d steps: %s", name, every, self.max_steps, what
                )

    def epoch(self, step: int) -> float:
        """Passes over the training prompts completed after GRPO step ``step`` (fractional)."""
        return step * self.prompts_per_step / self.num_rows

    def ends_epoch(self, step: int) -> bool:
        """Whether GRPO step ``step`` (1-based) completes a pass over the training prompts."""
        return math.floor(self.epoch(step)) > math.floor(self.epoch(step - 1))

    def logs(self, step: int) -> bool:
        """Whether the metrics of GRPO step ``step`` are logged: every ``logging_steps``, the last step, and
        the first with ``logging_first_step``."""
        return (
            step % self.logging_steps == 0
            or step == self.max_steps
            or (step == 1 and self.logging_first_step)
        )

    def evaluates(self, step: int) -> bool:
        return self._acts(self.eval_strategy, self.eval_steps, step)

    def saves(self, step: int) -> bool:
        return self._acts(self.save_strategy, self.save_steps, step)

    def _acts(self, strategy: str, every: int | None, step: int) -> bool:
        if strategy == "steps":
            return every is not None and step % every == 0
        if strategy == "epoch":
            return self.ends_epoch(step)
        return False


def total_grpo_steps(args: GRPOConfig, num_rows: int, plan: BatchPlan) -> int:
    """GRPO steps of the run: ``max_steps`` (converted from optimizer steps when that is its unit), else
    ``num_train_epochs`` passes over ``num_rows`` prompts, ``plan.prompts`` per step (rounded up)."""
    if args.max_steps > 0 and args.max_steps_unit == "grpo_steps":
        return args.max_steps
    if args.max_steps > 0:
        steps = math.ceil(args.max_steps / plan.optimizer_steps)
        if steps * plan.optimizer_steps != args.max_steps:
            logger.warning(
                "max_steps=%d optimizer steps is not a multiple of the %d optimizer steps of a GRPO step: "
                "running %d GRPO steps (%d optimizer steps)",
                args.max_steps, plan.optimizer_steps, steps, steps * plan.optimizer_steps,
            )  # fmt: skip
        return steps
    return max(1, math.ceil(args.num_train_epochs * num_rows / plan.prompts))

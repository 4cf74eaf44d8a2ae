"""Batch sizing in one place: what one GRPO step does, in counts, from a config's batch fields.

generation_batch_size = per_device_train_batch_size x gradient_accumulation_steps
                        x steps_per_generation x num_processes
optimizer steps per step = num_iterations x steps_per_generation
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grpokit.config.values import require

__all__ = ["BatchPlan", "plan_batch"]


@dataclass(frozen=True)
class BatchPlan:
    """What one GRPO step does, in counts (all per step, across all processes)."""

    prompts: int
    completions: int
    optimizer_steps: int
    micro_batches_per_optimizer_step: int
    completions_per_micro_batch: int
    num_processes: int

    def describe(self) -> str:
        return (
            f"each step: {self.prompts} prompts x G -> {self.completions} completions; "
            f"{self.optimizer_steps} optimizer step(s), each accumulating "
            f"{self.micro_batches_per_optimizer_step} micro-batch(es) of {self.completions_per_micro_batch} "
            f"completions on each of {self.num_processes} process(es)"
        )


def plan_batch(config: Any, num_processes: int = 1) -> BatchPlan:
    """The counts of one step of ``config`` (a GRPOConfig) on ``num_processes`` processes. Raises ValueError
    when the batch sizes do not fit together."""
    per_optimizer_step = (
        config.per_device_train_batch_size * config.gradient_accumulation_steps * num_processes
    )
    if config.generation_batch_size is not None:
        require(
            config.generation_batch_size % per_optimizer_step == 0,
            "generation_batch_size",
            f"({config.generation_batch_size}) must be a multiple of per_device_train_batch_size x "
            f"gradient_accumulation_steps x num_processes ({per_optimizer_step})",
        )
        steps = config.generation_batch_size // per_optimizer_step
        require(
            config.steps_per_generation in (None, steps),
            "steps_per_generation",
            f"({config.steps_per_generation}) contradicts generation_batch_size "
            f"({config.generation_batch_size} = {steps} x {per_optimizer_step}); set only one of them",
        )
    else:
        steps = 1 if config.steps_per_generation is None else config.steps_per_generation
        require(steps >= 1, "steps_per_generation", "must be >= 1")
    completions = steps * per_optimizer_step
    require(
        completions % config.num_generations == 0,
        "per_device_train_batch_size",
        f"completions per step ({completions} = per_device_train_batch_size x gradient_accumulation_steps"
        f" x steps_per_generation x num_processes) must be a multiple of num_generations "
        f"({config.num_generations})",
    )
    return BatchPlan(
        prompts=completions // config.num_generations,
        completions=completions,
        optimizer_steps=config.num_iterations * steps,
        micro_batches_per_optimizer_step=config.gradient_accumulation_steps,
        completions_per_micro_batch=config.per_device_train_batch_size,
        num_processes=num_processes,
    )

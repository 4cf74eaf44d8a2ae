"""The trainer's periodic evaluation: greedy completions of held-out prompts, scored by the run's reward
functions (``eval/reward`` and ``eval/rewards/<name>/mean``). ``grpokit eval`` (``grpokit.eval``) is the
stand-alone evaluation with pass@k / maj@k."""

from __future__ import annotations

from typing import Any

import torch
from accelerate.utils import gather_object

from grpokit.reporting.metrics import reward_means

__all__ = ["greedy_reward_means"]


def greedy_reward_means(trainer: Any, rows: list[dict[str, Any]], batch_size: int) -> dict[str, float]:
    """Reward means (weighted sum and per function, mean over rows) of one greedy completion per row.

    Under several processes each process generates for every ``num_processes``-th row and the rewards are
    gathered, so every row counts once. ``trainer`` is a ``GRPOTrainer`` (its ``sample`` and
    ``reward_matrix``)."""
    accelerator = trainer.accelerator
    num_funcs = len(trainer.reward_funcs)
    share = rows[accelerator.process_index :: accelerator.num_processes]
    parts = [torch.empty(0, num_funcs)]
    for start in range(0, len(share), batch_size):
        samples = trainer.sample(share[start : start + batch_size], greedy=True)
        parts.append(trainer.reward_matrix(samples)[0])
    matrix = torch.cat(parts)  # [len(share), F]
    if accelerator.num_processes > 1:  # every process's rows, in process order
        matrix = torch.tensor(gather_object(matrix.tolist()), dtype=torch.float32).reshape(-1, num_funcs)
    return reward_means(matrix, trainer.reward_weights, trainer.reward_names, prefix="eval/")

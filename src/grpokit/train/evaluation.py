"""Periodic evaluation during training: greedy completions of eval_dataset scored by the reward functions."""

from __future__ import annotations

from typing import Any

import torch

from grpokit.core import combine_rewards


def evaluate_rewards(trainer: Any, rows: list[dict[str, Any]], batch_size: int = 64) -> dict[str, float]:
    """eval/reward (weighted sum, mean over rows) and eval/rewards/<name>/mean under greedy decoding."""
    params = trainer.sampling_params(greedy=True)
    matrices = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        prompt_ids = [trainer.encode_prompt(row["prompt"]) for row in chunk]
        with trainer.accelerator.autocast():
            generated = trainer.backend.generate(prompt_ids, 1, params)
        _, matrix, _ = trainer.decode_and_score(chunk, generated.completion_ids)
        matrices.append(matrix)
    matrix = torch.cat(matrices)  # [len(rows), F]
    combined = combine_rewards(matrix, trainer.reward_weights)  # [len(rows)]
    metrics = {"eval/reward": float(torch.nanmean(combined))}
    for column, name in enumerate(trainer.reward_names):
        metrics[f"eval/rewards/{name}/mean"] = float(torch.nanmean(matrix[:, column]))
    return metrics

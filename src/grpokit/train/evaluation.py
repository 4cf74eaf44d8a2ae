"""Periodic evaluation during training: greedy completions of eval_dataset scored by the reward functions.

Under several processes each process generates for its share of the rows (every ``num_processes``-th row)
and the reward rows are gathered, so the metrics cover every row once and are the same on every process.
"""

from __future__ import annotations

from typing import Any

import torch
from accelerate.utils import gather_object

from grpokit.core import combine_rewards


def _local_reward_matrix(trainer: Any, rows: list[dict[str, Any]], batch_size: int) -> torch.Tensor:
    """[len(rows), F] rewards of greedy completions (NaN for None)."""
    params = trainer.sampling_params(greedy=True)
    matrices = [torch.empty(0, len(trainer.reward_funcs))]
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        prompt_ids = [trainer.encode_prompt(row["prompt"]) for row in chunk]
        with trainer.accelerator.autocast():
            generated = trainer.backend.generate(prompt_ids, 1, params)
        _, matrix, _ = trainer.decode_and_score(chunk, generated.completion_ids)
        matrices.append(matrix)
    return torch.cat(matrices)


def evaluate_rewards(trainer: Any, rows: list[dict[str, Any]], batch_size: int = 64) -> dict[str, float]:
    """eval/reward (weighted sum, mean over rows) and eval/rewards/<name>/mean under greedy decoding."""
    accelerator = trainer.accelerator
    share = rows[accelerator.process_index :: accelerator.num_processes]
    matrix = _local_reward_matrix(trainer, share, batch_size)  # [len(share), F]
    if accelerator.num_processes > 1:
        gathered = gather_object(matrix.tolist())  # every process's rows, in process order
        matrix = torch.tensor(gathered, dtype=torch.float32).reshape(-1, len(trainer.reward_funcs))
    combined = combine_rewards(matrix, trainer.reward_weights)  # [len(rows)]
    metrics = {"eval/reward": float(torch.nanmean(combined))}
    for column, name in enumerate(trainer.reward_names):
        metrics[f"eval/rewards/{name}/mean"] = float(torch.nanmean(matrix[:, column]))
    return metrics

"""Step 3 of a GRPO step: completions -> reward matrix [N, F] and the reward metrics of DESIGN.md §5."""

from __future__ import annotations

from typing import Any

import torch

from grpokit.data.loading import is_conversational, reward_columns
from grpokit.rewards import score_completions


def completions_for_rewards(rows: list[dict[str, Any]], texts: list[str]) -> list[Any]:
    """Completions as reward functions expect them: strings, or assistant messages for chat prompts."""
    return [
        [{"role": "assistant", "content": text}] if is_conversational(row) else text
        for row, text in zip(rows, texts)
    ]


def score_rollout(
    reward_funcs: list[Any],
    rows: list[dict[str, Any]],
    texts: list[str],
    completion_ids: list[list[int]],
    *,
    trainer_state: dict[str, Any],
    on_error: str,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Score N completions (``rows`` already repeated G times). Returns (rewards [N, F] with NaN for None,
    failure counts per metric name)."""
    columns = reward_columns(rows)
    matrix, failures = score_completions(
        reward_funcs,
        prompts=[row["prompt"] for row in rows],
        completions=completions_for_rewards(rows, texts),
        completion_ids=completion_ids,
        columns=columns,
        trainer_state=trainer_state,
        on_error=on_error,
    )
    return matrix, {f"rewards/{name}/failures": float(count) for name, count in failures.items()}


def reward_metrics(
    matrix: torch.Tensor, combined: torch.Tensor, names: list[str], group_size: int
) -> dict[str, float]:
    """reward, reward_std (mean within-group std), rewards/<f>/mean|std, frac_reward_zero_std.

    matrix [N, F] (NaN = no reward), combined [N] weighted sum (NaN when a row has no reward at all).
    """
    metrics: dict[str, float] = {}
    for column, name in enumerate(names):
        values = matrix[:, column]
        values = values[~torch.isnan(values)]
        metrics[f"rewards/{name}/mean"] = float(values.mean()) if values.numel() else float("nan")
        metrics[f"rewards/{name}/std"] = float(values.std()) if values.numel() > 1 else float("nan")
    groups = torch.nan_to_num(combined, nan=0.0).view(-1, group_size)  # [N/G, G]
    group_std = groups.std(dim=1)  # [N/G]
    metrics["reward"] = float(torch.nanmean(combined))
    metrics["reward_std"] = float(group_std.mean())
    metrics["frac_reward_zero_std"] = float((group_std < 1e-6).float().mean())
    return metrics

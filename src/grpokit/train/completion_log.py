"""What the policy writes, in the log: ``completions.jsonl`` (``log_completions``) and a console print of a
few samples (``num_completions_to_print``), at the steps whose metrics are logged (TRL's two option names).

One JSON line per completion of the step's whole batch (all processes)::

    {"step": 3, "prompt": "347+285=", "completion": "7+5=12,...<answer>632</answer>",
     "rewards": {"arithmetic_exact_answer_reward": 1.0, "arithmetic_format_reward": 1.0},
     "reward": 1.1, "advantage": 0.84}

``rewards`` holds each function's value (null where it returned None), ``reward`` the weighted sum the
advantage was computed from, ``advantage`` the group-relative (outcome) advantage of the completion.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

__all__ = ["CompletionLog", "completion_records"]


def _number(value: float) -> float | None:
    return None if math.isnan(value) or math.isinf(value) else round(value, 6)


def completion_records(
    prompts: Sequence[Any],
    completions: Sequence[str],
    reward_names: Sequence[str],
    rewards: torch.Tensor,
    combined: torch.Tensor,
    advantages: torch.Tensor,
) -> list[dict[str, Any]]:
    """One record per completion. rewards [N, F] (NaN = None), combined [N], advantages [N]."""
    n = len(completions)
    if not (len(prompts) == n == rewards.shape[0] == combined.shape[0] == advantages.shape[0]):
        sizes = f"{len(prompts)} prompts, {n} completions, {rewards.shape[0]} reward rows"
        raise ValueError(f"completion_records: sizes differ ({sizes})")
    rewards, combined, advantages = rewards.cpu().tolist(), combined.cpu().tolist(), advantages.cpu().tolist()
    return [
        {
            "prompt": prompt,
            "completion": text,
            "rewards": {name: _number(v) for name, v in zip(reward_names, row)},
            "reward": _number(total),
            "advantage": _number(advantage),
        }
        for prompt, text, row, total, advantage in zip(prompts, completions, rewards, combined, advantages)
    ]


class CompletionLog:
    """Writes ``<output_dir>/completions.jsonl`` and/or prints samples; does nothing when ``enabled`` is
    False (processes other than the main one) or when neither is asked for."""

    def __init__(
        self, output_dir: str | Path, write: bool, num_to_print: int | None, enabled: bool = True
    ) -> None:
        self.path = Path(output_dir) / "completions.jsonl"
        self.write = write
        self.num_to_print = num_to_print or 0
        self.enabled = enabled

    @property
    def wanted(self) -> bool:
        """Whether any process must collect completions for this log (the same answer on every process)."""
        return self.write or self.num_to_print > 0

    def log(self, step: int, records: list[dict[str, Any]]) -> None:
        if not self.enabled:
            return
        if self.write:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as handle:
                for record in records:
                    handle.write(json.dumps({"step": step, **record}) + "\n")
        for record in records[: self.num_to_print]:
            tqdm.write(_format(step, record))


def _format(step: int, record: dict[str, Any]) -> str:
    prompt = record["prompt"] if isinstance(record["prompt"], str) else json.dumps(record["prompt"])
    scores = ", ".join(f"{name} {value}" for name, value in record["rewards"].items())
    return (
        f"[step {step}] reward {record['reward']} (advantage {record['advantage']}; {scores})\n"
        f"  prompt:     {prompt!r}\n  completion: {record['completion']!r}"
    )

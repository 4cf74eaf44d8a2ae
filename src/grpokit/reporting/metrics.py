"""The metrics of one GRPO step, built in one place: :func:`step_metrics`.

Names follow TRL where TRL has the quantity: ``reward``, ``reward_std``, ``rewards/<func>/mean|std``,
``frac_reward_zero_std``, ``completions/*``, the loss's (``loss``, ``kl``, ``entropy``, ``clip_ratio/*``,
``grad_norm``), ``learning_rate``; plus the phase timings ``time/<phase>`` with ``time/step`` the whole step,
and ``tokens_per_second``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence

import torch

from grpokit.core import combine_rewards, group_mean_std, resolve_group_sizes
from grpokit.reporting.proxy_gold import GoldWatch
from grpokit.rollout.base import GenerationOutput
from grpokit.rollout.records import Scores

__all__ = [
    "PhaseTimer",
    "completion_metrics",
    "progress_fields",
    "reward_means",
    "reward_metrics",
    "step_metrics",
]


class PhaseTimer:
    """Wall-clock seconds of the named phases of one step, and of the whole step since construction."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        begin = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - begin

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def metrics(self) -> dict[str, float]:
        """``time/<phase>`` for every phase and ``time/step``."""
        return {
            **{f"time/{name}": value for name, value in self.seconds.items()},
            "time/step": self.elapsed(),
        }


def reward_metrics(
    matrix: torch.Tensor,
    combined: torch.Tensor,
    names: Sequence[str],
    group_size: int | None = None,
    *,
    group_sizes: Sequence[int] | None = None,
) -> dict[str, float]:
    """reward, reward_std (mean within-group std), rewards/<f>/mean|std, frac_reward_zero_std.

    matrix [N, F] (NaN = no reward), combined [N] weighted sum (NaN when a row has no reward at all).
    Groups are contiguous: ``group_size`` rows each, or ragged ``group_sizes`` (as in
    ``grpokit.core.group_advantages``), and every group's unbiased std uses its own size. For the group
    statistics a row with no reward at all counts as reward 0 (as TRL).
    """
    metrics: dict[str, float] = {}
    for column, name in enumerate(names):
        values = matrix[:, column]
        values = values[~torch.isnan(values)]
        metrics[f"rewards/{name}/mean"] = float(values.mean()) if values.numel() else float("nan")
        metrics[f"rewards/{name}/std"] = float(values.std()) if values.numel() > 1 else float("nan")
    filled = torch.nan_to_num(combined, nan=0.0)  # [N]
    _, group_std, _ = group_mean_std(filled, group_size, group_sizes=group_sizes)  # [K]
    metrics["reward"] = float(torch.nanmean(combined))
    metrics["reward_std"] = float(group_std.mean())
    metrics["frac_reward_zero_std"] = float((group_std < 1e-6).float().mean())
    return metrics


def reward_means(
    matrix: torch.Tensor, weights: torch.Tensor, names: Sequence[str], prefix: str
) -> dict[str, float]:
    """``<prefix>reward`` (mean weighted sum over rows) and ``<prefix>rewards/<name>/mean``. matrix [N, F]."""
    combined = combine_rewards(matrix, weights)  # [N]
    metrics = {f"{prefix}reward": float(torch.nanmean(combined))}
    for column, name in enumerate(names):
        metrics[f"{prefix}rewards/{name}/mean"] = float(torch.nanmean(matrix[:, column]))
    return metrics


def completion_metrics(generated: GenerationOutput) -> dict[str, float]:
    """completions/mean_length, min_length, max_length, clipped_ratio (fraction truncated)."""
    lengths = torch.tensor([len(ids) for ids in generated.completion_ids], dtype=torch.float32)
    truncated = torch.tensor(generated.truncated or [False] * len(lengths), dtype=torch.float32)
    return {
        "completions/mean_length": float(lengths.mean()),
        "completions/min_length": float(lengths.min()),
        "completions/max_length": float(lengths.max()),
        "completions/clipped_ratio": float(truncated.mean()),
    }


def step_metrics(
    *,
    scores: Scores,
    reward_names: Sequence[str],
    group_size: int | None,
    generated: GenerationOutput,
    update: dict[str, float],
    extra: dict[str, float],
    learning_rate: float,
    num_tokens: int,
    timer: PhaseTimer,
    group_sizes: Sequence[int] | None = None,
    gold: GoldWatch | None = None,
) -> dict[str, float]:
    """This process's metrics of one step: rewards (over the whole batch), failures, with a ``gold`` reward
    the proxy against it (``proxy_gold/*``), completion lengths, the update's, the hooks' (``extra``), the
    learning rate, the phase timings and the throughput. Groups: equal ``group_size`` or ragged
    ``group_sizes`` (see :func:`reward_metrics`)."""
    elapsed = timer.elapsed()
    rewards, combined = scores.rewards.cpu(), scores.combined.cpu()  # [N, F], [N]
    watched = {}
    if gold is not None:
        watched = gold.metrics(rewards, resolve_group_sizes(len(rewards), group_size, group_sizes))
    return {
        **reward_metrics(rewards, combined, reward_names, group_size, group_sizes=group_sizes),
        **watched,
        **scores.failures,
        **completion_metrics(generated),
        **update,
        **extra,
        "learning_rate": learning_rate,
        **timer.metrics(),
        "tokens_per_second": num_tokens / max(elapsed, 1e-9),
    }


def progress_fields(metrics: dict[str, float]) -> dict[str, str]:
    """What the progress bar shows after a step: reward, KL and loss ("-" for a step without an update)."""
    return {
        "reward": f"{metrics['reward']:.3f}",
        "kl": f"{metrics.get('kl', 0.0):.4f}",
        "loss": f"{metrics['loss']:.4f}" if "loss" in metrics else "-",
    }

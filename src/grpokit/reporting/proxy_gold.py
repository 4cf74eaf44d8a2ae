"""Watching a learned reward being gamed: the proxy reward the policy trains on against a gold reward that
only watches (``GRPOConfig.gold_reward``, a reward function of weight 0).

Per step, over the completions that have both rewards:

- ``proxy_gold/proxy_mean``: mean proxy reward, the weighted sum of the other reward functions (what the
  advantages are computed from);
- ``proxy_gold/gold_mean``: mean gold reward;
- ``proxy_gold/gap``: ``proxy_mean - gold_mean``; on one scale (a reward model's probability of being right
  against a 0/1 correctness reward) a growing gap is the policy learning what the proxy likes and the gold
  does not;
- ``proxy_gold/accuracy``: the proxy as a classifier of the gold: the fraction of completions where
  ``proxy >= proxy_threshold`` agrees with ``gold >= 0.5``;
- ``proxy_gold/pair_accuracy``: the ranking GRPO uses, scale-free: over the pairs of completions of one group
  whose gold rewards differ, the fraction the proxy orders the same way (a tie counts 1/2); NaN when no
  group has such a pair.

A falling accuracy (or pair accuracy) with a rising proxy is reward hacking under way.

With process rewards (``GoldWatch.process``) the proxy of a completion is the process rewards' score of the
whole of it: the weighted step reward at its last step (for a process reward model trained on prefix labels,
its probability that the whole solution is on track); the outcome rewards are not part of it. Those metrics
are over this process's completions (the step rewards stay where they were scored).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from grpokit.core import combine_rewards

__all__ = ["GoldWatch", "compare_proxy_gold", "gold_reward_column", "proxy_gold_metrics"]


@dataclass(frozen=True)
class GoldWatch:
    """A run's gold reward: its reward-matrix column, the run's reward weights [F] and the proxy threshold."""

    column: int
    weights: torch.Tensor
    threshold: float = 0.5
    process: bool = False
    """The proxy is the process rewards' (:meth:`process_metrics`), not the weighted outcome rewards'."""

    @classmethod
    def from_run(
        cls,
        gold_reward: str | None,
        names: Sequence[str],
        weights: Sequence[float],
        threshold: float = 0.5,
        *,
        process: bool = False,
    ) -> GoldWatch | None:
        """None without a gold reward; else checked by :func:`gold_reward_column`. ``process``: the run
        has process rewards, which are then the proxy."""
        column = gold_reward_column(gold_reward, names, weights, process=process)
        if column is None:
            return None
        weights = torch.tensor([float(w) for w in weights], dtype=torch.float32)
        return cls(column, weights, float(threshold), process)

    def metrics(self, matrix: torch.Tensor, group_sizes: Sequence[int]) -> dict[str, float]:
        """:func:`proxy_gold_metrics` of one step's reward matrix [N, F]; nothing when the proxy is the
        process rewards' (the process hook reports those)."""
        if self.process:
            return {}
        return proxy_gold_metrics(matrix, self.weights, self.column, group_sizes, self.threshold)

    def process_metrics(
        self, step_rewards: Sequence[Sequence[float]], matrix: torch.Tensor, group_sizes: Sequence[int]
    ) -> dict[str, float]:
        """The ``proxy_gold/*`` metrics with each completion's last weighted step reward as its proxy.
        step_rewards: [n][S_i] (no steps: no proxy); matrix: the same n completions' rewards [n, F]."""
        proxy = torch.tensor([float(r[-1]) if len(r) else math.nan for r in step_rewards])  # [n]
        gold = matrix[:, self.column].to(torch.float32).cpu()  # [n]
        return compare_proxy_gold(proxy, gold, group_sizes, self.threshold)


def gold_reward_column(
    gold_reward: str | None, names: Sequence[str], weights: Sequence[float], *, process: bool = False
) -> int | None:
    """The reward-matrix column of ``GRPOConfig.gold_reward`` (None when not set), after checking that it
    names one of the run's reward functions, has weight 0 and leaves a proxy to compare it with: another
    reward with a nonzero weight, or (``process``) the run's process rewards."""
    if gold_reward is None:
        return None
    if gold_reward not in names:
        raise ValueError(
            f"GRPOConfig.gold_reward {gold_reward!r} is not one of the run's reward functions {list(names)}; "
            "give the reward function's metric name (as in rewards/<name>/mean)"
        )
    column = list(names).index(gold_reward)
    if float(weights[column]) != 0.0:
        raise ValueError(
            f"GRPOConfig.gold_reward {gold_reward!r} has weight {float(weights[column])} in reward_weights; "
            "a gold reward only watches, so give it weight 0 (otherwise the policy trains on it)"
        )
    if not process and not any(float(w) != 0.0 for i, w in enumerate(weights) if i != column):
        raise ValueError(
            f"GRPOConfig.gold_reward {gold_reward!r}: every other reward function has weight 0 and there are "
            "no process rewards, so there is no proxy reward to compare it with"
        )
    return column


def proxy_gold_metrics(
    matrix: torch.Tensor,
    weights: torch.Tensor,
    gold_column: int,
    group_sizes: Sequence[int],
    threshold: float = 0.5,
) -> dict[str, float]:
    """The ``proxy_gold/*`` metrics (module doc). matrix [N, F] (NaN = no reward), weights [F] (the gold's
    is 0); groups are contiguous rows of ``group_sizes``."""
    if sum(group_sizes) != matrix.shape[0]:
        raise ValueError(f"group sizes {list(group_sizes)} do not add up to the {matrix.shape[0]} rows")
    others = [f for f in range(matrix.shape[1]) if f != gold_column]
    proxy = combine_rewards(matrix[:, others], weights[others])  # [N], NaN where no proxy reward applies
    return compare_proxy_gold(proxy, matrix[:, gold_column].to(torch.float32), group_sizes, threshold)


def compare_proxy_gold(
    proxy: torch.Tensor, gold: torch.Tensor, group_sizes: Sequence[int], threshold: float = 0.5
) -> dict[str, float]:
    """The ``proxy_gold/*`` metrics (module doc) of per-completion proxy and gold rewards, [N] each (NaN:
    none); groups are contiguous rows of ``group_sizes``."""
    if sum(group_sizes) != proxy.shape[0]:
        raise ValueError(f"group sizes {list(group_sizes)} do not add up to the {proxy.shape[0]} rows")
    both = ~torch.isnan(proxy) & ~torch.isnan(gold)  # [N]
    nan = math.nan
    if not bool(both.any()):
        keys = ("proxy_mean", "gold_mean", "gap", "accuracy", "pair_accuracy")
        return {f"proxy_gold/{k}": nan for k in keys}
    p, g = proxy[both], gold[both]
    proxy_mean, gold_mean = float(p.mean()), float(g.mean())
    agree = float(((p >= threshold) == (g >= 0.5)).float().mean())
    return {
        "proxy_gold/proxy_mean": proxy_mean,
        "proxy_gold/gold_mean": gold_mean,
        "proxy_gold/gap": proxy_mean - gold_mean,
        "proxy_gold/accuracy": agree,
        "proxy_gold/pair_accuracy": _pair_accuracy(proxy, gold, both, group_sizes),
    }


def _pair_accuracy(
    proxy: torch.Tensor, gold: torch.Tensor, valid: torch.Tensor, group_sizes: Sequence[int]
) -> float:
    """Over pairs (i, j) of one group with gold_i > gold_j (both valid): mean of 1[p_i > p_j] + 1/2 1[p_i ==
    p_j]; NaN without such pairs."""
    score, pairs, start = 0.0, 0, 0
    for size in group_sizes:
        rows = torch.arange(start, start + size)[valid[start : start + size]]  # this group's valid rows
        start += size
        p, g = proxy[rows], gold[rows]  # [k]
        better = g[:, None] > g[None, :]  # [k, k]: i's gold above j's
        if not bool(better.any()):
            continue
        right = (p[:, None] > p[None, :]).float() + 0.5 * (p[:, None] == p[None, :]).float()  # [k, k]
        score += float(right[better].sum())
        pairs += int(better.sum())
    return score / pairs if pairs else math.nan

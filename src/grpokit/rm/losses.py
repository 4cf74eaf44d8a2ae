"""Reward-model losses: pointwise binary cross-entropy (optionally class-balanced) and the pairwise
Bradley-Terry loss, on scalar logits.

- Pointwise: ``BCE(s_i, y_i)`` averaged over the items (samples for an outcome RM, steps for a process RM),
  each weighted by its class weight. ``class_weights(labels)`` gives the two classes equal total weight:
  ``w_pos = n / (2 n_pos)``, ``w_neg = n / (2 n_neg)`` (labels >= 0.5 are positive), so a reward model
  trained on the policy's samples, most of them wrong, cannot win by answering "wrong" to everything.
- Pairwise (Bradley-Terry, as InstructGPT's and most preference reward models): for every pair of items of
  the same group (the same prompt and, for a process RM, the same step index) whose labels differ, with
  ``y_i > y_j``: ``-log sigmoid(s_i - s_j)``, averaged over the pairs. It trains the ranking GRPO uses
  (advantages only compare completions of one prompt) directly.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["bradley_terry_loss", "class_weights", "pointwise_loss"]


def class_weights(labels: torch.Tensor) -> tuple[float, float]:
    """``(w_neg, w_pos)`` giving both classes equal total weight over ``labels`` (positive: >= 0.5):
    ``n / (2 n_c)``. A class that is absent gets weight 1 (there is nothing to balance)."""
    n = labels.numel()
    n_pos = int((labels >= 0.5).sum())
    n_neg = n - n_pos
    if n_pos == 0 or n_neg == 0:
        return 1.0, 1.0
    return n / (2 * n_neg), n / (2 * n_pos)


def pointwise_loss(
    logits: torch.Tensor, labels: torch.Tensor, weights: tuple[float, float] = (1.0, 1.0)
) -> torch.Tensor:
    """``mean_i w(y_i) * BCE-with-logits(s_i, y_i)``, ``weights = (w_neg, w_pos)``; logits, labels [S]."""
    w = torch.where(labels >= 0.5, weights[1], weights[0]).to(logits.dtype)  # [S]
    return F.binary_cross_entropy_with_logits(logits, labels, weight=w)


def bradley_terry_loss(
    logits: torch.Tensor, labels: torch.Tensor, groups: torch.Tensor
) -> torch.Tensor | None:
    """Mean ``-log sigmoid(s_i - s_j)`` over the pairs (i, j) with ``groups[i] == groups[j]`` and
    ``labels[i] > labels[j]``; None when the batch has no such pair. logits, labels, groups: [S]."""
    same = groups[:, None] == groups[None, :]  # [S, S]
    better = labels[:, None] > labels[None, :]  # [S, S]: i is labelled better than j
    pairs = same & better
    if not bool(pairs.any()):
        return None
    margins = logits[:, None] - logits[None, :]  # [S, S]: s_i - s_j
    return F.softplus(-margins[pairs]).mean()  # -log sigmoid(m) = softplus(-m)

"""Group-relative advantages: outcome supervision, several rewards, process supervision and the two combined.

DeepSeekMath (arXiv:2402.03300), section 4.1.2 and 4.1.3. Groups are contiguous: rows k*G .. k*G+G-1 answer
the same prompt (``group_size=G``), or, for ragged groups, the first ``group_sizes[0]`` rows are group 0, the
next ``group_sizes[1]`` group 1, and so on. Every std here is the unbiased (Bessel, divide by n-1) std. NaN
marks "no reward" (a reward function returned None): it is left out of every mean and std, and its row gets
advantage 0.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import torch
from torch import Tensor

from .choices import MULTI_REWARD_AGGREGATIONS, SCALES
from .ragged import check_group_size, masked_mean_std, pad_groups, resolve_group_sizes, unpad_groups


def _all_equal(values: Tensor, valid: Tensor, dim: int) -> Tensor:
    """True where every valid entry along ``dim`` is equal (max == min), so the group carries no signal."""
    inf = torch.full_like(values, float("inf"))
    vmax = torch.where(valid, values, -inf).amax(dim=dim, keepdim=True)
    vmin = torch.where(valid, values, inf).amin(dim=dim, keepdim=True)
    return vmax == vmin


def group_advantages(
    rewards: Tensor,
    group_size: int | None = None,
    scale: str = "group",
    eps: float = 1e-4,
    *,
    group_sizes: Sequence[int] | None = None,
) -> Tensor:
    """Outcome-supervision advantages, one per completion.

    rewards: [N] (NaN = no reward). Groups: ``group_size`` G (N = K * G) or ragged ``group_sizes``
    [G_0, .., G_{K-1}] (contiguous, each >= 2, sum N); give one, or both if they agree. Returns [N] float32 on
    rewards' device.

        A_i = (r_i - mean_g) / (std_g + eps)      scale="group"  (the paper; std_g: unbiased, in the group)
        A_i = (r_i - mean_g) / (std_B + eps)      scale="batch"  (std_B: unbiased std of all valid rewards)
        A_i =  r_i - mean_g                       scale="none"   (Dr. GRPO, arXiv:2503.20783)

    mean_g and std_g skip NaN rewards and use the group's own size. A NaN row, every row of a group with fewer
    than 2 valid rewards, and every row of a group whose valid rewards are all equal get exactly 0.
    ``group_sizes=[G] * K`` gives bit-identical results to ``group_size=G``.
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [N], got shape {tuple(rewards.shape)}")
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    if group_sizes is None:
        sizes = None
        check_group_size(rewards.shape[0], group_size)
        r = rewards.to(torch.float32).view(-1, group_size)  # [K, G]
    else:
        sizes = resolve_group_sizes(rewards.shape[0], group_size, group_sizes)
        # Ragged groups padded with NaN, which every statistic below skips: [K, G_max].
        r = pad_groups(rewards.to(torch.float32), sizes)  # [K, G_max]
    valid = ~torch.isnan(r)  # [K, G]
    mean, std, count = masked_mean_std(r, valid, dim=1)  # [K, 1] each
    centered = r - mean  # [K, G]
    if scale == "group":
        adv = centered / (std + eps)
    elif scale == "batch":
        _, batch_std, _ = masked_mean_std(r, valid, dim=None)  # 0-dim
        adv = centered / (batch_std + eps)
    else:
        adv = centered
    no_signal = (count < 2) | _all_equal(r, valid, dim=1)  # [K, 1]
    adv = torch.where(valid & ~no_signal, adv, torch.zeros_like(adv))  # [K, G]
    return adv.reshape(-1) if sizes is None else unpad_groups(adv, sizes)  # [N]


def combine_rewards(rewards: Tensor, weights: Tensor | None = None) -> Tensor:
    """Weighted sum of several reward functions, skipping "no reward" entries.

    rewards: [N, F] (NaN = this function does not apply), weights: [F] or None (all 1). Returns [N] float32:
    r_i = sum_{f: r_if not NaN} w_f * r_if. A row whose F values are all NaN stays NaN (no reward at all).
    """
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be 2-D [N, F], got shape {tuple(rewards.shape)}")
    r = rewards.to(torch.float32)  # [N, F]
    if weights is None:
        w = torch.ones(r.shape[1], dtype=torch.float32, device=r.device)
    else:
        w = torch.as_tensor(weights, dtype=torch.float32, device=r.device)
        if w.shape != (r.shape[1],):
            raise ValueError(f"weights must have shape [F]=[{r.shape[1]}], got {tuple(w.shape)}")
    valid = ~torch.isnan(r)  # [N, F]
    total = torch.where(valid, r * w, torch.zeros_like(r)).sum(dim=1)  # [N]
    return torch.where(valid.any(dim=1), total, torch.full_like(total, float("nan")))


def multi_reward_advantages(
    rewards: Tensor,
    weights: Tensor | None,
    group_size: int | None = None,
    scale: str = "group",
    aggregation: str = "sum_then_normalize",
    eps: float = 1e-4,
    *,
    group_sizes: Sequence[int] | None = None,
) -> Tensor:
    """Advantages from several reward functions. rewards: [N, F] (NaN = no reward), weights: [F] or None.

    Groups as in :func:`group_advantages`: ``group_size`` (equal) or ``group_sizes`` (ragged, contiguous).
    aggregation="sum_then_normalize" (TRL default): A = group_advantages(sum_f w_f r_f, scale).
    aggregation="normalize_then_sum" (GDPO, arXiv:2601.05242; TRL's multi_objective_aggregation):
        a_if = (r_if - mean_g(r_f)) / (std_g(r_f) + eps)     each reward column within its group (NaN-aware)
        s_i  = sum_{f: r_if not NaN} w_f a_if                  weighted NaN-skipping sum
        A_i  = (s_i - mean_B(s)) / (std_B(s) + eps)            batch-wise standardisation over valid rows
    As in TRL, ``scale`` is not used by "normalize_then_sum": the per-reward step always divides by the group
    std and the last step by the batch std. Rows with no reward at all get 0; so does the whole batch when
    fewer than 2 rows have a reward or all summed values are equal. Returns [N] float32.
    """
    if aggregation not in MULTI_REWARD_AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {MULTI_REWARD_AGGREGATIONS}, got {aggregation!r}")
    if aggregation == "sum_then_normalize":
        combined = combine_rewards(rewards, weights)  # [N]
        return group_advantages(combined, group_size, scale=scale, eps=eps, group_sizes=group_sizes)
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    r = rewards.to(torch.float32)
    if r.dim() != 2:
        raise ValueError(f"rewards must be 2-D [N, F], got shape {tuple(rewards.shape)}")
    if group_sizes is None:
        check_group_size(r.shape[0], group_size)  # checked once, before the F columns
    else:
        group_sizes = resolve_group_sizes(r.shape[0], group_size, group_sizes)
        group_size = None  # agreed (or absent); the columns use group_sizes
    # Each column normalised in its group; NaN entries come back as NaN so the weighted sum skips them.
    columns = [
        group_advantages(r[:, f], group_size, "group", eps, group_sizes=group_sizes)  # [N]
        for f in range(r.shape[1])
    ]
    per_reward = torch.stack(columns, dim=1)  # [N, F]
    per_reward = torch.where(torch.isnan(r), r, per_reward)  # [N, F], NaN kept
    summed = combine_rewards(per_reward, weights)  # [N], NaN where the row has no reward
    s = summed.view(1, -1)  # [1, N]: one "group" spanning the batch
    valid = ~torch.isnan(s)  # [1, N]
    mean, std, count = masked_mean_std(s, valid, dim=1)  # [1, 1] each
    no_signal = (count < 2) | _all_equal(s, valid, dim=1)  # [1, 1]
    adv = torch.where(valid & ~no_signal, (s - mean) / (std + eps), torch.zeros_like(s))  # [1, N]
    return adv.reshape(-1)


def process_advantages(
    step_rewards: Sequence[Sequence[float]],
    step_ends: Sequence[Sequence[int]],
    group_size: int | None = None,
    num_tokens: int | None = None,
    eps: float = 1e-4,
    *,
    group_sizes: Sequence[int] | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Process-supervision token advantages (DeepSeekMath section 4.1.3). Returns [N, num_tokens].

    step_rewards[i][j]: the reward of step j of completion i; step_ends[i][j]: index (within the completion)
    of the last token of that step, non-decreasing in j and < num_tokens. For each group, R = every step
    reward of every completion in it, and

        r~_ij  = (r_ij - mean(R)) / (std(R) + eps)       (unbiased std; r_ij - mean(R) if |R| < 2 or std = 0)
        A[i,t] = sum_{j : step_ends[i][j] >= t} r~_ij    (tokens after the last step end get 0)

    Groups as in :func:`group_advantages`: ``group_size`` (equal) or ``group_sizes`` (ragged, contiguous);
    ``num_tokens`` is required. A completion may have no steps (its row is 0). Step rewards must be finite:
    ValueError naming the row.
    """
    num_rows = len(step_rewards)
    if len(step_ends) != num_rows:
        raise ValueError(f"step_rewards has {num_rows} rows but step_ends has {len(step_ends)}")
    sizes = resolve_group_sizes(num_rows, group_size, group_sizes)
    if not isinstance(num_tokens, int) or num_tokens < 1:
        raise ValueError(f"num_tokens must be a positive int, got {num_tokens!r}")
    for i, (rews, ends) in enumerate(zip(step_rewards, step_ends)):
        if len(rews) != len(ends):
            raise ValueError(f"row {i}: {len(rews)} step rewards but {len(ends)} step ends")
        if any(b < a for a, b in itertools.pairwise(ends)):
            raise ValueError(f"row {i}: step_ends must be non-decreasing, got {list(ends)}")
        if any(not 0 <= e < num_tokens for e in ends):
            raise ValueError(
                f"row {i}: every step end must lie in [0, num_tokens={num_tokens}), got {list(ends)}"
            )
        if not all(math.isfinite(r) for r in rews):
            raise ValueError(f"row {i}: step rewards must be finite, got {list(rews)}")

    out = torch.zeros(num_rows, num_tokens, dtype=torch.float64)  # [N, T], built in float64 on the host
    for end, size in zip(itertools.accumulate(sizes), sizes, strict=True):
        g = end - size  # first row of the group
        pooled = torch.tensor(
            [float(r) for rews in step_rewards[g : g + size] for r in rews], dtype=torch.float64
        )  # [|R|]
        if pooled.numel() == 0:
            continue
        mean = pooled.mean()
        std = pooled.std(correction=1) if pooled.numel() >= 2 else torch.zeros((), dtype=torch.float64)
        denom = std + eps if std > 0 else torch.ones((), dtype=torch.float64)
        for i in range(g, g + size):
            if len(step_ends[i]) == 0:
                continue
            normed = (torch.tensor(step_rewards[i], dtype=torch.float64) - mean) / denom  # [S_i]
            at_end = torch.zeros(num_tokens, dtype=torch.float64)  # [T]: r~ placed at each step's last token
            at_end.index_add_(0, torch.tensor(step_ends[i], dtype=torch.long), normed)
            # A[i, t] = sum over steps ending at or after t: a reversed cumulative sum.
            out[i] = at_end.flip(0).cumsum(0).flip(0)
    return out.to(device=device, dtype=dtype)


def combine_outcome_and_process(
    outcome_adv: torch.Tensor,
    process_adv: torch.Tensor,
    mask: torch.Tensor,
    outcome_weight: float = 1.0,
    process_weight: float = 1.0,
) -> torch.Tensor:
    """Per-token advantages from both kinds of supervision: a weighted sum, masked. Returns [N, T] float32.

        A[i, t] = mask[i, t] * (outcome_weight * A_outcome[i] + process_weight * A_process[i, t])

    Each part is normalised within its group on its own first (``group_advantages`` over the outcome
    rewards, ``process_advantages`` over the pooled step rewards), so the weights set their relative scale.
    Note the process part sums the normalised rewards of every step at or after t, so early tokens of a
    long chain carry larger magnitudes than the outcome part; weight accordingly.
    outcome_adv: [N]; process_adv, mask: [N, T].
    """
    if outcome_adv.dim() != 1:
        raise ValueError(f"outcome_adv must be [N], got shape {tuple(outcome_adv.shape)}")
    if process_adv.dim() != 2 or process_adv.shape[0] != outcome_adv.shape[0]:
        raise ValueError(
            f"process_adv must be [N={outcome_adv.shape[0]}, T], got shape {tuple(process_adv.shape)}"
        )
    if mask.shape != process_adv.shape:
        raise ValueError(
            f"mask shape {tuple(mask.shape)} must equal process_adv shape {tuple(process_adv.shape)}"
        )
    outcome = outcome_adv.to(torch.float32)[:, None]  # [N, 1]
    combined = outcome_weight * outcome + process_weight * process_adv.to(torch.float32)  # [N, T]
    return combined * mask.to(torch.float32)  # [N, T]

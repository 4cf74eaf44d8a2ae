"""Group layout of a batch: equal groups of ``group_size`` rows, or ragged groups of ``group_sizes`` rows.

Groups are always contiguous: with ``group_sizes=[2, 3]`` rows 0..1 are group 0 and rows 2..4 group 1; with
``group_size=G`` rows k*G .. k*G+G-1 are group k. Ragged groups are laid out as a padded [K, G_max] matrix
(``pad_groups``) so per-group statistics are the same vectorised reductions over ``dim=1`` as for equal
groups; padding is NaN, which every statistic here already skips as "no reward".
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = [
    "check_group_size",
    "group_index",
    "group_mean_std",
    "masked_mean_std",
    "pad_groups",
    "resolve_group_sizes",
    "unpad_groups",
]


def check_group_size(num_rows: int, group_size: int | None) -> None:
    """ValueError unless ``group_size`` is an int >= 2 that divides ``num_rows``."""
    if group_size is None:
        raise ValueError("give group_size (equal groups) or group_sizes (ragged groups), got neither")
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 2:
        raise ValueError(
            f"group_size must be an int >= 2 (a group of one has no baseline), got {group_size!r}"
        )
    if num_rows % group_size != 0:
        raise ValueError(f"group_size={group_size} does not divide N={num_rows}: groups must be whole")


def resolve_group_sizes(
    num_rows: int, group_size: int | None = None, group_sizes: Sequence[int] | None = None
) -> list[int]:
    """The size of every group, checked: exactly one of ``group_size`` (equal groups) or ``group_sizes``
    (ragged groups, contiguous), or both when they agree (every entry of ``group_sizes`` == ``group_size``).

    ``group_sizes`` must hold ints >= 2 (a group of one has no baseline) that sum to ``num_rows``.
    Raises ValueError naming the argument at fault.
    """
    if group_sizes is None:
        check_group_size(num_rows, group_size)
        return [group_size] * (num_rows // group_size)
    if isinstance(group_sizes, Tensor):
        if group_sizes.dim() != 1 or group_sizes.is_floating_point() or group_sizes.dtype == torch.bool:
            raise ValueError(f"group_sizes must be a 1-D sequence of ints, got {group_sizes!r}")
        group_sizes = group_sizes.tolist()
    if isinstance(group_sizes, (str, bytes)) or not isinstance(group_sizes, Sequence):
        raise ValueError(f"group_sizes must be a sequence of ints, got {group_sizes!r}")
    sizes: list[int] = []
    for k, size in enumerate(group_sizes):
        if isinstance(size, bool):
            raise ValueError(f"group_sizes[{k}] must be an int, got {size!r}")
        try:
            size = operator.index(size)  # int, numpy int; not float
        except TypeError:
            raise ValueError(f"group_sizes[{k}] must be an int, got {size!r}") from None
        if size < 2:
            raise ValueError(
                f"group_sizes[{k}] = {size}: every group needs >= 2 rows (a group of one has no baseline)"
            )
        sizes.append(size)
    if sum(sizes) != num_rows:
        raise ValueError(
            f"group_sizes sum to {sum(sizes)} but there are N={num_rows} rows: groups must be whole"
        )
    if group_size is not None and any(size != group_size for size in sizes):
        raise ValueError(
            f"group_size={group_size!r} and group_sizes={sizes} disagree: give one of them "
            "(group_size for equal groups, group_sizes for ragged ones)"
        )
    return sizes


def group_index(sizes: Sequence[int], device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
    """Segment ids: (group [N], position [N]) long tensors, row i is entry ``position[i]`` of ``group[i]``."""
    sizes_t = torch.as_tensor(list(sizes), dtype=torch.long, device=device)  # [K]
    num_rows = int(sum(sizes))
    group = torch.repeat_interleave(
        torch.arange(len(sizes), device=device), sizes_t, output_size=num_rows
    )  # [N]
    starts = torch.cumsum(sizes_t, dim=0) - sizes_t  # [K]: first row of each group
    position = torch.arange(num_rows, device=device) - starts[group]  # [N]
    return group, position


def pad_groups(values: Tensor, sizes: Sequence[int], fill: float = float("nan")) -> Tensor:
    """Rows of ``values`` [N, ...] laid out per group: [K, G_max, ...], the missing entries set to ``fill``.

    With equal sizes G this is exactly ``values.view(K, G, ...)`` (same values, same layout).
    """
    group, position = group_index(sizes, values.device)  # [N], [N]
    width = max(sizes, default=1)  # no groups: [0, 1], so reductions over dim 1 stay well defined
    padded = values.new_full((len(sizes), width, *values.shape[1:]), fill)  # [K, G_max, ...]
    padded[group, position] = values
    return padded


def unpad_groups(padded: Tensor, sizes: Sequence[int]) -> Tensor:
    """The inverse of :func:`pad_groups`: [K, G_max, ...] -> [N, ...] (padding dropped)."""
    group, position = group_index(sizes, padded.device)  # [N], [N]
    return padded[group, position]


def masked_mean_std(values: Tensor, valid: Tensor, dim: int | None) -> tuple[Tensor, Tensor, Tensor]:
    """NaN-aware mean, unbiased std and count of ``values`` where ``valid``, over ``dim`` (None: all).

    count = sum(valid); mean = sum(v) / count; std = sqrt(sum((v - mean)^2) / (count - 1)).
    With count < 2 the std is returned as 0 (callers zero those advantages anyway).
    """
    zeros = torch.zeros_like(values)
    v = torch.where(valid, values, zeros)
    keep = dim is not None
    dims = dim if dim is not None else tuple(range(values.dim()))
    count = valid.sum(dim=dims, keepdim=keep).to(values.dtype)
    mean = v.sum(dim=dims, keepdim=keep) / count.clamp(min=1.0)
    centered = torch.where(valid, values - mean, zeros)
    var = centered.pow(2).sum(dim=dims, keepdim=keep) / (count - 1.0).clamp(min=1.0)
    return mean, var.sqrt(), count


def group_mean_std(
    values: Tensor, group_size: int | None = None, *, group_sizes: Sequence[int] | None = None
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-group NaN-skipping mean, unbiased std and count of valid values: three [K] float32 tensors.

    values: [N] (NaN = no value). A group with fewer than 2 valid values has std 0 (and mean 0 if none).
    """
    if values.dim() != 1:
        raise ValueError(f"values must be 1-D [N], got shape {tuple(values.shape)}")
    sizes = resolve_group_sizes(values.shape[0], group_size, group_sizes)
    grouped = pad_groups(values.to(torch.float32), sizes)  # [K, G_max], NaN padding
    mean, std, count = masked_mean_std(grouped, ~torch.isnan(grouped), dim=1)  # [K, 1] each
    return mean.squeeze(1), std.squeeze(1), count.squeeze(1)

"""Advantages for games the policy plays against itself: each role is its own group.

In self-play the same policy plays every role, and roles do not earn alike (Kuhn poker's first player
expects -1/18 at equilibrium, tic-tac-toe's X wins more often against a weak opponent). A baseline shared by
the roles would credit the seat, not the play. Two estimators:

- **Role groups** (``role_group_sizes``): G games from the same start (the same deal) give each role
  a group of G returns; each return is normalised within its role's group, exactly as
  ``group_advantages`` normalises a prompt's G completions. With a prompt's episodes laid out role-major
  (``grpokit.envs.selfplay``) the role groups are contiguous: splitting each prompt's group into its R
  roles' parts is all it takes.
- **Role-conditioned advantage estimation** (``RoleBaselines``; SPIRAL, arXiv 2506.24119, "RAE"): a
  baseline per (game, role), an exponential moving average of that role's returns; an episode's advantage
  is its return minus the baseline as it was before that episode, then the baseline moves toward the
  return: ``A = R - b``, ``b <- alpha b + (1 - alpha) R``, episode by episode in the batch's order.

Every turn a player takes carries that player's advantage (repeated on each of its turns).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

__all__ = ["RoleBaselines", "role_group_sizes"]


def role_group_sizes(group_sizes: Sequence[int], num_roles: int) -> list[int]:
    """Each prompt's group (``group_sizes[k]`` episodes, role-major) split into its ``num_roles`` roles'
    groups: ``[6, 4]`` with 2 roles -> ``[3, 3, 2, 2]``."""
    if num_roles < 1:
        raise ValueError(f"num_roles must be >= 1, got {num_roles}")
    uneven = [size for size in group_sizes if size % num_roles]
    if uneven:
        raise ValueError(f"groups of {uneven} episodes do not split into {num_roles} roles")
    return [size // num_roles for size in group_sizes for _ in range(num_roles)]


class RoleBaselines:
    """SPIRAL's role-conditioned baselines: one exponential moving average per (game, role).

    ``alpha``: the weight of the old baseline (SPIRAL: 0.95); a baseline starts at 0. ``advantages`` reads
    each episode's baseline, then updates it with that episode's return, in order. ``state_dict`` /
    ``load_state_dict`` carry them through a checkpoint."""

    def __init__(self, alpha: float = 0.95) -> None:
        if not 0.0 <= alpha < 1.0:
            raise ValueError(f"alpha must be in [0, 1), got {alpha}")
        self.alpha = alpha
        self.baselines: dict[str, float] = {}

    def advantages(self, keys: Sequence[str], returns: Tensor) -> Tensor:
        """keys: each episode's ``"<game>/<role>"``; returns: [N] (NaN: no return, advantage 0) -> [N]
        float32: each return minus its key's baseline before that episode; the baseline then takes it."""
        if returns.dim() != 1 or len(keys) != returns.numel():
            raise ValueError(f"returns must be [N], one key each: {tuple(returns.shape)}, {len(keys)} keys")
        out = torch.zeros(returns.numel(), dtype=torch.float32)
        for n, (key, value) in enumerate(zip(keys, returns.tolist())):
            if math.isnan(value):
                continue
            baseline = self.baselines.get(key, 0.0)
            out[n] = value - baseline
            self.baselines[key] = self.alpha * baseline + (1 - self.alpha) * value
        return out

    def state_dict(self) -> dict[str, object]:
        return {"alpha": self.alpha, "baselines": dict(self.baselines)}

    def load_state_dict(self, state: Mapping[str, object]) -> None:
        self.alpha = float(state["alpha"])  # type: ignore[arg-type]
        self.baselines = {str(k): float(v) for k, v in dict(state["baselines"]).items()}  # type: ignore[call-overload]

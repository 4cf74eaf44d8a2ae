"""Advantages for games the policy plays against itself: each role is its own group.

In self-play the same policy plays every role, and roles do not earn alike (Kuhn poker's first player
expects -1/18 at equilibrium, tic-tac-toe's X wins more often against a weak opponent). A baseline shared by
the roles would credit the seat, not the play. Two estimators:

- **Role groups** (``role_group_advantages``): G games from the same start (the same deal) give each role
  a group of G returns; each return is normalised within its role's group, exactly as
  ``group_advantages`` normalises a prompt's G completions.
- **Role-conditioned advantage estimation** (``RoleBaselines``; SPIRAL, arXiv 2506.24119, "RAE"): a
  baseline per (game, role), an exponential moving average of that role's returns; a game's advantage for a
  role is its return minus the baseline as it was before the game, then the baseline moves toward the
  return: ``A = R - b``, ``b <- alpha b + (1 - alpha) R``.

Every turn a player takes carries that player's advantage (repeated on each of its turns).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from torch import Tensor

from .advantages import group_advantages

__all__ = ["RoleBaselines", "role_group_advantages"]


def role_group_advantages(
    returns: Tensor, group_size: int, scale: str = "group", eps: float = 1e-4
) -> Tensor:
    """returns: [N, R] (N = K * G games, games k*G .. k*G+G-1 from one start; R roles; NaN: the role took
    no turn) -> [N, R] advantages, each role's column normalised within each group of G games
    (``group_advantages`` with ``scale`` "group", "batch" or "none", per role)."""
    if returns.dim() != 2:
        raise ValueError(f"returns must be [games, roles], got shape {tuple(returns.shape)}")
    columns = [group_advantages(returns[:, role], group_size, scale, eps) for role in range(returns.shape[1])]
    return torch.stack(columns, dim=1)  # [N, R]


class RoleBaselines:
    """SPIRAL's role-conditioned baselines: one exponential moving average per (game, role).

    ``alpha``: the weight of the old baseline (SPIRAL: 0.95); a baseline starts at 0. ``advantages`` reads
    each game's baselines, then updates them with that game's returns, in order. ``state_dict`` /
    ``load_state_dict`` carry them through a checkpoint."""

    def __init__(self, alpha: float = 0.95) -> None:
        if not 0.0 <= alpha < 1.0:
            raise ValueError(f"alpha must be in [0, 1), got {alpha}")
        self.alpha = alpha
        self.baselines: dict[str, float] = {}

    def advantages(self, game: str, roles: Iterable[str], returns: Tensor) -> Tensor:
        """returns: [N, R] for N games of ``game`` (R ``roles``; NaN: no turn) -> [N, R] float32: each game's
        return minus its role's baseline before that game; the baselines then take that game's returns."""
        roles = list(roles)
        out = torch.zeros(returns.shape, dtype=torch.float32)
        for n, row in enumerate(returns.tolist()):
            for r, (role, value) in enumerate(zip(roles, row)):
                if value != value:  # NaN: this role took no turn in game n
                    continue
                key = f"{game}/{role}"
                baseline = self.baselines.get(key, 0.0)
                out[n, r] = value - baseline
                self.baselines[key] = self.alpha * baseline + (1 - self.alpha) * value
        return out

    def state_dict(self) -> dict[str, object]:
        return {"alpha": self.alpha, "baselines": dict(self.baselines)}

    def load_state_dict(self, state: Mapping[str, object]) -> None:
        self.alpha = float(state["alpha"])  # type: ignore[arg-type]
        self.baselines = {str(k): float(v) for k, v in dict(state["baselines"]).items()}  # type: ignore[call-overload]

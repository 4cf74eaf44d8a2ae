"""Role-wise advantages against values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from grpokit.core import RoleBaselines, role_group_advantages


def test_each_role_is_its_own_group():
    # 2 starts x G=2 games, 2 roles; role 0 always earns more than role 1: a shared baseline would not see it
    returns = torch.tensor([[3.0, -1.0], [1.0, -3.0], [2.0, 0.0], [2.0, 0.0]])
    adv = role_group_advantages(returns, group_size=2, scale="none")
    assert adv.tolist() == [[1.0, 1.0], [-1.0, -1.0], [0.0, 0.0], [0.0, 0.0]]
    scaled = role_group_advantages(returns, group_size=2)  # std of (3, 1) = sqrt(2) (unbiased)
    assert scaled[0, 0].item() == pytest.approx(1 / (math.sqrt(2) + 1e-4))
    assert scaled[2:].abs().sum() == 0  # equal returns: no signal


def test_a_role_without_a_turn_gets_zero():
    returns = torch.tensor([[1.0, float("nan")], [0.0, 2.0], [0.5, 1.0]])
    adv = role_group_advantages(returns, group_size=3, scale="none")
    assert adv[:, 0].tolist() == pytest.approx([0.5, -0.5, 0.0])
    assert adv[:, 1].tolist() == pytest.approx([0.0, 0.5, -0.5])  # mean of (2, 1) only
    with pytest.raises(ValueError, match="games, roles"):
        role_group_advantages(torch.zeros(4), group_size=2)


def test_role_baselines_read_then_update():
    """alpha 0.5: baseline 0 -> A = 1, b = 0.5 -> A = 1 - 0.5 = 0.5, b = 0.75 -> A = -0.75, b = -0.125."""
    rae = RoleBaselines(alpha=0.5)
    adv = rae.advantages("kuhn", ["first", "second"], torch.tensor([[1.0, -1.0], [1.0, -1.0], [0.0, 0.0]]))
    assert adv[:, 0].tolist() == pytest.approx([1.0, 0.5, -0.75])
    assert adv[:, 1].tolist() == pytest.approx([-1.0, -0.5, 0.75])
    assert rae.baselines == pytest.approx({"kuhn/first": 0.375, "kuhn/second": -0.375})
    other = RoleBaselines()
    other.load_state_dict(rae.state_dict())
    assert other.alpha == 0.5 and other.baselines == rae.baselines
    with pytest.raises(ValueError, match="alpha"):
        RoleBaselines(alpha=1.0)

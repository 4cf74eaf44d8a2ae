"""Role-wise advantages against values computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from grpokit.core import RoleBaselines, group_advantages, role_group_sizes


def test_each_role_is_its_own_group():
    # one deal, 2 roles x G=2 games, role-major: role 0 always earns more than role 1; a baseline shared by
    # the seats would credit the seat (role 0 +2, role 1 -2), not the play
    returns = torch.tensor([3.0, 1.0, -1.0, -3.0, 2.0, 2.0, 0.0, 0.0])  # deal 1: equal returns
    sizes = role_group_sizes([4, 4], num_roles=2)
    assert sizes == [2, 2, 2, 2]
    adv = group_advantages(returns, None, "none", group_sizes=sizes)
    assert adv.tolist() == [1.0, -1.0, 1.0, -1.0, 0.0, 0.0, 0.0, 0.0]
    shared = group_advantages(returns, None, "none", group_sizes=[4, 4])
    assert shared[:4].tolist() == [3.0, 1.0, -1.0, -3.0]  # the seat's edge as signal
    scaled = group_advantages(returns, None, "group", group_sizes=sizes)  # std of (3, 1) = sqrt(2)
    assert scaled[0].item() == pytest.approx(1 / (math.sqrt(2) + 1e-4))
    assert scaled[4:].abs().sum() == 0  # equal returns: no signal


def test_a_seat_without_a_return_is_skipped():
    returns = torch.tensor([1.0, 0.0, 0.5, float("nan"), 2.0, 1.0])  # 2 roles x 3 games
    adv = group_advantages(returns, None, "none", group_sizes=role_group_sizes([6], 2))
    assert adv[:3].tolist() == pytest.approx([0.5, -0.5, 0.0])
    assert adv[4:].tolist() == pytest.approx([0.5, -0.5])  # the mean of (2, 1) only
    with pytest.raises(ValueError, match="do not split into 2 roles"):
        role_group_sizes([4, 3], 2)


def test_role_baselines_read_then_update():
    """alpha 0.5: baseline 0 -> A = 1, b = 0.5 -> A = 1 - 0.5 = 0.5, b = 0.75 -> A = -0.75, b = 0.375."""
    rae = RoleBaselines(alpha=0.5)
    keys = ["kuhn/first", "kuhn/second"] * 3
    adv = rae.advantages(keys, torch.tensor([1.0, -1.0, 1.0, -1.0, 0.0, 0.0]))
    assert adv[0::2].tolist() == pytest.approx([1.0, 0.5, -0.75])
    assert adv[1::2].tolist() == pytest.approx([-1.0, -0.5, 0.75])
    assert rae.baselines == pytest.approx({"kuhn/first": 0.375, "kuhn/second": -0.375})
    nan = rae.advantages(["kuhn/first"], torch.tensor([float("nan")]))
    assert nan.tolist() == [0.0] and rae.baselines["kuhn/first"] == 0.375  # no return: no update
    other = RoleBaselines()
    other.load_state_dict(rae.state_dict())
    assert other.alpha == 0.5 and other.baselines == rae.baselines
    with pytest.raises(ValueError, match="alpha"):
        RoleBaselines(alpha=1.0)

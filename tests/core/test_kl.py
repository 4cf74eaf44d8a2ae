"""KL estimators by hand, k3 >= 0, and no overflow."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpokit.core import kl_penalty

LOGPS = torch.tensor([-1.0, -2.0, -0.5])
REF = torch.tensor([-1.5, -1.0, -0.5])
# d = ref - logps = [-0.5, 1.0, 0.0]


def test_k1_by_hand():
    # k1 = logps - ref = -d = [0.5, -1.0, 0.0]
    torch.testing.assert_close(kl_penalty(LOGPS, REF, "k1"), torch.tensor([0.5, -1.0, 0.0]))


def test_k2_by_hand():
    # k2 = d^2 / 2 = [0.125, 0.5, 0.0]
    torch.testing.assert_close(kl_penalty(LOGPS, REF, "k2"), torch.tensor([0.125, 0.5, 0.0]))


def test_k3_by_hand():
    # k3 = exp(d) - d - 1: exp(-0.5) + 0.5 - 1 = 0.1065307; exp(1) - 1 - 1 = 0.7182818; exp(0) - 0 - 1 = 0.
    expected = torch.tensor([math.exp(-0.5) - 0.5, math.e - 2.0, 0.0])
    torch.testing.assert_close(kl_penalty(LOGPS, REF), expected)


def test_k3_gradient_by_hand():
    # d k3 / d logps = d/dlogps [exp(ref - logps) - (ref - logps) - 1] = 1 - exp(d) = [1 - e^-0.5, 1 - e, 0].
    logps = LOGPS.clone().requires_grad_(True)
    kl_penalty(logps, REF).sum().backward()
    torch.testing.assert_close(logps.grad, torch.tensor([1 - math.exp(-0.5), 1 - math.e, 0.0]))


def test_k3_is_finite_at_extremes():
    # d is clamped to [-20, 20]: d = -1000 -> exp(-20) + 20 - 1; d = +1000 -> exp(20) - 21.
    out = kl_penalty(torch.tensor([0.0, -1000.0]), torch.tensor([-1000.0, 0.0]))
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, torch.tensor([math.exp(-20) + 19.0, math.exp(20) - 21.0]))


def test_float32_whatever_the_input():
    out = kl_penalty(LOGPS.to(torch.bfloat16), REF.to(torch.bfloat16))
    assert out.dtype == torch.float32


def test_validation():
    with pytest.raises(ValueError, match="estimator"):
        kl_penalty(LOGPS, REF, "k4")
    with pytest.raises(ValueError, match="ref_logps"):
        kl_penalty(LOGPS, REF[:2])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(-60, 0, allow_nan=False, width=32), min_size=1, max_size=16),
    st.lists(st.floats(-60, 0, allow_nan=False, width=32), min_size=1, max_size=16),
)
def test_k3_is_nonnegative(a, b):
    n = min(len(a), len(b))
    out = kl_penalty(torch.tensor(a[:n]), torch.tensor(b[:n]), "k3")
    assert torch.isfinite(out).all()
    assert (out >= 0).all()


@settings(max_examples=200, deadline=None)
@given(
    st.floats(-30, 0, allow_nan=False, width=32),
    st.floats(-0.0009765625, 0.0009765625, allow_nan=False, width=32),
)
def test_k3_is_nonnegative_for_nearby_logps(logp, gap):
    # exp(d) - d - 1 computed naively in float32 goes negative for |d| ~ 1e-8; the estimator must not.
    out = kl_penalty(torch.tensor([logp]), torch.tensor([logp]) + gap, "k3")
    assert (out >= 0).all()

"""Policy loss: hand-computed objectives and aggregations, gradients, and equivalence invariants."""

import math

import pytest
import torch

from grpokit.core import (
    LOSS_PRESETS,
    LossConfigError,
    PolicyLoss,
    bnpo_aggregation,
    dapo_aggregation,
    dr_grpo_aggregation,
    entropy_threshold,
    grpo_aggregation,
    importance_sampling_weights,
    luspo_aggregation,
    off_policy_sequence_mask,
    policy_loss,
    top_entropy_mask,
    vespo_gamma_weights,
)
from grpokit.core.token_weights import importance_sampling_ratio

ALL_LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"]
LEVELS = ["token", "sequence", "sequence_token"]
# Ragged batch: row 0 has 3 completion tokens, row 1 has 2 (its last column is padding).
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
PER_TOKEN = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 100.0]])  # 100.0 is padding garbage


def kwargs_for(loss_type: str) -> dict:
    """Arguments each preset needs: dr_grpo a max length, cispo its weight cap."""
    extra: dict = {"loss_type": loss_type}
    if loss_type == "dr_grpo":
        extra["max_completion_length"] = 16
    if loss_type == "cispo":
        extra["epsilon_high"] = 5.0
    return extra


def scalar(x: torch.Tensor, value: float, tol: float = 1e-5) -> None:
    torch.testing.assert_close(x, torch.tensor(value, dtype=torch.float32), rtol=0.0, atol=tol)


# --- aggregations on a ragged batch -------------------------------------------------------------------------


def test_grpo_aggregation_by_hand():
    # Row means: (1 + 2 + 3) / 3 = 2 and (4 + 5) / 2 = 4.5; mean over rows = 3.25.
    scalar(grpo_aggregation(PER_TOKEN, MASK), 3.25)


def test_bnpo_aggregation_by_hand():
    # (1 + 2 + 3 + 4 + 5) / 5 tokens = 3.
    scalar(bnpo_aggregation(PER_TOKEN, MASK), 3.0)


def test_dr_grpo_aggregation_by_hand():
    # 15 / (N=2 * max_completion_length=4) = 1.875.
    scalar(dr_grpo_aggregation(PER_TOKEN, MASK, 4), 1.875)


def test_dapo_aggregation_by_hand():
    # 15 / num_items_in_batch=10 = 1.5; without it, the local count: 15 / 5 = 3.
    scalar(dapo_aggregation(PER_TOKEN, MASK, 10), 1.5)
    scalar(dapo_aggregation(PER_TOKEN, MASK, torch.tensor(10)), 1.5)
    scalar(dapo_aggregation(PER_TOKEN, MASK, None), 3.0)


def test_luspo_aggregation_by_hand():
    # Row sums: 1 + 2 + 3 = 6 and 4 + 5 = 9 (the padding 100 is not read); mean over rows = 7.5.
    scalar(luspo_aggregation(PER_TOKEN, MASK), 7.5)


@pytest.mark.parametrize(
    ("loss_type", "expected"),
    [("grpo", 3.25), ("bnpo", 3.0), ("dr_grpo", 15 / (2 * 4)), ("dapo", 1.5), ("luspo", 7.5)],
)
def test_policy_loss_aggregates_by_hand(loss_type, expected):
    # On-policy (ratio 1) the clipped objective is -A per token,
    # so A = -PER_TOKEN makes the per-token loss PER_TOKEN.
    logps = torch.full((2, 3), -1.0)
    loss, _ = policy_loss(
        logps, None, -PER_TOKEN, MASK, loss_type=loss_type, max_completion_length=4, num_items_in_batch=10
    )
    scalar(loss, expected)


def is_global(loss_type: str) -> bool:
    return PolicyLoss(**kwargs_for(loss_type)).is_global


def test_aggregation_is_global():
    assert is_global("dapo") and is_global("cispo") and is_global("vespo")
    assert not any(is_global(t) for t in ["grpo", "bnpo", "dr_grpo", "sapo", "luspo"])
    assert set(LOSS_PRESETS) == set(ALL_LOSS_TYPES)
    with pytest.raises(ValueError, match="loss_type"):
        PolicyLoss(loss_type="ppo")


# --- gradients ------------------------------------------------------------------------------------------


def test_on_policy_gradient_is_the_advantage_weighted_policy_gradient():
    # old_logps=None: r = exp(logps - sg[logps]) = 1, clipping inactive, so for grpo
    # d loss / d logps_it = -A_i * m_it / |o_i| / N.  N = 2, |o_0| = 3, |o_1| = 2, A = [1.5, -0.5]:
    # row 0: -1.5 / 3 / 2 = -0.25 per token; row 1: +0.5 / 2 / 2 = 0.125 per token; padding: 0.
    logps = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.2, 7.0]], requires_grad=True)
    loss, metrics = policy_loss(logps, None, torch.tensor([1.5, -0.5]), MASK)
    loss.backward()
    expected = torch.tensor([[-0.25, -0.25, -0.25], [0.125, 0.125, 0.0]])
    torch.testing.assert_close(logps.grad, expected)
    # Loss value: -(mean_t r * A) averaged: -(1.5 + (-0.5)) / 2 = -0.5.
    scalar(loss, -0.5)
    scalar(metrics["ratio_mean"], 1.0)
    scalar(metrics["clip_ratio/region_mean"], 0.0)
    assert "kl" not in metrics


def test_clipped_objective_by_hand():
    # One row of 4 tokens, epsilon 0.2, bnpo (mean over the 4 tokens), per-token advantages:
    #   tok 0: A=+1, r=1.5 -> min(1.5, 1.2) = 1.2   -> loss -1.2, clipped (grad 0)
    #   tok 1: A=-1, r=0.5 -> min(-0.5, -0.8) = -0.8 -> loss  0.8, clipped (grad 0)
    #   tok 2: A=+1, r=0.5 -> min(0.5, 0.8) = 0.5   -> loss -0.5, grad -A r = -0.5
    #   tok 3: A=-1, r=1.5 -> min(-1.5, -1.2) = -1.5 -> loss  1.5, grad -A r = +1.5
    # loss = (-1.2 + 0.8 - 0.5 + 1.5) / 4 = 0.15; gradients divided by 4: [0, 0, -0.125, 0.375].
    ratios = torch.tensor([[1.5, 0.5, 0.5, 1.5]])
    old = torch.tensor([[-1.0, -2.0, -0.7, -0.1]])
    logps = (old + ratios.log()).requires_grad_(True)
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0]])
    loss, metrics = policy_loss(logps, old, adv, torch.ones(1, 4), loss_type="bnpo")
    loss.backward()
    scalar(loss, 0.15)
    torch.testing.assert_close(logps.grad, torch.tensor([[0.0, 0.0, -0.125, 0.375]]))
    # Clip metrics: low = A<0 and r<0.8 (tok 1), high = A>0 and r>1.2 (tok 0), each 1/4; region 2/4.
    scalar(metrics["clip_ratio/low_mean"], 0.25)
    scalar(metrics["clip_ratio/high_mean"], 0.25)
    scalar(metrics["clip_ratio/region_mean"], 0.5)
    scalar(metrics["ratio_mean"], 1.0)  # (1.5 + 0.5 + 0.5 + 1.5) / 4


def test_zero_gradient_inside_the_clipped_region():
    # A > 0 and r = 1.3 > 1 + eps: the objective is the constant 1.2 A; no gradient at all.
    old = torch.tensor([[-1.0, -2.0]])
    logps = (old + math.log(1.3)).requires_grad_(True)
    loss, _ = policy_loss(logps, old, torch.tensor([2.0]), torch.ones(1, 2))
    loss.backward()
    assert torch.equal(logps.grad, torch.zeros(1, 2))
    scalar(loss, -1.2 * 2.0)


def test_clip_higher_epsilon_high():
    # epsilon 0.2, epsilon_high 0.28, A = +1: r = 1.25 is inside [0.8, 1.28] -> loss -1.25, grad -r = -1.25;
    # r = 1.3 is above -> loss -1.28, grad 0. bnpo over 2 tokens halves both.
    old = torch.tensor([[-1.0, -1.0]])
    logps = (old + torch.tensor([[1.25, 1.3]]).log()).requires_grad_(True)
    loss, metrics = policy_loss(
        logps, old, torch.tensor([1.0]), torch.ones(1, 2), loss_type="bnpo", epsilon_high=0.28
    )
    loss.backward()
    scalar(loss, (-1.25 - 1.28) / 2)
    torch.testing.assert_close(logps.grad, torch.tensor([[-1.25 / 2, 0.0]]))
    scalar(metrics["clip_ratio/high_mean"], 0.5)


def test_delta_caps_the_unclipped_ratio():
    # A = -1, r = 2: without delta, min(-2, -1.2) = -2 -> loss 2, grad -A r = 2.
    # delta = 1.5: min(-min(2, 1.5), -1.2) = -1.5 -> loss 1.5, and the capped term has no gradient.
    old = torch.tensor([[-1.0]])
    for delta, value, grad in [(None, 2.0, 2.0), (1.5, 1.5, 0.0)]:
        logps = (old + math.log(2.0)).requires_grad_(True)
        loss, _ = policy_loss(logps, old, torch.tensor([-1.0]), torch.ones(1, 1), delta=delta)
        loss.backward()
        scalar(loss, value)
        scalar(logps.grad[0, 0], grad)


# --- GSPO ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("level", ["sequence", "sequence_token"])
def test_gspo_sequence_ratio_by_hand(level):
    # Token log-ratios [0.1, 0.3]: s = exp(mean) = exp(0.2) = 1.2214 > 1.2.
    old = torch.tensor([[-1.0, -2.0]])
    # A = +1: clipped per sequence -> every token -1.2, no gradient.
    logps = (old + torch.tensor([[0.1, 0.3]])).requires_grad_(True)
    loss, metrics = policy_loss(
        logps, old, torch.tensor([1.0]), torch.ones(1, 2), importance_sampling_level=level
    )
    loss.backward()
    scalar(loss, -1.2)
    assert torch.equal(logps.grad, torch.zeros(1, 2))
    scalar(metrics["ratio_mean"], math.exp(0.2))
    scalar(metrics["clip_ratio/high_mean"], 1.0)
    # A = -1: min(-s, -1.2) = -s -> loss s per token, grpo mean = s. Gradient per token:
    # sequence: ds/dlogps_t = s / |o| = s / 2; sequence_token: (1/|o|) * s = s / 2. Same here.
    logps = (old + torch.tensor([[0.1, 0.3]])).requires_grad_(True)
    loss, _ = policy_loss(logps, old, torch.tensor([-1.0]), torch.ones(1, 2), importance_sampling_level=level)
    loss.backward()
    s = math.exp(0.2)
    scalar(loss, s)
    torch.testing.assert_close(logps.grad, torch.full((1, 2), s / 2))


@pytest.mark.parametrize("loss_type", ALL_LOSS_TYPES)
def test_gspo_with_one_token_sequences_equals_token_level(loss_type):
    g = torch.Generator().manual_seed(0)
    n, t = 5, 4
    mask = torch.zeros(n, t)
    mask[:, 0] = 1.0  # one completion token per row; the rest is padding
    old = -torch.rand(n, t, generator=g) * 3
    base = old + 0.3 * torch.randn(n, t, generator=g)
    adv = torch.randn(n, generator=g)
    results = []
    for level in LEVELS:
        logps = base.clone().requires_grad_(True)
        loss, _ = policy_loss(logps, old, adv, mask, importance_sampling_level=level, **kwargs_for(loss_type))
        loss.backward()
        results.append((loss.detach(), logps.grad))
    for loss, grad in results[1:]:
        torch.testing.assert_close(loss, results[0][0])
        torch.testing.assert_close(grad, results[0][1])


# --- CISPO and SAPO -------------------------------------------------------------------------------------


def test_cispo_by_hand():
    # r = [0.5, 3, 6], cap epsilon_high = 5 -> weights sg[min(r, 5)] = [0.5, 3, 5]; A = [1, 1, -1];
    # logps = [-1, -2, -0.5]. Per-token loss -w A logps = [0.5, 6, -2.5]; dapo with no global count divides
    # by the 3 local tokens: 4 / 3. Gradient -w A / 3 = [-0.5/3, -1, 5/3].
    ratios = torch.tensor([[0.5, 3.0, 6.0]])
    logps = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    old = logps.detach() - ratios.log()
    adv = torch.tensor([[1.0, 1.0, -1.0]])
    loss, metrics = policy_loss(logps, old, adv, torch.ones(1, 3), loss_type="cispo", epsilon_high=5.0)
    loss.backward()
    scalar(loss, 4.0 / 3.0)
    torch.testing.assert_close(logps.grad, torch.tensor([[-0.5 / 3, -1.0, 5.0 / 3]]))
    # The cap is active on token 2 only.
    scalar(metrics["clip_ratio/high_mean"], 1.0 / 3.0)
    scalar(metrics["clip_ratio/low_mean"], 0.0)


def test_cispo_without_epsilon_high_caps_at_epsilon_as_trl():
    # TRL: epsilon_high = epsilon when unset, so the cap is 0.2. r = [0.5, 3]: weights [min(0.5, 0.2),
    # min(3, 0.2)] = [0.2, 0.2]; A = 1, logps = [-1, -2]: per-token -0.2 * logps = [0.2, 0.4]; mean 0.3.
    ratios = torch.tensor([[0.5, 3.0]])
    logps = torch.tensor([[-1.0, -2.0]])
    loss, _ = policy_loss(logps, logps - ratios.log(), torch.ones(1), torch.ones(1, 2), loss_type="cispo")
    scalar(loss, 0.3)


def test_cispo_refuses_a_zero_cap():
    with pytest.raises(LossConfigError) as caught:
        PolicyLoss(loss_type="cispo", epsilon=0.0)
    assert caught.value.field == "epsilon"
    with pytest.raises(LossConfigError) as caught:
        PolicyLoss(loss_type="cispo", epsilon_high=0.0)
    assert caught.value.field == "epsilon_high"


# --- VESPO ----------------------------------------------------------------------------------------------


def phi_by_hand(log_w: float, k: float, lam: float) -> float:
    """Gamma weight e^lambda w^k e^(-lambda w), normalised so phi(1) = 1."""
    w = math.exp(log_w)
    return math.exp(lam) * w**k * math.exp(-lam * w)


def test_vespo_gamma_weights_by_hand():
    # Row 0: A = +1 (k=2, lambda=3); per-token log r = [0.1, 0.2] -> log w = 0.3.
    # Row 1: A = -1 (k=3, lambda=2); log r = [-0.5, (padding 9.0, not read)] -> log w = -0.5.
    log_ratio = torch.tensor([[0.1, 0.2], [-0.5, 9.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    phi = vespo_gamma_weights(torch.tensor([1.0, -1.0]), log_ratio, mask)
    expected = [[phi_by_hand(0.3, 2.0, 3.0)], [phi_by_hand(-0.5, 3.0, 2.0)]]
    torch.testing.assert_close(phi, torch.tensor(expected))
    # On-policy (w = 1): phi = e^lambda * 1 * e^-lambda = 1 for either sign.
    ones = vespo_gamma_weights(torch.tensor([1.0, -1.0]), torch.zeros(2, 2), mask)
    torch.testing.assert_close(ones, torch.ones(2, 1))


def test_vespo_folds_the_sampler_correction_into_w():
    # c = pi_old / pi_sampler = [2, 1] multiplies w: log w = 0.3 + log 2. A masked-out correction (c = 0)
    # clamps to 1e-8: log w = log 1e-8 and phi = e^3 * 1e-16 * e^(-3e-8), effectively 0.
    log_ratio = torch.tensor([[0.1, 0.2]])
    mask = torch.ones(1, 2)
    phi = vespo_gamma_weights(torch.ones(1), log_ratio, mask, torch.tensor([[2.0, 1.0]]))
    torch.testing.assert_close(phi, torch.tensor([[phi_by_hand(0.3 + math.log(2.0), 2.0, 3.0)]]))
    dropped = vespo_gamma_weights(torch.ones(1), log_ratio, mask, torch.tensor([[0.0, 1.0]]))
    assert float(dropped) < 1e-12


def test_vespo_loss_and_gradient_by_hand():
    # loss = -sg[phi] A logps, summed over tokens / the token count (dapo aggregation, 2 local tokens).
    # log r = [0.1, 0.2], A = 1: phi = phi_by_hand(0.3, 2, 3). logps = [-1, -2]: loss = -phi (-3) / 2;
    # gradient -phi A / 2 per token (phi is a constant). The sampler weight 2 on token 0 is folded into w,
    # not multiplied into the loss.
    logps = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    old = logps.detach() - torch.tensor([[0.1, 0.2]])
    loss, metrics = policy_loss(logps, old, torch.ones(1), torch.ones(1, 2), loss_type="vespo")
    loss.backward()
    phi = phi_by_hand(0.3, 2.0, 3.0)
    scalar(loss, 1.5 * phi)
    torch.testing.assert_close(logps.grad, torch.full((1, 2), -phi / 2))
    scalar(metrics["vespo/phi_seq_mean"], phi)
    corrected, _ = policy_loss(
        logps,
        old,
        torch.ones(1),
        torch.ones(1, 2),
        loss_type="vespo",
        sampler_weights=torch.tensor([[2.0, 1.0]]),
    )
    scalar(corrected, 1.5 * phi_by_hand(0.3 + math.log(2.0), 2.0, 3.0))


def test_sampler_weights_multiply_the_other_objectives():
    # On-policy grpo: per-token -A = 1 with A = -1; weights [2, 0.5] give (2 + 0.5) / 2 = 1.25.
    logps = torch.zeros(1, 2)
    loss, _ = policy_loss(
        logps, None, -torch.ones(1), torch.ones(1, 2), sampler_weights=torch.tensor([[2.0, 0.5]])
    )
    scalar(loss, 1.25)


# --- off-policy sequence mask ---------------------------------------------------------------------------


def test_off_policy_sequence_mask_by_hand():
    # KL_i = mean over real tokens of (log pi_sampler - log pi_theta); threshold 1.
    #   row 0: A = +1, KL = 2             -> keep (non-negative advantage)
    #   row 1: A = -1, KL = 0.5           -> keep (close enough)
    #   row 2: A = -1, KL = (2 + 2) / 2   -> drop; its padding (-1e4) is not read
    #   row 3: A = -1, KL = (NaN -> 0, 3) / 2 = 1.5 -> drop: the NaN adds 0 but still counts
    logps = torch.tensor([[-2.0, -2.0], [-0.5, -0.5], [-2.0, -1e4], [0.0, -3.0]])
    sampling = torch.tensor([[0.0, 0.0], [0.0, 0.0], [0.0, 0.0], [float("nan"), 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    keep = off_policy_sequence_mask(torch.tensor([1.0, -1.0, -1.0, -1.0]), logps, sampling, mask, 1.0)
    torch.testing.assert_close(keep, torch.tensor([[1.0], [1.0], [0.0], [0.0]]))


def test_off_policy_sequence_mask_with_per_token_advantages():
    # KL = 2 > 1: only the tokens with a negative advantage are dropped.
    keep = off_policy_sequence_mask(
        torch.tensor([[1.0, -1.0]]), torch.full((1, 2), -2.0), torch.zeros(1, 2), torch.ones(1, 2), 1.0
    )
    torch.testing.assert_close(keep, torch.tensor([[1.0, 0.0]]))


def test_sapo_by_hand():
    # f(r) = sigmoid(tau (r - 1)) * 4 / tau, tau = 1.0 if A > 0 else 1.05; loss = -f(r) A; grpo mean over 3.
    #   tok 0: r=1.0, A=+1: sigmoid(0) * 4 = 2                         -> loss -2
    #   tok 1: r=1.5, A=-1: sigmoid(1.05 * 0.5) * 4 / 1.05             -> loss +that
    #   tok 2: r=0.5, A=+2: sigmoid(-0.5) * 4                          -> loss -2 * that
    def sigmoid(x: float) -> float:
        return 1.0 / (1.0 + math.exp(-x))

    f1 = sigmoid(0.525) * 4 / 1.05  # 2.393588
    f2 = sigmoid(-0.5) * 4  # 1.510162
    expected = (-2.0 + f1 - 2 * f2) / 3
    old = torch.tensor([[-1.0, -1.0, -1.0]])
    logps = (old + torch.tensor([[1.0, 1.5, 0.5]]).log()).requires_grad_(True)
    adv = torch.tensor([[1.0, -1.0, 2.0]])
    loss, _ = policy_loss(logps, old, adv, torch.ones(1, 3), loss_type="sapo")
    loss.backward()
    scalar(loss, expected)
    # Gradient: d loss/d logps = -A f'(r) r / 3 with f'(r) = 4 sigmoid'(tau (r-1)) = 4 s (1 - s).
    #   tok 0: f'(1) = 1 -> -1 * 1 * 1 / 3.
    s1, s2 = sigmoid(0.525), sigmoid(-0.5)
    grads = [-1.0 / 3, 1.0 * 4 * s1 * (1 - s1) * 1.5 / 3, -2.0 * 4 * s2 * (1 - s2) * 0.5 / 3]
    torch.testing.assert_close(logps.grad, torch.tensor([grads]))


# --- KL, token weights, metrics -------------------------------------------------------------------------


def test_kl_term_by_hand():
    # A = 0, so only the KL term: beta * k3 with d = ref - logps = -0.5: 0.04 * (e^-0.5 + 0.5 - 1).
    k3 = math.exp(-0.5) - 0.5
    loss, metrics = policy_loss(
        torch.tensor([[-1.0]]),
        None,
        torch.zeros(1),
        torch.ones(1, 1),
        beta=0.04,
        ref_logps=torch.tensor([[-1.5]]),
    )
    scalar(loss, 0.04 * k3)
    scalar(metrics["kl"], k3)


def test_kl_metric_without_penalty():
    # ref given, beta 0: "kl" is reported (k3 = e^-0.5 - 0.5) but not added to the loss (A = 0 -> loss 0).
    loss, metrics = policy_loss(
        torch.tensor([[-1.0]]), None, torch.zeros(1), torch.ones(1, 1), ref_logps=torch.tensor([[-1.5]])
    )
    scalar(loss, 0.0)
    scalar(metrics["kl"], math.exp(-0.5) - 0.5)


def test_token_weights_scale_the_policy_term_only():
    # One token, A = 1, on-policy: policy term -1 * w = -0.5;
    # KL with d = -1: e^-1 + 1 - 1 = e^-1, times beta 0.1 (not weighted).
    loss, _ = policy_loss(
        torch.tensor([[-1.0]]),
        None,
        torch.ones(1),
        torch.ones(1, 1),
        beta=0.1,
        ref_logps=torch.tensor([[-2.0]]),
        token_weights=torch.tensor([[0.5]]),
    )
    scalar(loss, -0.5 + 0.1 * math.exp(-1.0))


def test_metrics_are_detached_float32_scalars():
    logps = torch.randn(2, 3, requires_grad=True)
    _, metrics = policy_loss(logps, None, torch.ones(2), MASK, ref_logps=torch.randn(2, 3))
    assert set(metrics) == {
        "kl",
        "ratio_mean",
        "clip_ratio/low_mean",
        "clip_ratio/high_mean",
        "clip_ratio/region_mean",
    }
    for value in metrics.values():
        assert value.dim() == 0 and value.dtype == torch.float32 and not value.requires_grad


def test_bf16_inputs_give_float32_loss():
    logps = torch.randn(2, 3).to(torch.bfloat16).requires_grad_(True)
    loss, _ = policy_loss(logps, None, torch.ones(2), MASK)
    assert loss.dtype == torch.float32
    loss.backward()
    assert logps.grad.dtype == torch.bfloat16


# --- invariants -----------------------------------------------------------------------------------------


def random_batch(n: int, t: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, t + 1, (n,), generator=g)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).float()  # [n, t] right-padded
    old = -torch.rand(n, t, generator=g) * 3
    return {
        "logps": old + 0.2 * torch.randn(n, t, generator=g),
        "old_logps": old,
        "ref_logps": old + 0.1 * torch.randn(n, t, generator=g),
        "advantages": torch.randn(n, generator=g),
        "mask": mask,
        "token_weights": torch.rand(n, t, generator=g),
    }


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("loss_type", ALL_LOSS_TYPES)
def test_right_padding_does_not_change_the_loss(loss_type, level):
    b = random_batch(4, 5, seed=1)
    extra = 3
    garbage = torch.tensor([[1e4, float("nan"), -1e4]]).expand(4, extra)

    def pad(x: torch.Tensor, fill: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, fill], dim=1)

    padded = {k: pad(v, garbage) for k, v in b.items() if k not in ("mask", "advantages")}
    padded["mask"] = pad(b["mask"], torch.zeros(4, extra))
    common = {
        "beta": 0.04,
        "num_items_in_batch": 13,
        "importance_sampling_level": level,
        **kwargs_for(loss_type),
    }

    def run(batch: dict, adv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logps = batch["logps"].clone().requires_grad_(True)
        loss, _ = policy_loss(
            logps,
            batch["old_logps"],
            adv,
            batch["mask"],
            ref_logps=batch["ref_logps"],
            token_weights=batch["token_weights"],
            **common,
        )
        loss.backward()
        return loss.detach(), logps.grad

    loss, grad = run(b, b["advantages"])
    loss_p, grad_p = run(padded, b["advantages"])
    torch.testing.assert_close(loss_p, loss)
    torch.testing.assert_close(grad_p[:, :5], grad)
    assert torch.equal(grad_p[:, 5:], torch.zeros(4, extra))
    # Per-token advantages [N, T] with garbage in the padding give the same too.
    adv_tok = b["advantages"][:, None].expand(4, 5)
    loss_t, _ = run(padded, pad(adv_tok, garbage))
    torch.testing.assert_close(loss_t, loss)


@pytest.mark.parametrize("level", LEVELS)
def test_grpo_batch_equals_mean_of_single_rows(level):
    b = random_batch(8, 6, seed=2)
    kw = {"beta": 0.04, "importance_sampling_level": level}
    full, _ = policy_loss(
        b["logps"], b["old_logps"], b["advantages"], b["mask"], ref_logps=b["ref_logps"], **kw
    )
    rows = [
        policy_loss(
            b["logps"][i : i + 1],
            b["old_logps"][i : i + 1],
            b["advantages"][i : i + 1],
            b["mask"][i : i + 1],
            ref_logps=b["ref_logps"][i : i + 1],
            **kw,
        )[0]
        for i in range(8)
    ]
    torch.testing.assert_close(full, torch.stack(rows).mean())


@pytest.mark.parametrize("loss_type", ["dapo", "cispo"])
def test_dapo_micro_batches_sum_to_the_full_batch(loss_type):
    # Global aggregation: each micro-batch divides by the token count of the whole step; the trainer sums.
    b = random_batch(8, 6, seed=3)
    total_tokens = int(b["mask"].sum())
    kw = {"num_items_in_batch": total_tokens, "beta": 0.04, **kwargs_for(loss_type)}

    def run(rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
        logps = b["logps"][rows].clone().requires_grad_(True)
        loss, _ = policy_loss(
            logps,
            b["old_logps"][rows],
            b["advantages"][rows],
            b["mask"][rows],
            ref_logps=b["ref_logps"][rows],
            **kw,
        )
        loss.backward()
        return loss.detach(), logps.grad

    full, full_grad = run(slice(0, 8))
    parts = [run(slice(i, i + 2)) for i in range(0, 8, 2)]
    torch.testing.assert_close(sum(p[0] for p in parts), full)
    torch.testing.assert_close(torch.cat([p[1] for p in parts]), full_grad)


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "sapo"])
def test_local_aggregations_divide_by_the_number_of_micro_batches(loss_type):
    # Local aggregation over equal-sized micro-batches: the full loss is the mean of the micro-batch losses.
    assert not is_global(loss_type)
    b = random_batch(8, 6, seed=4)
    kw = kwargs_for(loss_type)
    full, _ = policy_loss(b["logps"], b["old_logps"], b["advantages"], b["mask"], **kw)
    parts = [
        policy_loss(
            b["logps"][i : i + 4],
            b["old_logps"][i : i + 4],
            b["advantages"][i : i + 4],
            b["mask"][i : i + 4],
            **kw,
        )[0]
        for i in (0, 4)
    ]
    torch.testing.assert_close(sum(parts) / 2, full)


# --- validation -----------------------------------------------------------------------------------------


def test_policy_loss_validation():
    logps, mask, adv = torch.zeros(2, 3), torch.ones(2, 3), torch.ones(2)
    with pytest.raises(ValueError, match="loss_type"):
        policy_loss(logps, None, adv, mask, loss_type="ppo")
    with pytest.raises(ValueError, match="importance_sampling_level"):
        policy_loss(logps, None, adv, mask, importance_sampling_level="batch")
    with pytest.raises(ValueError, match="mask"):
        policy_loss(logps, None, adv, torch.ones(2, 4))
    with pytest.raises(ValueError, match="old_logps"):
        policy_loss(logps, torch.zeros(3, 3), adv, mask)
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(logps, None, torch.ones(3), mask)
    with pytest.raises(ValueError, match="max_completion_length"):
        policy_loss(logps, None, adv, mask, loss_type="dr_grpo")
    with pytest.raises(ValueError, match="epsilon_high"):
        policy_loss(logps, None, adv, mask, epsilon=0.2, epsilon_high=0.1)
    with pytest.raises(ValueError, match="ref_logps"):
        policy_loss(logps, None, adv, mask, beta=0.1)
    with pytest.raises(ValueError, match="delta"):
        policy_loss(logps, None, adv, mask, delta=0.9)
    with pytest.raises(ValueError, match="logps"):
        policy_loss(torch.zeros(6), None, adv, torch.ones(6))


# --- off-policy weights and entropy mask ----------------------------------------------------------------


IS_OLD = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -1.0, 0.0]])
IS_SAMPLING = torch.tensor([[-1.5, -0.5, -1.0], [-2.0, -1.0, 50.0]])
# old - sampling = [[0.5, -0.5, 0], [1, 0, (padding)]]


def test_token_importance_weights_by_hand():
    e = math.exp
    # Token ratios [[e^0.5, e^-0.5, 1], [e^1, 1, -]] = [[1.6487, 0.6065, 1], [2.7183, 1, -]]; padding -> 0.
    trunc = importance_sampling_weights(IS_OLD, IS_SAMPLING, MASK, mode="token_truncate", clip_max=2.0)
    torch.testing.assert_close(trunc, torch.tensor([[e(0.5), e(-0.5), 1.0], [2.0, 1.0, 0.0]]))  # e^1 > 2 -> 2
    masked = importance_sampling_weights(IS_OLD, IS_SAMPLING, MASK, mode="token_mask", clip_max=2.0)
    torch.testing.assert_close(
        masked, torch.tensor([[e(0.5), e(-0.5), 1.0], [0.0, 1.0, 0.0]])
    )  # e^1 > 2 -> 0
    # A lower bound 0.7 binds on e^-0.5 = 0.61: truncate lifts it to 0.7, mask zeroes it.
    both = importance_sampling_weights(
        IS_OLD, IS_SAMPLING, MASK, mode="token_truncate", clip_min=0.7, clip_max=2.0
    )
    torch.testing.assert_close(both, torch.tensor([[e(0.5), 0.7, 1.0], [2.0, 1.0, 0.0]]))
    low_only = importance_sampling_weights(
        IS_OLD, IS_SAMPLING, MASK, mode="token_mask", clip_min=0.7, clip_max=None
    )
    torch.testing.assert_close(low_only, torch.tensor([[e(0.5), 0.0, 1.0], [e(1.0), 1.0, 0.0]]))


def test_sequence_importance_weights_by_hand():
    # Sequence ratios: row 0 exp(0.5 - 0.5 + 0) = 1; row 1 exp(1 + 0) = e > cap 2.
    trunc = importance_sampling_weights(IS_OLD, IS_SAMPLING, MASK, mode="sequence_truncate", clip_max=2.0)
    torch.testing.assert_close(trunc, torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 0.0]]))
    masked = importance_sampling_weights(IS_OLD, IS_SAMPLING, MASK, mode="sequence_mask", clip_max=2.0)
    torch.testing.assert_close(masked, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))
    # Raise the cap above e: row 1 keeps e.
    kept = importance_sampling_weights(IS_OLD, IS_SAMPLING, MASK, mode="sequence_mask", clip_max=3.0)
    torch.testing.assert_close(kept[1], torch.tensor([math.e, math.e, 0.0]))
    # A lower bound 1.5 binds on row 0 (ratio 1): truncate lifts it, mask drops the sequence.
    lifted = importance_sampling_weights(IS_OLD, IS_SAMPLING, MASK, mode="sequence_truncate", clip_min=1.5)
    torch.testing.assert_close(lifted, torch.tensor([[1.5, 1.5, 1.5], [math.e, math.e, 0.0]]))
    dropped = importance_sampling_weights(IS_OLD, IS_SAMPLING, MASK, mode="sequence_mask", clip_min=1.5)
    torch.testing.assert_close(dropped, torch.tensor([[0.0, 0.0, 0.0], [math.e, math.e, 0.0]]))
    # The ratio itself has TRL's shapes: one per sequence, one per token.
    assert importance_sampling_ratio(IS_OLD, IS_SAMPLING, MASK, mode="sequence_mask").shape == (2, 1)
    assert importance_sampling_ratio(IS_OLD, IS_SAMPLING, MASK, mode="token_mask").shape == (2, 3)


def test_unknown_sampler_logprobs_give_ratio_one():
    sampling = IS_SAMPLING.clone()
    sampling[0, 0] = float("nan")  # row 0: d = [nan -> 0, -0.5, 0]
    token = importance_sampling_weights(IS_OLD, sampling, MASK, mode="token_mask", clip_max=None)
    torch.testing.assert_close(token[0], torch.tensor([1.0, math.exp(-0.5), 1.0]))
    sequence = importance_sampling_weights(IS_OLD, sampling, MASK, mode="sequence_truncate", clip_max=5.0)
    torch.testing.assert_close(sequence[0], torch.full((3,), math.exp(-0.5)))


def test_importance_weights_are_detached_and_validated():
    old = IS_OLD.clone().requires_grad_(True)
    assert not importance_sampling_weights(old, IS_SAMPLING, MASK).requires_grad
    with pytest.raises(ValueError, match="mode"):
        importance_sampling_weights(IS_OLD, IS_SAMPLING, MASK, mode="batch_mask")
    with pytest.raises(ValueError, match="mode"):
        importance_sampling_weights(IS_OLD, IS_SAMPLING, MASK, mode="truncate")
    with pytest.raises(ValueError, match="clip_max must be > 0"):
        importance_sampling_weights(IS_OLD, IS_SAMPLING, MASK, clip_max=0.0)
    with pytest.raises(ValueError, match="clip_min must be > 0"):
        importance_sampling_weights(IS_OLD, IS_SAMPLING, MASK, clip_min=-1.0)
    with pytest.raises(ValueError, match=r"clip_min \(2.0\) must be < clip_max \(1.5\)"):
        importance_sampling_weights(IS_OLD, IS_SAMPLING, MASK, clip_min=2.0, clip_max=1.5)
    with pytest.raises(ValueError, match="needs clip_min or clip_max"):
        importance_sampling_weights(IS_OLD, IS_SAMPLING, MASK, mode="token_truncate", clip_max=None)


ENTROPY = torch.tensor([[0.1, 0.5, 0.9, 99.0], [0.3, 0.7, 0.2, 0.4]])
ENT_MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
# Masked entropies sorted: [0.1, 0.2, 0.3, 0.4, 0.5, 0.7, 0.9] (M = 7; the padded 99 is ignored).


def test_top_entropy_mask_by_hand():
    # quantile 1.0: threshold Q_0 = 0.1 -> every masked token.
    assert torch.equal(top_entropy_mask(ENTROPY, ENT_MASK, 1.0), ENT_MASK.bool())
    # quantile 0.5: Q_0.5, position 0.5 * 6 = 3 -> 0.4; keep >= 0.4: 0.5, 0.9, 0.7, 0.4.
    expected = torch.tensor([[False, True, True, False], [False, True, False, True]])
    assert torch.equal(top_entropy_mask(ENTROPY, ENT_MASK, 0.5), expected)
    # quantile 0.2: Q_0.8, position 0.8 * 6 = 4.8 -> 0.5 + 0.8 * (0.7 - 0.5) = 0.66; keep 0.9 and 0.7.
    expected = torch.tensor([[False, False, True, False], [False, True, False, False]])
    assert torch.equal(top_entropy_mask(ENTROPY, ENT_MASK, 0.2), expected)
    # quantile 0.0: Q_1 = 0.9, the maximum only.
    expected = torch.tensor([[False, False, True, False], [False, False, False, False]])
    assert torch.equal(top_entropy_mask(ENTROPY, ENT_MASK, 0.0), expected)


def test_top_entropy_mask_matches_torch_quantile_and_edge_cases():
    g = torch.Generator().manual_seed(5)
    ent, mask = torch.rand(6, 9, generator=g), torch.rand(6, 9, generator=g) > 0.3
    for q in (0.05, 0.2, 0.37, 0.8):
        threshold = torch.quantile(ent[mask], 1 - q)
        assert torch.equal(top_entropy_mask(ent, mask, q), (ent >= threshold) & mask)
    assert not top_entropy_mask(ent, torch.zeros_like(mask), 0.2).any()
    with pytest.raises(ValueError, match="quantile"):
        top_entropy_mask(ent, mask, 1.5)


def test_entropy_threshold_by_hand_and_a_given_threshold():
    # Values 0.1 .. 1.0 (10 of them), q = 0.8: position 0.8 * 9 = 7.2 -> 0.8 + 0.2 * (0.9 - 0.8) = 0.82.
    values = torch.arange(1, 11, dtype=torch.float32) / 10
    scalar(entropy_threshold(values, 0.8), 0.82)
    scalar(entropy_threshold(values, 1.0), 1.0)
    # A threshold computed elsewhere (every process's tokens) replaces the local quantile.
    keep = top_entropy_mask(ENTROPY, ENT_MASK, 0.5, threshold=torch.tensor(0.6))
    assert torch.equal(keep, (ENTROPY >= 0.6) & ENT_MASK.bool())
    with pytest.raises(ValueError, match="non-empty"):
        entropy_threshold(torch.empty(0), 0.5)


# --- the loss spec: hyperparameters once, tensors per call ------------------------------------------------


@pytest.mark.parametrize("loss_type", ALL_LOSS_TYPES)
def test_loss_spec_equals_the_functional_form(loss_type):
    b = random_batch(4, 5, seed=9)
    spec = PolicyLoss(**{"beta": 0.04, "epsilon_high": 0.28, **kwargs_for(loss_type)})
    hyper = {f: getattr(spec, f) for f in ("loss_type", "epsilon_high", "beta", "max_completion_length")}
    ref = b["logps"].detach() - 0.1
    by_spec, m1 = spec(
        b["logps"], b["old_logps"], b["advantages"], b["mask"], ref_logps=ref, num_items_in_batch=7
    )
    by_fn, m2 = policy_loss(
        b["logps"], b["old_logps"], b["advantages"], b["mask"], ref_logps=ref, num_items_in_batch=7, **hyper
    )
    assert torch.equal(by_spec, by_fn)
    assert m1.keys() == m2.keys() and all(torch.equal(m1[k], m2[k]) for k in m1)


@pytest.mark.parametrize(
    ("hyper", "field"),
    [
        ({"delta": 1.1}, "delta"),  # must exceed 1 + epsilon_high = 1.2, not just 1
        ({"delta": 1.3, "epsilon_high": 0.3}, "delta"),
        ({"loss_type": "cispo", "epsilon_high": -1.0}, "epsilon_high"),
        ({"vespo_k_pos": 0.0}, "vespo_k_pos"),
        ({"vespo_lambda_neg": -1.0}, "vespo_lambda_neg"),
        ({"epsilon": 1.0}, "epsilon"),
        ({"beta": -1.0}, "beta"),
        ({"kl_estimator": "k4"}, "kl_estimator"),
        ({"sapo_temperature_neg": 0.0}, "sapo_temperature_neg"),
        ({"importance_sampling_level": "batch"}, "importance_sampling_level"),
    ],
)
def test_loss_spec_refuses_bad_hyperparameters_naming_the_field(hyper, field):
    with pytest.raises(LossConfigError) as caught:
        PolicyLoss(**hyper)
    assert caught.value.field == field


def test_the_loss_of_a_config():
    from grpokit import GRPOConfig

    config = GRPOConfig(loss_type="dapo", epsilon_high=0.28, delta=1.5, beta=0.0, max_completion_length=16)
    spec = config.policy_loss()
    assert (spec.loss_type, spec.clip_high, spec.delta, spec.kl_estimator) == ("dapo", 0.28, 1.5, "k3")
    assert spec.is_global


def test_bias_corrected_kl_weights_the_kl_by_the_ratio_and_keeps_its_gradient():
    """One token, advantage 0 (so only the KL term acts), beta 0.5, k3 KL with d = ref - lp:
    KL = e^d - d - 1, dKL/dlp = 1 - e^d. Plain: loss = beta KL. Bias-corrected with r = e^(lp - old):
    loss = beta KL r, d/dlp = beta (dKL/dlp r + KL r). Off-policy old = lp - 0.3 (r = e^0.3); on-policy
    (old None) r = 1 in value but still carries the gradient."""
    import math

    from grpokit.core import PolicyLoss

    lp0, ref0, beta = -1.2, -0.7, 0.5
    d = ref0 - lp0
    kl = math.exp(d) - d - 1
    dkl = 1 - math.exp(d)
    cases = [(None, 1.0), (torch.tensor([[lp0 - 0.3]]), math.exp(0.3))]
    for old, r in cases:
        for corrected in (False, True):
            lp = torch.tensor([[lp0]], requires_grad=True)
            loss_fn = PolicyLoss(beta=beta, use_bias_correction_kl=corrected)
            loss, _ = loss_fn(lp, old, torch.zeros(1), torch.ones(1, 1), ref_logps=torch.tensor([[ref0]]))
            loss.backward()
            if corrected:
                assert float(loss) == pytest.approx(beta * kl * r, rel=1e-6)
                assert float(lp.grad) == pytest.approx(beta * (dkl * r + kl * r), rel=1e-5)
            else:
                assert float(loss) == pytest.approx(beta * kl, rel=1e-6)
                assert float(lp.grad) == pytest.approx(beta * dkl, rel=1e-5)

"""Reward-model losses against hand-computed values: class weights, the weighted pointwise BCE, the pairwise
Bradley-Terry loss; the trivial (constant-answer) baseline of the evaluation; grouped batches."""

from __future__ import annotations

import math
import random

import pytest
import torch

from grpokit.rm import build_tiny_reward_model, evaluate_reward_model, train_reward_model
from grpokit.rm.losses import bradley_terry_loss, class_weights, pointwise_loss
from grpokit.rm.training import _epoch_order


def softplus(x: float) -> float:
    return math.log1p(math.exp(x))


def test_class_weights_give_both_classes_equal_weight():
    # 1 positive, 3 negatives: w_pos = 4 / (2 * 1) = 2, w_neg = 4 / (2 * 3) = 2/3; totals 2 and 3 * 2/3 = 2
    assert class_weights(torch.tensor([1.0, 0.0, 0.0, 0.0])) == pytest.approx((2 / 3, 2.0))
    assert class_weights(torch.tensor([0.7, 0.5, 0.2])) == pytest.approx((3 / 2, 3 / 4))  # >= 0.5 positive
    assert class_weights(torch.tensor([0.0, 0.0])) == (1.0, 1.0)  # one class only: nothing to balance


def test_pointwise_loss_weights_each_item_by_its_class():
    logits, labels = torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.tensor([1.0, 0.0, 0.0, 0.0])
    # BCE(1, y=1) = softplus(-1) = 0.31326; BCE(1, y=0) = softplus(1) = 1.31326; BCE(0, y=0) = log 2
    weighted = (2.0 * softplus(-1) + (2 / 3) * (softplus(1) + 2 * math.log(2))) / 4  # = 0.606557
    assert float(pointwise_loss(logits, labels, (2 / 3, 2.0))) == pytest.approx(weighted, rel=1e-6)
    plain = (softplus(-1) + softplus(1) + 2 * math.log(2)) / 4
    assert float(pointwise_loss(logits, labels)) == pytest.approx(plain, rel=1e-6)


def test_bradley_terry_loss_compares_only_pairs_of_one_group():
    logits = torch.tensor([2.0, 0.0, 1.0, -1.0])
    labels = torch.tensor([1.0, 0.0, 0.0, 1.0])
    groups = torch.tensor([0, 0, 1, 1])
    # group 0: item 0 (right) vs item 1 (wrong): margin 2 - 0 = 2 -> -log sigmoid(2) = softplus(-2) = 0.12693
    # group 1: item 3 (right) vs item 2 (wrong): margin -1 - 1 = -2 -> softplus(2) = 2.12693
    # pairs across groups (0 vs 2, 3 vs 1) do not count; mean over the two pairs = 1.12693
    expected = (softplus(-2) + softplus(2)) / 2
    assert float(bradley_terry_loss(logits, labels, groups)) == pytest.approx(expected, rel=1e-6)
    assert bradley_terry_loss(logits, torch.tensor([1.0, 1.0, 0.0, 0.0]), groups) is None  # no mixed group
    # graded labels: 0.9 beats 0.4 beats 0.1 within one group -> three pairs
    three = bradley_terry_loss(torch.tensor([0.0, 1.0, 3.0]), torch.tensor([0.1, 0.4, 0.9]), torch.zeros(3))
    assert float(three) == pytest.approx((softplus(-1) + softplus(-3) + softplus(-2)) / 3, rel=1e-6)


def test_evaluation_reports_the_constant_baseline(char_tok):
    model = build_tiny_reward_model(char_tok, "outcome", hidden_size=16, num_layers=1, seed=0)
    rows = [{"prompt": "1 +1\n", "completion": c, "label": y} for c, y in (("a", 1), ("b", 0), ("c", 0))]
    result = evaluate_reward_model(model, char_tok, rows, kind="outcome")
    assert result["positive_fraction"] == pytest.approx(1 / 3)
    assert result["constant_accuracy"] == pytest.approx(2 / 3)  # always "wrong" is right on 2 of 3
    steps = [{"prompt": "q\n", "completion": "a\nb\nc", "step_labels": [1, 1, 0]}]
    prm = build_tiny_reward_model(char_tok, "process", hidden_size=16, num_layers=1, seed=0)
    result = evaluate_reward_model(prm, char_tok, steps, kind="process")
    assert (result["count"], result["constant_accuracy"]) == (3, pytest.approx(2 / 3))  # over steps


def test_grouped_order_keeps_each_prompts_samples_together():
    samples = [{"prompt": p} for p in "abacbc"]  # prompt a: 0, 2; b: 1, 4; c: 3, 5
    order = _epoch_order(samples, random.Random(0), grouped=True)
    assert sorted(order) == list(range(6))
    blocks = [order[k : k + 2] for k in range(0, 6, 2)]
    assert sorted(blocks) == [[0, 2], [1, 4], [3, 5]]


def test_training_loss_is_pointwise_plus_weighted_pairwise(char_tok):
    """With lr 0 the model does not move: the logged loss of a one-batch epoch equals the class-weighted BCE
    plus pairwise_weight x Bradley-Terry computed here from the model's own logits."""
    model = build_tiny_reward_model(char_tok, "outcome", hidden_size=16, num_layers=1, seed=0)
    rows = [
        {"prompt": "1 +1\n", "completion": "1+1=2\n<answer>2</answer>", "label": 1.0},
        {"prompt": "1 +1\n", "completion": "1+1=3\n<answer>3</answer>", "label": 0.0},
        {"prompt": "1 +1\n", "completion": "<answer>5</answer>", "label": 0.0},
        {"prompt": "2 *2\n", "completion": "2*2=5\n<answer>5</answer>", "label": 0.0},
    ]
    from grpokit.rm import outcome_scores

    s = outcome_scores(model, char_tok, [r["prompt"] for r in rows], [r["completion"] for r in rows],
                       output="logit")  # fmt: skip
    w_neg, w_pos = 4 / 6, 4 / 2  # 1 positive, 3 negatives
    bce = (w_pos * softplus(-s[0]) + w_neg * (softplus(s[1]) + softplus(s[2]) + softplus(s[3]))) / 4
    bt = (softplus(-(s[0] - s[1])) + softplus(-(s[0] - s[2]))) / 2  # prompt "2 *2" has no right sample
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    metrics = train_reward_model(
        model, char_tok, rows, kind="outcome", epochs=1, batch_size=4, class_balance=True,
        pairwise_weight=0.5, optimizer=optimizer,
    )  # fmt: skip
    assert metrics["train_loss"] == pytest.approx(bce + 0.5 * bt, rel=1e-5)
    with pytest.raises(ValueError, match="pairwise_weight"):
        train_reward_model(model, char_tok, rows, kind="outcome", pairwise_weight=-1.0)

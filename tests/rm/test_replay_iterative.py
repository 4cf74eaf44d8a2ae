"""Replay mixing at the configured ratio (exact counts) and the iterative reward-model update."""

from __future__ import annotations

import math

import pytest
import torch

from grpokit.rm import (
    IterativeRewardModel,
    ReplayBuffer,
    build_tiny_reward_model,
    label_samples,
    replay_count,
)
from grpokit.tasks.chain import (
    chain_outcome_reward,
    chain_step_reward,
    make_chain_rm_samples,
    make_chain_splits,
    worked_solution,
)


@pytest.mark.parametrize(
    ("fresh", "ratio", "expected"),
    [
        (90, 0.1, 10),  # 0.1 * 90 / 0.9 = 10 exactly: 10 / 100 = 10%
        (100, 0.1, 11),  # 11.11 -> 11: 11 / 111
        (9, 0.1, 1),  # 1.0
        (4, 0.1, 0),  # 0.444 -> 0
        (5, 0.1, 1),  # 0.555 -> 1
        (45, 0.1, 5),  # 5.0
        (30, 0.25, 10),  # 0.25 * 30 / 0.75 = 10
        (3, 0.5, 3),  # half and half
        (0, 0.1, 0),
        (100, 0.0, 0),
    ],
)
def test_replay_count(fresh, ratio, expected):
    assert replay_count(fresh, ratio) == expected


def test_replay_count_rejects_bad_ratio():
    for ratio in (-0.1, 1.0, 1.5):
        with pytest.raises(ValueError, match="replay_ratio"):
            replay_count(10, ratio)


def test_mix_exact_counts():
    buffer = ReplayBuffer(seed=0)
    buffer.add([("old", i) for i in range(200)])
    fresh = [("new", i) for i in range(90)]
    mixed = buffer.mix(fresh, replay_ratio=0.1)
    assert len(mixed) == 100
    assert mixed[:90] == fresh
    replayed = mixed[90:]
    assert len(replayed) == 10 and len(set(replayed)) == 10 and all(tag == "old" for tag, _ in replayed)
    assert len(buffer) == 200  # mix does not add
    # capped by what the buffer holds
    small = ReplayBuffer(seed=0)
    small.add([("old", 0), ("old", 1)])
    assert len(small.mix(fresh, 0.1)) == 92
    assert ReplayBuffer().mix(fresh, 0.1) == fresh


def test_reservoir_keeps_capacity_and_is_seeded():
    a, b = ReplayBuffer(capacity=10, seed=1), ReplayBuffer(capacity=10, seed=1)
    for buf in (a, b):
        for start in range(0, 100, 7):
            buf.add(range(start, min(start + 7, 100)))
    assert len(a) == 10 and a.num_seen == 100
    assert a.samples == b.samples
    assert max(a.samples) >= 10  # later samples made it in


def test_label_samples_outcome_and_process():
    train, _ = make_chain_splits(0, 2, 0, num_ops=2)
    prompts = [r["prompt"] for r in train]
    right = worked_solution(train[0])
    wrong = worked_solution(train[1]).replace("<answer>", "<answer>1")
    columns = {k: [r[k] for r in train] for k in ("solution", "start", "operations")}
    outcome = label_samples(prompts, [right, wrong], chain_outcome_reward, columns)
    assert [s["label"] for s in outcome] == [1.0, 0.0]
    assert outcome[0] == {"prompt": prompts[0], "completion": right, "label": 1.0}
    process = label_samples(prompts, [right, wrong], chain_step_reward, columns, kind="process")
    assert [s["step_labels"] for s in process] == [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]


def test_iterative_update_metrics(char_tok, tmp_path):
    train, _ = make_chain_splits(0, 48, 16, num_ops=2)
    history = make_chain_rm_samples(train[:32], kind="process", seed=0)
    fresh = make_chain_rm_samples(train[32:], kind="process", seed=1)  # 16 fresh samples
    model = build_tiny_reward_model(char_tok, "process", hidden_size=16, num_layers=1, seed=0)
    rm = IterativeRewardModel(
        model, char_tok, kind="process", replay_ratio=0.2, lr=1e-2, batch_size=8, initial_samples=history
    )
    scorer = rm.reward_func
    before_scores = scorer([fresh[0]["prompt"]], [fresh[0]["completion"]])
    # the RM's accuracy on the policy's samples before it trains on them, computed through the scorer the
    # trainer uses (a step is judged right when its score > 0.5 agrees with label >= 0.5), and the baseline
    # of always giving the majority label
    scores = scorer([s["prompt"] for s in fresh], [s["completion"] for s in fresh])
    pairs = [(v, y) for s, row in zip(fresh, scores) for v, y in zip(row, s["step_labels"])]
    expected_accuracy = sum((v > 0.5) == (y >= 0.5) for v, y in pairs) / len(pairs)
    positive = sum(y >= 0.5 for _, y in pairs) / len(pairs)
    weights = [p.detach().clone() for p in model.parameters()]
    metrics = rm.update(fresh)
    assert set(metrics) == {
        "rm/loss_on_policy", "rm/accuracy_on_policy", "rm/constant_accuracy_on_policy", "rm/loss_after",
        "rm/accuracy_after", "rm/replay_size", "rm/num_fresh", "rm/num_replayed", "rm/train_loss",
    }  # fmt: skip
    assert metrics["rm/accuracy_on_policy"] == pytest.approx(expected_accuracy)
    assert metrics["rm/constant_accuracy_on_policy"] == pytest.approx(max(positive, 1 - positive))
    assert metrics["rm/num_fresh"] == 16
    assert metrics["rm/num_replayed"] == 4  # 0.2 * 16 / 0.8 = 4
    assert metrics["rm/replay_size"] == 32 + 16
    assert all(math.isfinite(metrics[k]) for k in metrics)
    assert any(not torch.equal(w, p) for w, p in zip(weights, model.parameters()))
    # the scorer handed to the trainer is the same module, so it scores with the updated weights
    assert rm.reward_func([fresh[0]["prompt"]], [fresh[0]["completion"]]) != before_scores
    assert not model.training
    empty = rm.update([])
    assert empty["rm/num_fresh"] == 0 and math.isnan(empty["rm/loss_on_policy"])
    out = rm.save(tmp_path / "rm")
    assert (out / "config.json").exists()
    assert len((out / "replay_buffer.jsonl").read_text().splitlines()) == 48


def test_iterative_outcome_reward_func(char_tok):
    model = build_tiny_reward_model(char_tok, "outcome", hidden_size=16, num_layers=1, seed=0)
    rm = IterativeRewardModel(model, char_tok, kind="outcome", batch_size=4)
    scores = rm.reward_func(["1 +2\n"] * 3, ["1+2=3\n<answer>3</answer>", "x", "<answer>4</answer>"], None)
    assert len(scores) == 3 and all(0.0 < s < 1.0 for s in scores)
    metrics = rm.update([{"prompt": "1 +2\n", "completion": "1+2=3", "label": 1.0}])
    assert metrics["rm/num_replayed"] == 0 and metrics["rm/replay_size"] == 1

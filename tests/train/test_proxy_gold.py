"""The proxy reward against a watching gold reward (``GRPOConfig.gold_reward``, ``proxy_gold/*``): the metrics
against hand-computed values, the checks of the setting, and a run that logs them."""

from __future__ import annotations

import json
import math

import pytest
import torch

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.reporting.metrics_log import plot_metrics
from grpokit.reporting.proxy_gold import GoldWatch, gold_reward_column, proxy_gold_metrics

from ..conftest import small_config
from .conftest import digit_reward

NAN = float("nan")


def _matrix() -> torch.Tensor:
    # Columns: gold (weight 0), rm (weight 1), fmt (weight 0.5). Groups of 3 and 4 rows.
    gold = [1.0, 0.0, 0.0, 1.0, 0.0, NAN, 1.0]
    rm = [0.9, 0.6, 0.2, 0.3, 0.3, 0.95, NAN]
    fmt = [0.0, NAN, 0.2, 0.0, 0.0, 0.0, NAN]
    return torch.tensor([gold, rm, fmt]).T  # [7, 3]


WEIGHTS = torch.tensor([0.0, 1.0, 0.5])


def test_proxy_gold_metrics_by_hand():
    metrics = proxy_gold_metrics(_matrix(), WEIGHTS, 0, [3, 4])
    # proxy = rm + 0.5 fmt (NaN-skipping) = [0.9, 0.6, 0.3, 0.3, 0.3, 0.95, NaN]; row 5 has no gold and row 6
    # no proxy, so rows 0-4 count: proxy mean 2.4 / 5 = 0.48, gold mean 2 / 5 = 0.4, gap 0.08.
    assert metrics["proxy_gold/proxy_mean"] == pytest.approx(0.48)
    assert metrics["proxy_gold/gold_mean"] == pytest.approx(0.4)
    assert metrics["proxy_gold/gap"] == pytest.approx(0.08)
    # proxy >= 0.5: [T, T, F, F, F]; gold >= 0.5: [T, F, F, T, F]; they agree on rows 0, 2, 4: 3 / 5.
    assert metrics["proxy_gold/accuracy"] == pytest.approx(0.6)
    # pairs with different gold: group 1 (0, 1): 0.9 > 0.6 right; (0, 2): 0.9 > 0.3 right; group 2 (3, 4):
    # 0.3 == 0.3, a tie, 1/2 (rows 5 and 6 are left out): (1 + 1 + 0.5) / 3.
    assert metrics["proxy_gold/pair_accuracy"] == pytest.approx(2.5 / 3)


def test_proxy_threshold_for_logits():
    # Threshold 0.3: every counted proxy value is judged right; agreement with gold [T, F, F, T, F] = 2 / 5.
    metrics = proxy_gold_metrics(_matrix(), WEIGHTS, 0, [3, 4], threshold=0.3)
    assert metrics["proxy_gold/accuracy"] == pytest.approx(0.4)


def test_no_pairs_and_no_rows_give_nan():
    matrix = torch.tensor([[1.0, 0.7], [1.0, 0.2]])  # one group, equal gold: no pair to order
    metrics = proxy_gold_metrics(matrix, torch.tensor([0.0, 1.0]), 0, [2])
    assert metrics["proxy_gold/accuracy"] == pytest.approx(0.5)
    assert math.isnan(metrics["proxy_gold/pair_accuracy"])
    empty = proxy_gold_metrics(torch.tensor([[NAN, 0.7]]), torch.tensor([0.0, 1.0]), 0, [1])
    assert all(math.isnan(v) for v in empty.values()) and len(empty) == 5
    with pytest.raises(ValueError, match="do not add up"):
        proxy_gold_metrics(matrix, torch.tensor([0.0, 1.0]), 0, [3])


def test_gold_reward_must_name_a_weight_zero_reward_beside_a_proxy():
    names = ["gold", "rm"]
    assert gold_reward_column(None, names, [0.0, 1.0]) is None
    assert gold_reward_column("gold", names, [0.0, 1.0]) == 0
    with pytest.raises(ValueError, match=r"GRPOConfig.gold_reward 'acc' is not one of .*\['gold', 'rm'\]"):
        gold_reward_column("acc", names, [0.0, 1.0])
    with pytest.raises(ValueError, match=r"GRPOConfig.gold_reward 'gold' has weight 0.5 .*give it weight 0"):
        gold_reward_column("gold", names, [0.5, 1.0])
    with pytest.raises(ValueError, match=r"GRPOConfig.gold_reward 'gold': every other reward .* weight 0"):
        gold_reward_column("gold", names, [0.0, 0.0])


def test_config_refuses_an_empty_name_and_an_infinite_threshold():
    with pytest.raises(ValueError, match=r"GRPOConfig.gold_reward must name a reward function"):
        GRPOConfig(gold_reward="")
    with pytest.raises(ValueError, match=r"GRPOConfig.proxy_threshold must be a finite number, got inf"):
        GRPOConfig(proxy_threshold=float("inf"))


def gold_reward(prompts, completions, completion_ids, solution, **kwargs):
    return [1.0 if s in c else 0.0 for c, s in zip(completions, solution)]


def test_a_run_logs_the_proxy_against_the_gold(tiny_model_dir, tmp_path, rows):
    config = small_config(tmp_path, max_steps=2, reward_weights=[0.0, 1.0], gold_reward="gold_reward")
    trainer = GRPOTrainer(
        model=str(tiny_model_dir), reward_funcs=[gold_reward, digit_reward], args=config, train_dataset=rows
    )
    assert isinstance(trainer.gold, GoldWatch) and trainer.gold.column == 0
    trainer.train()
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    for line in lines:
        # every completion has both rewards, and the gold's weight is 0: the proxy is the run's reward
        assert line["proxy_gold/proxy_mean"] == pytest.approx(line["reward"])
        assert line["proxy_gold/gold_mean"] == pytest.approx(line["rewards/gold_reward/mean"])
        assert line["proxy_gold/gap"] == pytest.approx(line["reward"] - line["rewards/gold_reward/mean"])
        assert 0.0 <= line["proxy_gold/accuracy"] <= 1.0
    # the plot's proxy-vs-gold panel has data; a panel of a metric this run lacks is left out
    panel = [("proxy_gold/proxy_mean", "proxy_gold/gold_mean")]
    assert plot_metrics(lines, tmp_path / "m.png", panel) == tmp_path / "m.png"
    assert plot_metrics(lines, tmp_path / "n.png", ["rm/accuracy_on_policy"]) is None


def test_a_run_refuses_a_gold_reward_that_trains(tiny_model_dir, tmp_path, rows):
    config = small_config(tmp_path, gold_reward="gold_reward")  # weights default to 1 each
    with pytest.raises(ValueError, match=r"gold_reward 'gold_reward' has weight 1.0"):
        GRPOTrainer(
            model=str(tiny_model_dir), reward_funcs=[gold_reward, digit_reward], args=config,
            train_dataset=rows,
        )  # fmt: skip


def test_seed_curves_and_the_comparison_plot(tmp_path):
    from grpokit.reporting.metrics_log import plot_runs, seed_curve

    seed0 = [{"step": 1, "kl": 0.0}, {"step": 2, "kl": 0.2}, {"step": 3, "kl": None}]
    seed1 = [{"step": 1, "kl": 0.1}, {"step": 2, "kl": 0.6}]
    # step 1: mean (0 + 0.1) / 2, min 0, max 0.1; step 2: mean 0.4; step 3 has no value and is left out
    curve = seed_curve([seed0, seed1], "kl")
    assert [x for point in curve for x in point] == pytest.approx([1, 0.05, 0.0, 0.1, 2, 0.4, 0.2, 0.6])
    assert seed_curve([seed0], "proxy_gold/gap") == []
    for name, records in (("a", seed0), ("b", seed1)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    out = plot_runs({"static": [tmp_path / "a", tmp_path / "b"]}, tmp_path / "curves.png", ["kl"])
    assert out == tmp_path / "curves.png" and out.stat().st_size > 0


def test_process_proxy_by_hand():
    """With process rewards the proxy of a completion is its last step's weighted reward."""
    watch = GoldWatch(0, torch.tensor([0.0]), process=True)
    matrix = torch.tensor([[1.0], [0.0], [1.0], [0.0]])  # [4, 1]: the gold
    # proxies 0.8, 0.2, none (no steps), 0.6; groups [0, 1] and [2, 3]
    metrics = watch.process_metrics([[1.0, 0.8], [0.9, 0.2], [], [0.6]], matrix, [2, 2])
    assert metrics["proxy_gold/proxy_mean"] == pytest.approx((0.8 + 0.2 + 0.6) / 3)
    assert metrics["proxy_gold/gold_mean"] == pytest.approx(1 / 3)
    assert metrics["proxy_gold/accuracy"] == pytest.approx(2 / 3)  # 0.6 judged right, gold 0
    assert metrics["proxy_gold/pair_accuracy"] == 1.0  # one pair (rows 0, 1), ordered as the gold
    assert watch.metrics(matrix, [2, 2]) == {}  # the outcome path reports nothing for it
    # process rewards are a proxy: the outcome rewards may all have weight 0
    assert gold_reward_column("gold", ["gold"], [0.0], process=True) == 0
    with pytest.raises(ValueError, match=r"has weight 1.0"):
        gold_reward_column("gold", ["gold"], [1.0], process=True)


def test_a_process_run_logs_its_process_rewards_against_the_gold(tiny_model_dir, tmp_path, rows):
    def quarter_steps(prompts, completions, steps, **kwargs):
        return [[0.25] * len(s) for s in steps]

    config = small_config(tmp_path, max_steps=2, reward_weights=[0.0], gold_reward="gold_reward",
                          outcome_advantage_weight=0.0)  # fmt: skip
    trainer = GRPOTrainer(
        model=str(tiny_model_dir), reward_funcs=[gold_reward], process_reward_funcs=[quarter_steps],
        args=config, train_dataset=rows,
    )  # fmt: skip
    assert trainer.gold.process
    trainer.train()
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    for line in lines:
        # every completion with a step gets proxy 0.25, judged wrong: accuracy = the fraction gold-wrong
        assert line["proxy_gold/proxy_mean"] == pytest.approx(0.25)
        assert line["proxy_gold/gold_mean"] == pytest.approx(line["rewards/gold_reward/mean"])
        assert line["proxy_gold/accuracy"] == pytest.approx(1 - line["proxy_gold/gold_mean"])

"""Asynchronous rollouts: max_staleness 0 is the synchronous loop (identical weights); with a bound of 1 or
2 the samples a step trains on come from an older policy (the correction sees the gap) and the logged
staleness never exceeds the bound; what is not supported is refused."""

from __future__ import annotations

import pytest
import torch

from grpokit import GRPOTrainer
from tests.conftest import small_config

ROWS = [{"prompt": f"{a}+{b}=", "solution": str(a + b)} for a, b in [(1, 2), (3, 4), (2, 5), (6, 1)]]


def digits(prompts, completions, completion_ids, **kwargs):
    return [float(sum(ch.isdigit() for ch in c)) for c in completions]


def run(tiny_model_dir, tmp_path, name, **overrides):
    config = small_config(tmp_path / name, max_steps=4, learning_rate=1e-2, logging_steps=1, **overrides)
    trainer = GRPOTrainer(str(tiny_model_dir), digits, config, train_dataset=ROWS)
    return trainer, trainer.train()


def test_staleness_zero_is_the_synchronous_loop(tiny_model_dir, tmp_path):
    sync, _ = run(tiny_model_dir, tmp_path, "sync")
    zero, history = run(tiny_model_dir, tmp_path, "zero", async_generation=True, max_staleness=0)
    for a, b in zip(sync.model.parameters(), zero.model.parameters()):
        assert torch.equal(a, b)
    assert "async/staleness" not in history[-1]


@pytest.mark.parametrize("bound, expected", [(1, [0, 1, 1, 1]), (2, [0, 1, 2, 2])])
def test_samples_come_from_an_older_policy_within_the_bound(tiny_model_dir, tmp_path, bound, expected):
    trainer, history = run(
        tiny_model_dir, tmp_path, f"async{bound}", async_generation=True, max_staleness=bound
    )
    assert [h["async/staleness"] for h in history] == expected
    gap = [h["sampling/sampling_logp_difference/max"] for h in history]
    assert gap[0] < 1e-4  # step 1: drawn now, from the current policy (only float noise)
    assert all(g > 1e-3 for g in gap[1:])  # later steps: sampled before the last update(s), lr 1e-2
    assert "time/generate_wait" in history[-1] and "time/async/generate" in history[-1]
    assert trainer.step == 4 and not trainer.draws.pending  # closed at the end


def test_async_generation_is_refused_where_it_cannot_run(tiny_model_dir, tmp_path):
    config = small_config(tmp_path, async_generation=True)

    class Outside:
        def generate(self, prompt_ids, num_generations, params):
            raise AssertionError("never called")

    with pytest.raises(ValueError, match="async_generation is not supported here: it samples from its own"):
        GRPOTrainer(str(tiny_model_dir), digits, config, train_dataset=ROWS, rollout_backend=Outside())
    with pytest.raises(ValueError, match="max_staleness must be >= 0"):
        small_config(tmp_path, async_generation=True, max_staleness=-1)

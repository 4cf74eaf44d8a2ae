"""Adaptive group sizes and the difficulty curriculum through GRPOTrainer: ragged groups get each group's
own advantages and exact log-probs; settled prompts are skipped; both resume exactly."""

from __future__ import annotations

import statistics

import pytest
import torch

from grpokit import GRPOTrainer
from grpokit.rollout import ScriptedBackend
from grpokit.train import trainer as trainer_module

from ..conftest import small_config

ROWS = [{"prompt": f"{k}+0=", "solution": str(k)} for k in range(4)]


def respond(prompt: str, index: int) -> str:
    return prompt[0] if index % 3 != 2 else "9"  # right, right, wrong, right, right, wrong


def exact(prompts, completions, completion_ids, solution, **kwargs):
    return [1.0 if c.strip() == s else 0.0 for c, s in zip(completions, solution)]


def make_trainer(tiny_model_dir, tmp_path, **overrides):
    values = {"beta": 0.0, "shuffle_dataset": False, "learning_rate": 1e-2, **overrides}
    trainer = GRPOTrainer(str(tiny_model_dir), [exact], small_config(tmp_path, **values), train_dataset=ROWS)
    trainer.backend = ScriptedBackend(trainer.tokenizer, respond)
    return trainer


def settle(trainer, row: int, passed: bool, times: int = 30) -> None:
    """Tell the pass-rate estimates that ``row`` was always (or never) solved ``times`` times."""
    rewards = torch.full((times,), 1.0 if passed else 0.0)
    trainer.prompt_stats.update([row], rewards, [times])


def plain_logprobs(model, batch) -> list[torch.Tensor]:
    """Each row's completion log-probs from one plain forward of its unpadded prompt + completion."""
    rows = []
    with torch.no_grad():
        for row in range(len(batch)):
            prompt = batch.prompt_ids[row][batch.prompt_mask[row].bool()]
            completion = batch.completion_ids[row][batch.completion_mask[row].bool()]
            logits = model(torch.cat([prompt, completion])[None]).logits[0, len(prompt) - 1 : -1]  # [C, V]
            rows.append(torch.log_softmax(logits.float(), -1).gather(-1, completion[:, None])[:, 0])
    return rows


def capture_batches(monkeypatch, model):
    """The update's batches, each with the plain log-probs of the weights it starts from."""
    batches = []
    original = trainer_module.run_update

    def recording(batch, config, ctx):
        was_training = model.training
        batches.append((batch, plain_logprobs(model.eval(), batch)))
        model.train(was_training)
        return original(batch, config, ctx)

    monkeypatch.setattr(trainer_module, "run_update", recording)
    return batches


def test_adaptive_groups_get_their_own_advantages_and_exact_logprobs(tiny_model_dir, tmp_path, monkeypatch):
    """Row 0 settled (always solved) and row 1 unseen: the step's budget of 2 x 4 completions goes 2 / 6."""
    trainer = make_trainer(
        tiny_model_dir, tmp_path, adaptive_num_generations=True, min_num_generations=2, max_num_generations=6,
        num_iterations=2,  # so the batch carries pi_old log-probs to check against a plain forward
    )  # fmt: skip
    settle(trainer, 0, passed=True)
    batches = capture_batches(monkeypatch, trainer.unwrapped_model)
    (metrics,) = trainer.train()
    ((batch, plain),) = batches
    assert metrics["adaptive/min_group"] == 2 and metrics["adaptive/max_group"] == 6
    # group 0: right, right; group 1: right, right, wrong, right, right, wrong
    rewards = [[1.0, 1.0], [1.0, 1.0, 0.0, 1.0, 1.0, 0.0]]
    expected = [0.0, 0.0]  # all equal: no signal
    g = rewards[1]
    expected += [(r - statistics.mean(g)) / (statistics.stdev(g) + 1e-4) for r in g]
    assert batch.advantages.tolist() == pytest.approx(expected, abs=1e-6)
    # every row's pi_old log-probs (ragged groups: no shared-prefix grouping) equal a plain forward
    assert len(batch) == 8 and batch.prompt_ids[:2].tolist() == [batch.prompt_ids[0].tolist()] * 2
    for row, expected_row in enumerate(plain):
        assert torch.allclose(batch.old_logps[row, : len(expected_row)], expected_row, atol=1e-5)


def test_curriculum_skips_settled_prompts(tiny_model_dir, tmp_path):
    trainer = make_trainer(tiny_model_dir, tmp_path, curriculum=True, curriculum_explore=1e-9, max_steps=1)
    settle(trainer, 0, passed=True)  # always solved
    settle(trainer, 1, passed=False)  # never solved
    (metrics,) = trainer.train()
    assert trainer.prompts.last_indices == [2, 3]
    assert metrics["curriculum/skipped_easy"] == 1 and metrics["curriculum/skipped_hard"] == 1
    assert metrics["curriculum/tracked_prompts"] == 4  # rows 2, 3 now have estimates too


@pytest.mark.parametrize("option", ["curriculum", "adaptive_num_generations"])
def test_resume_is_exact_with_pass_rate_estimates(tiny_model_dir, tmp_path, option):
    fields = {option: True, "max_steps": 3}
    full = make_trainer(tiny_model_dir, tmp_path / "a", **fields)
    full.train()
    first = make_trainer(tiny_model_dir, tmp_path / "b", save_steps=1, **fields)
    first.max_steps = 1
    first.train()
    checkpoint = str(tmp_path / "b" / "run" / "checkpoint-1")
    resumed = make_trainer(tiny_model_dir, tmp_path / "b", resume_from_checkpoint=checkpoint, **fields)
    resumed.train()
    params = [
        torch.cat([p.detach().flatten() for p in t.unwrapped_model.parameters()]) for t in (full, resumed)
    ]
    assert torch.equal(*params)
    assert full.prompt_stats.state_dict() == resumed.prompt_stats.state_dict()

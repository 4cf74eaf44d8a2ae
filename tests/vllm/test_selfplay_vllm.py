"""Self-play with vLLM's real engine generating the seats' turns (``use_vllm=True``): every turn re-reads
the seat's whole context through the engine (``envs.turns.ReprefillSession``), the seats of a game see each
other's moves, and in fp32 the engine's log-probs of the policy's tokens are the trainer's (IS ratio 1)."""

from __future__ import annotations

import pytest

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.envs import environment_reward
from tests.envs.test_selfplay import Dialogue
from tests.vllm.helpers import tiny_policy

pytest.importorskip("vllm", reason="vLLM is not installed: .ci/run's second stage runs tests/vllm")
pytestmark = pytest.mark.vllm


def test_vllm_plays_both_seats_and_its_logprobs_are_the_trainers(tmp_path):
    model, tokenizer = tiny_policy(seed=1, sharpen=2.0)
    rows = [{"prompt": "Talk.\n", "game_seed": k} for k in range(4)]
    args = GRPOConfig(
        output_dir=str(tmp_path / "run"), use_vllm=True, generation_dtype="float32", max_steps=1,
        num_generations=4, per_device_train_batch_size=8, max_prompt_length=8, max_completion_length=64,
        max_turn_tokens=4, learning_rate=0.0, beta=0.0, logging_steps=1, disable_tqdm=True, seed=0,
        report_to="none", num_iterations=2,
    )  # fmt: skip
    trainer = GRPOTrainer(model, environment_reward, args, rows, processing_class=tokenizer,
                          environment=Dialogue)  # fmt: skip
    try:
        samples = trainer.sample(rows[:2])
        assert [e.seat for e in samples.episodes] == ["first", "first", "second", "second"] * 2
        assert all(len(e.actions) == (3 if e.seat == "first" else 2) for e in samples.episodes)
        first, second = samples.episodes[0], samples.episodes[2]  # one game's two seats
        seen = tokenizer.decode([t for t, m in zip(second.completion_ids, second.policy_mask) if not m])
        assert f"p1:1:{first.actions[0][:2]}\n" in seen
        trainer.train()
        metrics = trainer.logger.read()[-1]
        assert metrics["sampling/importance_sampling_ratio/min"] == pytest.approx(1.0, abs=1e-3)
        assert metrics["sampling/importance_sampling_ratio/max"] == pytest.approx(1.0, abs=1e-3)
        assert metrics["selfplay/game_length"] == 5
    finally:
        trainer.backend.close()

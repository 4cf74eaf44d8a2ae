"""Self-play GRPO through the trainer: each role its own advantage group (hand-computed), SPIRAL's role
baselines, the lr-0 invariants, the selfplay/* metrics, the exploitability read from the policy against a
plain per-sequence computation, and every refusal naming its field."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.data.integrity import InputError
from grpokit.envs import environment_reward
from grpokit.envs.kuhn_poker import INFORMATION_SETS, decision_points, exploitability
from grpokit.eval.games import answer_probabilities, kuhn_strategy
from grpokit.models.tiny import build_char_tokenizer, build_tiny_model
from tests.conftest import small_config
from tests.envs.test_selfplay import Dialogue

ROWS = [{"prompt": "Talk.\n", "game_seed": 0}, {"prompt": "Talk now.\n", "game_seed": 1}]


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


def make_trainer(tmp_path, tokenizer, environment=Dialogue, rows=ROWS, **overrides):
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=2, num_heads=4, seed=1)
    values = dict(max_completion_length=64, max_turn_tokens=4, logging_steps=1)
    config = small_config(tmp_path, **{**values, **overrides})
    return GRPOTrainer(model, environment_reward, config, train_dataset=rows, processing_class=tokenizer,
                       environment=environment)  # fmt: skip


def test_each_role_is_its_own_group_and_the_step_trains_both_seats(tmp_path, tokenizer):
    trainer = make_trainer(tmp_path, tokenizer, scale_rewards="none")
    rewards = torch.tensor([[3.0], [1.0], [-1.0], [-3.0], [0.0], [0.0], [1.0], [-1.0]])  # 2 deals x 2 x 2
    advantages = trainer.selfplay.advantages(rewards, trainer.reward_weights, [4, 4])
    # deal 0: role "first" (3, 1) -> (1, -1); role "second" (-1, -3) -> (1, -1); deal 1: (0, 0), (1, -1)
    assert advantages.tolist() == [1.0, -1.0, 1.0, -1.0, 0.0, 0.0, 1.0, -1.0]
    trainer.selfplay.args = dataclasses.replace(trainer.args, role_advantage="prompt")  # the ablation
    shared = trainer.selfplay.advantages(rewards, trainer.reward_weights, [4, 4])
    assert shared.tolist() == [3.0, 1.0, -1.0, -3.0, 0.0, 0.0, 1.0, -1.0]  # the seat's edge counted as play
    samples = trainer.sample(ROWS, group_sizes=[4, 4])
    assert [e.seat for e in samples.episodes] == ["first", "first", "second", "second"] * 2
    trainer.train()
    metrics = trainer.logger.read()[-1]
    assert {"selfplay/return/first", "selfplay/return/second", "selfplay/game_length"} <= set(metrics)
    assert metrics["selfplay/game_length"] == 5 and metrics["selfplay/illegal_rate"] == 0


def test_role_baselines_replace_the_groups(tmp_path, tokenizer):
    trainer = make_trainer(tmp_path, tokenizer, role_advantage="rae", rae_decay=0.5)
    rewards = torch.tensor([[1.0], [1.0], [-1.0], [float("nan")]])  # one deal: first x2, second x2
    advantages = trainer.selfplay.advantages(rewards, trainer.reward_weights, [4])
    # first: 1 - 0, then b = 0.5: 1 - 0.5; second: -1 - 0, then no return (NaN): 0
    assert advantages.tolist() == [1.0, 0.5, -1.0, 0.0]
    assert trainer.selfplay.baselines.baselines == {"Dialogue/first": 0.75, "Dialogue/second": -0.5}


@pytest.mark.parametrize("setting", ["fp32", "bf16", "lora"])
def test_learning_rate_zero_ratio_one_kl_zero(tmp_path, tokenizer, setting):
    """A self-play step at learning rate 0 (two optimizer passes over the seats): ratio 1 and KL 0 exactly,
    full weights in fp32 or bf16 mixed precision, or LoRA adapters."""
    extra = {"bf16": True} if setting == "bf16" else {}
    if setting == "lora":
        from peft import LoraConfig

        model = build_tiny_model(tokenizer, hidden_size=32, num_layers=2, num_heads=4, seed=1)
        config = small_config(tmp_path, max_completion_length=64, max_turn_tokens=4, learning_rate=0.0,
                              beta=0.1, num_iterations=2, logging_steps=1)  # fmt: skip
        lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
        trainer = GRPOTrainer(model, environment_reward, config, train_dataset=ROWS,
                              processing_class=tokenizer, environment=Dialogue, peft_config=lora)  # fmt: skip
    else:
        trainer = make_trainer(tmp_path, tokenizer, learning_rate=0.0, beta=0.1, num_iterations=2, **extra)
    trainer.train()
    metrics = trainer.logger.read()[-1]
    assert metrics["kl"] == 0.0 and metrics["ratio_mean"] == 1.0
    assert metrics["selfplay/game_length"] == 5


def test_exploitability_is_read_from_the_policy(tmp_path, tokenizer):
    """The strategy the trainer logs equals, at each information set, the softmax over the two answers of
    their log-probabilities computed one plain forward per answer (no batching, no padding)."""
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=2, num_heads=4, seed=2).eval()
    prompt = tokenizer("Kuhn.\n", add_special_tokens=False)["input_ids"]
    strategy = kuhn_strategy(model, tokenizer, prompt)
    assert set(strategy) == set(INFORMATION_SETS)
    eos = tokenizer.eos_token_id

    def encode(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    for key, segments, texts in decision_points():
        context = list(prompt)
        for text, is_policy in segments:
            context += encode(text) + ([eos] if is_policy else [])
        moves = ("call", "fold") if "bet" in key[2] else ("bet", "pass")
        assert texts == tuple([move] for move in moves)  # the move's word
        mass = []
        for move_texts in texts:
            mass.append(0.0)
            for text in move_texts:
                answer = [*encode(text), eos]
                with torch.no_grad():
                    logits = model(input_ids=torch.tensor([context + answer])).logits[0].float()
                logps = torch.log_softmax(logits[len(context) - 1 : -1], -1)
                mass[-1] += math.exp(logps.gather(1, torch.tensor(answer)[:, None]).sum().item())
        expected = mass[0] / (mass[0] + mass[1])
        assert strategy[key] == pytest.approx(expected, abs=1e-5)
    assert exploitability(strategy) > 0
    options = [[[encode("a")], [encode("bc"), encode("d")]]]
    probabilities = answer_probabilities(model, tokenizer, [prompt], options)
    assert sum(probabilities[0]) == pytest.approx(1.0)


def test_kuhn_run_logs_exploitability_every_step(tmp_path, tokenizer):
    rows = [{"prompt": "Kuhn.\n", "game_seed": deal} for deal in range(2)]
    trainer = make_trainer(tmp_path, tokenizer, environment="kuhn_poker", rows=rows, max_steps=2)
    trainer.train()
    logged = trainer.logger.read()
    assert [0 <= m["selfplay/exploitability"] <= 1.5 for m in logged] == [True, True]
    prompt = tokenizer("Kuhn.\n", add_special_tokens=False)["input_ids"]
    strategy = kuhn_strategy(trainer.model, tokenizer, prompt)
    assert logged[-1]["selfplay/exploitability"] == pytest.approx(exploitability(strategy), abs=1e-6)


def test_refusals_name_the_field(tmp_path, tokenizer):
    with pytest.raises(InputError, match="num_generations"):
        make_trainer(tmp_path, tokenizer, num_generations=3, per_device_train_batch_size=6)
    with pytest.raises(InputError, match="game_opponent"):
        make_trainer(tmp_path, tokenizer, environment=lambda row, actions: ("", 1.0, True),
                     game_opponent="random")  # fmt: skip
    with pytest.raises(InputError, match="chat-message prompts"):
        make_trainer(tmp_path, tokenizer, rows=[{"prompt": [{"role": "user", "content": "hi"}]}] * 2,
                     chat_template_kwargs=None)  # fmt: skip
    with pytest.raises(ValueError, match="adaptive_num_generations"):
        make_trainer(tmp_path, tokenizer, adaptive_num_generations=True, num_generations=4)
    with pytest.raises(InputError, match="rae_decay"):
        GRPOConfig(output_dir=str(tmp_path), rae_decay=1.0)
    with pytest.raises(InputError, match="role_advantage"):
        GRPOConfig(output_dir=str(tmp_path), role_advantage="rae", dynamic_sampling=True)


def test_the_snapshot_pool(tmp_path, tokenizer):
    """``game_opponent="pool"``: the policy at step 0, then after every ``snapshot_every``-th update, the
    newest ``snapshot_pool_size`` kept; each step plays one drawn snapshot; the newest equals the policy."""
    from grpokit.train.selfplay import SelfPlay

    trainer = make_trainer(tmp_path, tokenizer, game_opponent="pool", snapshot_every=1, snapshot_pool_size=2,
                           max_steps=3, learning_rate=1e-2)  # fmt: skip
    trainer.train()
    logged = trainer.logger.read()
    assert [m["selfplay/pool_size"] for m in logged] == [2.0, 2.0, 2.0]
    drawn = [m["selfplay/opponent_step"] for m in logged]
    assert drawn[0] == 0.0 and drawn[1] in (0.0, 1.0) and drawn[2] in (1.0, 2.0)
    pool = trainer.selfplay.pool
    assert [step for step, _ in pool.snapshots] == [2, 3]
    newest = pool.snapshots[-1][1]
    assert all(torch.equal(newest[k], v.cpu()) for k, v in trainer.model.state_dict().items())
    assert not all(torch.equal(pool.snapshots[0][1][k], v) for k, v in newest.items())  # weights moved
    with pytest.raises(InputError, match="game_opponent='pool' with fsdp"):
        SelfPlay(trainer.selfplay.runner, trainer.args, policy=trainer.model, placement="fsdp")

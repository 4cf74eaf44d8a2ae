"""The golden test of examples/grpo_minimal.py: one step of the minimal loop and one GRPOTrainer step, from
the same policy on the same scripted completions and fixed rewards with plain SGD, leave the same parameters.
So the one-file statement of the algorithm is the trainer's algorithm, for grpo, dapo and mu = 2."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.models import build_char_tokenizer
from grpokit.rollout import ScriptedBackend

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "grpo_minimal.py"
ROWS = [{"prompt": "1+1=", "solution": "2"}, {"prompt": "2+3=", "solution": "5"}]
ANSWERS = ["2", "5", "12", "7<answer>5</answer>", "", "2+3=5", "55555555", "3"]  # some cut at the limit


def load_minimal():
    spec = importlib.util.spec_from_file_location("grpo_minimal", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def respond(prompt: str, index: int) -> str:
    return ANSWERS[(index + 3 * len(prompt)) % len(ANSWERS)]


def fixed_reward(prompts, completions, completion_ids, solution, **kwargs):
    """Depends on the text only: the same rewards on both sides, spread within each group."""
    return [(1.0 if s in c else 0.0) + 0.1 * len(c) for c, s in zip(completions, solution)]


def flat(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@pytest.mark.parametrize(
    "variant",
    [
        {"loss_type": "grpo", "beta": 0.04},
        {"loss_type": "dapo", "beta": 0.0, "epsilon_high": 0.28, "mask_truncated_completions": True},
        {"loss_type": "grpo", "beta": 0.04, "num_iterations": 2},
    ],
    ids=["grpo", "dapo", "mu2"],
)
def test_one_minimal_step_equals_one_trainer_step(tiny_model_dir, tmp_path, variant):
    args = GRPOConfig(
        output_dir=str(tmp_path / "run"),
        max_steps=1,
        num_generations=4,
        per_device_train_batch_size=8,  # 2 prompts x G=4: one micro-batch, one optimizer step per epoch
        max_completion_length=6,
        shuffle_dataset=False,
        disable_tqdm=True,
        seed=0,
        **variant,
    )
    tokenizer = build_char_tokenizer()
    start = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    lr = 0.5  # large, so that one step moves the parameters far beyond float rounding

    trainer_policy = copy.deepcopy(start)
    trainer = GRPOTrainer(
        trainer_policy,
        [fixed_reward],
        args,
        train_dataset=ROWS,
        processing_class=tokenizer,
        rollout_backend=ScriptedBackend(tokenizer, respond),
        optimizers=(torch.optim.SGD(trainer_policy.parameters(), lr=lr), None),
    )
    trainer.train()

    minimal_policy = copy.deepcopy(start)
    reference = copy.deepcopy(start).eval().requires_grad_(False)
    metrics = load_minimal().grpo_step(
        minimal_policy,
        reference,
        torch.optim.SGD(minimal_policy.parameters(), lr=lr),
        ScriptedBackend(tokenizer, respond),
        tokenizer,
        [fixed_reward],
        ROWS,
        args,
    )

    moved = (flat(minimal_policy) - flat(start)).abs().max()
    assert moved > 1e-2  # the step moved the parameters by far more than the tolerance below
    # identical up to the order of float sums (the trainer shuffles the rows of each epoch; measured: equal
    # bit for bit with mu = 1 here, 1e-8 apart with mu = 2)
    torch.testing.assert_close(flat(trainer_policy), flat(minimal_policy), rtol=0, atol=1e-7)
    assert metrics["reward"] == pytest.approx(trainer.logger.read()[-1]["reward"], rel=1e-6)

"""The reference model's memory: it keeps the policy's weights' dtype (a bf16 policy never gets an fp32
copy), or a chosen lower dtype, and can wait on the CPU between its log-prob passes."""

from __future__ import annotations

import torch

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.rollout.records import RolloutBatch
from grpokit.train.batch import LogprobPass
from grpokit.train.reference import Reference

from ..conftest import small_config
from .conftest import digit_reward


def config(tmp_path, **overrides) -> GRPOConfig:
    return small_config(tmp_path, max_completion_length=6, beta=0.04, **overrides)


def dtypes(model: torch.nn.Module) -> set[torch.dtype]:
    return {p.dtype for p in model.parameters()}


def test_a_bf16_policy_gets_a_bf16_reference(tiny_model_dir, rows, tmp_path):
    args = config(tmp_path, model_init_kwargs={"dtype": "bfloat16"})
    trainer = GRPOTrainer(str(tiny_model_dir), [digit_reward], args, train_dataset=rows)
    assert dtypes(trainer.unwrapped_model) == dtypes(trainer.reference.model) == {torch.bfloat16}


def test_ref_model_dtype_halves_an_fp32_reference(tiny_model_dir, rows, tmp_path):
    args = config(tmp_path, ref_model_dtype="bfloat16")
    trainer = GRPOTrainer(str(tiny_model_dir), [digit_reward], args, train_dataset=rows)
    assert dtypes(trainer.unwrapped_model) == {torch.float32}
    assert dtypes(trainer.reference.model) == {torch.bfloat16}
    history = trainer.train()
    # the bf16 reference is the same function up to bf16 rounding: the step's KL is small, not zero
    assert 0 < history[-1]["kl"] < 1e-2


def test_offloaded_reference_visits_the_device_only_for_its_pass(tiny_model_dir, rows, tmp_path):
    policy = GRPOTrainer(str(tiny_model_dir), [digit_reward], config(tmp_path), train_dataset=rows).model
    reference = Reference(policy, offload=True).to("cpu:0")  # "cpu:0" stands for the run's device
    moves: list[str] = []
    original_to = reference.model.to

    def spy(device, *args, **kwargs):
        moves.append(str(device))
        return original_to(device, *args, **kwargs)

    reference.model.to = spy
    ids = torch.tensor([[5, 6, 7, 8]] * 4)
    batch = RolloutBatch(
        prompt_ids=ids,
        prompt_mask=torch.ones_like(ids),
        completion_ids=ids[:, :3],
        completion_mask=torch.ones(4, 3, dtype=torch.long),
        advantages=torch.zeros(4),
    )
    logps = reference.logprobs(batch, LogprobPass(1.0, 4, 4))
    assert moves == ["cpu:0", "cpu"]  # to the run's device for the pass, back to the CPU after it
    plain = Reference(policy).logprobs(batch, LogprobPass(1.0, 4, 4))
    torch.testing.assert_close(logps, plain, atol=0, rtol=0)

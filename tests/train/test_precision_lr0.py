"""At learning rate 0 the update's policy, pi_old and the reference are one set of weights computed in one
precision, so the ratio is exactly 1 and the KL exactly 0, token by token, in every precision setting a
single process has: fp32 (old-policy pass), bf16 autocast over fp32 weights (``bf16=true``: the reference,
old-policy and update passes all under autocast), a bf16 sampler for fp32 training
(``generation_dtype=bfloat16``: pi_old from the fp32 pass, the off-policy correction on the sampler's
log-probs), and both. Real samples from the fast sampler (the placement matrix uses scripted ones), mu 2,
beta 0.04. Exact: the log-probs the loss receives are compared with ``torch.equal``, not to a tolerance."""

from __future__ import annotations

import pytest
import torch

from grpokit import GRPOTrainer
from grpokit.core import PolicyLoss

from ..conftest import small_config

ROWS = [{"prompt": "1+2+12=", "solution": "15"}, {"prompt": "9+9+99=", "solution": "117"}]

CELLS = {
    "fp32": {"reuse_sampler_logprobs": False},  # pi_old from the pass (the sampler's is ~1e-6 off)
    "bf16": {"bf16": True},
    "bf16-sampler": {"generation_dtype": "bfloat16"},
    "bf16-and-bf16-sampler": {"bf16": True, "generation_dtype": "bfloat16"},
}


def reward(prompts, completions, completion_ids, solution, **kwargs):
    return [float(s in c) + 0.1 * (sum(ids) % 7) for c, s, ids in zip(completions, solution, completion_ids)]


def record_loss_inputs(monkeypatch) -> list[dict]:
    calls = []
    original = PolicyLoss.__call__

    def spy(self, logps, old_logps, advantages, mask, **kwargs):
        calls.append({"logps": logps.detach().clone(), "old": old_logps, "ref": kwargs.get("ref_logps"),
                      "mask": mask.bool(), "weights": kwargs.get("sampler_weights")})  # fmt: skip
        return original(self, logps, old_logps, advantages, mask, **kwargs)

    monkeypatch.setattr(PolicyLoss, "__call__", spy)
    return calls


@pytest.mark.parametrize("cell", sorted(CELLS))
def test_learning_rate_zero_gives_ratio_one_and_kl_zero_exactly(cell, tiny_model_dir, tmp_path, monkeypatch):
    calls = record_loss_inputs(monkeypatch)
    config = small_config(
        tmp_path, num_iterations=2, beta=0.04, learning_rate=0.0, max_completion_length=6,
        per_device_train_batch_size=4, gradient_accumulation_steps=2, generation_backend="fast",
        **CELLS[cell],
    )  # fmt: skip
    trainer = GRPOTrainer(str(tiny_model_dir), [reward], config, train_dataset=ROWS)
    (metrics,) = trainer.train()
    assert len(calls) == 4  # two epochs x two micro-batches of one group
    for call in calls:
        mask = call["mask"]
        assert mask.sum() > 0
        assert torch.equal(call["logps"][mask], call["old"][mask])  # ratio exactly 1, every token
        assert torch.equal(call["logps"][mask], call["ref"][mask])  # KL exactly 0
    assert metrics["ratio_mean"] == 1.0 and metrics["kl"] == 0.0
    assert metrics["clip_ratio/region_mean"] == 0.0
    assert trainer.accelerator.mixed_precision == ("bf16" if CELLS[cell].get("bf16") else "no")
    corrected = "generation_dtype" in CELLS[cell]
    assert all((call["weights"] is not None) == corrected for call in calls)  # pi_old / pi_sampler
    if corrected:  # a real mismatch between the bf16 sampler and pi_old, corrected
        assert metrics["sampling/sampling_logp_difference/max"] > 1e-4


@pytest.mark.parametrize(("units", "stated"), [("1", {"bf16": True}), ("0", {"bf16": False})])
def test_a_run_that_sets_no_precision_follows_the_processor(
    units, stated, tiny_model_dir, tmp_path, monkeypatch
):
    """bf16 unset: on a CPU with bf16 matrix units the run is ``bf16=true`` exactly (the same log-probs
    into the loss, bit for bit), on one without it is ``bf16=false`` exactly."""
    calls = record_loss_inputs(monkeypatch)
    runs = {}
    for name, (env, fields) in {"unset": (units, {}), "stated": ("0", stated)}.items():
        monkeypatch.setenv("GRPOKIT_BF16_MATRIX_UNITS", env)
        config = small_config(tmp_path / name, learning_rate=1e-3, max_completion_length=6,
                              generation_backend="fast", **fields)  # fmt: skip
        trainer = GRPOTrainer(str(tiny_model_dir), [reward], config, train_dataset=ROWS)
        trainer.train()
        runs[name] = (list(calls), trainer.accelerator.mixed_precision, trainer.args.bf16)
        calls.clear()
    (unset, precision, bf16), (stated_calls, stated_precision, _) = runs["unset"], runs["stated"]
    assert precision == stated_precision == ("bf16" if units == "1" else "no")
    assert bf16 is (units == "1")  # the resolved config records the choice
    assert len(unset) == len(stated_calls) > 0
    for a, b in zip(unset, stated_calls):
        assert torch.equal(a["logps"], b["logps"]) and torch.equal(a["ref"], b["ref"])

"""Routing replay in training runs of tiny MoE policies whose router logits are close (``close_moe_dirs``):

- R3, a bf16 sampler feeding an fp32 trainer (Qwen3-MoE and Mixtral): without replay the old-policy pass
  routes many tokens to other experts than the sampler did; with R3 none, and the sampler-vs-trainer log-prob
  gap is no larger. The log-prob gap that stays is the precision's own: the same as with the routing forced
  equal, which is what R3 does.
- R2 at a real learning rate with mu = 2: once the first optimizer step moved the weights, the second
  epoch's update routes tokens otherwise than the old policy did; with R2 it uses the old policy's experts.
"""

import pytest

from grpokit import GRPOConfig, GRPOTrainer

ROWS = [{"prompt": f"{a}+{b}=", "solution": str(a + b)} for a in range(4) for b in range(2)]


def reward(completions, solution, **kwargs):
    return [(1.0 if s in c else 0.0) + 0.1 * len(c) for c, s in zip(completions, solution)]


def one_step(policy, out, **values):
    args = GRPOConfig(**{
        "output_dir": str(out), "max_steps": 1, "num_generations": 4, "per_device_train_batch_size": 8,
        "max_completion_length": 8, "beta": 0.04, "disable_tqdm": True, "report_to": [], "seed": 0,
        "save_steps": 0, **values,
    })  # fmt: skip
    (metrics,) = GRPOTrainer(str(policy), [reward], args, train_dataset=ROWS).train()
    return metrics


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral"])
def test_r3_removes_the_routing_mismatch_of_a_bf16_sampler(close_moe_dirs, tmp_path, arch):
    runs = {
        replay: one_step(close_moe_dirs[arch], tmp_path / replay, generation_dtype="bfloat16",
                         routing_replay=replay, learning_rate=0.0, num_iterations=2)
        for replay in ("off", "R3")
    }  # fmt: skip
    off, r3 = runs["off"], runs["R3"]
    assert off["routing/sampler_mismatch"] > 0.1
    assert all(off[f"routing/sampler_mismatch/layer_{k}"] > 0 for k in range(2))  # in every MoE layer
    assert r3["routing/sampler_mismatch"] == 0.0
    # the same samples: the first MoE layer sees the same input in both runs, so R3 overrode exactly the
    # tokens the plain run routed otherwise (later layers' inputs differ once R3 replayed the first's)
    assert r3["routing/sampler_overridden/layer_0"] == off["routing/sampler_mismatch/layer_0"]
    gap = "sampling/sampling_logp_difference/mean"
    assert r3[gap] <= off[gap]
    assert r3["ratio_mean"] == 1.0 and r3["kl"] == 0.0  # lr 0: the replayed passes agree exactly


def test_r2_replays_the_old_policys_experts_in_the_update(close_moe_dirs, tmp_path):
    runs = {
        replay: one_step(close_moe_dirs["qwen3_moe"], tmp_path / replay, routing_replay=replay,
                         learning_rate=0.05, num_iterations=2, per_device_train_batch_size=4,
                         gradient_accumulation_steps=2)
        for replay in ("off", "R2")
    }  # fmt: skip
    off, r2 = runs["off"], runs["R2"]
    # mu = 2: the second epoch's update sees moved weights, and its router chooses otherwise for some tokens
    assert off["routing/update_mismatch"] > 0
    assert r2["routing/update_mismatch"] == 0.0
    assert r2["routing/update_overridden"] > 0
    assert "routing/sampler_mismatch" in r2  # the old-policy pass ran (R2 needs its experts), compared too


def test_replay_on_a_dense_policy_is_refused_naming_the_field(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match=r"routing_replay='R2', but LlamaForCausalLM has no mixture"):
        one_step(tiny_model_dir, tmp_path / "dense", routing_replay="R2")

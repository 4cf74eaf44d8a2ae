"""LoRA on mixture-of-experts policies. transformers 5 stores an MoE layer's experts as stacked parameters and
its router as a module holding a weight; peft (0.22) maps the linear layers' old names onto them
(``target_parameters``), and ``all-linear`` takes them all."""

import pytest

from grpokit import GRPOConfig, GRPOTrainer

peft = pytest.importorskip("peft")
if tuple(int(x) for x in peft.__version__.split(".")[:2]) < (0, 22):
    pytest.skip("peft < 0.22 maps the expert names otherwise", allow_module_level=True)

ROWS = [{"prompt": f"{a}+{b}=", "solution": str(a + b)} for a in range(4) for b in range(2)]


def reward(completions, solution, **kwargs):
    return [(1.0 if s in c else 0.0) + 0.1 * len(c) for c, s in zip(completions, solution)]


def config(out, **values) -> GRPOConfig:
    return GRPOConfig(**{
        "output_dir": str(out), "max_steps": 1, "num_generations": 4, "per_device_train_batch_size": 8,
        "max_completion_length": 8, "beta": 0.04, "disable_tqdm": True, "report_to": [], "seed": 0,
        "save_steps": 0, **values,
    })  # fmt: skip


def adapted(model) -> set[str]:
    return {name for name, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("arch, targets", [("qwen3_moe", ["q_proj", "gate_proj", "up_proj", "down_proj"]),
                                           ("mixtral", ["w1", "w3", "gate"])])  # fmt: skip
def test_the_old_expert_names_adapt_what_peft_adapts(close_moe_dirs, tmp_path, arch, targets):
    """Names that are no module of the model (the experts are parameters) are not refused as unknown: the
    trainer's policy carries the adapters peft itself makes for them."""
    from transformers import AutoModelForCausalLM

    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=targets, task_type="CAUSAL_LM")
    trainer = GRPOTrainer(str(close_moe_dirs[arch]), [reward], config(tmp_path), train_dataset=ROWS,
                          peft_config=lora)  # fmt: skip
    plain = peft.get_peft_model(AutoModelForCausalLM.from_pretrained(close_moe_dirs[arch]), lora)
    assert adapted(trainer.model) == adapted(plain)
    assert any(".experts." in name for name in adapted(plain))


def test_half_of_the_fused_gate_and_up_is_refused_naming_the_field(close_moe_dirs, tmp_path):
    lora = peft.LoraConfig(r=4, target_modules=["q_proj", "up_proj"], task_type="CAUSAL_LM")
    refusal = r"peft_config.target_modules: .*up_proj without also targeting gate_proj"
    with pytest.raises(ValueError, match=refusal):
        GRPOTrainer(str(close_moe_dirs["qwen3_moe"]), [reward], config(tmp_path), train_dataset=ROWS,
                    peft_config=lora)  # fmt: skip


def test_r3_with_lora_on_the_router_and_the_experts(close_moe_dirs, tmp_path):
    """peft >= 0.22 puts ``all-linear`` LoRA on the router's weight and the experts' stacked parameters,
    through a parametrization that changes the router's class while it runs: R3 still replays the sampler's
    experts (lr 0: ratio 1, KL 0, no mismatch left; the trainer's own router would have chosen otherwise)."""
    args = config(tmp_path, generation_dtype="bfloat16", routing_replay="R3", learning_rate=0.0,
                  num_iterations=2)  # fmt: skip
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM")
    policy = str(close_moe_dirs["qwen3_moe"])
    trainer = GRPOTrainer(policy, [reward], args, train_dataset=ROWS, peft_config=lora)
    wrapped = {name.split(".lora_")[0].rsplit(".", 1)[-1] for name in adapted(trainer.model)}
    assert {"gate", "experts", "base_layer"} <= wrapped  # the router, and the experts' two parameters
    (r3,) = trainer.train()
    assert r3["routing/sampler_mismatch"] == 0.0 and r3["routing/sampler_overridden"] > 0.1
    assert r3["ratio_mean"] == 1.0 and abs(r3["kl"]) < 1e-9

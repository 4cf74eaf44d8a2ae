"""LoRA (peft) on every path: the fast sampler decodes with the adapter, the reference is the base model with
the adapter disabled, checkpoints resume exactly, ``save_model`` writes an adapter peft loads, and gradient
checkpointing keeps the adapters' gradients exact."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, PeftModel
from transformers import AutoModelForCausalLM

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.models.parts import linear_weight
from grpokit.rollout import FastSampler, SamplingParams
from grpokit.train.forward import completion_logprobs

from .conftest import digit_reward

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def lora(**overrides) -> LoraConfig:
    values = dict(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=TARGETS, task_type="CAUSAL_LM")
    values.update(overrides)
    return LoraConfig(**values)


def make_config(tmp_path, **overrides) -> GRPOConfig:
    values = dict(
        output_dir=str(tmp_path / "run"),
        max_steps=3,
        num_generations=4,
        per_device_train_batch_size=8,
        max_completion_length=6,
        learning_rate=0.05,  # large: the adapter moves the outputs far within a few steps
        beta=0.04,
        disable_tqdm=True,
        seed=0,
    )
    values.update(overrides)
    return GRPOConfig(**values)


def greedy_generate(model, tokenizer, prompts, max_new_tokens=12):
    """Plain ``model.generate``, one prompt at a time (no padding): the independent computation."""
    out = []
    for prompt in prompts:
        ids = torch.tensor([tokenizer(prompt, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            tokens = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=max_new_tokens,
                eos_token_id=None,
                pad_token_id=tokenizer.pad_token_id,
            )
        out.append(tokens[0, ids.shape[1] :].tolist())
    return out


def fast_greedy(model, tokenizer, prompts, max_new_tokens=12):
    params = SamplingParams(max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0, eos_token_ids=())
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    sampler = FastSampler(model, impl="native")
    return sampler.generate(ids, 1, params).completion_ids


@pytest.fixture(scope="module")
def trained(tiny_model_dir, tmp_path_factory):
    """A LoRA policy after 3 steps at learning rate 0.05, trained with the fast sampler."""
    tmp = tmp_path_factory.mktemp("lora-run")
    rows = [{"prompt": p, "solution": s} for p, s in (("1+1=", "2"), ("2+3=", "5"), ("4+4=", "8"))]
    config = make_config(tmp, generation_backend="fast")
    trainer = GRPOTrainer(str(tiny_model_dir), [digit_reward], config, train_dataset=rows, peft_config=lora())
    trainer.train()
    return trainer


def test_fast_sampler_decodes_with_the_adapter(trained):
    model, tokenizer = trained.unwrapped_model, trained.tokenizer
    assert isinstance(model, PeftModel) and trained.backend.impl == "native"
    prompts = ["1+1=", "2+3=", "12+30=", "9-4="]
    fast = fast_greedy(model, tokenizer, prompts)
    assert fast == greedy_generate(model, tokenizer, prompts)
    with model.disable_adapter():  # the adapter matters: without it the greedy output is another one
        assert fast_greedy(model, tokenizer, prompts) != fast


def test_fused_weight_of_a_lora_layer_is_base_plus_scaled_product(trained):
    q = trained.unwrapped_model.base_model.model.model.layers[0].self_attn.q_proj
    a, b = q.lora_A["default"].weight, q.lora_B["default"].weight  # [r, in], [out, r]
    assert b.abs().max() > 1e-3  # trained away from its zero initialisation
    expected = q.base_layer.weight + (8 / 4) * b @ a  # scaling = lora_alpha / r
    torch.testing.assert_close(linear_weight(q), expected)
    x = torch.randn(3, a.shape[1])
    torch.testing.assert_close(x @ linear_weight(q).T, q(x), atol=1e-6, rtol=1e-5)
    with trained.unwrapped_model.disable_adapter():
        assert linear_weight(q) is q.base_layer.weight


def test_reference_is_the_base_model(trained, tiny_model_dir):
    """pi_ref of a LoRA run = the untouched base model: its log-probs equal a fresh from_pretrained's."""
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert trained.reference.model is None  # nothing copied
    ids = torch.tensor([[5, 6, 7, 8]])
    mask = torch.ones_like(ids)
    comp = torch.tensor([[9, 10, 11]])
    with torch.no_grad():
        with trained.unwrapped_model.disable_adapter():
            ref, _ = completion_logprobs(trained.unwrapped_model, ids, mask, comp, torch.ones_like(comp))
        want, _ = completion_logprobs(base, ids, mask, comp, torch.ones_like(comp))
        adapted, _ = completion_logprobs(trained.unwrapped_model, ids, mask, comp, torch.ones_like(comp))
    torch.testing.assert_close(ref, want, atol=0, rtol=0)
    assert (adapted - want).abs().max() > 1e-3


def test_save_model_writes_an_adapter_peft_loads(trained, tiny_model_dir, tmp_path):
    trained.save_model(tmp_path / "out")
    assert (tmp_path / "out" / "adapter_model.safetensors").exists()
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), tmp_path / "out")
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, trained.unwrapped_model(ids).logits)


def test_lora_resume_continues_exactly(tiny_model_dir, tmp_path):
    rows = [{"prompt": p, "solution": s} for p, s in (("1+1=", "2"), ("2+3=", "5"), ("4+4=", "8"))]
    full = make_config(tmp_path / "a")
    straight = GRPOTrainer(str(tiny_model_dir), [digit_reward], full, train_dataset=rows, peft_config=lora())
    straight.train()
    split = make_config(tmp_path / "b", save_steps=2)
    first = GRPOTrainer(str(tiny_model_dir), [digit_reward], split, train_dataset=rows, peft_config=lora())
    first.max_steps = 2  # interrupted after the checkpoint at step 2
    first.train()
    resumed = GRPOTrainer(str(tiny_model_dir), [digit_reward], split, train_dataset=rows, peft_config=lora())
    resumed.train(resume_from_checkpoint=True)
    assert resumed.step == 3
    want = {k: v for k, v in straight.unwrapped_model.state_dict().items() if "lora_" in k}
    got = resumed.unwrapped_model.state_dict()
    assert want and all(torch.equal(v, got[k]) for k, v in want.items())


def test_unknown_target_modules_are_refused_by_name(tiny_model_dir, tmp_path):
    rows = [{"prompt": "1+1=", "solution": "2"}]
    with pytest.raises(ValueError, match=r"peft_config.target_modules.*'qkv'.*q_proj"):
        GRPOTrainer(
            str(tiny_model_dir),
            [digit_reward],
            make_config(tmp_path, per_device_train_batch_size=4),
            train_dataset=rows,
            peft_config=lora(target_modules=["qkv"]),
        )

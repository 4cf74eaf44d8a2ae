"""Gradient checkpointing changes memory, never numbers: on every forward path (plain, lean chunked head,
shared prefix), for full weights and for LoRA adapters, the log-probs and every gradient equal those of the
same model without checkpointing; a trainer step at learning rate 0 reports ratio 1 and KL 0."""

from __future__ import annotations

import copy

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import Qwen2Config, Qwen2ForCausalLM

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.models import build_char_tokenizer, build_tiny_model
from grpokit.models.policy import enable_gradient_checkpointing, is_checkpointing
from grpokit.rollout import ScriptedBackend
from grpokit.train.forward import completion_logprobs

from .test_forward import G, _batch, _plain

PATHS = {
    "plain": dict(shared_prefix=False),
    "chunked": dict(shared_prefix=False, chunk_size=4),
    "shared_prefix": dict(shared_prefix=True, chunk_size=5),
}


def qwen2(seed: int = 0) -> Qwen2ForCausalLM:
    config = Qwen2Config(
        vocab_size=61,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        initializer_range=0.2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config).train()


def logps_and_grads(model, options, batch, weights):
    model.zero_grad(set_to_none=True)
    p_ids, p_mask, c_ids, c_mask = batch
    if options is None:  # the textbook full forward
        logps, entropy = _plain(model, p_ids, p_mask, c_ids, c_mask)
    else:
        logps, entropy = completion_logprobs(
            model, p_ids, p_mask, c_ids, c_mask, with_entropy=True, num_generations=G, **options
        )
    (logps * weights).sum().add(0.1 * entropy.sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logps.detach(), grads


def assert_same(a, b):
    (lp_a, g_a), (lp_b, g_b) = a, b
    torch.testing.assert_close(lp_a, lp_b, atol=1e-6, rtol=1e-6)
    assert set(g_a) == set(g_b) and g_a
    for name in g_a:
        scale = g_b[name].abs().max().clamp(min=1e-6)
        torch.testing.assert_close(g_a[name] / scale, g_b[name] / scale, atol=1e-6, rtol=0, msg=name)


def test_is_checkpointing_reads_the_model_without_its_deprecated_name(recwarn):
    """transformers 5.x warns on ``is_gradient_checkpointing`` (gone in 6); a PEFT model answers for its
    base."""
    model = qwen2()
    assert not is_checkpointing(model)
    enable_gradient_checkpointing(model)
    lora = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj"]))
    assert is_checkpointing(model) and is_checkpointing(lora)
    assert not [w for w in recwarn if "checkpointing" in str(w.message)]


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("adapter", [False, True], ids=["full", "lora"])
def test_checkpointing_gives_the_same_logprobs_and_gradients(path, adapter):
    batch = _batch()
    weights = torch.randn(batch[2].shape, generator=torch.Generator().manual_seed(1))
    plain = qwen2()
    checkpointed = copy.deepcopy(plain)
    enable_gradient_checkpointing(checkpointed)
    if adapter:
        lora = LoraConfig(
            r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False
        )
        plain, checkpointed = get_peft_model(plain, lora), get_peft_model(checkpointed, copy.deepcopy(lora))
        checkpointed.load_state_dict(plain.state_dict())  # the same (random, nonzero) adapters
    want = logps_and_grads(plain, PATHS[path], batch, weights)
    got = logps_and_grads(checkpointed, PATHS[path], batch, weights)
    assert_same(got, want)
    textbook = logps_and_grads(plain, None, batch, weights)  # and both equal the full forward
    torch.testing.assert_close(want[0], textbook[0], atol=1e-5, rtol=1e-5)
    if adapter:  # only the adapters learn; the prompt's part of their gradient arrives through its keys
        assert all("lora_" in name for name in got[1])


def test_trainer_step_at_learning_rate_zero_has_ratio_one_and_kl_zero(tmp_path):
    """The issue's reproduction: long shared prompts, micro-batch = whole groups (shared-prefix forward),
    mu = 2, beta 0.04, learning rate 0. With and without checkpointing: ratio 1, KL 0, the same grad norm."""

    tokenizer = build_char_tokenizer()
    rows = [{"prompt": "12+34+56+78+90=", "solution": "310"}, {"prompt": "9+8+7+6+5+4+3=", "solution": "42"}]
    history = {}
    for checkpointing in (False, True):
        args = GRPOConfig(
            output_dir=str(tmp_path / str(checkpointing)),
            max_steps=1,
            num_generations=4,
            per_device_train_batch_size=4,  # one group per micro-batch: the shared-prefix forward
            gradient_accumulation_steps=2,
            num_iterations=2,
            beta=0.04,
            learning_rate=0.0,
            max_completion_length=5,
            gradient_checkpointing=checkpointing,
            disable_tqdm=True,
            seed=0,
        )
        policy = build_tiny_model(tokenizer, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
        trainer = GRPOTrainer(
            policy,
            [lambda completions, **kw: [float(len(c)) for c in completions]],
            args,
            train_dataset=rows,
            processing_class=tokenizer,
            rollout_backend=ScriptedBackend(tokenizer, lambda prompt, i: ["3", "31", "310", "42+"][i % 4]),
        )
        assert is_checkpointing(trainer.unwrapped_model) == checkpointing
        history[checkpointing] = trainer.train()[-1]
    for run in history.values():
        assert run["ratio_mean"] == pytest.approx(1.0, abs=1e-7)
        assert run["kl"] == pytest.approx(0.0, abs=1e-7)
    assert history[True]["grad_norm"] == pytest.approx(history[False]["grad_norm"], rel=1e-6)
    assert history[True]["loss"] == pytest.approx(history[False]["loss"], rel=1e-6, abs=1e-9)


def test_reentrant_checkpointing_is_refused():
    with pytest.raises(ValueError, match="gradient_checkpointing_kwargs use_reentrant=True"):
        GRPOConfig(gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": True})

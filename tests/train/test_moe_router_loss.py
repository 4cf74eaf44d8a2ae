"""A mixture-of-experts policy's load-balancing loss (``router_aux_loss_coef``, ``grpokit.models.moe``): the
lean forward's value equals the model's own ``aux_loss``; the trainer adds ``coef * aux`` to the loss."""

import pytest
import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

from grpokit import GRPOTrainer
from grpokit.models.moe import router_loss_for
from grpokit.models.tiny import build_char_tokenizer
from grpokit.train.forward import completion_logprobs
from tests.conftest import small_config


def tiny_moe(tokenizer=None, coef=0.001):
    torch.manual_seed(0)
    vocab = len(tokenizer) if tokenizer is not None else 64
    config = Qwen3MoeConfig(
        vocab_size=vocab, hidden_size=16, intermediate_size=32, moe_intermediate_size=8, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=8, num_experts=4, num_experts_per_tok=2,
        router_aux_loss_coef=coef, tie_word_embeddings=False,
        **({} if tokenizer is None else {"pad_token_id": tokenizer.pad_token_id,
                                          "eos_token_id": tokenizer.eos_token_id}),
    )  # fmt: skip
    return Qwen3MoeForCausalLM(config)


def test_the_router_loss_is_the_models_own_aux_loss():
    """Left-padded prompts and right-padded completions: the load-balancing loss of the lean forward's router
    logits equals ``model(...).aux_loss`` of a plain forward over the same tokens."""
    model = tiny_moe()
    prompt_ids = torch.tensor([[0, 5, 6, 7], [8, 9, 10, 11]])
    prompt_mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    completion_ids = torch.tensor([[12, 13, 14], [15, 16, 0]])
    completion_mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    routed = []
    completion_logprobs(
        model, prompt_ids, prompt_mask, completion_ids, completion_mask, num_generations=None,
        router_logits=routed,
    )  # fmt: skip
    router = router_loss_for(model, None)
    assert router is not None and router.coefficient == 0.001
    ours = router(*routed[0])
    ids = torch.cat([prompt_ids, completion_ids], 1)[:, :-1]
    mask = torch.cat([prompt_mask, completion_mask], 1)[:, :-1]
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    plain = model(input_ids=ids, attention_mask=mask, position_ids=positions, output_router_logits=True)
    torch.testing.assert_close(ours, plain.aux_loss, rtol=1e-6, atol=1e-7)


def test_which_models_get_a_router_loss(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    dense = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert router_loss_for(dense, None) is None and router_loss_for(dense, 0.0) is None
    with pytest.raises(ValueError, match=r"router_aux_loss_coef=0.01 but LlamaForCausalLM is not a mixture"):
        router_loss_for(dense, 0.01)
    moe = tiny_moe(coef=0.02)
    assert router_loss_for(moe, None).coefficient == 0.02
    assert router_loss_for(moe, 0.5).coefficient == 0.5
    assert router_loss_for(moe, 0.0) is None


ROWS = [{"prompt": "1+1="}, {"prompt": "2+3="}]


def length(completions, **kwargs):
    return [float(len(c)) for c in completions]


def saved_tiny_moe(tmp_path):
    """The tiny MoE and its character tokenizer saved in ``tmp_path/moe``: its path."""
    tokenizer = build_char_tokenizer()
    path = tmp_path / "moe"
    tiny_moe(tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_router_aux_loss_coef_is_checked(tmp_path):
    with pytest.raises(ValueError, match="router_aux_loss_coef"):
        small_config(tmp_path, router_aux_loss_coef=-1.0)


def test_the_trainer_adds_the_weighted_router_loss(tmp_path):
    """One optimizer step of one micro-batch: loss - policy_loss = coef * aux_loss exactly as logged."""
    path = saved_tiny_moe(tmp_path)
    config = small_config(tmp_path, router_aux_loss_coef=0.5, learning_rate=1e-3)
    trainer = GRPOTrainer(str(path), [length], config, train_dataset=ROWS)
    assert trainer.aux_loss_enabled
    (metrics,) = trainer.train()
    assert metrics["aux_loss"] > 0
    assert metrics["loss"] - metrics["policy_loss"] == pytest.approx(0.5 * metrics["aux_loss"], rel=1e-5)
    dense = GRPOTrainer(str(path), [length], small_config(tmp_path / "b", router_aux_loss_coef=0.0),
                        train_dataset=ROWS)  # fmt: skip
    assert not dense.aux_loss_enabled


def test_the_shared_prefix_forward_gives_the_same_router_loss_and_gradients():
    """Two groups of G=3 rows sharing a prompt each: with the prompt run once per group, its router logits
    repeated to the G rows, the load-balancing loss and every parameter's gradient equal the whole-row
    forward's (the model's own routing of every token)."""
    model = tiny_moe()
    prompt_ids = torch.tensor([[0, 5, 6, 7]] * 3 + [[8, 9, 10, 11]] * 3)
    prompt_mask = torch.tensor([[0, 1, 1, 1]] * 3 + [[1, 1, 1, 1]] * 3)
    completion_ids = torch.tensor(
        [[12, 13, 14], [15, 16, 0], [17, 0, 0], [18, 19, 20], [21, 22, 0], [9, 9, 9]]
    )
    completion_mask = (completion_ids > 0).long()
    router = router_loss_for(model, None)
    results = []
    for shared in (False, True):
        model.zero_grad()
        routed = []
        logps, _ = completion_logprobs(
            model, prompt_ids, prompt_mask, completion_ids, completion_mask, num_generations=3,
            shared_prefix=shared, router_logits=routed,
        )  # fmt: skip
        aux = router(*routed[0])
        (logps.sum() + aux).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        results.append((logps.detach(), aux.detach(), grads))
    (plain_logps, plain_aux, plain_grads), (logps, aux, grads) = results
    torch.testing.assert_close(logps, plain_logps, rtol=0, atol=1e-5)
    torch.testing.assert_close(aux, plain_aux, rtol=1e-6, atol=1e-7)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, plain_grads[name], rtol=1e-4, atol=1e-6, msg=name)


def test_a_token_budget_is_refused_with_the_router_loss(tmp_path):
    """The load-balancing loss is a statistic of each micro-batch's tokens: micro-batches filled by tokens
    would change it, so micro_batch_tokens is refused with it (and allowed once it is off)."""
    path = saved_tiny_moe(tmp_path)
    config = small_config(tmp_path, router_aux_loss_coef=0.5, micro_batch_tokens=64)
    with pytest.raises(ValueError, match=r"GRPOConfig.micro_batch_tokens .* load-balancing loss"):
        GRPOTrainer(str(path), [length], config, train_dataset=ROWS)
    plain = small_config(tmp_path / "b", router_aux_loss_coef=0.0, micro_batch_tokens=64)
    assert not GRPOTrainer(str(path), [length], plain, train_dataset=ROWS).aux_loss_enabled

"""Activations made again in the backward (``grpokit.models.recompute``): inside the update's block the
lean norms' outputs and the packed attention's joined output are kept as their recipes; the log-probs and
every gradient stay the same bit for bit, and what is no longer kept is exactly those tensors."""

from __future__ import annotations

from unittest import mock

import pytest
import torch

from grpokit.models import recompute
from grpokit.models.cpu_linear import use_onednn_linears
from grpokit.models.lean_layers import use_lean_layers
from grpokit.models.policy import enable_gradient_checkpointing
from grpokit.train.forward import completion_logprobs
from tests.models.test_lean_layers import tiny

G = 3
PROMPTS = (5, 8)  # real prompt tokens of the two groups (left-padded to 8)
LENGTHS = (2, 6, 4, 6, 1, 3)  # real completion tokens of the six rows (right-padded to 6)


def batch(vocab: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(0)
    width, longest = max(PROMPTS), max(LENGTHS)
    prompt_ids = torch.zeros(len(LENGTHS), width, dtype=torch.long)
    prompt_mask = torch.zeros_like(prompt_ids)
    for g, length in enumerate(PROMPTS):
        prompt_ids[g * G : (g + 1) * G, width - length :] = torch.randint(
            3, vocab, (length,), generator=generator
        )
        prompt_mask[g * G : (g + 1) * G, width - length :] = 1
    completion_ids = torch.randint(3, vocab, (len(LENGTHS), longest), generator=generator)
    completion_mask = (torch.arange(longest)[None] < torch.tensor(LENGTHS)[:, None]).long()
    return prompt_ids, prompt_mask, completion_ids, completion_mask


def forward_backward(model, block: bool) -> tuple[torch.Tensor, dict, dict[int, int], dict[int, int]]:
    """Log-probs, every parameter's gradient, and the storages kept for the backward as tensors and as
    recipes (address, resp. recipe -> bytes; parameters left out) of a packed, shared-prefix forward with
    entropy, inside the block or not."""
    model.zero_grad()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}
    recipes: dict[int, int] = {}
    inputs: set[int] = set()  # the storages the recipes read

    def counted(tensor: torch.Tensor, saved) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if saved is tensor and storage.data_ptr() not in params:
            kept[storage.data_ptr()] = storage.nbytes()
        elif saved is not tensor:  # (its storage is freed: its address may come again)
            recipes[id(saved.recipe)] = storage.nbytes()
            inputs.update(t.untyped_storage().data_ptr() for t in saved.recipe.inputs)
        return tensor

    if block:
        with recompute.recomputed_in_backward(observe=counted):
            logps, entropy = run_forward(model)
    else:
        with torch.autograd.graph.saved_tensors_hooks(lambda t: counted(t, t), lambda t: t):
            logps, entropy = run_forward(model)
    assert inputs <= set(kept) | params  # every recipe reads only what the backward keeps anyway
    weights = torch.linspace(-1, 1, logps.numel()).view(logps.shape)
    ((logps * weights).sum() + entropy.sum()).backward()
    return logps.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}, kept, recipes


def run_forward(model):
    return completion_logprobs(
        model, *batch(model.config.vocab_size), num_generations=G, padding_free=True, with_entropy=True
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_the_block_keeps_recipes_of_norm_outputs_and_joined_attention_and_changes_nothing(arch, dtype):
    """Log-probs and every gradient equal bit for bit. What the block no longer keeps is, per layer and
    backbone token (each group's prompt once, every completion token but the last), the two norms' outputs
    [H] and the attention's joined output [heads x d]; everything else is kept as it was."""
    model = use_lean_model(arch, dtype)
    want, want_grads, kept_plain, _ = forward_backward(model, block=False)
    got, got_grads, kept, recipes = forward_backward(model, block=True)
    assert torch.equal(got, want)
    for name, grad in want_grads.items():
        assert torch.equal(got_grads[name], grad), name
    tokens = sum(PROMPTS) + sum(LENGTHS) - len(LENGTHS)  # (a row's last token is scored, not fed)
    config = model.config
    per_token = 2 * config.hidden_size + config.num_attention_heads * config.head_dim
    size = torch.finfo(dtype).bits // 8
    # (the prompts' and the completions' passes: each layer's tensors of each pass are separate storages)
    assert sum(recipes.values()) == config.num_hidden_layers * tokens * per_token * size
    assert sum(kept.values()) + sum(recipes.values()) == sum(kept_plain.values())


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_under_autocast_a_norms_cast_is_made_once_and_kept_as_its_recipe(arch):
    """bf16 autocast over float32 weights, the policy's linears as the trainer gives them: autocast would
    cast the attention's input once for each of q, k and v and the MLP its input once, each copy kept by its
    product. Inside the block each norm output's cast is made once and kept as its recipe. Log-probs and
    every gradient equal bit for bit; per layer and backbone token the block keeps the two casts [H] and the
    joined attention [heads x d] as recipes, and no longer makes two of the three q, k, v copies."""
    model = use_lean_model(arch, torch.float32)
    use_onednn_linears(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want, want_grads, kept_plain, _ = forward_backward(model, block=False)
        got, got_grads, kept, recipes = forward_backward(model, block=True)
    assert torch.equal(got, want)
    for name, grad in want_grads.items():
        assert torch.equal(got_grads[name], grad), name
    tokens = sum(PROMPTS) + sum(LENGTHS) - len(LENGTHS)
    config = model.config
    per_token = 2 * config.hidden_size + config.num_attention_heads * config.head_dim
    bf16 = 2
    assert sum(recipes.values()) == config.num_hidden_layers * tokens * per_token * bf16
    copies_not_made = config.num_hidden_layers * tokens * 2 * config.hidden_size * bf16
    assert sum(kept.values()) + sum(recipes.values()) == sum(kept_plain.values()) - copies_not_made


def use_lean_model(arch: str, dtype: torch.dtype) -> torch.nn.Module:
    model = tiny(arch, dtype).train()
    assert use_lean_layers(model) > 0
    return model


def test_with_gradient_checkpointing_inside_the_block_the_gradients_are_the_same():
    """Checkpointing's own hooks take over inside each layer (nothing kept there, the layer run again in the
    backward outside the block): the gradients equal those of a plain forward without checkpointing."""
    model = use_lean_model("llama", torch.float32)
    _, want, _, _ = forward_backward(model, block=False)
    enable_gradient_checkpointing(model)
    _, got, _, _ = forward_backward(model, block=True)
    for name, grad in want.items():
        assert torch.equal(got[name], grad), name


def test_an_input_of_a_recipe_modified_in_place_is_refused():
    """A norm's input changed in place after the forward: its output cannot be made again, and the backward
    says so (where autograd would refuse a modified saved tensor)."""
    norm = use_lean_model("llama", torch.float32).model.norm
    x = torch.randn(3, 64, requires_grad=True)
    h = x * 1.0
    with recompute.recomputed_in_backward():
        out = torch.nn.functional.linear(norm(h), torch.randn(5, 64, requires_grad=True))
    h.mul_(2.0)
    with pytest.raises(RuntimeError, match="modified in place after the forward"):
        out.sum().backward()


def test_outside_a_block_nothing_is_offered_and_blocks_nest():
    x = torch.randn(4, requires_grad=True)
    y = x * 2.0
    recompute.offer(y, lambda: x.detach() * 2.0, x)  # no block: nothing happens
    assert not recompute.active()
    with recompute.recomputed_in_backward():
        outer = recompute._OFFERED
        with recompute.recomputed_in_backward():
            assert recompute._OFFERED is not outer
        assert recompute._OFFERED is outer
    assert not recompute.active()


def test_a_recipe_is_made_once_for_the_linears_that_share_it():
    """q, k and v keep the same norm output: the backward makes it once (the recipe's last use drops it)."""
    model = use_lean_model("llama", torch.float32)
    made = []
    tensor = recompute._Recipe.tensor

    def counting(self):
        if self.made is None:
            made.append(self.shape)
        return tensor(self)

    with mock.patch.object(recompute._Recipe, "tensor", counting):
        _, _, _, recipes = forward_backward(model, block=True)
    assert len(made) == len(recipes)  # each recipe made once, however many saved views read it

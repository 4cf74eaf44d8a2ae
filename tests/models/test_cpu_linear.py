"""Float32 products through oneDNN (``grpokit.models.cpu_linear``): the linear layer's output and its three
gradients against a float64 computation, where the products run (oneDNN's operator, seen by the profiler),
where they must not (autocast, bf16, a hooked layer), and a policy whose linears use them: the same log-probs
and gradients as the plain model, copies and pickles bound to their own weights."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch.profiler import ProfilerActivity, profile
from transformers import AutoConfig, AutoModelForCausalLM

from grpokit import GRPOConfig
from grpokit.models.cpu_linear import linear, matmul, onednn_available, onednn_float32, use_onednn_linears
from grpokit.models.policy import load_policy

needs_onednn = pytest.mark.skipif(
    not onednn_available(), reason="oneDNN's float32 products: x86 with AVX-512"
)


def tiny(arch: str) -> torch.nn.Module:
    values = dict(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4)
    values |= dict(num_key_value_heads=2, intermediate_size=96, max_position_embeddings=128, head_dim=16)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(arch, **values), dtype=torch.float32)


def onednn_calls(fn) -> int:
    """How many times ``fn()`` calls oneDNN's linear operator."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sum(e.count for e in prof.key_averages() if e.key == "mkldnn::_linear_pointwise")


@pytest.mark.parametrize("bias", [False, True])
def test_linear_and_its_gradients_equal_a_float64_product(bias):
    """y = x W^T + b on a [2, 5, 48] input (a transposed, non-contiguous view) and [40, 48] weight: y and the
    gradients of sum(y * c) (dx = c W, dW = c^T x, db = sum c) to 1e-5 of the same in float64."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 48, 5, generator=gen).transpose(1, 2).requires_grad_()
    weight = torch.randn(40, 48, generator=gen).requires_grad_()
    b = torch.randn(40, generator=gen).requires_grad_() if bias else None
    c = torch.randn(2, 5, 40, generator=gen)
    y = linear(x, weight, b)
    (y * c).sum().backward()

    x64, w64, c64 = x.detach().double(), weight.detach().double(), c.double()
    want = x64 @ w64.T + (b.detach().double() if bias else 0)
    torch.testing.assert_close(y.detach(), want.float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad, (c64 @ w64).float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        weight.grad, (c64.reshape(-1, 40).T @ x64.reshape(-1, 48)).float(), atol=1e-4, rtol=1e-5
    )
    if bias:
        torch.testing.assert_close(b.grad, c64.sum((0, 1)).float(), rtol=1e-5, atol=1e-5)


def test_matmul_equals_a_float64_product():
    gen = torch.Generator().manual_seed(1)
    a, b = torch.randn(7, 33, generator=gen), torch.randn(33, 12, generator=gen)
    torch.testing.assert_close(matmul(a, b), (a.double() @ b.double()).float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(matmul(a, b.t().contiguous().t()), matmul(a, b), rtol=0, atol=0)


@needs_onednn
def test_forward_and_backward_run_on_onednn():
    """Where the processor allows it, the forward and both gradient products are oneDNN's (3 calls); without
    a gradient, one."""
    x = torch.randn(6, 32).requires_grad_()
    weight = torch.randn(16, 32).requires_grad_()
    assert onednn_calls(lambda: linear(x, weight).sum().backward()) == 3
    with torch.no_grad():
        assert onednn_calls(lambda: linear(x, weight)) == 1


def test_other_products_are_torchs_own():
    """bf16 operands, autocast and a float64 weight take ``F.linear`` (no oneDNN call, its numbers)."""
    x, weight = torch.randn(4, 8), torch.randn(3, 8)
    assert not onednn_float32(x.bfloat16(), weight.bfloat16())
    assert not onednn_float32(x, weight.double())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not onednn_float32(x, weight)
        assert onednn_calls(lambda: linear(x, weight)) == 0
        out = linear(x, weight)
        assert out.dtype == torch.bfloat16 and torch.equal(out, torch.nn.functional.linear(x, weight))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_model_on_onednn_linears_has_the_logits_and_gradients_of_the_plain_one(arch):
    """Every linear of a Llama- and a Qwen2-family model (the LM head included) on ``linear``: logits and
    every parameter's gradient to 1e-5 of the same model's own forward."""
    plain = tiny(arch)
    fast = copy.deepcopy(plain)
    assert use_onednn_linears(fast) == 2 * 7 + 1 == use_onednn_linears(fast)  # idempotent
    ids = torch.randint(0, 100, (2, 11), generator=torch.Generator().manual_seed(3))
    results = []
    for model in (plain, fast):
        logits = model(input_ids=ids).logits
        logits.square().mean().backward()
        results.append((logits.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (want, want_grads), (got, got_grads) = results
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-5, atol=1e-6 * grad.abs().max().item())


@needs_onednn
def test_a_layer_with_hooks_runs_torchs_product():
    """A hook of the layer's own (DeepSpeed ZeRO-3 gathers and replaces the product in them): ``F.linear``."""
    layer = torch.nn.Linear(8, 4)
    use_onednn_linears(layer)
    x = torch.randn(3, 8)
    assert onednn_calls(lambda: layer(x)) == 1
    layer.register_forward_pre_hook(lambda module, args: None)
    assert onednn_calls(lambda: layer(x)) == 0


@needs_onednn
@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copy_runs_on_its_own_weights(how):
    model = tiny("llama")
    use_onednn_linears(model)
    twin = copy.deepcopy(model) if how == "deepcopy" else pickle.loads(pickle.dumps(model))
    ids = torch.randint(0, 100, (1, 6))
    assert onednn_calls(lambda: twin(input_ids=ids).logits.sum().backward()) > 0
    assert all(p.grad is None for p in model.parameters())  # into the copy's weights, not the original's
    assert all(p.grad is not None for p in twin.parameters())


def test_the_policy_gets_them():
    policy = load_policy(tiny("llama"), GRPOConfig(output_dir="unused"))
    linears = [m for m in policy.modules() if type(m) is torch.nn.Linear]
    assert len(linears) == 15 and all("forward" in vars(m) for m in linears)


def test_a_backward_called_inside_autocast_keeps_float32_products():
    """The forward ran in float32; a backward called under bf16 autocast computes its gradients in float32
    too (to 1e-5 of float64, where bf16 products would be ~1e-2 off)."""
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(9, 64, generator=gen).requires_grad_()
    weight = torch.randn(32, 64, generator=gen).requires_grad_()
    y = linear(x, weight)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y.sum().backward()
    ones = torch.ones(9, 32, dtype=torch.float64)
    torch.testing.assert_close(x.grad, (ones @ weight.detach().double()).float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(weight.grad, (ones.T @ x.detach().double()).float(), rtol=1e-5, atol=1e-5)

"""The lean MLP and RMSNorm (``grpokit.models.lean_layers``) against ``transformers``' own modules: the same
outputs bit for bit, the same gradients, and where they must not run, the modules' own forward. What they
save for the backward is counted exactly in tests/train/test_memory_plan.py
(``test_layer_activation_bytes_equal_what_autograd_saves``)."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from grpokit import GRPOConfig
from grpokit.models.cpu_linear import use_onednn_linears
from grpokit.models.lean_layers import GatedMLP, use_lean_layers
from grpokit.models.policy import enable_gradient_checkpointing, load_policy

ARCHS = ["llama", "qwen2", "qwen3", "mistral"]
PRECISIONS = {  # weights' dtype, autocast
    "fp32": (torch.float32, False),
    "bf16": (torch.bfloat16, False),
    "autocast": (torch.float32, True),
}


def tiny(arch: str, dtype: torch.dtype = torch.float32, **overrides) -> torch.nn.Module:
    values = dict(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4)
    values |= dict(num_key_value_heads=2, intermediate_size=96, max_position_embeddings=128, head_dim=16)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(AutoConfig.for_model(arch, **values, **overrides), dtype=dtype)


def run(module: torch.nn.Module, x: torch.Tensor, autocast: bool) -> tuple[torch.Tensor, dict]:
    """The module's output on a copy of x, and the gradients of a fixed function of it: x's and every
    parameter's. The module gets x as a layer does, computed (autocast keeps one cast of a leaf for all its
    uses, and one per use of anything else)."""
    x = x.detach().clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = module(x.clone())
    weights = torch.linspace(-1, 1, out.numel()).view(out.shape)
    (out.float() * weights).sum().backward()
    grads = {"x": x.grad} | {name: p.grad for name, p in module.named_parameters()}
    return out.detach(), grads


@pytest.mark.parametrize("precision", list(PRECISIONS))
@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("part", ["mlp", "input_layernorm"])
def test_a_lean_module_computes_what_the_transformers_module_does_bit_for_bit(arch, precision, part):
    """Alone, each lean module's output and every gradient (its input's, its weights') equal the
    ``transformers`` module's exactly, in float32, bf16 and under bf16 autocast over float32 weights (its
    linears on the products the lean MLP computes with, oneDNN's in float32 on x86 CPUs with AVX-512, as a
    policy's are: ``use_onednn_linears``)."""
    dtype, autocast = PRECISIONS[precision]
    original = getattr(tiny(arch, dtype).model.layers[0], part)
    use_onednn_linears(original)
    lean = copy.deepcopy(original)
    assert use_lean_layers(lean) == 1
    x = torch.randn(2, 7, 64, generator=torch.Generator().manual_seed(1)).to(dtype)
    (want, want_grads), (got, got_grads) = run(original, x, autocast), run(lean, x, autocast)
    assert got.dtype == want.dtype and torch.equal(got, want)
    for name, grad in want_grads.items():
        assert got_grads[name].dtype == grad.dtype and torch.equal(got_grads[name], grad), name


def test_qwen3s_head_norm_on_bf16_queries_with_a_float32_weight():
    """Under autocast over float32 weights, qwen3's q_norm gets the bf16 output of q_proj and multiplies it
    by its float32 weight (a float32 result): the lean norm follows the same promotions, bit for bit."""
    original = tiny("qwen3").model.layers[0].self_attn.q_norm
    lean = copy.deepcopy(original)
    assert use_lean_layers(lean) == 1
    x = torch.randn(2, 5, 4, 16, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    (want, want_grads), (got, got_grads) = run(original, x, False), run(lean, x, False)
    assert want.dtype == torch.float32 and torch.equal(got, want)
    for name, grad in want_grads.items():
        assert got_grads[name].dtype == grad.dtype and torch.equal(got_grads[name], grad), name


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "mlp_bias"])
@pytest.mark.parametrize("precision", list(PRECISIONS))
def test_the_lean_mlp_with_biases(precision, bias):
    """llama's ``mlp_bias``: the biases' gradients too, exactly."""
    dtype, autocast = PRECISIONS[precision]
    original = tiny("llama", dtype, mlp_bias=bias).model.layers[0].mlp
    use_onednn_linears(original)  # (as the policy's)
    lean = copy.deepcopy(original)
    use_lean_layers(lean)
    x = torch.randn(3, 5, 64, generator=torch.Generator().manual_seed(2)).to(dtype)
    (want, want_grads), (got, got_grads) = run(original, x, autocast), run(lean, x, autocast)
    assert torch.equal(got, want)
    assert ("gate_proj.bias" in want_grads) == bias
    for name, grad in want_grads.items():
        assert torch.equal(got_grads[name], grad), name


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_a_whole_model_with_lean_layers_has_the_same_logits_and_gradients(arch, dtype):
    """Every layer lean: the logits equal bit for bit; the gradients too in bf16, and in float32 to the last
    bits (the residual stream's gradient adds the norm's two terms before the residual's, autograd after)."""
    original = tiny(arch, dtype)
    use_onednn_linears(original)  # (as the policy's)
    lean = copy.deepcopy(original)
    assert use_lean_layers(lean) == 2 * 3 + 1 + (2 * 2 * (arch == "qwen3"))  # + final norm, + q/k norms
    ids = torch.randint(0, 100, (2, 11), generator=torch.Generator().manual_seed(3))
    results = []
    for model in (original, lean):
        logits = model(input_ids=ids).logits
        (logits.float().square().mean()).backward()
        results.append((logits.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (want, want_grads), (got, got_grads) = results
    assert torch.equal(got, want)
    for name, grad in want_grads.items():
        if dtype == torch.bfloat16:
            assert torch.equal(got_grads[name], grad), name
        else:
            torch.testing.assert_close(got_grads[name], grad, rtol=1e-5, atol=1e-6 * grad.abs().max().item())


def test_with_gradient_checkpointing_the_gradients_are_the_same():
    original = tiny("qwen2")
    enable_gradient_checkpointing(original)
    lean = copy.deepcopy(original)
    use_lean_layers(lean)
    ids = torch.randint(0, 100, (2, 9), generator=torch.Generator().manual_seed(4))
    grads = []
    for model in (original.train(), lean.train()):
        model(input_ids=ids).logits.square().mean().backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-5, atol=1e-6 * grad.abs().max().item())


def calls_of_the_lean_mlp(monkeypatch) -> list[int]:
    calls: list[int] = []
    apply = GatedMLP.apply

    def counted(*args):
        calls.append(1)
        return apply(*args)

    monkeypatch.setattr(GatedMLP, "apply", counted)
    return calls


def test_without_gradients_the_modules_own_forward_runs(monkeypatch):
    calls = calls_of_the_lean_mlp(monkeypatch)
    model = tiny("llama")
    use_lean_layers(model)
    ids = torch.randint(0, 100, (1, 6))
    with torch.no_grad():
        model(input_ids=ids)
    with torch.inference_mode():
        model(input_ids=ids)
    assert calls == []
    model(input_ids=ids)
    assert len(calls) == 2  # one per layer


def test_an_mlp_whose_linears_have_hooks_keeps_its_own_forward(monkeypatch):
    """A hook on a linear (DeepSpeed ZeRO-3 gathers its partitioned weights in one) still runs: the lean
    MLP is not used for that module."""
    calls = calls_of_the_lean_mlp(monkeypatch)
    model = tiny("llama")
    use_lean_layers(model)
    seen = []
    model.model.layers[1].mlp.up_proj.register_forward_pre_hook(lambda module, args: seen.append(module))
    model(input_ids=torch.randint(0, 100, (1, 6))).logits.sum().backward()
    assert len(seen) == 1 and len(calls) == 1  # layer 0 lean, layer 1 its own forward with the hook


@pytest.mark.parametrize(
    "targets, lean_mlps", [(["gate_proj", "q_proj"], 0), (["q_proj", "v_proj"], 2)], ids=["mlp", "attention"]
)
def test_with_lora_the_adapters_train_the_same(targets, lean_mlps, monkeypatch):
    """An adapted MLP runs its own forward; an MLP left frozen runs lean and gives its input's gradient
    only (its weights get none)."""
    peft = pytest.importorskip("peft")
    calls = calls_of_the_lean_mlp(monkeypatch)
    config = peft.LoraConfig(r=4, target_modules=targets, init_lora_weights=False)
    original = peft.get_peft_model(tiny("qwen2"), config)
    lean = copy.deepcopy(original)
    use_lean_layers(lean)
    ids = torch.randint(0, 100, (2, 8), generator=torch.Generator().manual_seed(5))
    grads = []
    for model in (original, lean):
        model(input_ids=ids).logits.square().mean().backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.requires_grad})
        assert all(p.grad is None for p in model.parameters() if not p.requires_grad)
    assert len(calls) == lean_mlps
    assert grads[0].keys() == grads[1].keys() and any("lora" in name for name in grads[0])
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-5, atol=1e-6 * grad.abs().max().item())


@pytest.mark.parametrize("lean", [True, False])
def test_the_policy_gets_the_lean_layers_unless_turned_off(lean):
    args = GRPOConfig(output_dir="unused", lean_activations=lean)
    policy = load_policy(tiny("llama"), args)
    marked = [m for m in policy.modules() if getattr(m, "_grpokit_lean", False)]
    assert len(marked) == (7 if lean else 0)
    assert GRPOConfig(output_dir="unused").lean_activations  # on by default


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
def test_a_copy_of_a_lean_model_is_lean_and_trains_its_own_weights(how, monkeypatch):
    calls = calls_of_the_lean_mlp(monkeypatch)
    model = tiny("llama")
    use_lean_layers(model)
    twin = copy.deepcopy(model) if how == "deepcopy" else pickle.loads(pickle.dumps(model))
    ids = torch.randint(0, 100, (1, 6))
    twin(input_ids=ids).logits.sum().backward()
    assert len(calls) == 2  # the copy's two MLPs ran lean
    assert all(p.grad is None for p in model.parameters())  # into the copy's weights, not the original's
    assert all(p.grad is not None for p in twin.parameters())


def test_other_modules_are_left_alone():
    """A mixture of experts' layers (their own classes) get nothing; installing twice changes nothing."""
    moe = AutoModelForCausalLM.from_config(
        AutoConfig.for_model(
            "qwen2_moe",
            vocab_size=100,
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            intermediate_size=64,
            moe_intermediate_size=16,
            shared_expert_intermediate_size=16,
            num_experts=4,
            num_experts_per_tok=2,
        )
    )
    assert use_lean_layers(moe) == 0
    model = tiny("mistral")
    assert use_lean_layers(model) == use_lean_layers(model) == 7


# Minor page faults of 8 forwards of a lean gated MLP (x [512, 256], intermediate 1,024: silu(gate) * up is a
# 2 MiB block, freed before the MLP returns) and of a lean RMSNorm (x [2,048, 256]: its squares a 2 MiB
# block), after two that settle the heap, in a fresh process after keep_freed_memory at GRPOConfig's
# defaults; argv[1] "on"/"off": its cpu_memory_reuse_transient. gate and up (kept for the backward) and the
# norm's output are mapped fresh either way.
TRANSIENT_FAULTS = """
import resource, sys, torch
from grpokit import GRPOConfig
from grpokit.models.lean_layers import GatedMLP, RMSNorm
from grpokit.parallel.cpu_runtime import keep_freed_memory
keep_freed_memory(GRPOConfig(cpu_memory_reuse_transient=sys.argv[1] == "on"))
torch.manual_seed(0)
x = torch.randn(512, 256, requires_grad=True)
gate, up, down = torch.randn(1024, 256), torch.randn(1024, 256), torch.randn(256, 1024)
h, w = torch.randn(2048, 256, requires_grad=True), torch.randn(256)
def faults(rounds, run):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(rounds):
        run()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
mlp = lambda: GatedMLP.apply(x, gate, None, up, None, down, None, None)
norm = lambda: RMSNorm.apply(h, w, 1e-6)
faults(2, mlp), faults(2, norm)
print(faults(8, mlp), faults(8, norm))
"""


def test_a_lean_layers_short_lived_blocks_come_from_the_heap():
    """The lean MLP's silu(gate) * up and the norm's squares (``grpokit.models.transient``, served from
    glibc's heap by the CPU runtime): one block's pages faulted once, not once per forward (8 x 512 pages
    each with ``cpu_memory_reuse_transient=False``)."""
    import platform
    import subprocess
    import sys

    from grpokit.parallel.cpu_runtime import preloaded_allocator

    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc" or preloaded_allocator() is not None:
        pytest.skip("the CPU runtime sets glibc's thresholds")

    def faults(setting: str) -> list[int]:
        run = [sys.executable, "-c", TRANSIENT_FAULTS, setting]
        printed = subprocess.run(run, capture_output=True, text=True, check=True).stdout
        return [int(n) for n in printed.split()]

    (mlp_on, norm_on), (mlp_off, norm_off) = faults("on"), faults("off")
    block = 2 * 2**20 // 4096  # pages of one 2 MiB block
    assert mlp_off - mlp_on >= 8 * block * 0.9
    assert norm_off - norm_on >= 8 * block * 0.9


def test_the_layers_and_the_lm_head_allocate_their_intermediates_as_transient(monkeypatch):
    """Where the window opens: around the lean MLP's silu(gate) * up and down product, the norm's squares and,
    under ``recomputed_in_backward`` (the update), its output, and the LM head's chunk loop; the outputs are
    those without it."""
    import contextlib

    from grpokit.models import transient
    from grpokit.models.recompute import recomputed_in_backward
    from grpokit.train.lm_head import head_logprobs

    entered = []

    @contextlib.contextmanager
    def window():
        entered.append(1)
        yield

    model = tiny("llama")
    use_lean_layers(model)
    ids = torch.randint(0, 100, (2, 6))
    expected = model(input_ids=ids).logits
    monkeypatch.setattr(transient, "_window", window)
    assert torch.equal(model(input_ids=ids).logits, expected)
    norms = 2 * 2 + 1  # two per layer, the final one
    assert len(entered) == 2 + norms  # each MLP, each norm's squares ...
    entered.clear()
    with recomputed_in_backward():
        assert torch.equal(model(input_ids=ids).logits, expected)
    assert len(entered) == 2 + 2 * norms  # ... and under the update's block each norm's output too
    entered.clear()
    hidden = torch.randn(2, 3, 64)
    mask = torch.ones(2, 3)
    head_logprobs(model, hidden, ids[:, :3], mask, temperature=1.0, with_entropy=True, chunk_size=2)
    assert len(entered) == 1


def test_the_lean_layers_survive_train_and_eval_of_a_model_loaded_with_hub_kernels(tiny_model_dir):
    """``transformers`` loads a model with its hub kernels on where the ``kernels`` package is installed,
    and every ``train()`` / ``eval()`` then replaces the forward of each layer it maps (the RMSNorms),
    which would drop the lean one: ``use_lean_layers`` switches that off, so the update's norms stay
    lean."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert use_lean_layers(model) > 0
    model.train()
    model.eval()
    model.train()
    norms = [m for m in model.modules() if type(m).__name__ in ("LlamaRMSNorm", "Qwen2RMSNorm")]
    assert norms and all(type(m.__dict__.get("forward")).__name__ == "_LeanForward" for m in norms)
    assert not getattr(model, "use_kernels", False)

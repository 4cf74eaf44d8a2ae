"""Decoder layers that keep fewer activations for the backward: the gated MLP and the RMSNorms of Llama-family
decoders (llama, qwen2, qwen3, mistral) as autograd functions that save their inputs and run the element-wise
intermediates again in the backward. The forward computes the same operations as ``transformers``' modules
(the same outputs, bit for bit, where their linears compute the same products: on x86 CPUs with AVX-512 the
MLP's float32 products are oneDNN's, ``grpokit.models.cpu_linear``, as the policy's linears are); the
backward computes the gradients autograd would, and no matrix product runs twice.

What a layer keeps for its backward, per token (H hidden, I intermediate, c bytes of the compute dtype:
autocast's, else the weights'; r those of the residual stream):

- the MLP ``down(silu(gate(x)) * up(x))``: ``transformers`` keeps gate, up, silu(gate) and their product
  (4 x [I] c), under autocast a cast of x for each of gate and up and the bf16 copies of the three weights.
  ``GatedMLP`` keeps gate and up (2 x [I] c) and one cast of x; the weights are cast again in the backward.
- each RMSNorm ``w * (x / rms(x))``: ``transformers`` keeps its input in float32, x / rms [H] (r) and 1 / rms.
  ``RMSNorm`` keeps its input as it comes and 1 / rms.
- the norm's output, which the linears after it keep as their input (q, k, v; gate, up: [H] r each): inside
  ``grpokit.models.recompute.recomputed_in_backward`` (the update's forward) ``RMSNorm`` offers it with its
  recipe, and the backward makes it again from the input and 1 / rms (and a copy of w as the forward read
  it) instead of keeping it.

For SmolLM2-135M in float32 a layer keeps 12 KiB (MLP) and 4.5 KiB (norms) less per token, of 43.5 KiB
besides the attention mask (``grpokit.cli.memory_plan.layer_activation_bytes``, which
tests/train/test_memory_plan.py holds to what autograd saves), and inside the update's block 4.5 KiB less
again; a W4-shaped micro-batch 1,164 MiB (1,484 outside the block) instead of 2,268
(``benchmarks/saved_activations.py``).

``use_lean_layers(model)`` gives a model's modules of those classes the lean forward (their instance
``forward``, which copies and pickles with the module). Each call runs the module's own forward instead
where the lean one would change what happens: no gradient is being taken, one of the MLP's linears is not a
plain ``nn.Linear`` (LoRA, quantized) or has hooks (DeepSpeed ZeRO-3 gathers its partitioned weights in
them), or module-wide hooks are registered.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.autograd.function import FunctionCtx, once_differentiable
from torch.nn.modules import module as nn_module

from grpokit.models import recompute
from grpokit.models.cpu_linear import linear, matmul, plain_linear
from grpokit.models.parts import autocast_dtype, cast, hf_model
from grpokit.models.transient import transient_blocks

__all__ = ["LEAN_MODEL_TYPES", "MLP_CLASSES", "NORM_CLASSES", "GatedMLP", "RMSNorm", "use_lean_layers"]

LEAN_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")
"""The model types whose decoder layers' MLP and norms are these classes (mixtures of experts are not)."""

MLP_CLASSES = ("LlamaMLP", "Qwen2MLP", "Qwen3MLP", "MistralMLP")
"""``transformers``' gated MLPs whose forward is ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``."""
NORM_CLASSES = ("LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "MistralRMSNorm")
"""``transformers``' RMSNorms whose forward is ``weight * (x32 * rsqrt(mean(x32^2) + eps)).to(x.dtype)``."""

_LEAN = "_grpokit_lean"


def use_lean_layers(model: torch.nn.Module) -> int:
    """Give the gated SiLU MLPs and RMSNorms of ``model`` (classes ``MLP_CLASSES``, ``NORM_CLASSES``) the lean
    forward; returns how many modules have it. Idempotent. Modules driven by accelerate's hooks (an
    offloaded ``device_map``) are left as they are. A model loaded with ``transformers``' hub kernels (on by
    default where the ``kernels`` package is installed) has them switched off first: each ``train()`` and
    ``eval()`` would otherwise give its kernel layers (the RMSNorms) their forward again, dropping the lean
    one."""
    base = hf_model(model)
    if getattr(base, "use_kernels", False) and callable(getattr(base, "reset_kernels", None)):
        base.reset_kernels()  # the layers' own forward, and no kernelization at a later train() / eval()
    count = 0
    for module in model.modules():
        name = type(module).__name__
        if getattr(module, _LEAN, False):
            count += 1
            continue
        if hasattr(module, "_hf_hook"):
            continue
        if name in MLP_CLASSES and _is_silu(getattr(module, "act_fn", None)):
            module.forward = _LeanForward(module, _lean_mlp_forward)
        elif name in NORM_CLASSES and hasattr(module, "variance_epsilon"):
            module.forward = _LeanForward(module, _lean_norm_forward)
        else:
            continue
        setattr(module, _LEAN, True)
        count += 1
    return count


class _LeanForward:
    """A module's lean forward (its instance ``forward``): ``lean(module, x)``. Copied (``copy.deepcopy``)
    and pickled with its module, it stays bound to the copy."""

    def __init__(self, module: torch.nn.Module, lean: Callable[..., torch.Tensor]) -> None:
        self.module, self.lean = module, lean

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.lean(self.module, x)

    def __reduce__(self) -> tuple:
        return _LeanForward, (self.module, self.lean)


def _is_silu(activation: object) -> bool:
    """torch's SiLU module or ``transformers``' (``ACT2FN["silu"]``, ``F.silu``)."""
    return isinstance(activation, torch.nn.SiLU) or type(activation).__name__ == "SiLUActivation"


def _taking_gradients(*tensors: torch.Tensor) -> bool:
    """A forward whose graph is recorded: gradients on, some input or weight requiring one, and no module-wide
    hooks that expect the submodules to be called."""
    hooks = nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks
    hooks = hooks or nn_module._global_backward_hooks or nn_module._global_backward_pre_hooks
    return torch.is_grad_enabled() and not hooks and any(t.requires_grad for t in tensors)


def _lean_mlp_forward(self, x: torch.Tensor) -> torch.Tensor:
    gate, up, down = self.gate_proj, self.up_proj, self.down_proj
    lean = all(plain_linear(linear) for linear in (gate, up, down))
    if not (lean and _taking_gradients(x, gate.weight, up.weight, down.weight)):
        return type(self).forward(self, x)
    dtype = autocast_dtype(x.device)  # autocast's compute dtype, or None
    return GatedMLP.apply(x, gate.weight, gate.bias, up.weight, up.bias, down.weight, down.bias, dtype)


def _lean_norm_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
    if not _taking_gradients(hidden_states, self.weight):
        return type(self).forward(self, hidden_states)
    return RMSNorm.apply(hidden_states, self.weight, self.variance_epsilon)


class GatedMLP(torch.autograd.Function):
    """out = down(silu(gate(x)) * up(x)), keeping x (its compute-dtype cast), gate(x) and up(x) for the
    backward, which runs silu(gate) and the product again (two element-wise operations) instead of keeping
    them. ``dtype``: autocast's compute dtype (inputs and weights cast to it, as autocast would), or None.

    Backward, with a = silu(g), h = a * u and dO the output's gradient [N, H]:
        dW_down = dO^T h      dh = dO W_down      da = dh * u      du = dh * a      dg = silu'(g) da
        dW_gate = dg^T x      dW_up = du^T x      dx = dg W_gate + du W_up       (biases: the row sums)
    """

    @staticmethod
    def forward(
        ctx: FunctionCtx,
        x: torch.Tensor,
        gate_weight: torch.Tensor,
        gate_bias: torch.Tensor | None,
        up_weight: torch.Tensor,
        up_bias: torch.Tensor | None,
        down_weight: torch.Tensor,
        down_bias: torch.Tensor | None,
        dtype: torch.dtype | None,
    ) -> torch.Tensor:
        # [*, H]; under autocast within the update's block, the norm output's one cast (kept as its recipe)
        xc = None if dtype is None else recompute.cast_of(x, dtype)
        xc = cast(x, dtype) if xc is None else xc
        with torch.autocast(x.device.type, enabled=False):
            gate = linear(xc, cast(gate_weight, dtype), cast(gate_bias, dtype))  # [*, I]
            up = linear(xc, cast(up_weight, dtype), cast(up_bias, dtype))  # [*, I]
            with transient_blocks():  # (freed soon: the residual sum takes out)
                hidden = F.silu(gate).mul_(up)  # [*, I] silu(gate) * up, in silu's block (no second one)
                out = linear(hidden, cast(down_weight, dtype), cast(down_bias, dtype))  # [*, H]
                del hidden
        ctx.save_for_backward(xc, gate, up, gate_weight, up_weight, down_weight)
        ctx.dtype = dtype
        ctx.input_dtype = x.dtype
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad_out: torch.Tensor) -> tuple:
        xc, gate, up, gate_weight, up_weight, down_weight = ctx.saved_tensors
        dtype = ctx.dtype
        hidden, inter = xc.shape[-1], gate.shape[-1]
        with torch.autocast(xc.device.type, enabled=False):
            needs = ctx.needs_input_grad  # (x, gate w, gate b, up w, up b, down w, down b, dtype)
            d_out = grad_out.reshape(-1, hidden).to(gate.dtype)  # [N, H]
            x2, g2, u2 = xc.reshape(-1, hidden), gate.reshape(-1, inter), up.reshape(-1, inter)  # [N, .]
            act = F.silu(g2)  # [N, I]
            d_down = matmul(d_out.t(), act * u2).to(down_weight.dtype) if needs[5] else None  # [H, I]
            d_h = matmul(d_out, cast(down_weight, dtype))  # [N, I]
            d_up = d_h * act  # [N, I]
            d_gate = torch.ops.aten.silu_backward(d_h * u2, g2)  # [N, I]
            del act, d_h
            d_x = None
            if needs[0]:  # [N, H]: each linear's input gradient back in x's dtype, then summed (autograd
                # casts each of autocast's two casts of x back before adding)
                d_x = matmul(d_gate, cast(gate_weight, dtype)).to(ctx.input_dtype)
                d_x = (d_x + matmul(d_up, cast(up_weight, dtype)).to(ctx.input_dtype)).reshape(xc.shape)
            d_gate_weight = matmul(d_gate.t(), x2).to(gate_weight.dtype) if needs[1] else None  # [I, H]
            d_up_weight = matmul(d_up.t(), x2).to(up_weight.dtype) if needs[3] else None  # [I, H]
            gate_b, up_b, down_b = needs[2], needs[4], needs[6]  # (False for a missing bias)
            biases = (
                d_gate.sum(0).to(gate_weight.dtype) if gate_b else None,
                d_up.sum(0).to(up_weight.dtype) if up_b else None,
                d_out.sum(0).to(down_weight.dtype) if down_b else None,
            )
        return d_x, d_gate_weight, biases[0], d_up_weight, biases[1], d_down, biases[2], None


def _normed(x: torch.Tensor, weight: torch.Tensor, rstd: torch.Tensor) -> torch.Tensor:
    """RMSNorm's output w * (x32 * r).to(x.dtype) from its input x [*, H] and r = 1 / rms [*, 1]; the product
    with w in the block of (x32 * r) where it keeps that dtype (the same numbers: one block fewer)."""
    normed = (x.to(torch.float32) * rstd).to(x.dtype)  # [*, H]
    if torch.result_type(weight, normed) == normed.dtype:
        return normed.mul_(weight)
    return weight * normed


class RMSNorm(torch.autograd.Function):
    """out = w * (x32 / rms(x32)).to(x.dtype), rms = sqrt(mean(x32^2) + eps), x32 = x in float32 (as
    ``transformers`` computes it), keeping x as it comes and r = 1 / rms [*, 1] for the backward.

    Backward, with n = x32 r and dO the output's gradient (autograd's own steps, in its order):
        dw = sum over tokens of dO n        dn = dO w        dr = sum_H dn x32
        dx32 = dn r + (-1/2 dr r^3) / H * 2 x32
    """

    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        x32 = x.to(torch.float32)  # [*, H]
        with transient_blocks():  # (the squares)
            rstd = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)  # [*, 1]
        ctx.save_for_backward(x, weight, rstd)
        if not recompute.active():
            return _normed(x, weight, rstd)
        with transient_blocks():  # (freed once the linears after the norm have read it)
            out = _normed(x, weight, rstd)
        # the linears after the norm keep its recipe, not out (x, r are kept anyway)
        kept = weight.detach().clone()  # as read now (ZeRO-3 releases the module's own after the forward)
        recompute.offer(out, lambda: _normed(x, kept, rstd), x, rstd)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad_out: torch.Tensor) -> tuple:
        x, weight, rstd = ctx.saved_tensors
        x32 = x.to(torch.float32)  # [*, H]
        normed = (x32 * rstd).to(x.dtype)  # [*, H]
        d_weight = None
        if ctx.needs_input_grad[1]:
            d_weight = (grad_out * normed).sum_to_size(weight.shape).to(weight.dtype)  # [H]
        d_normed = (grad_out * weight).to(x.dtype).to(torch.float32)  # [*, H] (back through n's cast)
        del normed
        d_rstd = (d_normed * x32).sum(-1, keepdim=True)  # [*, 1]
        d_variance = -0.5 * d_rstd * rstd.pow(3)  # [*, 1]
        d_squares = d_variance.expand_as(x32) / x32.shape[-1]  # [*, H]
        d_x = d_normed * rstd + d_squares * (2.0 * x32)  # [*, H]
        return d_x.to(x.dtype), d_weight, None

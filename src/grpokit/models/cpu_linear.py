"""Float32 matrix products through oneDNN on x86 CPUs, for the training passes.

torch computes a float32 ``F.linear`` / ``mm`` on a CPU with MKL's sgemm, and the bf16 ones with oneDNN. On
AMD's Zen 5 MKL's float32 kernels run at less than half of what oneDNN's do on the same operands: on a
2-core Zen 5 EPYC (AVX-512), SmolLM2-135M's training products with 1,024 rows ran at 198-221 GFLOP/s with
MKL and 389-502 with oneDNN (forward 473-479, input gradient 470-502, weight gradient 389-432), the LM head's
[170 x 576] x [576 x 49,152] at 158 and 411 (``python benchmarks/cpu_products.py``;
``benchmarks/results/cpu-products-zen5-2026-12-06.txt``). On a 2-core Zen 4 EPYC the gain is smaller: the
projections' forward and input gradients 1.13-1.30x MKL's rate, the head's 1.76x and 1.10x, the weight
gradients 0.85-1.15x (``benchmarks/results/cpu-products-zen4-2026-12-07.txt``). oneDNN's product is an
ordinary float32 product (accumulated in float32, in its own order): it differs from MKL's by rounding only,
as two BLAS libraries do.

``linear`` and ``matmul`` compute through ``torch.ops.mkldnn._linear_pointwise`` (the kernel ``torch.compile``
uses for CPU linears) where ``onednn_float32`` holds, else through torch's own operators. Where a gradient
is being taken they record ``Linear``, whose backward computes both gradient products through oneDNN too.
``use_onednn_linears`` gives a model's plain ``nn.Linear`` layers a forward on ``linear`` (with
``lean_activations``, ``grpokit.models.lean_layers.use_lean_layers`` does, whose gated MLP computes its
products with them too); ``grpokit.train.lm_head`` computes its float32 head products with them.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch.autograd.function import FunctionCtx, once_differentiable

from grpokit.models import recompute

__all__ = [
    "Linear",
    "cpu_family",
    "cpuinfo",
    "linear",
    "matmul",
    "onednn_available",
    "onednn_float32",
    "onednn_ops",
    "plain_linear",
    "use_onednn_linears",
]


_PLAIN = (torch.Tensor, torch.nn.Parameter)


@functools.cache
def cpuinfo() -> dict[str, str]:
    """The first processor's fields of ``/proc/cpuinfo`` (``flags``, ``vendor_id``, ``cpu family``, ...);
    empty where there is no such file (macOS, Windows). Which library's products run faster depends on the
    processor (``grpokit.rollout.native_decode.packed_fp32_min_rows``); ``grpokit.parallel.hardware`` reads
    its flags here too."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor's block ends
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def cpu_family() -> tuple[str, int] | None:
    """The x86 CPU's vendor and family (``cpuinfo``): ``("AuthenticAMD", 25)`` for Zen 3 and Zen 4,
    ``("AuthenticAMD", 26)`` for Zen 5, ``("GenuineIntel", 6)`` for most of Intel's; None where it says
    neither (Arm, macOS, Windows)."""
    fields = cpuinfo()
    vendor, family = fields.get("vendor_id"), fields.get("cpu family", "")
    return (vendor, int(family)) if vendor and family.isdigit() else None


def onednn_ops(*names: str) -> bool:
    """torch has oneDNN and its operators ``torch.ops.mkldnn.<name>`` (the packed decode asks here too)."""
    return torch.backends.mkldnn.is_available() and all(hasattr(torch.ops.mkldnn, op) for op in names)


@functools.cache
def onednn_available() -> bool:
    """torch has oneDNN's linear operator and runs on an x86 CPU with AVX-512 (where it was measured: AMD's
    Zen 4 and Zen 5; AVX2 processors and Intel's, where MKL's kernels may be as fast, were not)."""
    return onednn_ops("_linear_pointwise") and torch.backends.cpu.get_cpu_capability().startswith("AVX512")


def onednn_float32(*tensors: torch.Tensor | None) -> bool:
    """Whether a product of ``tensors`` (None ones ignored) runs through oneDNN: all plain float32 tensors on
    the CPU (not a tensor subclass such as a DTensor or a compiler's fake tensor; ``onednn_available``), and
    autocast off there (autocast computes its own dtype's products)."""
    present = [t for t in tensors if t is not None]
    if not all(type(t) in _PLAIN and t.dtype == torch.float32 and t.device.type == "cpu" for t in present):
        return False
    return onednn_available() and not torch.is_autocast_enabled("cpu")


def use_onednn_linears(model: torch.nn.Module) -> int:
    """Give each plain ``nn.Linear`` of ``model`` a forward on ``linear`` (their instance ``forward``, which
    copies and pickles with the module); returns how many have it. Idempotent. Layers driven by accelerate's
    hooks (an offloaded ``device_map``) are left as they are; a layer with hooks of its own when called
    (DeepSpeed ZeRO-3's gather its weight and replace the product) runs ``F.linear``."""
    count = 0
    for module in model.modules():
        if type(module) is not torch.nn.Linear or hasattr(module, "_hf_hook"):
            continue
        if not isinstance(module.__dict__.get("forward"), _LinearForward):
            module.forward = _LinearForward(module)
        count += 1
    return count


def plain_linear(module: torch.nn.Module) -> bool:
    """An ``nn.Linear`` itself (not LoRA's or a quantized layer) without hooks of its own."""
    hooks = module._forward_hooks or module._forward_pre_hooks
    hooks = hooks or module._backward_hooks or module._backward_pre_hooks
    return type(module) is torch.nn.Linear and not hooks


class _LinearForward:
    """A linear layer's forward on ``linear`` (its instance ``forward``); copied (``copy.deepcopy``) and
    pickled with its module, it stays bound to the copy."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        module = self.module
        if not plain_linear(module):
            return F.linear(x, module.weight, module.bias)
        return linear(recompute.autocast_input(x), module.weight, module.bias)

    def __reduce__(self) -> tuple:
        return _LinearForward, (self.module,)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``: x [*, in], weight [out, in] -> [*, out], through oneDNN where
    ``onednn_float32`` holds (strided operands as they are: a transposed view costs no copy), by ``Linear``
    where a gradient is being taken; else ``F.linear`` itself."""
    if not onednn_float32(x, weight, bias):
        return F.linear(x, weight, bias)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, weight, bias)):
        return Linear.apply(x, weight, bias)
    return _onednn_linear(x, weight, bias)


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b``: a [n, k], b [k, m] -> [n, m], through oneDNN where ``onednn_float32`` holds."""
    return linear(a, b.t())


def _onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


class Linear(torch.autograd.Function):
    """y = x W^T + b, its three products oneDNN's (where ``onednn_float32`` holds: ``linear`` applies it).
    Keeps x and W for the backward, as ``F.linear`` does.

    Backward, with dY the output's gradient [N, out] and x [N, in]:
        dx = dY W      dW = dY^T x      db = sum over rows of dY
    """

    @staticmethod
    def forward(
        ctx: FunctionCtx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
    ) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _onednn_linear(x, weight, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx: FunctionCtx, grad_out: torch.Tensor) -> tuple:
        with torch.autocast("cpu", enabled=False):  # (float32 products wherever the backward is called)
            return Linear._gradients(ctx, grad_out)

    @staticmethod
    def _gradients(ctx: FunctionCtx, grad_out: torch.Tensor) -> tuple:
        x, weight = ctx.saved_tensors
        d_out = grad_out.reshape(-1, weight.shape[0])  # [N, out]
        d_x = matmul(d_out, weight).reshape(x.shape) if ctx.needs_input_grad[0] else None  # [*, in]
        d_weight = matmul(d_out.t(), x.reshape(-1, weight.shape[1])) if ctx.needs_input_grad[1] else None
        d_bias = d_out.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None  # [out]
        return d_x, d_weight, d_bias

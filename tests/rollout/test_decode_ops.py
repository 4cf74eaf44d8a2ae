"""The native decode step's own forms of ``transformers``' operators, against ``transformers``' modules and
functions bit for bit: its RMSNorm (``_rms_norm``) and its rotary positions over q and k heads together
(``_rope``, with the tables ``NativeDecoder`` builds)."""

from __future__ import annotations

import importlib
import inspect

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from grpokit.rollout import native_decode

MODULES = {
    "Llama": "llama",
    "Qwen2": "qwen2",
    "Qwen3": "qwen3",
    "Mistral": "mistral",
    "Qwen2Moe": "qwen2_moe",
    "Qwen3Moe": "qwen3_moe",
    "Mixtral": "mixtral",
}


def _norm_class(name: str) -> type:
    module = importlib.import_module(f"transformers.models.{MODULES[name]}.modeling_{MODULES[name]}")
    return getattr(module, f"{name}RMSNorm")


def test_the_listed_norms_are_the_decoders_and_compute_as_llamas():
    """Every class ``_rms_norm`` computes itself is one of the native decoders' norms, and its forward is
    ``LlamaRMSNorm``'s (a change in ``transformers`` would show here)."""
    assert {f"{name}RMSNorm" for name in MODULES} == native_decode.RMS_NORMS
    llama = inspect.getsource(_norm_class("Llama").forward)
    for name in MODULES:
        assert inspect.getsource(_norm_class(name).forward) == llama, name


@pytest.mark.parametrize("name", sorted(MODULES))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_equals_the_module_bit_for_bit(name, dtype):
    gen = torch.Generator().manual_seed(0)
    for width in (8, 64, 576):
        norm = _norm_class(name)(width, eps=1e-5).to(dtype)
        with torch.no_grad():
            norm.weight.copy_(torch.randn(width, generator=gen))
        for shape in ((3, 1, width), (5, 4, width)):  # the decode's [N, 1, H] and its [N, heads, d]
            x = (torch.randn(*shape, generator=gen) * 3).to(dtype)
            with torch.inference_mode():
                assert torch.equal(native_decode._rms_norm(norm, x), norm(x)), (width, shape)


def test_other_norms_run_as_themselves():
    norm = torch.nn.LayerNorm(16)
    x = torch.randn(2, 1, 16)
    assert torch.equal(native_decode._rms_norm(norm, x), norm(x))


def test_rope_over_q_and_k_together_equals_transformers():
    """``_rope`` on [N, h+kv, d] with per-head tables of scale 1 equals ``apply_rotary_pos_emb`` on q and k
    apart, bit for bit; with the q heads' tables scaled by a power of two, q comes out scaled exactly."""
    gen = torch.Generator().manual_seed(0)
    rows, heads, kv, d = 3, 6, 2, 16
    q, k = torch.randn(rows, heads, 1, d, generator=gen), torch.randn(rows, kv, 1, d, generator=gen)
    angles = torch.rand(rows, 1, d // 2, generator=gen) * 10
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()  # [N, 1, d]
    expected_q, expected_k = apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)  # [N, heads, 1, d]
    sign = torch.cat([-torch.ones(d // 2), torch.ones(d // 2)])
    for scaling in (1.0, 0.25):
        scale = torch.tensor([scaling] * heads + [1.0] * kv)[:, None]  # [h+kv, 1]
        qk = torch.cat([q[:, :, 0], k[:, :, 0]], dim=1)  # [N, h+kv, d]
        out = native_decode._rope(qk, cos * scale, sin * (scale * sign))
        assert torch.equal(out[:, :heads], expected_q[:, :, 0] * scaling)
        assert torch.equal(out[:, heads:], expected_k[:, :, 0])

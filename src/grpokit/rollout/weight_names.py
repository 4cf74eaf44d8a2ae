"""The policy's weights under the names an inference engine loads: plain Hugging Face checkpoint names.

An engine (vLLM's ``model.load_weights``, or a vLLM server through its weight-transfer endpoints) takes the
weights of a ``transformers`` checkpoint, e.g. ``model.layers.0.self_attn.q_proj.weight``, and maps them onto
its own fused layout itself. The trainer's policy holds them under other names and in other forms:

- PEFT: ``base_model.model.`` in front, the frozen linear under ``.base_layer``, and the adapters
  ``lora_A`` / ``lora_B`` beside it. The engine has no adapters: it gets the merged weight
  ``W + scaling * B @ A`` under the base name (``grpokit.models.parts.linear_weight``, computed into a new
  tensor; the policy's base weights are never merged in place). ``modules_to_save`` copies replace their
  original module.
- Wrappers: ``module.`` (DDP, DeepSpeed), ``_fsdp_wrapped_module.`` (FSDP1), ``_checkpoint_wrapped_module.``
  (activation checkpointing), ``_orig_mod.`` (``torch.compile``) are removed.
- FSDP2: sharded parameters are ``DTensor``s; each is gathered into its full tensor (``full_tensor()``, a
  collective: every process must iterate, in the same order). Inside ``parallel.fsdp.gathered`` (where the
  trainer generates) the parameters are already full and nothing is gathered.
- Tied weights (``lm_head`` tied to ``embed_tokens``): yielded once, under the first name, as
  ``named_parameters`` does; vLLM's loaders tie the head themselves.

Buffers (rotary frequencies) are not weights: engines compute their own. Pure torch: tested on CPU with a real
tiny Llama and a real PEFT LoRA model (tests/rollout/test_vllm_cpu.py).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable, Iterator

import torch
from torch import nn

from grpokit.models.parts import hf_model, linear_weight

__all__ = ["autocast_off", "checkpoint_layout", "full_tensors", "policy_weights", "vllm_name"]

ADAPTER_PARTS = frozenset(
    {"lora_A", "lora_B", "lora_embedding_A", "lora_embedding_B", "lora_magnitude_vector", "lora_dropout"}
)
"""Name components of PEFT adapter parameters: they have no counterpart in a plain checkpoint."""
WRAPPER_PARTS = frozenset({"_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod", "base_layer"})
"""Name components that wrappers insert anywhere in a path (PEFT's ``base_layer`` included)."""


@contextlib.contextmanager
def autocast_off() -> Iterator[None]:
    """No autocast inside (the trainer generates under ``accelerator.autocast()``): merged weights are
    computed in the weights' dtype, and an engine running in this process runs in its own."""
    with contextlib.ExitStack() as stack:
        for device in ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",):
            stack.enter_context(torch.autocast(device_type=device, enabled=False))
        yield


def vllm_name(name: str) -> str | None:
    """The plain checkpoint name of a policy parameter ``name``, or None for a parameter the engine does not
    have (a LoRA adapter, the original copy of a ``modules_to_save`` module).

    ``module.base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight`` ->
    ``model.layers.0.self_attn.q_proj.weight``; ``..._fsdp_wrapped_module.mlp...`` -> ``...mlp...``;
    ``lm_head.modules_to_save.default.weight`` -> ``lm_head.weight``.
    """
    parts = name.split(".")
    while parts and parts[0] == "module":  # DDP / DeepSpeed engine
        parts = parts[1:]
    if parts[:2] == ["base_model", "model"]:  # PeftModel -> LoraModel -> the transformers model
        parts = parts[2:]
    if ADAPTER_PARTS.intersection(parts) or "original_module" in parts:
        return None
    kept: list[str] = []
    skip_next = False
    for part in parts:
        if skip_next:  # the adapter name after modules_to_save
            skip_next = False
        elif part == "modules_to_save":
            skip_next = True
        elif part not in WRAPPER_PARTS:
            kept.append(part)
    return ".".join(kept)


def full_tensors(named: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` with each ``DTensor`` (an FSDP2 shard) gathered into its full plain tensor,
    detached. Gathering is a collective: under FSDP every process must consume the iterator, in order."""
    for name, tensor in named:
        full = getattr(tensor, "full_tensor", None)
        yield name, (full() if callable(full) else tensor).detach()


def policy_weights(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Every weight of ``model`` (a ``transformers`` model, a PEFT model, or either inside a DDP/FSDP wrapper)
    as ``(plain checkpoint name, full tensor)``, LoRA adapters merged, each shared parameter once.

    Raises ValueError for adapters one merged weight cannot express (DoRA and other LoRA variants, adapter
    biases, LoRA on a non-linear layer), and for two parameters that would load under the same name."""
    with torch.no_grad():
        yield from checkpoint_layout(_transformers_model(model), _plain_weights(model))


def _plain_weights(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """``policy_weights`` in the model's own layout: its parameters' names without the wrappers'."""
    seen_names: set[str] = set()
    for raw_name, tensor in full_tensors(_walk(model, "", set())):
        name = vllm_name(raw_name)
        if name is None:
            continue
        if name in seen_names:
            raise ValueError(f"two policy parameters map to the engine weight {name!r} (from {raw_name!r})")
        seen_names.add(name)
        yield name, tensor


def checkpoint_layout(
    model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]]
) -> Iterator[tuple[str, torch.Tensor]]:
    """``weights`` (plain names of ``model``'s parameters) in the layout of the model's checkpoints.
    transformers 5 loads some checkpoints into another layout: a mixture of experts' per-expert linear layers
    (``mlp.experts.3.gate_proj.weight``) stacked into [E, ...] parameters (``mlp.experts.gate_up_proj``),
    Mixtral's ``block_sparse_moe`` renamed ``mlp``. An engine loads the checkpoint's layout, so each decoder
    layer's weights are turned back as ``save_pretrained`` turns them (``revert_weight_conversion``), one
    layer at a time; a model without a conversion keeps its weights as they are."""
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # transformers 4: no conversions
        yield from weights
        return
    group: dict[str, torch.Tensor] = {}
    layer: str | None = None
    for name, tensor in weights:
        match = _LAYER.match(name)
        here = match.group(0) if match else None
        if group and here != layer:
            yield from revert_weight_conversion(model, group).items()
            group = {}
        layer = here
        group[name] = tensor
    if group:
        yield from revert_weight_conversion(model, group).items()


_LAYER = re.compile(r"^(.*\.)?layers\.\d+\.")
"""The prefix of a decoder layer's weight names (``model.layers.3.``)."""


def _transformers_model(model: nn.Module) -> nn.Module:
    """The ``transformers`` model inside DDP / DeepSpeed (``module``), ``torch.compile`` (``_orig_mod``) and
    PEFT wrappers (FSDP2 shards it in place)."""
    while True:
        wrapped = [getattr(model, name, None) for name in ("module", "_orig_mod")]
        inner = next((m for m in wrapped if isinstance(m, nn.Module)), None)
        if inner is None:
            return hf_model(model)
        model = inner


def _walk(module: nn.Module, path: str, seen: set[int]) -> Iterator[tuple[str, torch.Tensor]]:
    """``(raw name, tensor)`` of the weights under ``module``: LoRA layers as their merged weight and base
    bias, ``modules_to_save`` wrappers as their active copy, every other parameter as is (once per tensor)."""
    if _is_parameter_lora(module):
        yield from _merged_parameters(module, path, seen)
        return
    if _is_lora_layer(module):
        yield from _merged_lora(module, path)
        return
    active = _active_saved_module(module)
    if active is not None:
        yield from _walk(active, path, seen)
        return
    for name, param in module.named_parameters(recurse=False):
        if id(param) not in seen:
            seen.add(id(param))
            yield f"{path}{name}", param
    for name, child in module.named_children():
        yield from _walk(child, f"{path}{name}.", seen)


def _is_parameter_lora(module: nn.Module) -> bool:
    """peft's ``ParamWrapper``: LoRA on one parameter of the layer it wraps (``parameter_name``; peft's
    ``target_parameters``, or what peft >= 0.21 maps an MoE model's old linear names onto: the experts'
    stacked weights, the router's). Wrappers nest, one per adapted parameter of the same layer."""
    return _is_lora_layer(module) and isinstance(getattr(module, "parameter_name", None), str)


def _merged_parameters(module: nn.Module, path: str, seen: set[int]) -> Iterator[tuple[str, torch.Tensor]]:
    """The parameters of the layer under a chain of ``ParamWrapper``s, each adapted one as W + its active
    adapters' deltas (``get_delta_weight``, in W's dtype and layout), computed into a new tensor."""
    deltas: dict[str, list[torch.Tensor]] = {}
    layer = module
    with autocast_off():
        while _is_parameter_lora(layer):
            if not (layer.disable_adapters or layer.merged):
                active = [name for name in layer.active_adapters if name in layer.lora_A]
                deltas.setdefault(layer.parameter_name, []).extend(layer.get_delta_weight(a) for a in active)
            layer = layer.base_layer
    if _is_lora_layer(layer):  # (a linear LoRA layer inside: not a combination peft makes)
        raise ValueError(f"the LoRA layer {path.rstrip('.')!r} adapts both a parameter and the layer")
    for name, param in layer.named_parameters(recurse=False):
        seen.add(id(param))
        yield f"{path}{name}", sum(deltas.get(name, []), param)
    for name, child in layer.named_children():
        yield from _walk(child, f"{path}{name}.", seen)


def _is_lora_layer(module: nn.Module) -> bool:
    """A PEFT LoRA layer: a base layer with ``lora_A`` / ``lora_B`` adapters beside it."""
    return hasattr(module, "lora_A") and callable(getattr(module, "get_base_layer", None))


def _merged_lora(module: nn.Module, path: str) -> Iterator[tuple[str, torch.Tensor]]:
    """A LoRA layer's weight with its active adapters merged (``linear_weight``), and its base bias."""
    with autocast_off():
        weight = linear_weight(module)
    if weight is None:
        raise ValueError(
            f"the LoRA layer {path.rstrip('.')!r} cannot be pushed to vLLM as one merged weight (DoRA and "
            "other LoRA variants, adapter biases, and LoRA on non-linear layers are not supported); use "
            "plain LoRA on linear layers, or use_vllm=False"
        )
    yield f"{path}weight", weight
    bias = getattr(module.get_base_layer(), "bias", None)
    if bias is not None:
        yield f"{path}bias", bias


def _active_saved_module(module: nn.Module) -> nn.Module | None:
    """For a PEFT ``modules_to_save`` wrapper: the copy it runs (the active adapter's, or the original when
    adapters are disabled); None for any other module."""
    copies = getattr(module, "modules_to_save", None)
    original = getattr(module, "original_module", None)
    if not isinstance(copies, nn.ModuleDict) or original is None:
        return None
    adapter = getattr(module, "active_adapter", None)
    if isinstance(adapter, (list, tuple)):
        adapter = adapter[0] if adapter else None
    if getattr(module, "disable_adapters", False) or adapter not in copies:
        return original
    return copies[adapter]

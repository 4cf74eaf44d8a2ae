"""Fully sharded data parallel (PyTorch FSDP2, ``fully_shard``): the policy's (and the reference's) weights,
gradients and optimizer state split over the processes.

How grpokit shards (``shard``): one FSDP unit per decoder layer, and the root unit is the ``PolicyLogprobs``
module whose ``forward`` is the lean log-prob pass, so that pass (which reaches into the backbone and the LM
head rather than calling ``model(...)``) runs with the root's weights (embeddings, final norm, LM head)
gathered, and their gradients are reduce-scattered after the backward like any unit's.

Generation (``gathered``) reads full weights: every unit is gathered for the whole generation call and kept
so (no per-layer re-gather per token), then resharded. The cost is one full copy of the weights on each
device for the duration of generation, the same as a non-sharded run holds all the time; the fast sampler
and ``model.generate`` both run on those gathered weights unchanged.

grpokit applies FSDP itself (on CUDA and on CPU processes over gloo alike), so the ``Accelerator`` is
built without accelerate's FSDP plugin (see ``parallel.distributed.make_accelerator``); ``accelerate launch``
with an FSDP config (``recipes/accelerate/fsdp.yaml``) selects this path through ``ACCELERATE_USE_FSDP``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from grpokit.models.parts import decoder_of

logger = logging.getLogger(__name__)

__all__ = [
    "fsdp_requested",
    "full_optimizer_state",
    "full_state_dict",
    "gathered",
    "load_full_optimizer_state",
    "load_full_state_dict",
    "load_sharded_weights",
    "shard",
    "unwrap_tensor",
]


def fsdp_requested(args: Any, num_processes: int) -> bool:
    """``GRPOConfig.fsdp`` holds "full_shard", or ``accelerate launch`` was given an FSDP config, and there
    are several processes to shard over (with one, a warning says that nothing is sharded)."""
    from_config = "full_shard" in args.fsdp.split()
    requested = from_config or os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
    if requested and num_processes == 1:
        logger.warning("fsdp: a single process has nothing to shard over; training unsharded")
    return requested and num_processes > 1


def _fsdp_modules(root: nn.Module) -> list[nn.Module]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in root.modules() if isinstance(m, FSDPModule)]


def shard(root: nn.Module, model: nn.Module, compute_dtype: torch.dtype | None = None) -> nn.Module:
    """Shard ``root`` (a ``PolicyLogprobs`` holding ``model``) in place: each decoder layer of ``model`` is
    a unit, ``root`` holds the rest. ``compute_dtype`` (bf16/fp16 mixed precision): the shards stay in the
    weights' dtype (float32 master weights for AdamW), a unit is gathered in ``compute_dtype`` for its
    forward (and for generation: half the bytes of gathering float32), gradients are reduced in float32.
    Runs one tiny no-grad forward through ``root`` so FSDP knows its root before generation calls the
    layers directly. Returns ``root``."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    for layer in decoder_of(model).layers:
        fully_shard(layer, mp_policy=policy)
    fully_shard(root, mp_policy=policy)
    device = next(root.parameters()).device
    one = torch.ones(1, 1, dtype=torch.long, device=device)
    with torch.no_grad():
        root(one, one, one, one)  # FSDP's lazy initialisation happens on the root's first forward
    # The root keeps its weights gathered after a forward; reshard so that the module's parameters are the
    # shards again (an optimizer built now must hold the shards, not the gathered copies).
    root.reshard()
    return root


@contextmanager
def gathered(root: nn.Module | None) -> Iterator[None]:
    """Full weights in every unit of a sharded ``root`` for the duration (generation); nothing without
    FSDP (``root`` None or not sharded)."""
    units = _fsdp_modules(root) if root is not None else []
    if not units:
        yield
        return
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
        unit.unshard()
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()
            unit.set_reshard_after_forward(unit is not root, recurse=False)  # FSDP's defaults


def unwrap_tensor(value: Any) -> Any:
    """A ``DTensor`` (e.g. the gradient norm of sharded parameters) as its full plain tensor."""
    full = getattr(value, "full_tensor", None)
    return full() if callable(full) else value


def full_state_dict(root: nn.Module, prefix: str = "model.") -> dict[str, torch.Tensor]:
    """The full (unsharded) weights of a sharded ``root``, on the CPU, keys without ``prefix`` (the
    ``PolicyLogprobs`` attribute). A collective: every process calls it; only the main one gets the tensors
    (the others get an empty dict)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = get_model_state_dict(root, options=options)
    # a tied weight (the LM head = the embeddings) under its first name only, as save_pretrained writes it
    tied = _tied_names(root)
    return {k.removeprefix(prefix): v for k, v in state.items() if k not in tied}


def _tied_names(root: nn.Module) -> dict[str, str]:
    """Each second name of a parameter that appears under several (a tied LM head) -> its first name."""
    first: dict[int, str] = {}
    tied = {}
    for name, param in root.named_parameters(remove_duplicate=False):
        if id(param) in first:
            tied[name] = first[id(param)]
        else:
            first[id(param)] = name
    return tied


def load_full_state_dict(
    root: nn.Module,
    state: dict[str, torch.Tensor],
    prefix: str = "model.",
    *,
    strict: bool = True,
    from_main: bool = False,
) -> None:
    """Load full weights into a sharded ``root``: each process keeps its shard. ``from_main``: only the
    main process holds ``state`` (read from disk there) and sends it, tensor by tensor, to the others, which
    pass an empty dict; otherwise every process passes the same full state. ``strict=False`` for a partial
    state (a PEFT model's adapters). A collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    options = StateDictOptions(full_state_dict=True, strict=strict, broadcast_from_rank0=from_main)
    state = {prefix + k: v for k, v in state.items()}
    for name, first in _tied_names(root).items():  # a tied weight saved under its first name only
        if first in state and name not in state:
            state[name] = state[first]
    set_model_state_dict(root, state, options=options)


def load_sharded_weights(root: nn.Module, model: nn.Module, path: Any, *, is_main: bool) -> None:
    """Resume: the full weights a checkpoint holds, read by the main process only and sent to the others'
    shards (a PEFT model's adapters are restored from the checkpoint's extra state instead:
    ``parallel.run_state``). A collective."""
    from grpokit.parallel.checkpoint import read_model_weights

    load_full_state_dict(root, read_model_weights(path) if is_main else {}, from_main=True)


def full_optimizer_state(root: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer state of a sharded ``root`` as one full state (a collective; CPU tensors)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_optimizer_state_dict(root, _bare(optimizer), options=options)


def load_full_optimizer_state(
    root: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    """Load a full optimizer state into the optimizer of a sharded ``root``: the main process holds it
    (read from disk there) and sends it, tensor by tensor, to the others, which pass an empty dict. A
    collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_optimizer_state_dict(root, _bare(optimizer), optim_state_dict=state, options=options)


def _bare(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer inside accelerate's wrapper."""
    return getattr(optimizer, "optimizer", optimizer)

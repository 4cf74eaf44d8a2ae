"""Activations computed again in the backward instead of kept: within ``recomputed_in_backward()``, a tensor
that autograd saves for the backward and that is (a view of) a tensor *offered* here is kept as the recipe
that made it, and made again when the backward needs it.

Offered are outputs whose recipe is cheap and whose inputs are kept for the backward anyway, so that a
consumer's copy costs nothing to drop: a lean RMSNorm's output (from its input and 1 / rms; the q, k, v
projections and the MLP save it) and the packed attention's joined output (from the per-run
outputs that ``scaled_dot_product_attention`` keeps; the output projection saves it). The recipe runs the
same element-wise operations on the same inputs, so the tensor is the same bit for bit.

Under autocast the linears after a norm read its output cast to autocast's dtype, and autocast casts it
again for each of them (q, k and v: three copies, each kept by its product). ``autocast_input`` makes that
cast once per offered tensor and offers it too (its recipe: the tensor's recipe, cast), so the linears keep
one recipe instead of three copies; each linear still gets its own cast node, whose backward casts the
gradient back as autocast's does, so the gradients are the same bit for bit.

The update enters the block around the policy's forward. Another ``saved_tensors_hooks`` entered inside it
(gradient checkpointing's, ``save_on_cpu``) takes over for what is saved within its own block, as torch
nests them.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import torch

__all__ = ["active", "autocast_input", "cast_of", "offer", "recomputed_in_backward"]


class _Recipe:
    """How to make an offered tensor again, the tensors it reads (held by the recipe; in-place changes to them
    after the forward are refused), and how many saved views still need it: the first use makes the tensor,
    the last one drops it."""

    def __init__(self, make: Callable[[], torch.Tensor], inputs: tuple[torch.Tensor, ...]) -> None:
        self.make, self.inputs = make, inputs
        self.versions = tuple(t._version for t in inputs)
        self.uses = 0
        self.made: torch.Tensor | None = None
        self.shape: torch.Size | None = None  # the offered tensor's (contiguous, its whole storage)

    def tensor(self) -> torch.Tensor:
        if tuple(t._version for t in self.inputs) != self.versions:
            raise RuntimeError(
                "a tensor kept to recompute an activation for the backward was modified in place after the "
                "forward (grpokit's lean_activations: turn it off, or do not modify it in place)"
            )
        made = self.made
        if made is None:
            with torch.autocast(self.inputs[0].device.type, enabled=False), torch.no_grad():
                made = self.make()
            if made.shape != self.shape or not made.is_contiguous():  # (a recipe's own error)
                shapes = f"{tuple(made.shape)}, not {tuple(self.shape)}"
                raise RuntimeError(f"an activation made again as {shapes}")
        self.uses -= 1
        self.made = made if self.uses > 0 else None
        return made


class _Saved(NamedTuple):
    """A saved tensor kept as the recipe of the offered tensor it views, with its place in it."""

    recipe: _Recipe
    shape: torch.Size
    stride: tuple[int, ...]
    offset: int


class _Offered:
    """The tensors offered inside one block, by their storage's address, each held weakly with its recipe."""

    def __init__(self, observe: Callable[[torch.Tensor, Any], None] | None = None) -> None:
        self.entries: dict[int, tuple[weakref.ref, _Recipe]] = {}
        self.casts: dict[int, dict[torch.dtype, torch.Tensor]] = {}  # offered tensors' casts, while they live
        self.observe = observe

    def add(self, tensor: torch.Tensor, recipe: _Recipe) -> None:
        storage = tensor.untyped_storage()
        if not tensor.is_contiguous() or storage.nbytes() != tensor.numel() * tensor.element_size():
            return  # (a saved view's place is then not the same in the tensor made again)
        recipe.shape = tensor.shape
        tensor = tensor if tensor._base is None else tensor._base  # (which every view keeps alive)
        address = storage.data_ptr()

        def forget(ref: weakref.ref) -> None:  # (not a later tensor made at the same address)
            if self.entries.get(address, (None,))[0] is ref:
                del self.entries[address]
                self.casts.pop(address, None)

        self.entries[address] = (weakref.ref(tensor, forget), recipe)

    def find(self, tensor: torch.Tensor) -> tuple[torch.Tensor | None, _Recipe | None]:
        """The offered tensor whose storage ``tensor`` views in its dtype, and its recipe (or two Nones)."""
        ref, recipe = self.entries.get(tensor.untyped_storage().data_ptr(), (None, None))
        offered = None if ref is None else ref()
        if offered is None or tensor.dtype != offered.dtype:
            return None, None
        return offered, recipe

    def cast(self, tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
        """``tensor.to(dtype)`` made once and offered, for an offered tensor (not a view of part of it)."""
        offered, recipe = self.find(tensor)
        if offered is None or tensor.data_ptr() != offered.data_ptr() or tensor.shape != recipe.shape:
            return None  # (not offered, or a view of part of it)
        if tensor.dtype == dtype:
            return None
        casts = self.casts.setdefault(tensor.untyped_storage().data_ptr(), {})
        if dtype not in casts:
            with torch.no_grad():
                copy = tensor.detach().to(dtype)  # [*, H], contiguous as the offered tensor is
            make = recipe.make
            self.add(copy, _Recipe(lambda: make().to(dtype), recipe.inputs))
            casts[dtype] = copy  # (until the offered tensor is freed: its linears are called by then)
        return casts[dtype]

    def pack(self, tensor: torch.Tensor) -> Any:
        saved = self.saved(tensor)
        if self.observe is not None:
            self.observe(tensor, saved)
        return saved

    def saved(self, tensor: torch.Tensor) -> Any:
        offered, recipe = self.find(tensor)
        if offered is None:
            return tensor
        recipe.uses += 1  # (a view of the base: its place is the same in the base made again)
        return _Saved(recipe, tensor.shape, tensor.stride(), tensor.storage_offset())


def _unpack(saved: Any) -> torch.Tensor:
    if not isinstance(saved, _Saved):
        return saved
    return saved.recipe.tensor().as_strided(saved.shape, saved.stride, saved.offset)


_OFFERED: _Offered | None = None


def active() -> bool:
    """Whether a ``recomputed_in_backward`` block is open (offering is then worth its recipe)."""
    return _OFFERED is not None


def offer(tensor: torch.Tensor, make: Callable[[], torch.Tensor], *inputs: torch.Tensor) -> None:
    """Within an open block: where autograd saves ``tensor`` (or a view of it), keep ``make`` instead, which
    returns a contiguous tensor equal to it from ``inputs`` (tensors the backward keeps anyway). Nothing
    outside a block, nor for a tensor that is not contiguous over its whole storage."""
    if _OFFERED is not None:
        _OFFERED.add(tensor, _Recipe(make, inputs))


def cast_of(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """Within an open block, an offered tensor's cast to ``dtype``, made once and offered itself (a product
    that keeps it keeps its recipe); None for any other tensor, or outside a block. No gradient flows through
    it: for a differentiable input use ``autocast_input``."""
    return None if _OFFERED is None else _OFFERED.cast(tensor, dtype)


class _SharedCast(torch.autograd.Function):
    """``x.to(copy.dtype)`` for one consumer, over the cast ``copy`` made once for all of them: forward a view
    of ``copy``; backward the gradient cast back to x's dtype, as autocast's cast node does for each of its
    consumers (autograd then sums the consumers' gradients in x's dtype, as before)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, copy: torch.Tensor) -> torch.Tensor:
        ctx.dtype = x.dtype
        return copy.view_as(copy)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad.to(ctx.dtype), None


def autocast_input(x: torch.Tensor) -> torch.Tensor:
    """``x`` as an autocast-enabled linear reads it: within an open block with autocast on, an offered
    tensor's cast to autocast's dtype, made once for all the linears after it (``cast_of``), each getting its
    own gradient path back to ``x``; otherwise ``x`` itself (autocast then casts it as usual)."""
    device = x.device.type
    if _OFFERED is None or not torch.is_autocast_enabled(device):
        return x
    copy = _OFFERED.cast(x, torch.get_autocast_dtype(device))
    if copy is None:
        return x
    return _SharedCast.apply(x, copy) if torch.is_grad_enabled() and x.requires_grad else copy


@contextlib.contextmanager
def recomputed_in_backward(observe: Callable[[torch.Tensor, Any], None] | None = None) -> Iterator[None]:
    """The block in which offered tensors are saved as their recipes (module docstring). Enter it around a
    forward whose backward follows. ``observe(tensor, saved)``, where given, sees each tensor autograd saves
    in the block and what is kept for it: the tensor itself, or a record whose ``recipe`` holds ``inputs``
    (for counting what the block keeps: ``benchmarks/``, the memory plan's test)."""
    global _OFFERED
    outer, offered = _OFFERED, _Offered(observe)
    _OFFERED = offered
    try:
        with torch.autograd.graph.saved_tensors_hooks(offered.pack, _unpack):
            yield
    finally:
        _OFFERED = outer

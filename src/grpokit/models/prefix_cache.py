"""Key/value caches for a forward that runs a prompt once and its G completions on top, exact under
gradient checkpointing.

``transformers`` checkpointing (``GradientCheckpointingLayer``) drops a layer's cache when it checkpoints
it: a layer that *writes* a cache would write it a second time when the backward replays it. Scoring the
completions of a group on top of a cached prompt then silently scores them without the prompt. The two
caches here are safe to replay, so the layers may keep them (``replay_safe_layers``):

- ``RecordingCache`` (the prompt pass): ``update`` stores the layer's keys/values, replacing what was there
  (a replay stores equal, recomputed values into this cache only; nothing reads it after the prompt pass);
- ``PrefixCache`` (the completion pass): holds the prompt's keys/values (repeated to the G rows) and only
  *reads* them: ``update`` returns ``[prefix | new]`` and stores nothing, so a replay sees the same prefix.

Gradients reach the prompt through the stored keys/values, which non-reentrant checkpointing records like
any other output of the layer (reentrant checkpointing does not: it is refused by the trainer).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

__all__ = ["PrefixCache", "RecordingCache", "full_attention_only", "replay_safe_layers"]


class _RecordingLayer(DynamicLayer):
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        self.keys, self.values = key_states, value_states  # [b, kv, P, d]
        self.is_initialized = True
        return key_states, value_states


class _PrefixLayer(DynamicLayer):
    def __init__(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        super().__init__()
        self.keys, self.values = keys, values  # [B, kv, P, d]
        self.device = keys.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        keys = torch.cat([self.keys, key_states], dim=-2)  # [B, kv, P + c, d]
        values = torch.cat([self.values, value_states], dim=-2)
        return keys, values


class RecordingCache(Cache):
    """One ``_RecordingLayer`` per decoder layer: after a forward, ``layers[i].keys/values`` are that layer's
    keys/values of the whole input."""

    def __init__(self, num_layers: int) -> None:
        super().__init__(layers=[_RecordingLayer() for _ in range(num_layers)])

    def repeated(self, repeats: int) -> PrefixCache:
        """A read-only prefix of these keys/values, each row repeated ``repeats`` times
        (``repeat_interleave``: its backward sums the repeated rows' gradients into the one computation)."""
        return PrefixCache(
            [
                (layer.keys.repeat_interleave(repeats, dim=0), layer.values.repeat_interleave(repeats, dim=0))
                for layer in self.layers
            ]
        )


class PrefixCache(Cache):
    """Read-only prefix keys/values per layer: attention sees ``[prefix | new]``, nothing is stored."""

    def __init__(self, keys_values: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        super().__init__(layers=[_PrefixLayer(k, v) for k, v in keys_values])


def full_attention_only(config: object) -> bool:
    """True when every decoder layer's cache is plain full attention (no sliding window, no linear or
    indexed attention), the only layout these caches reproduce."""
    layers = DynamicCache(config=config).layers
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


@contextmanager
def replay_safe_layers(model: torch.nn.Module) -> Iterator[None]:
    """Let checkpointed decoder layers keep the cache they are given (these caches replay safely).

    The layer's checkpointed call captures the cache when the forward runs, so the backward's replay uses it
    even after this context has exited.
    """
    layers = [m for m in model.modules() if hasattr(m, "_can_checkpoint_with_cache")]
    saved = [m.__dict__.get("_can_checkpoint_with_cache") for m in layers]
    for m in layers:
        m._can_checkpoint_with_cache = True
    try:
        yield
    finally:
        for m, value in zip(layers, saved):
            if value is None:
                del m._can_checkpoint_with_cache
            else:
                m._can_checkpoint_with_cache = value

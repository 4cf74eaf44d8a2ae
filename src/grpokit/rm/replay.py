"""A replay buffer of labelled reward-model samples (iterative GRPO, DeepSeekMath section 4.2).

"The reward model is continuously trained on the policy's new samples with a replay mechanism that
incorporates 10% of historical data." ``mix(fresh, replay_ratio)`` returns the fresh samples plus ``r``
historical ones drawn uniformly without replacement from the buffer, with

    r = round_half_up(replay_ratio * F / (1 - replay_ratio))      F = len(fresh)

so that r / (F + r) equals ``replay_ratio`` as closely as whole samples allow (F = 90, ratio 0.1 -> r = 10,
exactly 10%; F = 100 -> r = round(11.11) = 11, 11/111 = 9.9%). ``r`` is capped at the buffer's size, so the
first updates, with little history, replay less. The buffer keeps a uniform sample of everything ever added
(reservoir sampling, Vitter's algorithm R) once ``capacity`` is reached: "historical data" means all of it,
not only the most recent.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable
from typing import Any

__all__ = ["ReplayBuffer", "replay_count"]


def replay_count(num_fresh: int, replay_ratio: float) -> int:
    """Historical samples to add to ``num_fresh`` fresh ones: round_half_up(ratio * F / (1 - ratio))."""
    if not 0.0 <= replay_ratio < 1.0:
        raise ValueError(f"replay_ratio must be in [0, 1), got {replay_ratio}")
    if num_fresh < 0:
        raise ValueError(f"num_fresh must be >= 0, got {num_fresh}")
    exact = replay_ratio * num_fresh / (1.0 - replay_ratio)
    return math.floor(
        exact + 0.5 + 1e-9
    )  # the epsilon absorbs float error (0.1 * 90 / 0.9 = 10.000000000000002)


class ReplayBuffer:
    """Historical labelled samples. ``capacity`` None keeps everything; otherwise reservoir sampling."""

    def __init__(self, capacity: int | None = None, seed: int = 0) -> None:
        if capacity is not None and capacity < 1:
            raise ValueError(f"capacity must be >= 1 or None, got {capacity}")
        self.capacity = capacity
        self._rng = random.Random(f"grpokit-replay-{seed}")
        self._samples: list[Any] = []
        self.num_seen = 0
        """Samples ever added (the reservoir's stream length)."""

    def __len__(self) -> int:
        return len(self._samples)

    @property
    def samples(self) -> list[Any]:
        """A copy of the stored samples."""
        return list(self._samples)

    def add(self, samples: Iterable[Any]) -> None:
        """Store samples; past ``capacity`` each new one replaces a random stored one with probability
        capacity / num_seen, so the buffer stays a uniform sample of the whole stream."""
        for sample in samples:
            self.num_seen += 1
            if self.capacity is None or len(self._samples) < self.capacity:
                self._samples.append(sample)
            else:
                slot = self._rng.randrange(self.num_seen)
                if slot < self.capacity:
                    self._samples[slot] = sample

    def sample(self, k: int) -> list[Any]:
        """``min(k, len(self))`` stored samples, uniformly without replacement."""
        return self._rng.sample(self._samples, min(max(k, 0), len(self._samples)))

    def mix(self, fresh: Iterable[Any], replay_ratio: float = 0.1) -> list[Any]:
        """``fresh`` followed by ``replay_count(len(fresh), replay_ratio)`` replayed samples (fewer when the
        buffer holds fewer). Does not add ``fresh`` to the buffer (``add`` does)."""
        fresh = list(fresh)
        return fresh + self.sample(replay_count(len(fresh), replay_ratio))

    def state_dict(self) -> dict[str, Any]:
        """The stored samples, the stream length and the RNG state: everything a resume needs."""
        return {"samples": list(self._samples), "num_seen": self.num_seen, "rng": self._rng.getstate()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._samples = list(state["samples"])
        self.num_seen = int(state["num_seen"])
        self._rng.setstate(state["rng"])

"""Asynchronous rollouts: the next steps' samples are generated while this step's update runs, from
weights at most ``max_staleness`` steps old (docs/generation.md, "Asynchronous rollouts").

With ``async_generation`` and ``max_staleness = m >= 1``, every time the trainer takes a step's samples, a
background thread starts drawing (generating and scoring) the samples of the step ``m`` steps later, from a
frozen copy of the policy taken right then, before this step's update. In steady state the samples a step
trains on therefore come from the policy of ``m`` updates earlier (their *staleness*, logged as
``async/staleness``, never above ``m``); the first ``m`` steps use fresher ones (step 1 is drawn in the
foreground from the current policy, staleness 0). Those samples are off-policy: the trainer computes pi_old
(the current policy) and weights every token by TRL's truncated importance-sampling correction
pi_old / pi_sampler (``sampling.off_policy``), exactly as for a vLLM sampler.

``max_staleness = 0`` is the synchronous loop itself (the same code path: identical weights). One process
only: the draw gathers rewards across processes, which must not run beside the update's collectives.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from grpokit.reporting.metrics import PhaseTimer
from grpokit.rollout import RolloutBackend, make_backend
from grpokit.sampling.off_policy import generation_copy, policy_dtype, refresh_copy

__all__ = ["AsyncDrawer", "check_async_generation", "draws_ahead"]


def check_async_generation(
    args: Any, num_processes: int, strategy: str, rollout_backend: Any, *, environment_factory: bool = False
) -> None:
    """What asynchronous rollouts do not support, refused with the reason (ValueError naming the field)."""
    if not args.async_generation or args.max_staleness == 0:
        return
    why = None
    if num_processes > 1:
        why = "it runs on one process only (the background draw would gather beside the update's collectives)"
    elif strategy in ("fsdp", "zero"):
        why = f"the weights are placed by {strategy}; the background sampler needs a full copy"
    elif rollout_backend is not None or args.use_vllm:
        why = "it samples from its own copies of the policy, not an outside sampler (rollout_backend, vLLM)"
    elif environment_factory:
        why = (
            "TRL's environment_factory hands its pooled instances to one batch at a time; a draw ahead "
            "would share them with the step's evaluation"
        )
    if why is not None:
        raise ValueError(f"GRPOConfig.async_generation is not supported here: {why}")


@dataclass
class _Pending:
    """A draw in flight."""

    future: Future
    copy: nn.Module  # the frozen policy it samples from
    version: int  # policy updates done when the copy was taken
    timer: PhaseTimer  # its phases (generate, reward), reported as async/time/...


def draws_ahead(args: Any) -> bool:
    """Whether the run draws its steps' samples ahead (``async_generation`` with ``max_staleness`` >= 1):
    then they come from older copies of the policy, so the sampler is not pi_old (``sampling.off_policy``)."""
    return bool(args.async_generation) and args.max_staleness > 0


class AsyncDrawer:
    """Draws steps' samples ahead, in a background thread, from frozen copies of the policy (module
    docstring). ``draw(timer)`` is ``draw(timer, backend)`` (a ``GroupDrawer``'s) with the staleness bound.

    ``model``: the policy generation reads (copied, and refreshed from it before each draw starts);
    ``dtype``: the copies' dtype; ``backend_name``, ``micro_batch_size`` and ``padding_free``: the copies'
    samplers (``rollout.make_backend``)."""

    def __init__(
        self,
        draw: Callable[[PhaseTimer, RolloutBackend | None], Any],
        model: nn.Module,
        *,
        max_staleness: int,
        dtype: torch.dtype,
        backend_name: str,
        micro_batch_size: int | None = None,
        padding_free: bool | None = None,
    ) -> None:
        self.draw_now, self.model, self.max_staleness = draw, model, max_staleness
        # one frozen copy per draw in flight: a copy must not change while its draw runs
        self.copies: collections.deque[nn.Module] = collections.deque(
            generation_copy(model, dtype) for _ in range(max_staleness)
        )
        self.backends = {
            id(c): make_backend(backend_name, c, micro_batch_size=micro_batch_size, padding_free=padding_free)
            for c in self.copies
        }
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="grpokit-rollouts")
        self.pending: collections.deque[_Pending] = collections.deque()
        self.version = -1  # policy updates done: one per step, so the draws taken before this one
        self.last_staleness = 0

    @classmethod
    def from_config(
        cls, args: Any, draw: Callable[[PhaseTimer, RolloutBackend | None], Any], model: nn.Module
    ) -> AsyncDrawer:
        """The drawer ``args`` asks for: ``max_staleness`` copies in ``generation_dtype`` ("auto": the
        policy's) on ``generation_backend``."""
        auto = args.generation_dtype == "auto"
        dtype = policy_dtype(model) if auto else getattr(torch, args.generation_dtype)
        return cls(
            draw, model, max_staleness=args.max_staleness, dtype=dtype, backend_name=args.generation_backend,
            micro_batch_size=args.generation_micro_batch_size, padding_free=args.padding_free,
        )  # fmt: skip

    def draw(self, timer: PhaseTimer) -> Any:
        """This step's samples: the oldest draw in flight (waited for), or, before any is, one drawn now
        from the current policy; then the draw ``max_staleness`` steps ahead is started."""
        self.version += 1
        if self.pending:
            pending = self.pending.popleft()
            with timer.phase("generate_wait"):
                drawn = pending.future.result()
            self.copies.append(pending.copy)
            # its phases as time/async/...
            timer.seconds.update({f"async/{k}": v for k, v in pending.timer.seconds.items()})
            self.last_staleness = self.version - pending.version
        else:
            drawn = self.draw_now(timer, None)
            self.last_staleness = 0
        while len(self.pending) < self.max_staleness:
            self._start()
        drawn.metrics["async/staleness"] = float(self.last_staleness)
        return drawn

    def _start(self) -> None:
        copy = self.copies.popleft()
        refresh_copy(copy, self.model)  # the weights now, before this step's update
        timer = PhaseTimer()
        future = self.pool.submit(self.draw_now, timer, self.backends[id(copy)])
        self.pending.append(_Pending(future, copy, self.version, timer))

    def close(self) -> None:
        """Stop drawing ahead (a draw in flight finishes; its samples are dropped)."""
        self.pool.shutdown(wait=True, cancel_futures=True)
        self.pending.clear()

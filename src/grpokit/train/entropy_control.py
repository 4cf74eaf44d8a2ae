"""The run's entropy-bonus coefficient: ``entropy_coef`` as given, or adapted after every optimizer step
(``use_adaptive_entropy``, Skywork-OR1; the rule is ``grpokit.core.entropy_control``). A step hook only for
its checkpoint: a resume continues with the coefficient and last entropy it had."""

from __future__ import annotations

import math
from typing import Any

from grpokit.config import GRPOConfig
from grpokit.core.entropy_control import adapted_entropy_coef, applied_entropy_coef
from grpokit.train.hooks import StepHook

__all__ = ["EntropyControl"]


class EntropyControl(StepHook):
    """``coef``: the coefficient now (TRL's ``trainer.entropy_coef``); ``last_entropy``: the mean token
    entropy of the last optimizer step (all processes), inf before the first."""

    checkpoint_key = "entropy_control"

    def __init__(
        self,
        coef: float,
        *,
        adaptive: bool = False,
        target: float = 0.2,
        delta: float = 0.005,
        coef_min: float = 0.0,
        coef_max: float = 1.0,
    ) -> None:
        self.coef, self.adaptive = coef, adaptive
        self.target, self.delta, self.coef_min, self.coef_max = target, delta, coef_min, coef_max
        self.last_entropy = math.inf

    @classmethod
    def from_config(cls, args: GRPOConfig) -> EntropyControl:
        """``entropy_coef`` and, with ``use_adaptive_entropy``, its controller's fields."""
        return cls(
            args.entropy_coef, adaptive=args.use_adaptive_entropy, target=args.entropy_target,
            delta=args.entropy_coef_delta, coef_min=args.entropy_coef_min, coef_max=args.entropy_coef_max,
        )  # fmt: skip

    @property
    def enabled(self) -> bool:
        """Whether the loss has an entropy bonus at all (adaptive control keeps it even at coefficient 0,
        so that it can come back)."""
        return self.coef != 0.0 or self.adaptive

    def applied(self) -> float:
        """The coefficient of this optimizer step's bonus (fixed for all its micro-batches)."""
        if not self.adaptive:
            return self.coef
        return applied_entropy_coef(self.coef, self.last_entropy, self.target)

    def step_done(self, entropy: float) -> None:
        """After an optimizer step whose mean token entropy (all processes) was ``entropy``."""
        if self.adaptive:
            self.coef = adapted_entropy_coef(
                self.coef, entropy, target=self.target, delta=self.delta,
                coef_min=self.coef_min, coef_max=self.coef_max,
            )  # fmt: skip
            self.last_entropy = entropy

    def state_dict(self) -> Any:
        return {"coef": self.coef, "last_entropy": self.last_entropy} if self.adaptive else None

    def load_state_dict(self, state: Any) -> None:
        self.coef, self.last_entropy = float(state["coef"]), float(state["last_entropy"])

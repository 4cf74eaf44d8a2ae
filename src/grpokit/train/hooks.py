"""Optional behaviour around the GRPO step, kept out of the step itself.

``GRPOTrainer.training_step`` is the algorithm; everything a run may add to it is a :class:`StepHook`
called at three points of the step:

1. ``on_scored(step, samples, scores)``: the completions are scored (process supervision scores their steps;
   iterative GRPO keeps them for the reward model; the completion log writes them);
2. ``on_batch(batch)``: the RolloutBatch is built (process supervision replaces the advantages by per-token
   ones);
3. ``after_update(step)``: the optimizer steps are done (the reference is reset; the reward model learns).

``metrics()`` then adds the hook's metrics to the step's. ``step`` is the 1-based number of the step being
run. Hooks with state that a resume needs give ``state_dict`` / ``load_state_dict`` (and a
``checkpoint_key``).
"""

from __future__ import annotations

from typing import Any

from grpokit.config import GRPOConfig
from grpokit.rollout.records import RolloutBatch, Samples, Scores
from grpokit.sampling.prompt_stats import Curriculum, PromptStats
from grpokit.train.reference import Reference

__all__ = ["PromptStatsHook", "ReferenceSync", "StepHook", "StepHooks", "run_hooks"]


class StepHook:
    """Base class: every method does nothing unless overridden."""

    checkpoint_key: str | None = None
    """Name of this hook's entry in a checkpoint; None when it has no state to save."""

    def on_scored(self, step: int, samples: Samples, scores: Scores) -> None:
        """The step's completions are scored."""

    def on_batch(self, batch: RolloutBatch) -> None:
        """The step's RolloutBatch is built (the hook may change its advantages)."""

    def after_update(self, step: int) -> None:
        """The step's policy update is done."""

    def metrics(self) -> dict[str, float]:
        """This step's metrics (read after ``after_update``)."""
        return {}

    def state_dict(self) -> Any:
        return None

    def load_state_dict(self, state: Any) -> None:
        """Restore what ``state_dict`` returned."""


class StepHooks:
    """The run's hooks, called in order."""

    def __init__(self, hooks: list[StepHook]) -> None:
        self.hooks = hooks

    def on_scored(self, step: int, samples: Samples, scores: Scores) -> None:
        for hook in self.hooks:
            hook.on_scored(step, samples, scores)

    def on_batch(self, batch: RolloutBatch) -> None:
        for hook in self.hooks:
            hook.on_batch(batch)

    def after_update(self, step: int) -> None:
        for hook in self.hooks:
            hook.after_update(step)

    def metrics(self) -> dict[str, float]:
        return {name: value for hook in self.hooks for name, value in hook.metrics().items()}

    def state_dict(self) -> dict[str, Any]:
        return {hook.checkpoint_key: hook.state_dict() for hook in self.hooks if hook.checkpoint_key}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for hook in self.hooks:
            if hook.checkpoint_key and state.get(hook.checkpoint_key) is not None:
                hook.load_state_dict(state[hook.checkpoint_key])


class ReferenceSync(StepHook):
    """``sync_ref_model``: every ``every`` steps, ref <- alpha * policy + (1 - alpha) * ref (R1-Zero replaced
    the reference every 400 steps)."""

    def __init__(self, reference: Reference, every: int, alpha: float) -> None:
        self.reference, self.every, self.alpha = reference, every, alpha

    def after_update(self, step: int) -> None:
        if step % self.every == 0:
            self.reference.reset(self.alpha)


class PromptStatsHook(StepHook):
    """Keeps the per-prompt pass-rate estimates (curriculum, adaptive group sizes) and the curriculum's
    random state in checkpoints, and reports the curriculum's metrics each step."""

    checkpoint_key = "curriculum"

    def __init__(self, stats: PromptStats, curriculum: Curriculum | None) -> None:
        self.stats, self.curriculum = stats, curriculum

    def metrics(self) -> dict[str, float]:
        return self.curriculum.metrics() if self.curriculum is not None else {}

    def state_dict(self) -> Any:
        return (
            self.curriculum.state_dict()
            if self.curriculum is not None
            else {"stats": self.stats.state_dict()}
        )

    def load_state_dict(self, state: Any) -> None:
        if self.curriculum is not None:
            self.curriculum.load_state_dict(state)
        else:
            self.stats.load_state_dict(state["stats"])


def run_hooks(
    args: GRPOConfig,
    *,
    episodes: StepHook | None = None,
    process: StepHook | None = None,
    reference: Reference | None = None,
    iterative: StepHook | None = None,
    prompt_stats: PromptStats | None = None,
    curriculum: Curriculum | None = None,
    entropy: StepHook | None = None,
    selfplay: StepHook | None = None,
) -> list[StepHook]:
    """The optional behaviour a run asked for, in the order it runs: the episodes' metrics and turn
    advantages, process supervision, reference resets (``sync_ref_model``), the iterative reward model's
    updates, each followed by a reset of the reference to the policy, the per-prompt pass rates, the
    adaptive entropy coefficient (``train.entropy_control``, a hook only for its checkpoint), a game's
    ``selfplay/*`` metrics and role baselines (``train.selfplay``)."""
    hooks: list[StepHook] = [h for h in (episodes, process, selfplay) if h is not None]
    if reference is not None and args.sync_ref_model:
        hooks.append(ReferenceSync(reference, args.ref_model_sync_steps, args.ref_model_mixup_alpha))
    if iterative is not None:
        hooks.append(iterative)
        if reference is not None:  # iterative GRPO: pi_ref <- pi_theta after every reward-model update
            hooks.append(ReferenceSync(reference, args.iteration_steps, 1.0))
    if prompt_stats is not None:  # pass-rate estimates: checkpointed, curriculum metrics
        hooks.append(PromptStatsHook(prompt_stats, curriculum))
    if entropy is not None:
        hooks.append(entropy)
    return hooks

"""Iterative GRPO, a step hook (DeepSeekMath section 4.2): the reward model keeps learning from the policy's
samples, and the reference model is reset to the current policy.

Every step the hook keeps the step's completions (``on_scored``); every ``iteration_steps`` steps
(``after_update``) it

1. labels the completions kept since the last update with ``rm_label_func`` (the task's verifier or an
   outcome reward comparing with the dataset's gold answers; a step verifier for a process RM);
2. trains the reward model on them mixed with replayed history (``replay_ratio``), logging ``rm/*`` (loss
   and accuracy on the fresh samples before training, ``rm/accuracy_on_policy``, and after; replay buffer
   size);
3. then the reference model is reset to the current policy (a ``ReferenceSync`` hook every
   ``iteration_steps`` steps, right after this one: ``train.hooks.run_hooks``).

Scoring goes on with the same module, now updated (``IterativeRewardModel.reward_func``). The reward model
itself, its training and its replay buffer are :mod:`grpokit.rm`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from grpokit.config import GRPOConfig
from grpokit.data.chat import as_completion
from grpokit.data.loading import reward_columns
from grpokit.rewards import resolve_reward
from grpokit.rewards.process_rewards import resolve_process_reward_funcs
from grpokit.rm import IterativeRewardModel, label_samples
from grpokit.rollout.records import Samples, Scores
from grpokit.train.hooks import StepHook

__all__ = ["IterativeGRPO", "rm_metric_summary"]


class IterativeGRPO(StepHook):
    """The trainer's side of iterative GRPO: the reward model being trained, its labeller and the completions
    kept since the last update. ``gather``: collects every process's kept completions (None with one
    process), so that every process trains the same reward model on the same data."""

    checkpoint_key = "iterative"

    def __init__(
        self,
        reward_model: IterativeRewardModel,
        label_func: Callable[..., Any],
        every: int,
        gather: Callable[[list[Any]], list[Any]] | None = None,
    ) -> None:
        if every < 1:
            raise ValueError(
                "GRPOConfig.iteration_steps must be >= 1 when an iterative_reward_model is given "
                "(it is how often the reward model is updated and the reference reset)"
            )
        self.reward_model = reward_model
        self.label_func = label_func
        self.every = every
        self.pending: list[tuple[dict[str, Any], str, list[int]]] = []
        self.gather = gather
        self._metrics: dict[str, float] = {}

    @classmethod
    def from_config(
        cls,
        spec: Any,
        label_func: Any,
        args: GRPOConfig,
        device: torch.device | str | None = None,
        gather: Callable[[list[Any]], list[Any]] | None = None,
    ) -> IterativeGRPO | None:
        """The hook for ``GRPOTrainer(iterative_reward_model=spec, rm_label_func=label_func)``, or None
        without one; ``iteration_steps`` and an iterative reward model go together."""
        if spec is None:
            if args.iteration_steps > 0:
                raise ValueError(
                    "GRPOConfig.iteration_steps > 0 needs an iterative_reward_model (to reset the reference "
                    "model alone, use sync_ref_model and ref_model_sync_steps)"
                )
            return None
        return cls.build(spec, label_func, args, device, gather)

    @classmethod
    def build(
        cls,
        spec: Any,
        label_func: Any,
        args: GRPOConfig,
        device: torch.device | str | None = None,
        gather: Callable[[list[Any]], list[Any]] | None = None,
    ) -> IterativeGRPO:
        """``spec``: an ``IterativeRewardModel`` (used as is, with its own settings) or a reward-model
        directory (``grpokit train-rm`` output; built with the ``rm_*``/``replay_ratio`` fields of ``args``,
        its buffer seeded from the directory's replay file). ``label_func``: a callable, a built-in step
        verifier name (process RM) or a reward name / import path (outcome RM)."""
        if isinstance(spec, IterativeRewardModel):
            reward_model = spec
        elif isinstance(spec, (str, Path)):
            reward_model = IterativeRewardModel.from_pretrained(
                spec,
                replay_ratio=args.replay_ratio,
                buffer_capacity=args.rm_buffer_capacity,
                lr=args.rm_learning_rate,
                epochs=args.rm_epochs,
                batch_size=args.rm_batch_size,
                delimiter=args.step_delimiter,
                seed=args.seed,
            )
        else:
            raise TypeError(
                f"iterative_reward_model: expected an IterativeRewardModel or a reward-model directory, got "
                f"{type(spec).__name__}"
            )
        if reward_model.kind == "process" and reward_model.delimiter != args.step_delimiter:
            raise ValueError(
                f"iterative_reward_model splits steps at {reward_model.delimiter!r} but "
                f"GRPOConfig.step_delimiter is {args.step_delimiter!r}"
            )
        if device is not None:
            reward_model.model.to(device)
        if label_func is None:
            raise ValueError(
                "rm_label_func is required with an iterative_reward_model: the verifier that labels the "
                "policy's samples (a step verifier such as 'chain_steps' for a process RM, an outcome reward "
                "such as the task's exact-answer reward for an outcome RM)"
            )
        if not callable(label_func):
            if reward_model.kind == "process":
                label_func = resolve_process_reward_funcs([label_func], delimiter=args.step_delimiter)[0]
            else:
                label_func = resolve_reward(label_func)
        return cls(reward_model, label_func, args.iteration_steps, gather)

    @property
    def kind(self) -> str:
        return self.reward_model.kind

    @property
    def reward_func(self) -> Callable[..., Any]:
        """The scorer: a process reward function (process RM) or an outcome reward function."""
        return self.reward_model.reward_func

    # -- the step ----------------------------------------------------------------------------------------
    def on_scored(self, step: int, samples: Samples, scores: Scores) -> None:
        """Keep one step's completions for the next update."""
        ids = samples.generated.completion_ids
        self.pending.extend((row, text, list(i)) for row, text, i in zip(samples.rows, samples.texts, ids))

    def after_update(self, step: int) -> None:
        self._metrics = {}
        if step % self.every == 0:
            self._metrics = self.update()
        self._metrics["rm/replay_size"] = float(len(self.reward_model.buffer))

    def metrics(self) -> dict[str, float]:
        return self._metrics

    def update(self) -> dict[str, float]:
        """Label the kept completions (all processes' when ``gather`` is set, so that every process trains
        the same reward model on the same data), update the reward model, forget the completions.
        Returns the ``rm/*`` metrics plus ``rm/num_labelled`` and ``rm/num_updates``."""
        pending = self.gather(self.pending) if self.gather is not None else list(self.pending)
        self.pending = []
        rows = [row for row, _, _ in pending]
        fresh = (
            label_samples(
                [row["prompt"] for row in rows],
                [as_completion(text, row["prompt"]) for row, text, _ in pending],
                self.label_func,
                reward_columns(rows),
                kind=self.kind,
                delimiter=self.reward_model.delimiter,
                completion_ids=[ids for _, _, ids in pending],
            )
            if pending
            else []
        )
        metrics = self.reward_model.update(fresh)
        metrics["rm/num_labelled"] = float(len(fresh))
        metrics["rm/num_updates"] = float(self.reward_model.num_updates)
        return metrics

    # -- checkpoints --------------------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """The current reward model as a ``transformers`` checkpoint plus its replay buffer."""
        return self.reward_model.save(path)

    def state_dict(self) -> dict[str, Any]:
        """Everything a resume needs: the reward model's state and the completions kept since its update."""
        return {**self.reward_model.state_dict(), "pending": list(self.pending)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.reward_model.load_state_dict(state)
        self.pending = list(state["pending"])


def rm_metric_summary(history: Sequence[dict[str, float]]) -> dict[str, float]:
    """The ``rm/*`` metrics of every update in a training history, for summaries: the number of updates and
    the means of the accuracy and loss on the policy's samples before each update (with the constant
    baseline's accuracy) and after it."""
    updates = [h for h in history if "rm/accuracy_on_policy" in h]
    out: dict[str, float] = {"rm/updates": float(len(updates))}
    for key in (
        "rm/accuracy_on_policy", "rm/constant_accuracy_on_policy", "rm/accuracy_after",
        "rm/loss_on_policy", "rm/loss_after",
    ):  # fmt: skip
        values = [h[key] for h in updates if not math.isnan(h[key])]
        out[f"{key}/mean"] = sum(values) / len(values) if values else math.nan
    return out

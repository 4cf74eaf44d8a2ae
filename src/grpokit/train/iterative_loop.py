"""Iterative GRPO inside the trainer (DeepSeekMath section 4.2): the reward model keeps learning from the
policy's samples, and the reference model is reset to the current policy.

Every step the trainer hands its completions to ``IterativeLoop.observe``; every ``iteration_steps`` steps
``IterativeLoop.update``:

1. labels the completions observed since the last update with ``rm_label_func`` (the task's verifier or an
   outcome reward comparing with the dataset's gold answers; a step verifier for a process RM);
2. trains the reward model on them mixed with replayed history (``replay_ratio``), logging ``rm/*`` (loss
   and accuracy on the fresh samples before and after, replay buffer size);
3. scoring goes on with the same module, now updated (``IterativeRewardModel.reward_func``);

and the trainer then resets the reference model to the current policy (``sync_reference(ref, policy, 1)``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from grpokit.config import GRPOConfig
from grpokit.data.loading import reward_columns
from grpokit.rewards import resolve_reward
from grpokit.rewards.process import resolve_process_reward_funcs
from grpokit.train.iterative import IterativeRewardModel, label_samples
from grpokit.train.reward_model import load_reward_model, load_rm_samples
from grpokit.train.scoring import completions_for_rewards

__all__ = ["IterativeLoop", "reward_model_kind"]

REPLAY_FILE = "replay_buffer.jsonl"


def reward_model_kind(path: str | Path) -> str:
    """``"process"`` or ``"outcome"`` for a reward-model checkpoint: ``grpokit_reward_kind`` in its config
    (written by ``grpokit train-rm``), else its architecture (token / sequence classification)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(path))
    kind = getattr(config, "grpokit_reward_kind", None)
    if kind in ("outcome", "process"):
        return kind
    architectures = getattr(config, "architectures", None) or []
    if any(a.endswith("ForTokenClassification") for a in architectures):
        return "process"
    if any(a.endswith("ForSequenceClassification") for a in architectures):
        return "outcome"
    raise ValueError(
        f"iterative_reward_model {path}: not a reward model (no grpokit_reward_kind and architectures "
        f"{architectures}); train one with `grpokit train-rm`"
    )


class IterativeLoop:
    """The trainer's side of iterative GRPO: the reward model being trained, its labeller, and the
    completions observed since the last update."""

    def __init__(
        self, reward_model: IterativeRewardModel, label_func: Callable[..., Any], every: int
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

    @classmethod
    def build(
        cls, spec: Any, label_func: Any, args: GRPOConfig, device: torch.device | str | None = None
    ) -> IterativeLoop:
        """``spec``: an ``IterativeRewardModel`` (used as is, with its own settings) or a reward-model
        directory (``grpokit train-rm`` output; built with the ``rm_*``/``replay_ratio`` fields of ``args``,
        its buffer seeded from ``replay_buffer.jsonl`` in that directory when present). ``label_func``: a
        callable, a built-in step verifier name (process RM) or a reward name / import path (outcome RM)."""
        if isinstance(spec, IterativeRewardModel):
            reward_model = spec
        elif isinstance(spec, (str, Path)):
            kind = reward_model_kind(spec)
            model, tokenizer = load_reward_model(str(spec), kind)
            replay = Path(spec) / REPLAY_FILE
            initial = (
                load_rm_samples(replay, kind, delimiter=args.step_delimiter, name=str(replay))
                if replay.exists()
                else None
            )
            reward_model = IterativeRewardModel(
                model,
                tokenizer,
                kind=kind,
                replay_ratio=args.replay_ratio,
                buffer_capacity=args.rm_buffer_capacity,
                lr=args.rm_learning_rate,
                epochs=args.rm_epochs,
                batch_size=args.rm_batch_size,
                delimiter=args.step_delimiter,
                seed=args.seed,
                initial_samples=initial,
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
        return cls(reward_model, label_func, args.iteration_steps)

    @property
    def kind(self) -> str:
        return self.reward_model.kind

    @property
    def reward_func(self) -> Callable[..., Any]:
        """The scorer: a process reward function (process RM) or an outcome reward function."""
        return self.reward_model.reward_func

    def observe(
        self, rows: Sequence[dict[str, Any]], texts: Sequence[str], completion_ids: Sequence[Any]
    ) -> None:
        """Remember one step's completions (``rows`` repeated G times) for the next update."""
        self.pending.extend((row, text, list(ids)) for row, text, ids in zip(rows, texts, completion_ids))

    def due(self, step: int) -> bool:
        """Whether the step just finished (1-based) ends an iteration."""
        return step % self.every == 0

    def update(self, gather: Callable[[list[Any]], list[Any]] | None = None) -> dict[str, float]:
        """Label the observed completions (all processes' when ``gather`` is given, so that every process
        trains the same reward model on the same data), update the reward model, clear the observations.
        Returns the ``rm/*`` metrics plus ``rm/num_labelled`` and ``rm/num_updates``."""
        pending = gather(self.pending) if gather is not None else list(self.pending)
        self.pending = []
        rows = [row for row, _, _ in pending]
        texts = [text for _, text, _ in pending]
        fresh = (
            label_samples(
                [row["prompt"] for row in rows],
                completions_for_rewards(rows, texts),
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

    def step_metrics(self) -> dict[str, float]:
        """Logged every step: the replay buffer size."""
        return {"rm/replay_size": float(len(self.reward_model.buffer))}

    # -- checkpoints ----------------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """The current reward model as a ``transformers`` checkpoint plus its replay buffer."""
        return self.reward_model.save(path)

    def state_dict(self) -> dict[str, Any]:
        """Everything a resume needs: RM weights and optimizer, the buffer (with its RNG), the pending
        observations and the update count."""
        buffer = self.reward_model.buffer
        return {
            "model": {k: v.detach().cpu().clone() for k, v in self.reward_model.model.state_dict().items()},
            "optimizer": self.reward_model.optimizer.state_dict(),
            "buffer": {"samples": buffer.samples, "num_seen": buffer.num_seen, "rng": buffer._rng.getstate()},
            "pending": list(self.pending),
            "num_updates": self.reward_model.num_updates,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        rm = self.reward_model
        rm.model.load_state_dict(state["model"])
        rm.optimizer.load_state_dict(state["optimizer"])
        rm.buffer._samples = list(state["buffer"]["samples"])
        rm.buffer.num_seen = int(state["buffer"]["num_seen"])
        rm.buffer._rng.setstate(state["buffer"]["rng"])
        self.pending = list(state["pending"])
        rm.num_updates = int(state["num_updates"])
        rm.model.eval()


def rm_metric_summary(history: Sequence[dict[str, float]]) -> dict[str, float]:
    """The ``rm/*`` metrics of every update in a training history, for summaries: means of
    accuracy before/after on fresh samples and the number of updates."""
    updates = [h for h in history if "rm/accuracy_before" in h]
    out: dict[str, float] = {"rm/updates": float(len(updates))}
    for key in ("rm/accuracy_before", "rm/accuracy_after", "rm/loss_before", "rm/loss_after"):
        values = [h[key] for h in updates if not math.isnan(h[key])]
        out[f"{key}/mean"] = sum(values) / len(values) if values else math.nan
    return out

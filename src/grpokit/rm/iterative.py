"""Iterative GRPO (DeepSeekMath section 4.2, Algorithm 1 outer loop): keep training the reward model on the
policy's new samples, with a replay of historical data, while the policy trains against it.

The trainer, every ``iteration_steps`` policy steps:

1. ``label_samples(...)``: label the completions of the recent steps with the task's verifier (or the
   dataset's gold answers through an outcome reward such as exact-match).
2. ``IterativeRewardModel.update(samples)``: RM loss/accuracy on the fresh samples before training on them
   (its accuracy on the policy's current samples, ``rm/accuracy_on_policy``), training on fresh + replayed
   history (``replay_ratio``), loss/accuracy after; fresh samples join the buffer.
3. Scoring goes on with ``IterativeRewardModel.reward_func`` (the same module, now updated: nothing to
   swap by hand).
4. Reset the reference model to the current policy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from grpokit.data.chat import completion_text
from grpokit.data.records import write_jsonl
from grpokit.rewards.process_rewards.prm import ProcessRewardModel
from grpokit.rewards.process_rewards.steps import DEFAULT_STEP_DELIMITER, split_steps
from grpokit.rm.checkpoints import freeze_bottom, load_reward_model, reward_model_kind, save_reward_model
from grpokit.rm.replay import ReplayBuffer
from grpokit.rm.samples import load_rm_samples, validate_rm_samples
from grpokit.rm.training import evaluate_reward_model, outcome_scores, train_reward_model

__all__ = ["REPLAY_FILE", "IterativeRewardModel", "label_samples"]

REPLAY_FILE = "replay_buffer.jsonl"
"""The replay history saved next to a reward model (by ``train-rm`` and :meth:`IterativeRewardModel.save`)."""


def label_samples(
    prompts: Sequence[Any],
    completions: Sequence[Any],
    verifier_fn: Callable[..., Any],
    columns: dict[str, Sequence[Any]] | None = None,
    *,
    kind: str = "outcome",
    delimiter: str = DEFAULT_STEP_DELIMITER,
    completion_ids: Sequence[Sequence[int]] | None = None,
) -> list[dict[str, Any]]:
    """Labelled reward-model samples from policy completions.

    ``kind="outcome"``: ``verifier_fn`` is an outcome reward ``fn(prompts, completions, completion_ids,
    **columns) -> list[float | None]`` with values in [0, 1]; rows ``{"prompt", "completion", "label"}``.
    ``kind="process"``: ``verifier_fn`` is a step verifier ``fn(prompts, completions, steps, **columns)
    -> list[list[float] | None]``; rows ``{"prompt", "completion", "step_labels"}``. Completions the
    verifier returns None for are left out; completions are stored as text; prompts as given.
    """
    columns = dict(columns or {})
    texts = [completion_text(c) for c in completions]
    if kind == "outcome":
        labels = verifier_fn(list(prompts), list(completions), completion_ids, **columns)
        key = "label"
    elif kind == "process":
        steps = [[t[s:e] for s, e in split_steps(t, delimiter)] for t in texts]
        spans = [split_steps(t, delimiter) for t in texts]
        labels = verifier_fn(list(prompts), list(completions), steps, step_spans=spans, **columns)
        key = "step_labels"
    else:
        raise ValueError(f"kind must be 'outcome' or 'process', got {kind!r}")
    if len(labels) != len(texts):
        raise ValueError(f"verifier returned {len(labels)} labels for {len(texts)} completions")
    rows = [
        {"prompt": p, "completion": t, key: (float(v) if kind == "outcome" else [float(x) for x in v])}
        for p, t, v in zip(prompts, texts, labels)
        if v is not None
    ]
    return validate_rm_samples(rows, kind, delimiter=delimiter, name="labelled samples")


class IterativeRewardModel:
    """A reward model that keeps learning: the model, its tokenizer, a replay buffer and one optimizer
    (AdamW, kept across updates so its moments carry over).

    ``kind="process"``: ``model`` is a token classifier and ``reward_func`` a ``ProcessRewardModel`` on the
    same module; ``kind="outcome"``: a sequence classifier and ``reward_func`` an outcome reward function
    (TRL signature, sigmoid scores). ``initial_samples`` (e.g. the RM's original training data) seed the
    buffer as the first "historical data".
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        *,
        kind: str = "process",
        replay_ratio: float = 0.1,
        buffer_capacity: int | None = None,
        lr: float = 1e-4,
        weight_decay: float = 0.0,
        epochs: int = 1,
        batch_size: int = 16,
        delimiter: str = DEFAULT_STEP_DELIMITER,
        max_length: int | None = None,
        seed: int = 0,
        initial_samples: Sequence[dict[str, Any]] | None = None,
    ) -> None:
        if kind not in ("outcome", "process"):
            raise ValueError(f"kind must be 'outcome' or 'process', got {kind!r}")
        if not 0.0 <= replay_ratio < 1.0:
            raise ValueError(f"replay_ratio must be in [0, 1), got {replay_ratio}")
        self.model = model
        self.tokenizer = tokenizer
        self.kind = kind
        self.replay_ratio = replay_ratio
        self.epochs = epochs
        self.batch_size = batch_size
        self.delimiter = delimiter
        self.max_length = max_length
        self.seed = seed
        self.buffer = ReplayBuffer(buffer_capacity, seed=seed)
        if initial_samples:
            self.buffer.add(
                validate_rm_samples(initial_samples, kind, delimiter=delimiter, name="initial_samples")
            )
        # everything trains but the layers frozen when it was trained (train-rm's freeze_backbone)
        freeze_bottom(self.model, int(getattr(self.model.config, "grpokit_frozen_layers", 0) or 0))
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(trainable, lr=lr, weight_decay=weight_decay)
        self.num_updates = 0
        self.model.eval()
        self._prm = (
            ProcessRewardModel(model, tokenizer, delimiter=delimiter, batch_size=batch_size, freeze=False)
            if kind == "process"
            else None
        )

    @classmethod
    def from_pretrained(cls, path: str | Path, **settings: Any) -> IterativeRewardModel:
        """A reward-model directory (``grpokit train-rm`` output, outcome or process): its kind read from
        the checkpoint, its replay buffer seeded from ``REPLAY_FILE`` in that directory when present.
        ``settings``: the other constructor arguments (``replay_ratio``, ``lr``, ``delimiter``, ...)."""
        kind = reward_model_kind(path)
        model, tokenizer = load_reward_model(str(path), kind)
        replay = Path(path) / REPLAY_FILE
        delimiter = settings.get("delimiter", DEFAULT_STEP_DELIMITER)
        initial = (
            load_rm_samples(replay, kind, delimiter=delimiter, name=str(replay)) if replay.exists() else None
        )
        return cls(model, tokenizer, kind=kind, initial_samples=initial, **settings)

    def save(self, path: str | Path) -> Path:
        """Save the current reward model (a ``transformers`` checkpoint, as ``train-rm`` writes) and the
        replay buffer (``REPLAY_FILE``). The optimizer state is not saved."""
        out = save_reward_model(self.model, self.tokenizer, path, kind=self.kind, delimiter=self.delimiter)
        write_jsonl(out / REPLAY_FILE, self.buffer.samples)
        return out

    @property
    def reward_func(self) -> Callable[..., Any]:
        """The scorer for the trainer: a process reward function (process) or an outcome reward function."""
        if self._prm is not None:
            return self._prm

        def outcome_rm(prompts, completions, completion_ids=None, **columns):
            return outcome_scores(
                self.model,
                self.tokenizer,
                prompts,
                completions,
                batch_size=self.batch_size,
                max_length=self.max_length,
            )

        outcome_rm.__name__ = "outcome_rm"
        return outcome_rm

    def _evaluate(self, samples: list[dict[str, Any]]) -> dict[str, float]:
        return evaluate_reward_model(
            self.model,
            self.tokenizer,
            samples,
            kind=self.kind,
            batch_size=self.batch_size,
            delimiter=self.delimiter,
            max_length=self.max_length,
        )

    def update(self, fresh_samples: Sequence[dict[str, Any]]) -> dict[str, float]:
        """Evaluate on ``fresh_samples``, train on them plus replayed history, evaluate again, then add them
        to the buffer. Returns, on the fresh samples (the policy's current ones) before training,
        ``rm/loss_on_policy``, ``rm/accuracy_on_policy`` and ``rm/constant_accuracy_on_policy`` (the
        accuracy of always giving their majority label, the baseline to beat); after training,
        ``rm/loss_after`` and ``rm/accuracy_after``; and ``rm/train_loss``, ``rm/num_fresh``,
        ``rm/num_replayed``, ``rm/replay_size`` (buffer size after adding). No fresh samples: nothing
        trains, NaN metrics."""
        fresh = validate_rm_samples(fresh_samples, self.kind, delimiter=self.delimiter, name="fresh samples")
        metrics = {"rm/num_fresh": float(len(fresh))}
        if not fresh:
            nan = math.nan
            metrics.update(
                {
                    "rm/loss_on_policy": nan,
                    "rm/accuracy_on_policy": nan,
                    "rm/constant_accuracy_on_policy": nan,
                    "rm/loss_after": nan,
                    "rm/accuracy_after": nan,
                    "rm/train_loss": nan,
                    "rm/num_replayed": 0.0,
                    "rm/replay_size": float(len(self.buffer)),
                }
            )
            return metrics
        before = self._evaluate(fresh)
        mixed = self.buffer.mix(fresh, self.replay_ratio)
        seed = self.seed + 1000 * self.num_updates
        # Dropout draws from a generator seeded per update, not the process's own stream: every training
        # process updates its copy of the reward model identically.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            train = train_reward_model(
                self.model,
                self.tokenizer,
                mixed,
                kind=self.kind,
                epochs=self.epochs,
                batch_size=self.batch_size,
                delimiter=self.delimiter,
                max_length=self.max_length,
                seed=seed,
                optimizer=self.optimizer,
            )
        after = self._evaluate(fresh)
        self.buffer.add(fresh)
        self.num_updates += 1
        self.model.eval()
        metrics.update(
            {
                "rm/loss_on_policy": before["loss"],
                "rm/accuracy_on_policy": before["accuracy"],
                "rm/constant_accuracy_on_policy": before["constant_accuracy"],
                "rm/loss_after": after["loss"],
                "rm/accuracy_after": after["accuracy"],
                "rm/train_loss": train["train_loss"],
                "rm/num_replayed": float(len(mixed) - len(fresh)),
                "rm/replay_size": float(len(self.buffer)),
            }
        )
        return metrics

    def state_dict(self) -> dict[str, Any]:
        """Everything a resume needs: weights, optimizer moments, the replay buffer and the update count."""
        return {
            "model": {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
            "buffer": self.buffer.state_dict(),
            "num_updates": self.num_updates,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.buffer.load_state_dict(state["buffer"])
        self.num_updates = int(state["num_updates"])
        self.model.eval()

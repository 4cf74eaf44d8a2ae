"""Reward models that grpokit trains: outcome and process reward-model training, replay, iterative updates.

Labelled samples, outcome and process reward-model training, checkpoints, the replay buffer, and the
reward model that keeps learning during iterative GRPO.

``grpokit train-rm`` (``grpokit.cli.train_rm``) trains one from the command line; the trainer's side of
iterative GRPO is ``grpokit.train.iterative_grpo``. See docs/process-supervision.md.
"""

from grpokit.rm.checkpoints import (
    build_tiny_reward_model,
    freeze_bottom,
    load_reward_model,
    reward_model_kind,
    save_reward_model,
)
from grpokit.rm.iterative import REPLAY_FILE, IterativeRewardModel, label_samples
from grpokit.rm.replay import ReplayBuffer, replay_count
from grpokit.rm.samples import RM_KINDS, RMKind, check_kind, load_rm_samples, validate_rm_samples
from grpokit.rm.training import (
    classifier_pad_id,
    evaluate_reward_model,
    outcome_scores,
    prefix_labels,
    train_reward_model,
)

__all__ = [
    "REPLAY_FILE",
    "RM_KINDS",
    "IterativeRewardModel",
    "RMKind",
    "ReplayBuffer",
    "build_tiny_reward_model",
    "check_kind",
    "classifier_pad_id",
    "evaluate_reward_model",
    "freeze_bottom",
    "label_samples",
    "load_reward_model",
    "load_rm_samples",
    "outcome_scores",
    "prefix_labels",
    "replay_count",
    "reward_model_kind",
    "save_reward_model",
    "train_reward_model",
    "validate_rm_samples",
]

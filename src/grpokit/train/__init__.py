"""The training step only: GRPOTrainer (draw, score, advantages, batch, log-probs, update, log) and its parts.

``trainer`` (GRPOTrainer: ``training_step`` top to bottom, the loop around it), ``batch`` (Samples ->
Scores -> RolloutBatch), ``forward`` and ``lm_head`` (the lean log-prob forward), ``reference`` (pi_ref),
``update`` (mu epochs of optimizer steps), ``prompts`` (which prompts, as token ids), ``run_rewards`` (what
scores a run), ``schedule`` (when a run logs, evaluates and saves), ``hooks`` (the protocol of optional
behaviour) and the hooks: ``process_supervision`` (process rewards, an environment's turn rewards) and
``iterative_grpo``."""

from grpokit.rollout.records import RolloutBatch, Samples, Scores
from grpokit.train.hooks import StepHook
from grpokit.train.trainer import GRPOTrainer

__all__ = ["GRPOTrainer", "RolloutBatch", "Samples", "Scores", "StepHook"]

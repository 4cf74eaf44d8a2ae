"""Training with GRPO: the trainer and the parts of its step.

``trainer`` (GRPOTrainer: the step, top to bottom) · ``batch`` (Samples -> Scores -> RolloutBatch) ·
``update`` (mu epochs of optimizer steps) · ``forward`` (the lean log-prob forward) · ``prompts`` (which
prompts, as token ids) · ``reference`` (pi_ref) · ``policy`` (loading the policy) · ``hooks`` (optional
behaviour: ``process_supervision``, ``iterative_grpo``, ``completion_log``) · ``metrics`` /
``metrics_log`` · ``checkpoint`` · ``distributed``.
"""

from grpokit.train.batch import RolloutBatch, Samples, Scores
from grpokit.train.hooks import StepHook
from grpokit.train.trainer import GRPOTrainer

__all__ = ["GRPOTrainer", "RolloutBatch", "Samples", "Scores", "StepHook"]

"""The training step: ``trainer`` (GRPOTrainer: the step, top to bottom), ``batch`` (Samples -> Scores ->
RolloutBatch), ``forward`` and ``lm_head`` (the lean log-prob forward), ``reference`` (pi_ref), ``update``
(mu epochs of optimizer steps), ``prompts`` (which prompts, as token ids), ``hooks`` (the protocol of optional
behaviour: ``process_supervision``, ``iterative_grpo``), and what the loop around it needs."""

from grpokit.rollout.records import RolloutBatch, Samples, Scores
from grpokit.train.hooks import StepHook
from grpokit.train.trainer import GRPOTrainer

__all__ = ["GRPOTrainer", "RolloutBatch", "Samples", "Scores", "StepHook"]

"""GRPOConfig: every knob of a run, validated in one place, YAML in and out; the batch plan of a step; what
each TRL field means here."""

from grpokit.config.batch_plan import BatchPlan, plan_batch
from grpokit.config.grpo_config import GRPOConfig

__all__ = ["BatchPlan", "GRPOConfig", "plan_batch"]

"""GRPOConfig: every knob of a run as data (``grpo_config``), each value typed by its field's type
(``values``), validated in one place (``validation``), derived values computed from the fields as set
(``resolution``); one source list per enumerated option (``choices``); the batch plan of a step
(``batch_plan``); what each TRL field grpokit does not have means here (``trl_fields``)."""

from grpokit.config.batch_plan import BatchPlan, plan_batch
from grpokit.config.grpo_config import GRPOConfig

__all__ = ["BatchPlan", "GRPOConfig", "plan_batch"]

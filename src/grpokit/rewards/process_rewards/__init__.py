"""Process rewards: steps of a completion, process reward functions (rule-based or a neural PRM), scoring.

See docs/process-supervision.md. The trainer's path:
``score_process(...).step_rewards / .step_ends -> grpokit.core.process_advantages(...)``, optionally
``grpokit.core.combine_outcome_and_process`` with the outcome advantages.
"""

from grpokit.rewards.process_rewards.prm import ProcessRewardModel, encode_prompt_completion, scalar_logits
from grpokit.rewards.process_rewards.scoring import (
    ProcessScores,
    check_process_reward_specs,
    resolve_process_reward_funcs,
    score_process,
)
from grpokit.rewards.process_rewards.steps import (
    DEFAULT_STEP_DELIMITER,
    split_steps,
    step_char_ends,
    step_texts,
    step_token_ends,
)

__all__ = [
    "DEFAULT_STEP_DELIMITER",
    "ProcessRewardModel",
    "ProcessScores",
    "check_process_reward_specs",
    "encode_prompt_completion",
    "resolve_process_reward_funcs",
    "scalar_logits",
    "score_process",
    "split_steps",
    "step_char_ends",
    "step_texts",
    "step_token_ends",
]

"""Process supervision: steps, process reward functions (rule-based or a neural PRM), scoring.

See docs/process-supervision.md. The trainer's path:
``score_process(...) -> (step_rewards, step_ends) -> grpokit.core.process_advantages(...)``, optionally
``combine_outcome_and_process`` with the outcome advantages.
"""

from grpokit.rewards.process.prm import ProcessRewardModel, encode_prompt_completion, scalar_logits
from grpokit.rewards.process.scoring import (
    ProcessRewardFunc,
    ProcessScores,
    combine_outcome_and_process,
    process_reward_name,
    resolve_process_reward_funcs,
    score_process,
    score_process_detailed,
)
from grpokit.rewards.process.steps import (
    DEFAULT_STEP_DELIMITER,
    split_steps,
    step_char_ends,
    step_texts,
    step_token_ends,
)

__all__ = [
    "DEFAULT_STEP_DELIMITER",
    "ProcessRewardFunc",
    "ProcessRewardModel",
    "ProcessScores",
    "combine_outcome_and_process",
    "encode_prompt_completion",
    "process_reward_name",
    "resolve_process_reward_funcs",
    "scalar_logits",
    "score_process",
    "score_process_detailed",
    "split_steps",
    "step_char_ends",
    "step_texts",
    "step_token_ends",
]

"""Reward functions for GRPO: math accuracy, format, length shaping, sandboxed code execution, reward models.

Every reward has the TRL signature
``fn(prompts, completions, completion_ids, **columns) -> list[float | None]`` and accepts plain-string and
conversational completions; ``None`` means "does not apply" (the contract: :mod:`grpokit.rewards.base`).
The failure policy lives in :func:`score_completions`; names and specs resolve through
:func:`resolve_reward`. Rooms: ``isolation/`` runs untrusted work in worker processes (math-verify, the code
sandbox); ``process_rewards/`` scores steps (process supervision). See docs/rewards.md.
"""

from grpokit.data.chat import completion_text
from grpokit.rewards.accuracy import accuracy_reward, make_accuracy_reward
from grpokit.rewards.base import ProcessRewardFunc, RewardFunc
from grpokit.rewards.code import code_execution_reward, extract_code, make_code_execution_reward
from grpokit.rewards.extract import EXTRACTORS
from grpokit.rewards.format import (
    ANSWER_TAG_PATTERN,
    THINK_PATTERN,
    answer_tag_format_reward,
    make_format_reward,
    make_tag_count_reward,
    tag_count_reward,
    think_format_reward,
)
from grpokit.rewards.isolation.sandbox import SandboxError, SandboxLimits, SandboxResult, run_python_tests
from grpokit.rewards.isolation.verifier import MathVerifier
from grpokit.rewards.length import cosine_scaled_reward, repetition_penalty_reward, soft_overlong_punishment
from grpokit.rewards.registry import BUILTIN_REWARDS, check_reward_specs, resolve_reward, resolve_rewards
from grpokit.rewards.reward_model import RewardModel
from grpokit.rewards.scoring import (
    RewardFunctionError,
    combine_rewards,
    reward_name,
    reward_names,
    reward_weights,
    score_completions,
)

__all__ = [
    "ANSWER_TAG_PATTERN",
    "BUILTIN_REWARDS",
    "EXTRACTORS",
    "THINK_PATTERN",
    "MathVerifier",
    "ProcessRewardFunc",
    "RewardFunc",
    "RewardFunctionError",
    "RewardModel",
    "SandboxError",
    "SandboxLimits",
    "SandboxResult",
    "accuracy_reward",
    "answer_tag_format_reward",
    "check_reward_specs",
    "code_execution_reward",
    "combine_rewards",
    "completion_text",
    "cosine_scaled_reward",
    "extract_code",
    "make_accuracy_reward",
    "make_code_execution_reward",
    "make_format_reward",
    "make_tag_count_reward",
    "repetition_penalty_reward",
    "resolve_reward",
    "resolve_rewards",
    "reward_name",
    "reward_names",
    "reward_weights",
    "run_python_tests",
    "score_completions",
    "soft_overlong_punishment",
    "tag_count_reward",
    "think_format_reward",
]

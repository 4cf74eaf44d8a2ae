"""What scores a run's completions: the outcome reward functions and their weights, the process rewards,
the iterative reward model, and the environment's own reward, resolved from ``GRPOTrainer``'s arguments."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from grpokit.envs import environment_reward
from grpokit.reporting.proxy_gold import GoldWatch
from grpokit.rewards import resolve_rewards, reward_names, reward_weights
from grpokit.train.iterative_grpo import IterativeGRPO
from grpokit.train.process_supervision import ProcessSupervision

__all__ = ["RunRewards", "run_rewards"]


@dataclass
class RunRewards:
    """A run's scorers."""

    funcs: list[Any]
    """The outcome reward functions, resolved."""
    names: list[str]
    """Their unique metric names."""
    weights: torch.Tensor
    """[F] float32, ``reward_weights`` (default 1 each)."""
    process: ProcessSupervision | None
    """Process supervision (per-step rewards -> token advantages), or None."""
    iterative: IterativeGRPO | None
    """Iterative GRPO's reward model, or None."""
    gold: GoldWatch | None = None
    """``GRPOConfig.gold_reward``: a reward of weight 0 watching the others (``proxy_gold/*``), or None."""


def run_rewards(
    args: Any,
    reward_funcs: Any,
    process_reward_funcs: Any,
    iterative_reward_model: Any,
    rm_label_func: Any,
    tokenizer: Any,
    device: torch.device,
    *,
    has_environment: bool = False,
    gather: Callable[[list[Any]], list[Any]] | None = None,
    reward_processing_classes: Any = None,
    environment_rewards: list[Any] | None = None,
) -> RunRewards:
    """Resolve the trainer's reward arguments. A run with an environment and no reward functions is scored
    by the environment's own reward (``environment_reward``). The reward model iterative GRPO trains is the
    one that scores: appended to the process rewards (process RM) or the outcome rewards (outcome RM); it
    learns from every process's samples (``gather``, None with one process). ``reward_processing_classes``
    (TRL's): the tokenizer of each reward model in ``reward_funcs`` (None: the model's own).
    ``environment_rewards`` (TRL's ``environment_factory``: one per environment class with ``get_reward``)
    come last, with weight 1 each (``reward_weights`` weighs the others); with them ``reward_funcs`` may
    be empty. No reward source at all is a ValueError; so is a ``gold_reward`` that is not a reward function
    of weight 0 beside one of nonzero weight or process rewards (which are then the proxy it watches)."""
    empty = reward_funcs is None or (isinstance(reward_funcs, (list, tuple)) and not reward_funcs)
    owned = list(environment_rewards or [])
    if has_environment and empty and not owned:
        reward_funcs = [environment_reward]
    iterative = IterativeGRPO.from_config(iterative_reward_model, rm_label_func, args, device, gather)
    process_specs = list(process_reward_funcs or [])
    outcome_specs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    if iterative is not None:
        (process_specs if iterative.kind == "process" else outcome_specs).append(iterative.reward_func)
    process = ProcessSupervision(process_specs, args, tokenizer, device) if process_specs else None
    classes = reward_processing_classes
    if classes is not None and iterative is not None and iterative.kind != "process":
        classes = [*(classes if isinstance(classes, (list, tuple)) else [classes]), None]  # (the RM's own)
    funcs = resolve_rewards(
        outcome_specs, device=device, allow_empty=process is not None or bool(owned),
        max_completion_length=args.max_completion_length, processing_classes=classes,
    )  # fmt: skip
    weights = reward_weights(args.reward_weights, reward_names(funcs), "reward_weights") + [1.0] * len(owned)
    funcs += owned
    names = reward_names(funcs)
    has_process = process is not None
    gold = GoldWatch.from_run(args.gold_reward, names, weights, args.proxy_threshold, process=has_process)
    if process is not None:
        process.gold = gold  # the process rewards are the proxy
    return RunRewards(funcs, names, torch.tensor(weights, dtype=torch.float32), process, iterative, gold)

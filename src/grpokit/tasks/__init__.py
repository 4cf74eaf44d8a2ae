"""Built-in tasks: generated datasets with exact answers and rule-based rewards.

Usage::

    from grpokit.tasks import get_task
    task = get_task("arithmetic")
    train, test = task.make_splits(seed=0)
    rewards = task.reward_funcs            # {"exact_answer": fn, "format": fn}, TRL signature
    weights = task.default_reward_weights  # {"exact_answer": 1.0, "format": 0.1}

Registered: ``arithmetic`` (column addition, ``arithmetic.py``), ``chain`` (chained +, -, * with
rule-checkable steps and process rewards, ``chain.py``), and two multi-turn tasks whose rows start episodes
in an environment (``grpokit.envs``): ``maze`` (text mazes, one move per turn, ``maze.py``), ``maze_path``
(the same mazes, the whole path in one turn) and ``calculator`` (multiplication with a calculator tool,
``calculator.py``).
"""

from grpokit.tasks.cold_start import (
    COLD_START_THREADS,
    ColdStartSettings,
    cold_start_blueprint,
    cold_start_policy,
    default_cache_root,
)
from grpokit.tasks.registry import TASKS, Task, get_task, register_task

__all__ = [
    "COLD_START_THREADS",
    "TASKS",
    "ColdStartSettings",
    "Task",
    "cold_start_blueprint",
    "cold_start_policy",
    "default_cache_root",
    "get_task",
    "register_task",
]

"""The options of ``grpokit train`` beside ``GRPOConfig``: what to train, on what data, rewarded how, and
how the before/after evaluation and LoRA are set. Read from recipes and the command line
(``cli.recipes``), run by ``cli.train_command``."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from grpokit.config import GRPOConfig
from grpokit.config.values import field_types, typed
from grpokit.data.integrity import InputError
from grpokit.tasks import get_task

if TYPE_CHECKING:
    from grpokit.data.loading import DataSettings

__all__ = ["TrainArgs", "data_settings"]


@dataclass
class TrainArgs:
    """A GRPO run: what to train, on what, rewarded how. GRPOConfig options sit beside these."""

    model: str = "tiny:arithmetic"
    """A model directory or hub id, or ``tiny:<task>`` for the built-in tiny policy of a built-in task
    (built locally with a supervised cold start and cached in ~/.cache/grpokit)."""
    task: str | None = "arithmetic"
    """A built-in task (arithmetic, chain): supplies train/held-out prompts and its reward functions."""
    dataset: str | None = None
    """Training prompts from a local json/jsonl/csv/parquet file (overrides the task's train split)."""
    eval_dataset: str | None = None
    """Held-out prompts from a local file (overrides the task's held-out split)."""
    dataset_config: str | None = None
    """Configuration (subset) name when ``dataset`` / ``eval_dataset`` is a data set name that
    ``datasets.load_dataset`` resolves (a hub id, or a local folder of data files; configs from its
    README.md). TRL ScriptArguments' name."""
    dataset_train_split: str = "train"
    """Split of a named (or folder) ``dataset`` to train on (TRL ScriptArguments' name)."""
    dataset_test_split: str = "test"
    """Split of a named (or folder) ``eval_dataset`` to evaluate on (TRL ScriptArguments' name)."""
    reward_funcs: list[str] | None = None
    """Reward functions: built-in names, ``module:function`` import paths, or reward-model directories.
    None: the task's rewards."""
    process_reward_funcs: list[str] | None = None
    """Process rewards (per-step, per-token advantages): the task's step verifiers by name (chain:
    ``chain_steps``, ``chain_steps_local``) or process-reward-model directories (``grpokit train-rm --kind
    process``). None: outcome supervision only."""
    iterative_rm: str | None = None
    """Iterative GRPO: a reward-model directory (``grpokit train-rm`` output, outcome or process) that keeps
    training on the policy's labelled samples every ``iteration_steps`` steps; its scorer joins the process
    rewards (process RM) or the rewards (outcome RM, listed last for ``reward_weights``)."""
    rm_label_func: str | None = None
    """What labels the policy's samples for ``iterative_rm``: a step verifier or reward name. None: the
    task's first step verifier (process RM) or its correctness reward (outcome RM)."""
    num_train_examples: int | None = None
    """Generate this many training questions for a built-in task (None: the task's default)."""
    num_eval_examples: int | None = None
    """Generate this many held-out questions for a built-in task (None: the task's default)."""
    task_seed: int = 0
    """Seed of the built-in task's question generator."""
    evaluate: bool = True
    """Evaluate the held-out split (greedy accuracy) before and after training."""
    eval_max_new_tokens: int | None = None
    """Completion limit for the evaluation (None: max_completion_length)."""
    use_peft: bool = False
    """Train LoRA adapters (peft) instead of all weights (TRL's name); the reference is then the base model
    with the adapters disabled."""
    lora_r: int = 16
    """LoRA rank."""
    lora_alpha: int = 32
    """LoRA scaling numerator: the adapter's update is (lora_alpha / lora_r) B A."""
    lora_dropout: float = 0.05
    """Dropout on the adapters' input (0 with ``disable_dropout``)."""
    lora_target_modules: list[str] | None = None
    """Module names that get adapters (e.g. ``[q_proj, v_proj]``); None: every linear layer but the LM
    head (peft's ``all-linear``)."""
    config: GRPOConfig = field(default_factory=GRPOConfig)
    """GRPOConfig (flattened on the command line)."""

    def __post_init__(self) -> None:
        """Each option typed by its declared type (``grpokit.config.values``), then the counts checked."""
        types = field_types(TrainArgs)
        for spec in dataclasses.fields(self):
            if spec.name != "config":
                setattr(self, spec.name, typed(types[spec.name], getattr(self, spec.name), spec.name))
        if not self.model.strip():
            raise InputError(
                "model: empty; give a model directory, a hub id, or tiny:<task> (e.g. tiny:arithmetic)"
            )
        for name in ("model", "dataset", "eval_dataset"):  # ~ as a shell expands it
            value = getattr(self, name)
            if isinstance(value, str) and value.startswith("~"):
                setattr(self, name, os.path.expanduser(value))
        if self.task is not None:
            get_task(self.task)  # an unknown name: the known ones listed
        for name in ("dataset_train_split", "dataset_test_split"):
            if not getattr(self, name):
                raise InputError(f"{name} must name a split, got ''")
        for name, none_means in _COUNTS.items():
            value = getattr(self, name)
            if value is not None and value < 1:
                raise InputError(f"{name} must be >= 1 (or None: {none_means}), got {value}")
        if self.lora_r < 1:
            raise InputError(f"lora_r must be >= 1 (the adapters' rank), got {self.lora_r}")
        if self.lora_alpha <= 0:
            raise InputError(f"lora_alpha must be > 0 (the adapters' scale is lora_alpha / lora_r), got "
                             f"{self.lora_alpha}")  # fmt: skip
        if not 0 <= self.lora_dropout < 1:
            raise InputError(f"lora_dropout must be in [0, 1), got {self.lora_dropout}")


_COUNTS = {
    "num_train_examples": "the task's default",
    "num_eval_examples": "the task's default; evaluate=false skips the evaluation",
    "eval_max_new_tokens": "max_completion_length",
}
"""TrainArgs' counts -> what None means for each."""


def data_settings(args: TrainArgs) -> DataSettings:
    """How ``dataset`` / ``eval_dataset`` are read: the splits and configuration given here, the columns as
    the config maps them."""
    from grpokit.data.loading import DataSettings

    config = args.config
    return DataSettings(
        dataset_config=args.dataset_config,
        dataset_train_split=args.dataset_train_split,
        dataset_test_split=args.dataset_test_split,
        prompt_column=config.prompt_column,
        column_mapping=config.column_mapping,
    )

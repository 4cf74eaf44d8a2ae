"""``grpokit eval model=... eval_dataset=... reward_funcs=[...] [key=value ...]``: any model on any prompt
file, graded by any reward functions and/or an answer extractor; or a built-in task's held-out split
(``task=arithmetic``, the default when no eval_dataset is given, with its ``tiny:<task>`` policy).

Options are ``key=value`` (typed by each option's declared type, as for ``grpokit train``) or ``--key
value``. What the output keys mean: :func:`grpokit.eval.grade_completions` and docs/evaluation.md.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import tyro

from grpokit.cli.recipes import TYRO_MARKERS, to_flag_arguments
from grpokit.cli.train_command import resolve_model, task_splits
from grpokit.config.values import field_types, typed_value
from grpokit.data.integrity import InputError
from grpokit.data.run_folder import check_writable
from grpokit.parallel.stopping import StopSignals

__all__ = [
    "EvalArgs",
    "EvalPlan",
    "eval_main",
    "load_eval_model",
    "parse_eval_args",
    "plan_eval",
    "resolve_device",
    "run_eval",
]

DEFAULT_TASK = "arithmetic"
TASK_MAX_NEW_TOKENS = 64
DATASET_MAX_NEW_TOKENS = 512


@dataclass
class EvalArgs:
    """Evaluate a model: generate for every prompt of a data set (or a built-in task's held-out split) and
    grade with reward functions and/or an answer extractor. Options may also be given as key=value."""

    model: str
    """A model directory or hub id, or ``tiny:<task>`` for the built-in cold-started tiny policy."""
    eval_dataset: str | None = None
    """Prompts to evaluate: a local json/jsonl/csv/parquet file or folder of data files, or a hub data set
    name. Rows need a prompt (a string or chat messages; see prompt_column) and whatever columns the graders
    read (``solution`` for answer grading and maj@k)."""
    dataset_config: str | None = None
    """The configuration (subset) of a hub data set or folder, e.g. ``main`` for gsm8k."""
    dataset_split: str = "test"
    """The split of a hub data set, folder or DatasetDict to evaluate (a single file is read whole)."""
    prompt_column: str = "prompt"
    """The column holding the prompt, e.g. ``question``."""
    column_mapping: dict[str, str] | None = None
    """Column renames applied first, ``{old: new}``, e.g. ``{answer: solution}``."""
    task: str | None = None
    """A built-in task (arithmetic, chain): without eval_dataset its held-out split is evaluated (default
    arithmetic); its reward names (exact_answer, format, ...) may be used in reward_funcs, and unless
    reward_funcs / answer_extractor are given it grades with its correctness reward and answer extractor."""
    reward_funcs: list[str] | None = None
    """Reward functions as training takes them: built-in names (accuracy, think_format, ...),
    ``module.function`` / ``module:function`` import paths, reward-model directories, or the task's names.
    A completion's reward is their weighted sum."""
    reward_weights: list[float] | None = None
    """One weight per reward function (default 1.0 each)."""
    answer_extractor: str | None = None
    """How to read the final answer of a completion: boxed, answer_tag, hash, last_number, auto, or a
    ``module.function`` path (str -> str | None). Without reward_funcs a completion is correct when its
    answer equals the row's ``solution``; with num_samples > 1 it enables maj@k."""
    correct_threshold: float = 1.0
    """A completion is correct when its (weighted) reward is >= this."""
    num_samples: int = 1
    """Completions per prompt (k); k > 1 reports pass@k, mean@k and (with an answer extractor) maj@k."""
    pass_k: list[int] | None = None
    """Smaller budgets j < num_samples to report pass@j for as well (same unbiased estimator), e.g. [1, 4]."""
    temperature: float | None = None
    """Sampling temperature; 0 is greedy decoding. Default: 0 when num_samples = 1, else 1.0."""
    top_p: float = 1.0
    """Nucleus sampling mass (1.0 = off); ignored when greedy."""
    top_k: int = 0
    """Keep only the top_k most likely tokens (0 = off); ignored when greedy."""
    max_new_tokens: int | None = None
    """Completion limit in tokens. Default: 64 for a built-in task, 512 for an eval_dataset."""
    max_prompt_length: int | None = None
    """Cut longer prompts from the left, as training does (None: keep whole)."""
    chat_template_kwargs: dict[str, str | int | float | bool] | None = None
    """Extra chat-template variables for conversational prompts, e.g. ``{enable_thinking: false}``."""
    device: str = "auto"
    """cpu, cuda, cuda:1, ... or auto (cuda when available, else cpu)."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Weights' dtype; auto keeps the checkpoint's own."""
    generation_backend: Literal["auto", "fast", "transformers"] = "auto"
    """auto: grpokit's fast sampler where it supports the model (llama, qwen2, qwen3, mistral, and the
    mixtures of experts qwen2_moe, qwen3_moe, mixtral), else transformers' model.generate."""
    batch_size: int = 64
    """Prompts per generation call (each with its num_samples completions)."""
    seed: int = 0
    """Sampling seed."""
    per_example: bool = False
    """Add ``records``: per prompt its completions, rewards, correctness and extracted answers."""
    output: str | None = None
    """Write the result as JSON to this file (checked before the model loads; written aside, then renamed
    into place, so a stopped evaluation never leaves half a file)."""
    overwrite_output: bool = False
    """Replace an existing ``output`` file (without it, an existing one is refused: another evaluation's
    result)."""
    num_eval_examples: int | None = None
    """Evaluate only this many prompts: a built-in task generates this many, an eval_dataset's first rows."""
    task_seed: int = 0
    """Seed of the built-in task's question generator (and of the tiny:<task> policy)."""
    progress: bool = True
    """Show a progress bar over prompts (on stderr)."""
    environment: str | None = None
    """Multi-turn episodes in this environment (a built-in name such as maze or calculator, or an import path
    module.Class / module.step_function) instead of single completions; a task with an environment uses its
    own. Without reward_funcs its reward grades (accuracy: solve rate; pass@k over episodes)."""
    environment_kwargs: dict[str, str | int | float | bool] | None = None
    """Keyword arguments of the environment class (default: the task's)."""
    max_turns: int = 8
    """Policy turns per episode at most."""
    max_turn_tokens: int | None = None
    """Tokens per policy turn at most (None: what is left of max_new_tokens, which bounds the episode)."""
    environment_timeout: float | None = 30.0
    """Seconds one environment call may take before its episode counts as failed."""


def resolve_device(spec: str) -> str:
    """``auto`` -> ``cuda`` when a GPU is available, else ``cpu``; anything else is checked (a device of
    this machine) and returned."""
    import torch

    if spec == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(spec)
    except RuntimeError as error:
        raise InputError(f"device: {spec!r} is not a torch device (cpu, cuda, cuda:1, auto)") from error
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise InputError(f"device={spec}: this machine has no CUDA device; use device=cpu (or auto)")
        if device.index is not None and device.index >= count:
            raise InputError(
                f"device={spec}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}"
            )
    elif device.type not in ("cpu", "meta"):
        backend = getattr(torch, device.type, None)
        available = getattr(backend, "is_available", None)
        if callable(available) and not available():
            raise InputError(
                f"device={spec}: no {device.type} device on this machine; use device=cpu (or auto)"
            )
    return spec


def load_eval_model(path: str, device: str = "auto", dtype: str = "auto") -> tuple[Any, Any]:
    """(model in eval mode on ``device`` in ``dtype``, tokenizer) of a directory or hub id; a vision-language
    model's processor instead of its tokenizer (``grpokit.models.vision``)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    from grpokit.data.integrity import check_model_dir
    from grpokit.models import load_tokenizer
    from grpokit.models.loading import load_processor
    from grpokit.models.vision import is_vision_language

    check_model_dir(path, "model")  # a damaged config.json or weights file: one sentence naming it
    weights: Any = "auto" if dtype == "auto" else getattr(torch, dtype)
    vision = is_vision_language(AutoConfig.from_pretrained(path))
    auto = AutoModelForImageTextToText if vision else AutoModelForCausalLM
    model = auto.from_pretrained(path, dtype=weights)
    preparer = load_processor(path) if vision else load_tokenizer(path)
    return model.to(resolve_device(device)).eval(), preparer


def _graders(args: EvalArgs, task: Any) -> tuple[list[Any], Any]:
    """(reward function specs, answer extractor spec): the task's names resolve to its functions; a task
    grades with its correctness reward and extractor unless told otherwise."""
    rewards: list[Any] = list(args.reward_funcs or [])
    extractor: Any = args.answer_extractor
    if task is not None:
        rewards = [task.reward_funcs.get(r, r) for r in rewards]
        if not rewards and extractor is None:
            rewards = [task.reward_funcs[task.correctness_reward]]
        if extractor is None:
            extractor = task.extract_answer
    return rewards, extractor


def _rows(args: EvalArgs, task_name: str | None) -> list[dict[str, Any]]:
    """The built-in task's held-out split, or ``eval_dataset`` loaded as training loads data sets
    (``grpokit.data.loading.load_dataset_rows``: split, configuration, column renames, prompt column)."""
    from grpokit.data.loading import DataSettings, load_dataset_rows

    if args.eval_dataset is None:
        return task_splits(task_name, args)[1]
    settings = DataSettings(
        dataset_config=args.dataset_config,
        dataset_test_split=args.dataset_split,
        prompt_column=args.prompt_column,
        column_mapping=args.column_mapping,
    )
    rows = load_dataset_rows(args.eval_dataset, settings, name="eval_dataset")
    return rows if args.num_eval_examples is None else rows[: args.num_eval_examples]


@dataclass
class EvalPlan:
    """What ``run_eval`` evaluates, resolved and checked before any model loads."""

    rows: list[dict[str, Any]]
    reward_funcs: list[Any]
    extractor: Any
    task: str | None
    temperature: float
    max_new_tokens: int


def plan_eval(args: EvalArgs) -> EvalPlan:
    """Rows, graders and decoding of ``args``; every input error raises ValueError (or FileNotFoundError)
    naming the option, before the model loads."""
    from grpokit.eval import resolve_extractor, validate_grading
    from grpokit.rewards import resolve_rewards
    from grpokit.tasks.evaluation import task_game

    task_name = args.task or (DEFAULT_TASK if args.eval_dataset is None else None)
    task = None
    if task_name is not None:
        from grpokit.tasks import TASKS

        if task_name not in TASKS:
            raise InputError(f"task: unknown built-in task {task_name!r}; known tasks: {sorted(TASKS)}")
        task = TASKS[task_name]
    rows = _rows(args, task_name)
    reward_specs, extractor_spec = _graders(args, task)
    try:
        reward_funcs = resolve_rewards(reward_specs, allow_empty=True)
    except ValueError as error:
        raise ValueError(f"reward_funcs: {error}") from error
    extractor = resolve_extractor(extractor_spec)
    _refuse_missing_columns(args, rows, reward_funcs)
    temperature = args.temperature
    if temperature is None:
        temperature = 0.0 if args.num_samples == 1 else 1.0
    validate_grading(
        rows,
        num_reward_funcs=len(reward_funcs),
        extractor=extractor,
        num_samples=args.num_samples,
        temperature=temperature,
        reward_weights=args.reward_weights,
        pass_k=args.pass_k or (),
    )
    max_new = args.max_new_tokens
    if max_new is None and task is not None and task_game(task) is not None:  # a whole game's budget
        max_new = task.cold_start.get("max_new_tokens")
    if max_new is None:
        max_new = TASK_MAX_NEW_TOKENS if args.eval_dataset is None else DATASET_MAX_NEW_TOKENS
    if max_new < 1:
        raise InputError(f"max_new_tokens must be >= 1, got {max_new}")
    if args.batch_size < 1:
        raise InputError(f"batch_size must be >= 1, got {args.batch_size}")
    resolve_device(args.device)
    check_output_file(args.output, args.overwrite_output)
    return EvalPlan(rows, reward_funcs, extractor, task_name, temperature, max_new)


def check_options(args: EvalArgs) -> None:
    """The options' own ranges, before anything is read: the sampling settings as GRPOConfig checks them
    (``config.validation.check_sampling_values``), the counts, the threshold, the environment's options."""
    import math

    from grpokit.config.validation import check_sampling_values

    temperature = args.temperature if args.temperature is not None else 0.0
    check_sampling_values(temperature=temperature, top_p=args.top_p, top_k=args.top_k, owner="",
                          greedy_allowed=True)  # fmt: skip
    if not math.isfinite(args.correct_threshold):
        raise InputError(f"correct_threshold must be a finite number, got {args.correct_threshold}")
    for name in ("num_samples", "num_eval_examples", "max_prompt_length", "max_turns", "max_turn_tokens"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise InputError(f"{name} must be >= 1, got {value}")
    if args.environment_timeout is not None and not args.environment_timeout > 0:
        raise InputError(
            f"environment_timeout must be > 0 seconds (or None: unbounded), got {args.environment_timeout}"
        )
    if args.environment_kwargs and args.environment is None:
        from grpokit.envs.sampler import refuse_unused_environment_kwargs
        from grpokit.tasks import TASKS

        task = TASKS.get(args.task or (DEFAULT_TASK if args.eval_dataset is None else ""))
        if task is None or task.environment is None:  # (a task's environment takes them)
            refuse_unused_environment_kwargs(args.environment_kwargs)


def check_output_file(output: str | None, overwrite: bool) -> None:
    """``output`` can take the result: a file path (not a folder) whose folder can be made and written,
    and no earlier result there unless ``overwrite``."""
    if output is None:
        return
    path = Path(output)
    if path.is_dir():
        raise InputError(f"output: {output} is a folder; give a file path, e.g. output={path / 'eval.json'}")
    if path.exists() and not overwrite:
        raise InputError(
            f"output: {output} already exists (another evaluation's result?); give another file, or "
            "overwrite_output=true to replace it"
        )
    check_writable(path.parent, "output's folder")  # a file, or not writable: refused


def _write_output(path: Path, result: dict[str, Any]) -> None:
    """The result as JSON, written aside and renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(result, indent=2))
    os.replace(tmp, path)


def _refuse_missing_columns(args: EvalArgs, rows: list[dict[str, Any]], reward_funcs: list[Any]) -> None:
    """A column a reward function reads that no row has: refused naming the data, the column and the
    reward, before the model loads (``grpokit.rewards.base.refuse_missing_columns``)."""
    from grpokit.rewards.base import refuse_missing_columns
    from grpokit.rewards.scoring import reward_names

    where = f"eval_dataset {args.eval_dataset}" if args.eval_dataset is not None else f"task {args.task}"
    refuse_missing_columns(reward_names(reward_funcs), reward_funcs, rows, where)


def run_eval(args: EvalArgs, plan: EvalPlan | None = None) -> dict[str, Any]:
    """Plan (:func:`plan_eval`, unless given), load the model, evaluate; print the metrics (``records`` too
    only when no output file takes them) and write the whole result as JSON to ``output``."""
    from grpokit.eval import evaluate_model
    from grpokit.tasks.evaluation import game_evaluation

    if plan is None:
        check_options(args)
        plan = plan_eval(args)
    path = resolve_model(args.model, seed=args.task_seed)
    model, tokenizer = load_eval_model(path, args.device, args.dtype)
    make_game = _game(args, plan)
    if make_game is not None:  # a game: its policy against the scripted players (and its exploitability)
        result = game_evaluation(
            make_game, model, tokenizer, plan.rows, max_new_tokens=plan.max_new_tokens,
            max_turn_tokens=args.max_turn_tokens, temperature=plan.temperature, seed=args.seed,
        )  # fmt: skip
        return _report(args, {"model": args.model, "eval_dataset": args.eval_dataset, "task": plan.task,
                              "game": type(make_game()).__name__, **result})  # fmt: skip
    template = {k: typed_value(v) for k, v in (args.chat_template_kwargs or {}).items()}
    result = evaluate_model(
        model,
        tokenizer,
        plan.rows,
        reward_funcs=plan.reward_funcs,
        reward_weights=args.reward_weights,
        answer_extractor=plan.extractor,
        correct_threshold=args.correct_threshold,
        pass_k=args.pass_k or (),
        num_samples=args.num_samples,
        temperature=plan.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        max_new_tokens=plan.max_new_tokens,
        max_prompt_length=args.max_prompt_length,
        chat_template_kwargs=template or None,
        generation_backend=args.generation_backend,
        batch_size=args.batch_size,
        seed=args.seed,
        per_example=args.per_example,
        progress=args.progress,
        episodes=_episode_runner(args, plan, tokenizer),
    )
    result = {"model": args.model, "eval_dataset": args.eval_dataset, "task": plan.task, **result}
    return _report(args, result)


def _report(args: EvalArgs, result: dict[str, Any]) -> dict[str, Any]:
    """Print the result (``records`` only when no output file takes them) and write it to ``output``."""
    shown = {k: v for k, v in result.items() if k != "records"} if args.output else result
    print(json.dumps(shown, indent=2))
    if args.output:
        _write_output(Path(args.output), result)
    return result


def _game(args: EvalArgs, plan: EvalPlan) -> Any:
    """A factory of the evaluated game (``environment``, or the task's environment) when it is a game;
    None otherwise."""
    from grpokit.envs import game_factory

    environment = _environment(args, plan)
    return None if environment is None else game_factory(*environment)


def _environment(args: EvalArgs, plan: EvalPlan) -> tuple[Any, Any] | None:
    """``(environment, its keyword arguments)``: ``environment`` or the task's, with the task's keyword
    arguments unless given; None when neither names one."""
    from grpokit.tasks import TASKS

    task = TASKS.get(plan.task) if plan.task is not None else None
    spec = args.environment or (task.environment if task is not None else None)
    if spec is None:
        return None
    kwargs = args.environment_kwargs
    if kwargs is None and task is not None and spec == task.environment:
        kwargs = task.environment_kwargs
    return spec, kwargs


def _episode_runner(args: EvalArgs, plan: EvalPlan, tokenizer: Any) -> Any:
    """The episode runner of ``environment`` (or the task's environment); None for single completions."""
    from grpokit.envs.episodes import EpisodeRunner

    environment = _environment(args, plan)
    if environment is None:
        return None
    spec, kwargs = environment
    return EpisodeRunner.for_rows(
        spec, tokenizer, plan.rows, environment_kwargs=kwargs, max_turns=args.max_turns,
        max_tokens=plan.max_new_tokens, max_turn_tokens=args.max_turn_tokens,
        timeout=args.environment_timeout, on_error="none",
    )  # fmt: skip


def parse_eval_args(argv: list[str]) -> EvalArgs:
    """``key=value`` / ``--key value`` arguments -> EvalArgs (tyro; ``--help`` lists every option)."""
    args = tyro.cli(
        EvalArgs,
        args=to_flag_arguments(argv, field_types(EvalArgs)),
        prog="grpokit eval",
        description="Evaluate a model. Options below may also be given as key=value.",
        use_underscores=True,
        config=TYRO_MARKERS,
    )
    for name in ("model", "eval_dataset", "output"):  # ~ as a shell expands it
        value = getattr(args, name)
        if isinstance(value, str) and value.startswith("~"):
            setattr(args, name, os.path.expanduser(value))
    return args


def eval_main(argv: list[str]) -> int:
    """``grpokit eval [key=value | --key value ...]``; returns the exit status. Bad input stops with a
    message naming the option: from the parser (exit status 2), or ``SystemExit("grpokit eval: ...")``."""
    args = parse_eval_args(argv)
    try:
        check_options(args)
        plan = plan_eval(args)  # fail on bad input before the model loads
    except (ValueError, FileNotFoundError) as error:
        raise SystemExit(f"grpokit eval: {error}") from error
    with StopSignals.in_force():  # a signal stops it at once: nothing is written
        run_eval(args, plan)
    return 0

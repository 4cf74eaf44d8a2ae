"""What ``grpokit train`` runs: a recipe (model, data, rewards, GRPOConfig) end to end, with a held-out
evaluation before and after training written to ``<output_dir>/eval_summary.json``."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpokit.cli.held_out import HeldOut
from grpokit.cli.train_args import TrainArgs, data_settings
from grpokit.cli.train_rm_command import TRAINED_RM_PREFIX, resolve_trained_rm
from grpokit.config import GRPOConfig, resolution
from grpokit.data.integrity import InputError
from grpokit.data.run_folder import claim_run_folder
from grpokit.parallel.stopping import RunInterrupted, StopSignals
from grpokit.train.preflight import (
    check_output_folder,
    check_policy_fits,
    check_rows_per_step,
    longest_prompt,
    output_folder_reads,
    read_model_config,
    resumes_in,
)


def peft_config(args: TrainArgs) -> Any:
    """The ``peft.LoraConfig`` of ``use_peft`` runs (None otherwise)."""
    if not args.use_peft:
        return None
    try:
        from peft import LoraConfig
    except ImportError as err:
        raise SystemExit("grpokit: use_peft needs `pip install grpokit[peft]`") from err
    targets = list(args.lora_target_modules) if args.lora_target_modules else "all-linear"
    return LoraConfig(
        r=args.lora_r,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        target_modules=targets,
        task_type="CAUSAL_LM",
    )


def resolve_model(spec: str, *, seed: int = 0) -> str:
    """``tiny:<task>`` -> the cached cold-started tiny policy directory; anything else unchanged."""
    if spec.startswith("tiny:"):
        from grpokit.tasks import cold_start_policy

        return str(cold_start_policy(spec.split(":", 1)[1], seed=seed))
    return spec


def task_splits(task_name: str, args: Any) -> tuple[list[dict], list[dict]]:
    """(train rows, held-out rows) of a built-in task, sized by ``args``' ``num_*_examples``."""
    from grpokit.tasks import get_task

    task = get_task(task_name)
    sizes = {}
    if getattr(args, "num_train_examples", None) is not None:
        sizes["num_train"] = args.num_train_examples
    if args.num_eval_examples is not None:
        sizes["num_test"] = args.num_eval_examples
    return task.make_splits(seed=args.task_seed, **sizes)


def training_data(args: TrainArgs) -> tuple[Any, Any, list[Any], list[float] | None]:
    """(train rows, held-out rows, reward functions, reward weights) for a recipe: ``dataset`` and
    ``eval_dataset`` files are loaded here (checked before any model loads) and cut to
    ``num_train_examples`` / ``num_eval_examples`` when those are set; ``train-rm:<kind>`` rewards stay names
    (``resolve_trained_rm`` trains them when the run is built)."""
    train_rows: Any = None
    if args.dataset is not None:
        train_rows = _rows_as_read(args, args.dataset, "dataset", args.num_train_examples)
    eval_rows: Any = None
    if args.eval_dataset is not None:
        eval_rows = _rows_as_read(args, args.eval_dataset, "eval_dataset", args.num_eval_examples)
    rewards: list[Any] | None = list(args.reward_funcs) if args.reward_funcs else None
    weights = args.config.reward_weights
    if args.task is not None:
        from grpokit.tasks import get_task

        task = get_task(args.task)
        task_train, task_eval = task_splits(args.task, args)
        train_rows = task_train if train_rows is None else train_rows
        eval_rows = task_eval if eval_rows is None else eval_rows
        if rewards is None:
            rewards = list(task.reward_funcs.values())
            if weights is None:
                weights = [task.default_reward_weights.get(name, 1.0) for name in task.reward_funcs]
        else:  # the task's own reward names (exact_answer, format, ...) resolve to its functions
            rewards = [task.reward_funcs.get(r, r) if isinstance(r, str) else r for r in rewards]
    if train_rows is None:
        raise InputError("give a task or a dataset")
    if not rewards:
        raise InputError("give reward_funcs (or a task that has them)")
    return train_rows, eval_rows, rewards, weights


def _rows_as_read(args: TrainArgs, source: str, name: str, count: int | None) -> list[Any]:
    """The first ``count`` rows of a data file, folder or data set name, as read (the trainer renames their
    columns itself), checked now as the run will use them: columns mapped, every row with a prompt."""
    from grpokit.data.loading import load_dataset_rows
    from grpokit.data.sources import source_rows

    settings = data_settings(args)
    split = settings.dataset_test_split if name == "eval_dataset" else settings.dataset_train_split
    rows = source_rows(source, split=split, dataset_config=settings.dataset_config, name=name)[:count]
    load_dataset_rows(rows, settings, name=name)  # a missing column or prompt: refused naming the row
    return rows


def process_supervision(args: TrainArgs) -> dict[str, Any]:
    """GRPOTrainer keyword arguments for process rewards and iterative GRPO: task names resolve to the
    task's functions; anything else (built-in names, directories) is passed on."""
    task = None
    if args.task is not None:
        from grpokit.tasks import get_task

        task = get_task(args.task)
    steps = dict(task.process_reward_funcs) if task is not None else {}
    kwargs: dict[str, Any] = {}
    if args.process_reward_funcs:
        names = [steps.get(name, name) for name in args.process_reward_funcs]
        kwargs["process_reward_funcs"] = [resolve_trained_rm(name) for name in names]
    if args.iterative_rm is not None:
        from grpokit.rm import reward_model_kind

        iterative_rm = resolve_trained_rm(args.iterative_rm)
        kind = reward_model_kind(iterative_rm)
        label: Any = args.rm_label_func
        if kind == "process":
            label = steps.get(label, label) if label is not None else next(iter(steps.values()), None)
        elif task is not None:
            label = task.reward_funcs.get(label, label) if label is not None else None
            label = label if label is not None else task.reward_funcs[task.correctness_reward]
        kwargs["iterative_reward_model"] = iterative_rm
        kwargs["rm_label_func"] = label
    return kwargs


def _env(result: dict[str, Any]) -> str:
    """A multi-turn evaluation's episode means (``env/turns``, ``env/tool_calls``, ...) and a game's
    exploitability, for a summary line."""
    shown = [f"{key} {value:.2f}" for key, value in result.items() if key.startswith("env/")]
    if "game/exploitability" in result:
        shown.append(f"exploitability {result['game/exploitability']:.3f}")
    return f" ({', '.join(shown)})" if shown else ""


def with_task_environment(config: GRPOConfig, task_name: str | None) -> GRPOConfig:
    """A multi-turn task's episodes run in its environment unless the recipe names another; the task's
    environment keyword arguments are the defaults of the recipe's."""
    if task_name is None or config.environment is not None:
        return config
    from grpokit.tasks import get_task

    task = get_task(task_name)
    if task.environment is None:
        return config
    kwargs = {**task.environment_kwargs, **config.environment_kwargs}
    return dataclasses.replace(config, environment=task.environment, environment_kwargs=kwargs)


def print_memory_plan(args: TrainArgs) -> None:
    """Before any weights load, the main process prints what one device will need (``grpokit plan``)."""
    import os

    from grpokit.cli.plan_command import describe_plan
    from grpokit.parallel.distributed import placement

    if int(os.environ.get("RANK", "0")) != 0:
        return
    from grpokit.parallel.zero import zero_stage

    processes = int(os.environ.get("WORLD_SIZE", "1"))
    strategy = placement(args.config, processes)
    if strategy == "zero" and zero_stage(args.config) == 3:
        strategy = "zero3"
    print(describe_plan(args, processes, strategy), flush=True)


def publish_model_card(args: TrainArgs, config: GRPOConfig, trainer: Any, summary: dict[str, Any]) -> None:
    """Rewrite the model card in output_dir with the held-out evaluation and the recipe's model and task
    names (the trainer's ``Publisher``); with ``push_to_hub`` push it again, with ``eval_summary.json``."""
    publisher = trainer.publisher
    dataset = args.dataset or (f"the built-in `{args.task}` task" if args.task else None)
    publisher.write_card(
        config.output_dir, trainer.reward_names, trainer.logger.read, summary, base_model=args.model,
        dataset_name=dataset,
    )  # fmt: skip
    publisher.push(config.output_dir, "Held-out evaluation")


def check_resume(config: GRPOConfig) -> None:
    """A resume is checked before the cold start and before any weights load (the checkpoint exists and is
    whole, the config's changes are allowed: ``grpokit.parallel.resume``); the trainer checks the rest
    (process count, training rows, model shape) when it is built, before any evaluation."""
    if not config.resume_from_checkpoint:
        return
    from grpokit.parallel.resume import plan_resume

    plan_resume(config.resume_from_checkpoint, config, config.output_dir)


def held_out_accuracy(trainer: Any, held_out: Any, args: TrainArgs, config: GRPOConfig) -> dict[str, Any]:
    """Greedy accuracy on the held-out rows, graded as ``held_out`` says (``cli.held_out``)."""
    max_new_tokens = args.eval_max_new_tokens or config.max_completion_length
    if held_out.task is not None:
        from grpokit.tasks.evaluation import task_accuracy

        return task_accuracy(
            trainer.unwrapped_model, trainer.tokenizer, held_out.rows, held_out.task,
            max_new_tokens=max_new_tokens, max_turns=config.max_turns, max_turn_tokens=config.max_turn_tokens,
            environment_kwargs=config.environment_kwargs,
        )  # fmt: skip
    from grpokit.eval import evaluate_model

    return evaluate_model(
        trainer.unwrapped_model, trainer.processing_class, held_out.rows, reward_funcs=trainer.reward_funcs,
        reward_weights=trainer.reward_weights, max_new_tokens=max_new_tokens,
        max_prompt_length=config.max_prompt_length, chat_template_kwargs=config.chat_template_kwargs,
    )  # fmt: skip


@dataclass
class CheckedRun:
    """What ``grpokit train`` runs, resolved and checked before any model loads (``check_run``)."""

    config: GRPOConfig
    """The recipe's config with the task's environment and reward weights."""
    train_rows: list[dict[str, Any]]
    eval_rows: list[dict[str, Any]] | None
    """Rows for an in-training evaluation schedule (None without one)."""
    rewards: list[Any]
    """Reward specifications (``train-rm:<kind>`` still names, trained when the run is built)."""
    held_out: HeldOut


def check_run(args: TrainArgs) -> CheckedRun:
    """Every check of a ``grpokit train`` run that needs no model, in the order a user would fix them: the
    data (files loaded, columns), the rewards (names, import paths, weights), the held-out evaluation, a
    resume, the output folder, then what the model's config says (vocabulary, positions, LoRA targets) and
    how many rows a step takes, read without weights (``tiny:<task>``: its blueprint, before any cold
    start). An ``InputError`` naming the option otherwise."""
    from grpokit.cli.held_out import plan_held_out
    from grpokit.data.loading import load_dataset_rows
    from grpokit.envs.sampler import refuse_unused_environment_kwargs

    train_rows, eval_rows, rewards, weights = training_data(args)
    config = with_task_environment(dataclasses.replace(args.config, reward_weights=weights), args.task)
    if args.dataset is not None and args.eval_dataset is None:
        eval_rows = None  # the task's held-out questions are not held out from the user's data
    config.check_eval_dataset(eval_rows is not None, "give eval_dataset=FILE (held-out rows)")
    if config.environment is None:
        refuse_unused_environment_kwargs(config.environment_kwargs)
    check_reward_names(args, config, rewards)
    held_out = plan_held_out(args, config, eval_rows, rewards)
    check_resume(config)
    reads = output_folder_reads(args.model, args.dataset, args.eval_dataset)
    check_output_folder(config, reads)
    check_model_inputs(args, config, load_dataset_rows(train_rows, config.data_settings(), name="dataset"))
    in_training = resolution.eval_strategy(config) != "no" or config.eval_on_start  # eval_steps, ...
    return CheckedRun(config, train_rows, eval_rows if in_training else None, rewards, held_out)


def check_reward_names(args: TrainArgs, config: GRPOConfig, rewards: list[Any]) -> None:
    """The rewards resolve (``train-rm:<kind>`` by its kind; reward-model directories by their files) and
    ``reward_weights`` has one weight per reward function, before anything is trained or loaded."""
    from grpokit.rewards import check_reward_specs
    from grpokit.rewards.process_rewards import check_process_reward_specs

    named = [spec for spec in rewards if not _trained_rm_name(spec)]
    check_reward_specs(named, "reward_funcs", config.max_completion_length)
    if args.process_reward_funcs:
        steps = _task_step_verifiers(args)
        process = [steps.get(n, n) for n in args.process_reward_funcs if not _trained_rm_name(n)]
        check_process_reward_specs(process)
    count = len(rewards) + (1 if _iterative_kind(args) == "outcome" else 0)
    weights = config.reward_weights
    if weights is not None and len(weights) != count:
        raise InputError(
            f"GRPOConfig.reward_weights has {len(weights)} values but the run has {count} reward "
            f"function(s) ({', '.join(_spec_name(s) for s in rewards)}"
            f"{', the iterative reward model' if count > len(rewards) else ''}); give one weight each"
        )


def _trained_rm_name(spec: Any) -> bool:
    """``train-rm:<kind>``, checked by its kind (trained when the run is built)."""
    if not (isinstance(spec, str) and spec.startswith(TRAINED_RM_PREFIX)):
        return False
    if spec[len(TRAINED_RM_PREFIX) :] not in ("outcome", "process"):
        raise InputError(f"{spec!r}: the kind after {TRAINED_RM_PREFIX!r} must be 'outcome' or 'process'")
    return True


def _task_step_verifiers(args: TrainArgs) -> dict[str, Any]:
    if args.task is None:
        return {}
    from grpokit.tasks import get_task

    return dict(get_task(args.task).process_reward_funcs)


def _iterative_kind(args: TrainArgs) -> str | None:
    """The kind of ``iterative_rm`` (outcome or process), read from its config without weights."""
    spec = args.iterative_rm
    if spec is None:
        return None
    if _trained_rm_name(spec):
        return spec[len(TRAINED_RM_PREFIX) :]
    if not Path(spec).is_dir():
        raise InputError(f"iterative_rm: {spec!r} is not a reward-model directory (grpokit train-rm output)")
    from grpokit.rm import reward_model_kind

    return reward_model_kind(spec)


def _spec_name(spec: Any) -> str:
    return spec if isinstance(spec, str) else getattr(spec, "__name__", type(spec).__name__)


def check_model_inputs(args: TrainArgs, config: GRPOConfig, rows: list[dict[str, Any]]) -> None:
    """The model's config against the run (vocabulary, positions, LoRA targets) and the rows a step takes,
    without weights: a ``tiny:<task>`` policy's blueprint (no cold start), else the config and tokenizer of
    the model directory or hub id."""
    from grpokit.models.policy import tokenizer_of
    from grpokit.models.vision import is_vision_language

    if args.model.startswith("tiny:"):
        from grpokit.tasks import TASKS, cold_start_blueprint

        name = args.model.split(":", 1)[1]
        if name not in TASKS:
            raise InputError(f"model: {args.model!r}: no built-in task {name!r} (tiny:<task>, one of "
                             f"{', '.join(sorted(TASKS))})")  # fmt: skip
        skeleton, tokenizer = cold_start_blueprint(name, seed=args.task_seed)
        model_config = skeleton.config
    else:
        model_config = read_model_config(args.model, config.trust_remote_code)
        tokenizer, skeleton = tokenizer_of(args.model, config.trust_remote_code), None
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    what = "dataset" if args.dataset else f"the {args.task} task's training rows"
    check_rows_per_step(len(rows), config.batch_plan(processes).prompts, what)
    # (a prompt with images is measured when it is encoded with them: the trainer refuses one too long)
    longest = 0 if is_vision_language(model_config) else longest_prompt(rows, tokenizer, config)
    check_policy_fits(
        model_config, tokenizer, config, prompt_tokens=longest, peft_config=peft_config(args),
        skeleton=skeleton,
    )  # fmt: skip


class Stage:
    """Where a ``grpokit train`` run is, for the line it ends with when a signal stops it."""

    def __init__(self) -> None:
        self.now = "checking its inputs"

    def __call__(self, now: str) -> None:
        self.now = now


def run_training(args: TrainArgs, command: list[str] | None = None) -> dict[str, Any]:
    """Train per the recipe; evaluate held-out greedy accuracy before and after; write eval_summary.json.

    Every input is checked before anything loads (``check_run``); then the run claims output_dir
    (``grpokit.data.run_folder``: refused if another run's results or a live run are there, cleared
    first with ``overwrite_output_dir``) and holds it to the end. SIGTERM/SIGINT stop it at any moment:
    during a step at the step's end with a checkpoint, during a checkpoint or the final save once it is
    written, elsewhere at once; the last line says what the folder holds and the command that continues it
    (``command``: this run's arguments, to repeat them)."""
    started = time.perf_counter()
    checked = check_run(args)
    print_memory_plan(args)
    config = checked.config
    output_dir = Path(config.output_dir)
    main = int(os.environ.get("RANK", "0")) == 0
    stage = Stage()
    summary: dict[str, Any] = {
        "model": args.model,
        "task": args.task if args.dataset is None else None,
        "train_dataset": args.dataset or (f"the built-in `{args.task}` task" if args.task else None),
        "held_out": checked.held_out.describe(),
    }
    trainer = None
    stage("taking its output folder")
    try:
        with StopSignals.in_force() as signals, _claim(config, args, enabled=main) as claim:
            if claim.removed and main:
                print(f"grpokit: overwrite_output_dir: deleted {', '.join(claim.removed)} in {output_dir}")
            try:
                trainer = _build_trainer(args, checked, stage)
                summary = _train_and_evaluate(args, trainer, checked, summary, stage, signals)
            except RunInterrupted as stop:  # outside a step, a checkpoint or the final save: at once
                summary["stopped_by"] = stop.signal
            with signals.deferred():  # what the run ends with is written whole
                summary["wall_time_s"] = round(time.perf_counter() - started, 1)
                _close(args, trainer, claim, summary, stage, command, main)
    except RunInterrupted as stop:  # while the folder was being taken: nothing was written
        summary["stopped_by"] = stop.signal
        if main:
            print(closing_line(stop.signal, stage, _trained(trainer), output_dir, command), flush=True)
    _end(trainer)
    return summary


def _close(
    args: TrainArgs, trainer: Any, claim: Any, summary: dict[str, Any], stage: Stage, command: Any, main: bool
) -> None:
    """The run's end: eval_summary.json and the card (when training finished, or nothing stopped it), the
    manifest's state, and the closing line naming what exists."""
    output_dir = Path(claim.path)
    trained = _trained(trainer)  # (a signal may have come just after train(), before anything read it)
    if main and trainer is not None and (trained or "stopped_by" not in summary):
        _write_summary(output_dir, summary, trainer.args)
        publish_model_card(args, trainer.args, trainer, summary)
    state = "finished" if trained else "interrupted"
    claim.update(state=state, stopped_by=summary.get("stopped_by"), stage=stage.now)
    if not main:
        return
    if "stopped_by" in summary:
        print(closing_line(summary["stopped_by"], stage, trained, output_dir, command), flush=True)
    else:
        print(f"grpokit: done in {summary['wall_time_s']} s; {_holds(output_dir)} in {output_dir}")


def _claim(config: GRPOConfig, args: TrainArgs, *, enabled: bool) -> Any:
    """output_dir held by this run (the main process) from before the cold start to its last line."""
    record = dataclasses.replace(config, hub_token=None).to_yaml()
    return claim_run_folder(
        config.output_dir, "train", config_text=record,
        resume=resumes_in(config.resume_from_checkpoint, config.output_dir),
        overwrite=config.overwrite_output_dir, reads=output_folder_reads(args.model, args.dataset),
        details={"command": "grpokit train", "model": args.model}, enabled=enabled,
    )  # fmt: skip


def _build_trainer(args: TrainArgs, checked: CheckedRun, stage: Stage) -> Any:
    """The cold start (``tiny:<task>``), the trained reward models (``train-rm:<kind>``), the trainer."""
    from grpokit.train import GRPOTrainer

    stage("building the cold-start policy" if args.model.startswith("tiny:") else "loading the model")
    model_path = resolve_model(args.model, seed=args.task_seed)
    rewards = [resolve_trained_rm(r) for r in checked.rewards]  # train-rm:<kind>: trained once, cached
    stage("loading the model")
    trainer = GRPOTrainer(
        model=model_path,
        reward_funcs=rewards,
        args=checked.config,
        train_dataset=checked.train_rows,
        eval_dataset=checked.eval_rows,
        peft_config=peft_config(args),
        **process_supervision(args),
    )
    config = trainer.args  # resolved: what the run uses, recorded in config.yaml
    if trainer.accelerator.is_main_process:
        print(f"grpokit: {trainer.plan.describe()}; {trainer.max_steps} steps; output in {config.output_dir}")
        if trainer.bf16_by_default:
            print(
                "grpokit: bf16 autocast, this CPU's default (it has bf16 matrix units); bf16=false for fp32"
            )
        dataclasses.replace(config, hub_token=None).to_yaml(Path(config.output_dir) / "config.yaml")
    return trainer


def _train_and_evaluate(
    args: TrainArgs, trainer: Any, checked: CheckedRun, summary: dict[str, Any], stage: Stage, signals: Any
) -> dict[str, Any]:
    """The before evaluation, the training, the after evaluation (skipped after a stop signal)."""
    config, held_out = trainer.args, checked.held_out
    main = trainer.accelerator.is_main_process
    summary["held_out"] = held_out.describe(trainer.reward_names)
    evaluating = held_out.skipped is None and main
    if held_out.skipped is not None and main and args.evaluate:
        print(f"grpokit: no before/after evaluation: {held_out.skipped}")
    if evaluating:
        stage("evaluating before training")
        summary["before"] = held_out_accuracy(trainer, held_out, args, config)
        before = summary["before"]
        print(f"grpokit: held-out accuracy before GRPO: {before['accuracy']:.3f}{_env(before)}")
    stage("training")
    history = trainer.train()
    if trainer.stopped_by is not None:  # a checkpoint was saved; the run continues with resume
        summary["stopped_by"] = trainer.stopped_by
        stage(f"training (after step {trainer.step} of {trainer.max_steps})")
        return summary
    if trainer.iterative is not None:
        from grpokit.train.iterative_grpo import rm_metric_summary

        summary["reward_model"] = rm_metric_summary(history)
    if signals.received is not None:  # it came during the last step or the final save: both completed
        summary["stopped_by"] = signals.received
        stage("the last step or the final save")
        return summary
    if evaluating:
        stage("evaluating after training")
        summary["after"] = held_out_accuracy(trainer, held_out, args, config)
        after = summary["after"]
        print(f"grpokit: held-out accuracy after GRPO:  {after['accuracy']:.3f}{_env(after)}")
    stage("done")
    return summary


def _write_summary(output_dir: Path, summary: dict[str, Any], config: GRPOConfig) -> None:
    (output_dir / "eval_summary.json").write_text(json.dumps(summary, indent=2))
    dataclasses.replace(config, hub_token=None).to_yaml(output_dir / "config.yaml")


def _holds(output_dir: Path) -> str:
    """What a finished run's folder holds, by name, only what exists."""
    files = ("metrics.jsonl", "metrics.png", "eval_summary.json")
    shown = [name for name in files if (output_dir / name).exists()]
    if (output_dir / "config.json").exists() or (output_dir / "adapter_config.json").exists():
        shown.insert(0, "the model")
    return ", ".join(shown) or "nothing"


def _trained(trainer: Any) -> bool:
    """Whether training ran to max_steps and saved the model (the trainer's own record)."""
    return trainer is not None and trainer.finished


def closing_line(
    signal_name: str, stage: Stage, trained: bool, output_dir: Path, command: list[str] | None
) -> str:
    """The last line of a run a signal stopped: when (``stage``), whether training had finished
    (``trained``), what ``output_dir`` holds now, what to run next."""
    from grpokit.parallel.checkpoint import latest_checkpoint

    again = _command(command)
    if trained:
        skipped = ""
        if stage.now != "done":
            measure = f"grpokit eval model={output_dir} ... measures it"
            skipped = f"; its evaluation after training was skipped ({measure})"
        return (
            f"grpokit: stopped by {signal_name} during {stage.now}; the run finished first: "
            f"{_holds(output_dir)} in {output_dir}{skipped}"
        )
    found = latest_checkpoint(output_dir)
    if found is not None:
        return (
            f"grpokit: stopped by {signal_name} during {stage.now}; {found.name} in {output_dir} (no final "
            f"model yet); continue with: {again} resume_from_checkpoint=latest"
        )
    return (
        f"grpokit: stopped by {signal_name} while {stage.now}; nothing was trained and {output_dir} holds no "
        f"results; start again with: {again}"
    )


def _command(command: list[str] | None) -> str:
    """This run's command line, without a resume_from_checkpoint (the closing line adds its own)."""
    kept = [a for a in (command or []) if not a.lstrip("-").startswith("resume_from_checkpoint")]
    return shlex.join(["grpokit", "train", *kept])


def _end(trainer: Any) -> None:
    """The processes' group left (``GRPOTrainer.end``; without a trainer, only that)."""
    if trainer is not None:
        trainer.end()
        return
    from grpokit.parallel.distributed import end_processes

    end_processes()

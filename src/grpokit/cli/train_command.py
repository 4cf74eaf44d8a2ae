"""What ``grpokit train`` runs: a recipe (model, data, rewards, GRPOConfig) end to end, with a held-out
evaluation before and after training written to ``<output_dir>/eval_summary.json``."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from grpokit.cli.train_args import TrainArgs
from grpokit.cli.train_rm_command import resolve_trained_rm
from grpokit.config import GRPOConfig, resolution


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
    """(train rows, held-out rows, reward functions, reward weights) for a recipe."""
    train_rows: Any = args.dataset
    eval_rows: Any = args.eval_dataset
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
    rewards = [resolve_trained_rm(r) for r in rewards] if rewards else rewards  # train-rm:<kind>: cached
    if train_rows is None:
        raise SystemExit("grpokit: give a task or a dataset")
    if not rewards:
        raise SystemExit("grpokit: give reward_funcs (or a task that has them)")
    return train_rows, eval_rows, rewards, weights


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
    """A multi-turn evaluation's episode means (``env/turns``, ``env/tool_calls``, ...) for a summary line."""
    shown = [f"{key} {value:.2f}" for key, value in result.items() if key.startswith("env/")]
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
        trainer.unwrapped_model, trainer.tokenizer, held_out.rows, reward_funcs=trainer.reward_funcs,
        reward_weights=trainer.reward_weights, max_new_tokens=max_new_tokens,
        max_prompt_length=config.max_prompt_length, chat_template_kwargs=config.chat_template_kwargs,
    )  # fmt: skip


def run_training(args: TrainArgs) -> dict[str, Any]:
    """Train per the recipe; evaluate held-out greedy accuracy before and after; write eval_summary.json.
    Every input is checked before the cold start: the data, the held-out rows' columns, a resume."""
    from grpokit.cli.held_out import plan_held_out
    from grpokit.train import GRPOTrainer

    started = time.perf_counter()
    print_memory_plan(args)
    train_rows, eval_rows, rewards, weights = training_data(args)
    config = with_task_environment(dataclasses.replace(args.config, reward_weights=weights), args.task)
    if args.dataset is not None and args.eval_dataset is None:
        eval_rows = None  # the task's held-out questions are not held out from the user's data
    try:  # an eval_strategy without held-out rows: refused before the cold start
        config.check_eval_dataset(eval_rows is not None, "give eval_dataset=FILE (held-out rows)")
    except ValueError as err:
        raise SystemExit(f"grpokit: {err}") from None
    held_out = plan_held_out(args, config, eval_rows, rewards)
    in_training = resolution.eval_strategy(config) != "no" or config.eval_on_start  # eval_steps, ...
    check_resume(config)
    model_path = resolve_model(args.model, seed=args.task_seed)
    trainer = GRPOTrainer(
        model=model_path,
        reward_funcs=rewards,
        args=config,
        train_dataset=train_rows,
        eval_dataset=eval_rows if in_training else None,
        peft_config=peft_config(args),
        **process_supervision(args),
    )
    config = trainer.args  # resolved: what the run uses, recorded in config.yaml
    output_dir = Path(config.output_dir)
    main = trainer.accelerator.is_main_process
    if main:
        print(f"grpokit: {trainer.plan.describe()}; {trainer.max_steps} steps; output in {output_dir}")
        if trainer.bf16_by_default:
            print(
                "grpokit: bf16 autocast, this CPU's default (it has bf16 matrix units); bf16=false for fp32"
            )
        output_dir.mkdir(parents=True, exist_ok=True)  # what this run trains on, before it starts
        dataclasses.replace(config, hub_token=None).to_yaml(output_dir / "config.yaml")  # no secrets on disk
    summary: dict[str, Any] = {
        "model": args.model,
        "task": args.task if args.dataset is None else None,
        "train_dataset": args.dataset or (f"the built-in `{args.task}` task" if args.task else None),
        "held_out": held_out.describe(trainer.reward_names),
    }
    evaluating = held_out.skipped is None and main
    if held_out.skipped is not None and main and args.evaluate:
        print(f"grpokit: no before/after evaluation: {held_out.skipped}")
    if evaluating:
        summary["before"] = held_out_accuracy(trainer, held_out, args, config)
        before = summary["before"]
        print(f"grpokit: held-out accuracy before GRPO: {before['accuracy']:.3f}{_env(before)}")
    history = trainer.train()
    if trainer.stopped_by is not None:  # a checkpoint was saved; the run continues with resume
        summary["stopped_by"] = trainer.stopped_by
        evaluating = False
    if trainer.iterative is not None:
        from grpokit.train.iterative_grpo import rm_metric_summary

        summary["reward_model"] = rm_metric_summary(history)
    if evaluating:
        summary["after"] = held_out_accuracy(trainer, held_out, args, config)
        after = summary["after"]
        print(f"grpokit: held-out accuracy after GRPO:  {after['accuracy']:.3f}{_env(after)}")
    summary["wall_time_s"] = round(time.perf_counter() - started, 1)
    if main:
        (output_dir / "eval_summary.json").write_text(json.dumps(summary, indent=2))
        dataclasses.replace(config, hub_token=None).to_yaml(output_dir / "config.yaml")
        if trainer.stopped_by is None:
            publish_model_card(args, config, trainer, summary)
        print(
            f"grpokit: done in {summary['wall_time_s']} s; model, metrics.jsonl, metrics.png and "
            f"eval_summary.json in {output_dir}"
        )
    from grpokit.parallel.distributed import end_processes

    close = getattr(trainer.backend, "close", None)
    if callable(close):  # a vLLM engine in this process: shut down before the process group is left
        close()
    end_processes()
    return summary

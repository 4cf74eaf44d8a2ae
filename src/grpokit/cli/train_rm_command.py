"""``grpokit train-rm``: train an outcome or process reward model from labelled samples and save it."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch

from grpokit.data.records import write_jsonl
from grpokit.rewards.process_rewards.steps import DEFAULT_STEP_DELIMITER
from grpokit.rm import (
    REPLAY_FILE,
    RMKind,
    build_tiny_reward_model,
    check_kind,
    evaluate_reward_model,
    load_reward_model,
    load_rm_samples,
    save_reward_model,
    train_reward_model,
)

__all__ = ["TrainRMArgs", "run_train_rm", "train_rm_main"]


@dataclass
class TrainRMArgs:
    """Train an outcome or process reward model and save it as a transformers checkpoint."""

    kind: RMKind = "process"
    """outcome: sequence classifier on {prompt, completion, label}; process: token classifier on
    {prompt, completion, step_labels}."""
    model: str = "tiny:chain"
    """The reward model's starting point: a model directory (a causal LM, e.g. the policy, gets a new
    one-logit head on its backbone); "tiny:<task>" (the built-in cold-started tiny policy of that task, same
    head swap: it already knows the task); or "tiny" (a randomly initialised tiny model on the character
    tokenizer of grpokit.models.tiny)."""
    dataset: str = "chain"
    """A labelled .json/.jsonl file; "chain": the built-in chain task's questions answered by
    ``sample_policy`` (its own samples, labelled by the task's rules); "chain-synthetic": worked solutions
    of the chain task and corrupted ones (half each)."""
    eval_dataset: str | None = None
    """A labelled file for held-out evaluation; with dataset "chain"/"chain-synthetic" the same kind of
    samples on the task's held-out questions is used."""
    sample_policy: str = "tiny:chain"
    """dataset "chain": the policy whose samples are labelled ("tiny:<task>" or a model directory), the one
    RL starts from, so the reward model learns the mistakes it will be scoring."""
    num_generations: int = 8
    """dataset "chain": sampled completions per question (temperature 1), as GRPO's groups."""
    output_dir: str = "runs/rm"
    """Where the checkpoint (model + tokenizer) and metrics.json are written."""
    epochs: int = 3
    """Passes over the training samples."""
    lr: float = 3e-4
    """AdamW learning rate."""
    batch_size: int = 16
    """Samples per optimizer step."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    max_length: int | None = None
    """Cut longer prompt + completion sequences from the left; None keeps them whole."""
    step_delimiter: str = DEFAULT_STEP_DELIMITER
    """What separates steps (process models); saved into the checkpoint's config. A literal backslash-n
    (or backslash-t) given on a command line means a newline (tab)."""
    seed: int = 0
    """Seed for the model init, the generated data and the data order."""
    num_samples: int = 2000
    """dataset "chain"/"chain-synthetic": labelled training samples to generate (for "chain", whole
    groups: num_samples / num_generations questions, rounded up)."""
    num_eval_samples: int = 200
    """dataset "chain"/"chain-synthetic": held-out samples to generate (whole groups, as num_samples)."""
    num_ops: int = 3
    """dataset "chain": operations per question."""
    tiny_hidden_size: int = 64
    """model "tiny": hidden size."""
    tiny_num_layers: int = 2
    """model "tiny": transformer layers."""
    class_balance: bool = True
    """Weight the pointwise loss so both classes (label >= 0.5 or not) weigh the same in total: the policy's
    samples are mostly wrong, and a model answering "wrong" to all of them would learn nothing useful."""
    pairwise_weight: float = 1.0
    """Weight of the pairwise Bradley-Terry loss added to the pointwise one: right vs wrong samples of the
    same question (process: the same step), the comparison GRPO's advantages make; 0 turns it off."""


def _chain_samples(args: TrainRMArgs) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Training and held-out samples of the chain task: the sample policy's (dataset "chain") or made up."""
    from grpokit.tasks.chain import make_chain_policy_rm_samples, make_chain_rm_samples, make_chain_splits

    if args.dataset == "chain-synthetic":
        train_rows, test_rows = make_chain_splits(
            args.seed, args.num_samples, args.num_eval_samples, num_ops=args.num_ops
        )
        return (
            make_chain_rm_samples(train_rows, kind=args.kind, seed=args.seed),
            make_chain_rm_samples(test_rows, kind=args.kind, seed=args.seed + 1),
        )
    if args.num_generations < 1:
        raise ValueError(f"num_generations must be >= 1, got {args.num_generations}")
    groups = -(-args.num_samples // args.num_generations), -(-args.num_eval_samples // args.num_generations)
    train_rows, test_rows = make_chain_splits(args.seed, *groups, num_ops=args.num_ops)
    model, tokenizer = _load_policy(args.sample_policy, args.seed)
    settings = {"kind": args.kind, "num_generations": args.num_generations}
    return (
        make_chain_policy_rm_samples(model, tokenizer, train_rows, seed=args.seed, **settings),
        make_chain_policy_rm_samples(model, tokenizer, test_rows, seed=args.seed + 1, **settings),
    )


def _load_policy(spec: str, seed: int) -> tuple[Any, Any]:
    """A causal LM and its tokenizer: "tiny:<task>" (the cold-started tiny policy) or a directory."""
    from transformers import AutoModelForCausalLM

    from grpokit.models.loading import load_tokenizer

    path = str(_policy_path(spec, seed))
    return AutoModelForCausalLM.from_pretrained(path).eval(), load_tokenizer(path)


def _policy_path(spec: str, seed: int) -> str:
    if spec.startswith("tiny:"):
        from grpokit.tasks import cold_start_policy

        return str(cold_start_policy(spec.split(":", 1)[1], seed=seed))
    return spec


def run_train_rm(args: TrainRMArgs, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Everything ``grpokit train-rm`` does; returns the metrics it writes to ``output_dir/metrics.json``."""
    check_kind(args.kind)
    if "\\" in args.step_delimiter:
        args = replace(args, step_delimiter=args.step_delimiter.replace("\\n", "\n").replace("\\t", "\t"))
    torch.manual_seed(args.seed)
    if not (args.pairwise_weight >= 0 and args.pairwise_weight != float("inf")):
        raise ValueError(f"pairwise_weight must be a finite number >= 0, got {args.pairwise_weight}")
    if args.dataset in ("chain", "chain-synthetic"):
        train_samples, eval_samples = _chain_samples(args)
        if args.step_delimiter != DEFAULT_STEP_DELIMITER and args.kind == "process":
            raise ValueError("dataset 'chain' has one step per line: use the default step_delimiter")
    else:
        train_samples = load_rm_samples(
            args.dataset, args.kind, delimiter=args.step_delimiter, name=args.dataset
        )
        eval_samples = None
    if args.eval_dataset is not None:
        eval_samples = load_rm_samples(
            args.eval_dataset, args.kind, delimiter=args.step_delimiter, name=args.eval_dataset
        )
    if args.model == "tiny":
        from grpokit.models.tiny import build_char_tokenizer

        tokenizer = build_char_tokenizer()
        model = build_tiny_reward_model(
            tokenizer,
            args.kind,
            hidden_size=args.tiny_hidden_size,
            num_layers=args.tiny_num_layers,
            seed=args.seed,
        )
    else:
        model, tokenizer = load_reward_model(_policy_path(args.model, args.seed), args.kind)
    common = {
        "kind": args.kind,
        "batch_size": args.batch_size,
        "delimiter": args.step_delimiter,
        "max_length": args.max_length,
    }
    metrics: dict[str, Any] = {"args": asdict(args)}
    if eval_samples:
        before = evaluate_reward_model(model, tokenizer, eval_samples, **common)
        metrics["eval_before"] = before
        log(f"held-out before training: {_describe(before)}")
    metrics["train"] = train_reward_model(
        model,
        tokenizer,
        train_samples,
        epochs=args.epochs,
        lr=args.lr,
        weight_decay=args.weight_decay,
        seed=args.seed,
        class_balance=args.class_balance,
        pairwise_weight=args.pairwise_weight,
        log_fn=lambda m: log(f"epoch {m['epoch']}: train loss {m['loss']:.4f}"),
        **common,
    )
    if eval_samples:
        after = evaluate_reward_model(model, tokenizer, eval_samples, **common)
        metrics["eval_after"] = after
        log(f"held-out after training: {_describe(after)}")
    out = save_reward_model(model, tokenizer, args.output_dir, kind=args.kind, delimiter=args.step_delimiter)
    (out / "metrics.json").write_text(json.dumps(metrics, indent=2))
    # The training samples, as the history an iterative run replays (GRPOTrainer's iterative_reward_model
    # seeds its replay buffer from this file; IterativeRewardModel.save writes the same file).
    write_jsonl(out / REPLAY_FILE, train_samples)
    log(f"saved {args.kind} reward model to {out}")
    return metrics


def _describe(result: dict[str, Any]) -> str:
    """``loss 0.41 accuracy 0.87 (constant baseline 0.66, 2000 samples)``."""
    return (
        f"loss {result['loss']:.4f} accuracy {result['accuracy']:.4f} (constant baseline "
        f"{result['constant_accuracy']:.4f}, {result['count']} labels)"
    )


def train_rm_main(argv: list[str] | None = None) -> int:
    """``grpokit train-rm [--option value ...]``; returns the exit status."""
    import tyro

    args = tyro.cli(
        TrainRMArgs,
        args=list(sys.argv[1:] if argv is None else argv),
        prog="grpokit train-rm",
        use_underscores=True,
        config=(tyro.conf.FlagConversionOff,),
    )
    try:
        run_train_rm(args)
    except (ValueError, FileNotFoundError) as err:
        print(f"grpokit train-rm: error: {err}", file=sys.stderr)
        return 2
    return 0

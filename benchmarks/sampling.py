"""Which groups to train on (docs/sampling.md): plain GRPO vs dynamic sampling vs the curriculum vs adaptive
group sizes on the built-in arithmetic task, each with the same wall-clock training budget, over seeds.

Every run starts from the cold-started tiny policy and the default recipe's settings (16 prompts x G=8 per
step, lr 2e-5, beta 0.04), trains on the same 256 training questions (so prompts come back, about every 16
steps, which the curriculum and adaptive G need), stops when its training time reaches ``--budget`` seconds
(a ``TrainerCallback`` setting ``should_training_stop``), then is evaluated greedily on 500 held-out
questions. Reported per method: held-out accuracy, GRPO steps done in the budget, and the gradient signal:
the fraction of generated completions that got a non-zero advantage (over the whole run).

    python benchmarks/sampling.py --seeds 0 1 2 --budget 20 --out benchmarks/results/sampling.json

Run it on an otherwise idle machine: the budget is wall-clock time.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from statistics import mean, stdev

from transformers import TrainerCallback

METHODS = {
    "plain": {},
    "dynamic_sampling": {"dynamic_sampling": True, "max_sampling_rounds": 4},
    "curriculum": {"curriculum": True},
    "adaptive_G": {"adaptive_num_generations": True, "min_num_generations": 2, "max_num_generations": 16},
}


class TimeBudget(TrainerCallback):
    """Stops training once ``seconds`` of wall-clock time have passed since ``on_train_begin``."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.start = seconds, 0.0

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        control.should_training_stop = time.perf_counter() - self.start >= self.seconds


def run(method: str, seed: int, budget: float, output_dir: Path) -> dict:
    from grpokit import GRPOConfig, GRPOTrainer
    from grpokit.cli.train_command import held_out_accuracy, resolve_model
    from grpokit.tasks import get_task

    task = get_task("arithmetic")
    train, held_out = task.make_splits(seed=0, num_train=256, num_test=500)
    names = list(task.reward_funcs)
    config = GRPOConfig(
        output_dir=str(output_dir), max_steps=10_000, num_generations=8, per_device_train_batch_size=128,
        max_completion_length=40, learning_rate=2e-5, beta=0.04, seed=seed, disable_tqdm=True,
        reward_weights=[task.default_reward_weights[n] for n in names], overwrite_output_dir=True,
        **METHODS[method],
    )  # fmt: skip
    trainer = GRPOTrainer(
        resolve_model("tiny:arithmetic"), [task.reward_funcs[n] for n in names], config,
        train_dataset=train, callbacks=[TimeBudget(budget)],
    )  # fmt: skip
    history = trainer.train()
    sampled = sum(r["signal/sampled_completions"] for r in history)
    signal = sum(
        r["signal/frac_completions_nonzero_advantage"] * r["signal/sampled_completions"] for r in history
    )
    accuracy = held_out_accuracy(trainer.unwrapped_model, trainer.tokenizer, held_out, "arithmetic", 40)
    return {"accuracy": accuracy["accuracy"], "steps": trainer.step, "signal": signal / sampled,
            "sampled_completions": sampled}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--budget", type=float, default=20.0, help="training seconds per run")
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--runs", default="runs/sampling")
    parser.add_argument("--out", default="benchmarks/results/sampling.json")
    args = parser.parse_args()
    run("plain", 0, 3.0, Path(args.runs) / "warm-up")  # first-use costs (kernels, caches) out of the timings
    results: dict[str, list[dict]] = {m: [] for m in args.methods}
    for seed in args.seeds:
        for method in args.methods:
            results[method].append(run(method, seed, args.budget, Path(args.runs) / f"{method}-{seed}"))
            print(method, seed, results[method][-1], flush=True)
    summary = {
        m: {k: (mean(r[k] for r in rs), stdev(r[k] for r in rs) if len(rs) > 1 else 0.0) for k in rs[0]}
        for m, rs in results.items()
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"budget_s": args.budget, "seeds": args.seeds, "runs": results,
                                          "summary": summary}, indent=2))  # fmt: skip
    print("| method | held-out accuracy | GRPO steps in the budget | completions with non-zero advantage |")
    print("|---|---|---|---|")
    for m, s in summary.items():
        print(f"| {m} | {s['accuracy'][0]:.3f} ± {s['accuracy'][1]:.3f} | {s['steps'][0]:.0f} ± "
              f"{s['steps'][1]:.0f} | {s['signal'][0]:.3f} ± {s['signal'][1]:.3f} |")  # fmt: skip


if __name__ == "__main__":
    main()

"""DeepSeekMath's Figure 7 claim on the built-in arithmetic task: does GRPO lift maj@k more than pass@k?

DeepSeekMath (arXiv:2402.03300, section 5.2.2) reports that RL improved Maj@K but not Pass@K and reads it
as RL making the output distribution more robust (boosting correct answers already in the top-K) rather
than adding capability. This script measures the same quantities before and after the default recipe's
GRPO run, over several training seeds:

* before: the cold-started tiny policy (``tiny:arithmetic``), sampled with each seed;
* after: ``grpokit train`` (the default recipe, ``recipes/arithmetic-tiny.yaml``) with ``seed=s``;
* n = 64 samples per held-out question at the training temperature (1.0), graded by the task's exact-answer
  reward; pass@k by the unbiased estimator (Chen et al. 2021) from the 64 samples, maj@k as the mean over
  the 64/k disjoint blocks of k samples of "the most frequent extracted answer is right" (maj@1 = mean@1).

Usage (about 6 minutes on 2 cores; the machine must be otherwise idle only for the timings it prints):

    python benchmarks/faithfulness.py --seeds 0 1 2 --out benchmarks/results/faithfulness.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from statistics import mean, stdev

KS = (1, 4, 16, 64)


def sampling_metrics(correct: list[list[bool]], answers: list[list[str | None]], gold: list[str]) -> dict:
    """pass@k and maj@k for k in KS from n = max(KS) samples per prompt."""
    from grpokit.eval.metrics import maj_at_k, mean_pass_at_k

    n = len(correct[0])
    out: dict[str, float] = {}
    for k in KS:
        out[f"pass@{k}"] = mean_pass_at_k(correct, k)
        blocks = [maj_at_k([a[b : b + k] for a in answers], gold) for b in range(0, n, k)]
        out[f"maj@{k}"] = mean(blocks)
    return out


def evaluate(model_dir: str, rows: list[dict], seed: int) -> dict:
    """n = max(KS) samples per row at temperature 1.0, graded as the task grades."""
    from transformers import AutoModelForCausalLM

    from grpokit.eval.generic import generate_completions
    from grpokit.eval.grading import grade_completions
    from grpokit.models import load_tokenizer
    from grpokit.tasks import get_task

    task = get_task("arithmetic")
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    tokenizer = load_tokenizer(model_dir)
    started = time.perf_counter()
    completions = generate_completions(
        model, tokenizer, rows, num_samples=max(KS), temperature=1.0, max_new_tokens=40, batch_size=32,
        seed=seed,
    )  # fmt: skip
    graded = grade_completions(
        rows, completions, reward_funcs=[task.reward_funcs[task.correctness_reward]],
        answer_extractor=task.extract_answer, per_example=True,
    )  # fmt: skip
    records = graded["records"]
    correct = [r["correct"] for r in records]
    answers = [[None if a is None else str(a).strip() for a in r["extracted"]] for r in records]
    gold = [str(row["solution"]).strip() for row in rows]
    return {**sampling_metrics(correct, answers, gold), "seconds": time.perf_counter() - started}


def train(seed: int, output_dir: Path) -> str:
    """The default recipe with ``seed``; returns the trained model's directory."""
    command = [sys.executable, "-m", "grpokit.cli", "train", f"seed={seed}", f"output_dir={output_dir}"]
    subprocess.run(command, check=True)
    return str(output_dir)


def summarise(runs: list[dict]) -> dict:
    keys = [k for k in runs[0] if k != "seconds"]
    return {
        k: {"mean": mean(r[k] for r in runs), "std": stdev(r[k] for r in runs) if len(runs) > 1 else 0.0}
        for k in keys
    }


def table(before: dict, after: dict) -> str:
    lines = [
        "| k | pass@k before | pass@k after | gain | maj@k before | maj@k after | gain |",
        "|---|---|---|---|---|---|---|",
    ]
    for k in KS:
        p0, p1 = before[f"pass@{k}"], after[f"pass@{k}"]
        m0, m1 = before[f"maj@{k}"], after[f"maj@{k}"]
        lines.append(
            f"| {k} | {p0['mean']:.3f} ± {p0['std']:.3f} | {p1['mean']:.3f} ± {p1['std']:.3f} | "
            f"{p1['mean'] - p0['mean']:+.3f} | {m0['mean']:.3f} ± {m0['std']:.3f} | "
            f"{m1['mean']:.3f} ± {m1['std']:.3f} | {m1['mean'] - m0['mean']:+.3f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--runs", default="runs/faithfulness", help="where the trained models go")
    parser.add_argument("--out", default="benchmarks/results/faithfulness.json")
    args = parser.parse_args()

    from grpokit.cli.train_command import resolve_model
    from grpokit.tasks import get_task

    _, held_out = get_task("arithmetic").make_splits(seed=0, num_test=500)
    cold_start = resolve_model("tiny:arithmetic")
    before, after = [], []
    for seed in args.seeds:
        before.append(evaluate(cold_start, held_out, seed))
        trained = train(seed, Path(args.runs) / f"seed{seed}")
        after.append(evaluate(trained, held_out, seed))
        print(f"seed {seed}: before {before[-1]}\n        after  {after[-1]}", flush=True)
    result = {
        "seeds": args.seeds, "num_prompts": len(held_out), "num_samples": max(KS), "temperature": 1.0,
        "before": before, "after": after, "summary": {"before": summarise(before), "after": summarise(after)},
    }  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))
    print(table(result["summary"]["before"], result["summary"]["after"]))


if __name__ == "__main__":
    main()

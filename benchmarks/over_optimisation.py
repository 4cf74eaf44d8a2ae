"""Over-optimisation of a learned reward on the chain task: static reward model against iterative GRPO.

Three recipes, each over several GRPO seeds at the same step budget (``recipes/chain-outcome.yaml``: 200
steps of 8 prompts x G = 8):

* ``chain-outcome``: the exact-answer rule as the reward, the ceiling;
* ``chain-outcome-orm``: a learned outcome reward model (``train-rm:outcome``), frozen; the rule only
  watches (``gold_reward``);
* ``chain-iterative-orm``: the same reward model retrained every 10 steps on the policy's samples labelled
  by the rule (10% replay), the reference reset to the policy each time.

From each run's metrics.jsonl: the gold reward (the rule's mean on the step's samples) at the start
(steps 1-10), at its peak (the best 10-step window) and at the end (last 20 steps); the proxy (the
reward model's mean score) and the KL at the end; the reward model's accuracy on the policy's current
samples (``proxy_gold/accuracy`` at the start and end; iterative runs: ``rm/accuracy_on_policy`` at the
first and last update); held-out greedy accuracy after training (``eval_summary.json``). Writes a JSON, a
markdown table and the curves (``grpokit.reporting.metrics_log.plot_runs``).

Usage (2 CPU cores, each run a few minutes; the reward model is trained once and cached):

    python benchmarks/over_optimisation.py --seeds 0 1 2 --runs runs/over-optimisation \\
        --out benchmarks/results/over-optimisation
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from statistics import mean

RECIPES = {
    "rule (ceiling)": "chain-outcome",
    "static ORM": "chain-outcome-orm",
    "iterative ORM": "chain-iterative-orm",
}
GOLD = "rewards/chain_outcome_reward/mean"


def train(recipe: str, seed: int, output_dir: Path) -> None:
    command = [sys.executable, "-m", "grpokit.cli", "train", recipe, f"seed={seed}",
               f"output_dir={output_dir}", "disable_tqdm=True", "torch_num_threads=1"]  # fmt: skip
    subprocess.run(command, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})


def window(records: list[dict], name: str, first: int, last: int) -> float | None:
    """Mean of ``name`` over steps first..last (inclusive), None if never logged there."""
    values = [r[name] for r in records if first <= r["step"] <= last and r.get(name) is not None]
    return mean(values) if values else None


def summarise(run_dir: Path) -> dict:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    steps = max(r["step"] for r in records)
    peaks = [(window(records, GOLD, s, s + 9), s) for s in range(1, steps - 8)]
    peak, peak_step = max((p for p in peaks if p[0] is not None), default=(None, None))
    updates = [r["rm/accuracy_on_policy"] for r in records if r.get("rm/accuracy_on_policy") is not None]
    summary = json.loads((run_dir / "eval_summary.json").read_text())
    return {
        "gold_start": window(records, GOLD, 1, 10),
        "gold_peak": peak,
        "gold_peak_step": peak_step,
        "gold_end": window(records, GOLD, steps - 19, steps),
        "proxy_end": window(records, "proxy_gold/proxy_mean", steps - 19, steps),
        "kl_end": window(records, "kl", steps - 19, steps),
        "rm_accuracy_start": window(records, "proxy_gold/accuracy", 1, 10),
        "rm_accuracy_end": window(records, "proxy_gold/accuracy", steps - 19, steps),
        "rm_accuracy_on_policy_first": updates[0] if updates else None,
        "rm_accuracy_on_policy_last": updates[-1] if updates else None,
        "held_out_after": summary["after"]["accuracy"],
    }


def cell(values: list, digits: int = 3) -> str:
    """mean (min-max) over seeds, or - when not logged."""
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{mean(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


COLUMNS = [
    ("gold start (1-10)", "gold_start"),
    ("gold peak (10 steps)", "gold_peak"),
    ("peak at step", "gold_peak_step"),
    ("gold end (last 20)", "gold_end"),
    ("proxy end", "proxy_end"),
    ("KL end", "kl_end"),
    ("RM acc. on policy start / end", None),
    ("held-out greedy after", "held_out_after"),
]


def table(results: dict[str, list[dict]]) -> str:
    lines = ["| run | " + " | ".join(c for c, _ in COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    for label, runs in results.items():
        cells = []
        for _, key in COLUMNS:
            if key is None:
                start = [r["rm_accuracy_start"] for r in runs]
                end = [r["rm_accuracy_end"] for r in runs]
                cells.append(f"{cell(start)} / {cell(end)}")
            else:
                cells.append(cell([r[key] for r in runs], 0 if key == "gold_peak_step" else 3))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--runs", default="runs/over-optimisation", help="where the runs go")
    parser.add_argument("--out", default="benchmarks/results/over-optimisation", help="path stem of outputs")
    parser.add_argument("--skip_training", action="store_true", help="summarise runs already there")
    args = parser.parse_args()

    from grpokit.reporting.metrics_log import plot_runs

    dirs: dict[str, list[Path]] = {}
    for label, recipe in RECIPES.items():
        dirs[label] = [Path(args.runs) / f"{recipe}-s{seed}" for seed in args.seeds]
        for seed, run_dir in zip(args.seeds, dirs[label]):
            if not args.skip_training:
                train(recipe, seed, run_dir)
    results = {label: [summarise(d) for d in run_dirs] for label, run_dirs in dirs.items()}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=2))
    out.with_suffix(".md").write_text(table(results) + "\n")
    plot_runs({label: [str(d) for d in ds] for label, ds in dirs.items()}, out.with_suffix(".png"))
    print(table(results))


if __name__ == "__main__":
    main()

"""Over-optimisation of a learned reward on the chain task: static reward models against iterative GRPO,
for outcome and process supervision.

Six recipes, each over several GRPO seeds at the same step budget (``recipes/chain-outcome.yaml``: 200
steps of 8 prompts x G = 8, beta 0.04):

* outcome: ``chain-outcome`` (the exact-answer rule as the reward, the ceiling); ``chain-outcome-orm`` (a
  learned outcome reward model, ``train-rm:outcome``, frozen; the rule only watches, ``gold_reward``);
  ``chain-iterative-orm`` (that reward model retrained every 10 steps on the policy's samples labelled by
  the rule, 10% replay, the reference reset to the policy each time);
* process: ``chain-process-rule`` (the rule's step verifier, the ceiling); ``chain-process-prm`` (a learned
  process reward model, ``train-rm:process``, frozen); ``chain-iterative-prm`` (retrained as above).

The gold reward is the exact-answer rule's mean on each step's samples (``rewards/chain_outcome_reward/mean``,
logged by every run; the learned-reward and process runs name it ``gold_reward``, so they also log
``proxy_gold/*``). From each run's metrics.jsonl: the gold at the start (steps 1-10), at its peak (the best
10-step window) and at the end (last 20 steps); the proxy (``proxy_gold/proxy_mean``, what the advantages
come from: the outcome reward model's probability of being right; with process rewards, each completion's
last step score) and the KL to the reference at the end; the reward model's accuracy on the policy's
current samples (static models: ``proxy_gold/accuracy`` over steps 1-10 and the last 20; iterative runs:
``rm/accuracy_on_policy`` at the first and last update); held-out greedy accuracy after training
(``eval_summary.json``). Writes a JSON, a markdown table and the curves (gold, proxy and KL against step,
gold against KL; mean over seeds, 10-step windows).

Usage (2 CPU cores; runs go two at a time with one thread each, 1-3 minutes per run; the reward models are
trained once and cached):

    python benchmarks/over_optimisation.py --seeds 0 1 2 --runs runs/over-optimisation \\
        --out benchmarks/results/over-optimisation
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from statistics import mean

RECIPES = {
    "outcome": {
        "rule (ceiling)": "chain-outcome",
        "static ORM": "chain-outcome-orm",
        "iterative ORM": "chain-iterative-orm",
    },
    "process": {
        "rule (ceiling)": "chain-process-rule",
        "static PRM": "chain-process-prm",
        "iterative PRM": "chain-iterative-prm",
    },
}
GOLD = "rewards/chain_outcome_reward/mean"
PROXY = "proxy_gold/proxy_mean"
WINDOW = 10
PANELS = ("gold (exact answer)", "proxy (what it trains on)", "KL to the reference", "gold vs KL (windows)")


def train(recipe: str, seed: int, output_dir: Path) -> None:
    command = [sys.executable, "-m", "grpokit.cli", "train", recipe, f"seed={seed}",
               f"output_dir={output_dir}", "disable_tqdm=True", "torch_num_threads=1"]  # fmt: skip
    log = output_dir.with_suffix(".log")
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:
        subprocess.run(command, check=True, stdout=out, stderr=subprocess.STDOUT,
                       env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip


def window(records: list[dict], name: str, first: int, last: int) -> float | None:
    """Mean of ``name`` over steps first..last (inclusive), None if never logged there."""
    values = [r[name] for r in records if first <= r["step"] <= last and r.get(name) is not None]
    return mean(values) if values else None


def read(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]


def summarise(run_dir: Path) -> dict:
    records = read(run_dir)
    steps = max(r["step"] for r in records)
    peaks = [(window(records, GOLD, s, s + WINDOW - 1), s) for s in range(1, steps - WINDOW + 2)]
    peak, peak_step = max((p for p in peaks if p[0] is not None), default=(None, None))
    updates = [r["rm/accuracy_on_policy"] for r in records if r.get("rm/accuracy_on_policy") is not None]
    summary = json.loads((run_dir / "eval_summary.json").read_text())
    if updates:
        rm_start, rm_end = updates[0], updates[-1]
    else:
        rm_start = window(records, "proxy_gold/accuracy", 1, 10)
        rm_end = window(records, "proxy_gold/accuracy", steps - 19, steps)
    return {
        "gold_start": window(records, GOLD, 1, 10),
        "gold_peak": peak,
        "gold_peak_step": peak_step,
        "gold_end": window(records, GOLD, steps - 19, steps),
        "proxy_end": window(records, PROXY, steps - 19, steps),
        "kl_end": window(records, "kl", steps - 19, steps),
        "rm_accuracy_start": rm_start,
        "rm_accuracy_end": rm_end,
        "held_out_before": summary["before"]["accuracy"],
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


def table(results: dict[str, dict[str, list[dict]]]) -> str:
    head = "| supervision | run | " + " | ".join(c for c, _ in COLUMNS) + " |"
    lines = [head, "|---" * (len(COLUMNS) + 2) + "|"]
    for supervision, rows in results.items():
        for label, runs in rows.items():
            cells = []
            for _, key in COLUMNS:
                if key is None:
                    start = cell([r["rm_accuracy_start"] for r in runs])
                    end = cell([r["rm_accuracy_end"] for r in runs])
                    cells.append("-" if start == end == "-" else f"{start} / {end}")
                else:
                    cells.append(cell([r[key] for r in runs], 0 if key == "gold_peak_step" else 3))
            lines.append(f"| {supervision} | {label} | " + " | ".join(cells) + " |")
    before = [r["held_out_before"] for rows in results.values() for runs in rows.values() for r in runs]
    lines.append(f"\nHeld-out greedy accuracy of the cold-started policy before GRPO: {cell(before)}.")
    return "\n".join(lines)


def windowed(curve: list[tuple[int, float, float, float]]) -> list[tuple[float, float, float, float]]:
    """(step, mean, min, max) averaged over consecutive WINDOW-step blocks (the per-step means are noisy:
    64 samples a step)."""
    blocks: dict[int, list[tuple[int, float, float, float]]] = {}
    for point in curve:
        blocks.setdefault((point[0] - 1) // WINDOW, []).append(point)
    return [tuple(mean(p[i] for p in points) for i in range(4)) for _, points in sorted(blocks.items())]


def plot(dirs: dict[str, dict[str, list[Path]]], path: Path) -> None:
    """One row per supervision: gold, proxy and KL against step, gold against KL."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from grpokit.reporting.metrics_log import seed_curve

    fig, axes = plt.subplots(len(dirs), 4, figsize=(16, 3.4 * len(dirs)), squeeze=False)
    for row, (supervision, runs) in zip(axes, dirs.items()):
        for label, run_dirs in runs.items():
            records = [read(d) for d in run_dirs]
            gold, kl = windowed(seed_curve(records, GOLD)), windowed(seed_curve(records, "kl"))
            for axis, curve in zip(row[:3], (gold, windowed(seed_curve(records, PROXY)), kl)):
                if not curve:
                    continue
                line = axis.plot([c[0] for c in curve], [c[1] for c in curve], label=label)[0]
                axis.fill_between([c[0] for c in curve], [c[2] for c in curve], [c[3] for c in curve],
                                  alpha=0.15, color=line.get_color())  # fmt: skip
            row[3].scatter([c[1] for c in kl], [c[1] for c in gold], s=12, alpha=0.7, label=label)
        titles = [f"{supervision}: {name}" for name in PANELS]
        for axis, title in zip(row, titles):
            axis.set_title(title, fontsize=9)
            axis.set_xlabel("KL" if "vs KL" in title else "step")
            axis.grid(alpha=0.3)
        row[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--runs", default="runs/over-optimisation", help="where the runs go")
    parser.add_argument("--out", default="benchmarks/results/over-optimisation", help="path stem of outputs")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (one torch thread each)")
    parser.add_argument("--skip_training", action="store_true", help="summarise runs already there")
    args = parser.parse_args()

    def seed_dirs(recipe: str) -> list[Path]:
        return [Path(args.runs) / f"{recipe}-s{seed}" for seed in args.seeds]

    dirs = {s: {label: seed_dirs(recipe) for label, recipe in runs.items()} for s, runs in RECIPES.items()}
    if not args.skip_training:
        # the cached reward models first, so that parallel runs do not each train them
        from grpokit.cli.train_rm_command import trained_reward_model

        for kind in ("process", "outcome"):
            trained_reward_model(kind)
        jobs = [(RECIPES[s][label], seed, d) for s, runs in dirs.items() for label, ds in runs.items()
                for seed, d in zip(args.seeds, ds)]  # fmt: skip
        with ThreadPoolExecutor(args.jobs) as pool:
            list(pool.map(lambda job: train(*job), jobs))
    results = {
        s: {label: [summarise(d) for d in ds] for label, ds in runs.items()} for s, runs in dirs.items()
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=2))
    out.with_suffix(".md").write_text(table(results) + "\n")
    plot(dirs, out.with_suffix(".png"))
    print(table(results))


if __name__ == "__main__":
    main()

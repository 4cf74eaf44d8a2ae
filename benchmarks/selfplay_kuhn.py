"""Kuhn poker self-play, measured: ``recipes/kuhn-selfplay.yaml`` over seeds, beside its ablations.

Each run is ``grpokit train recipes/kuhn-selfplay.yaml seed=S task_seed=S <overrides>``; what is kept of it:
the exact exploitability of the policy before GRPO (the cold start) and after (``eval_summary.json``), its
minimum and its mean over the last 20 steps (``selfplay/exploitability`` in ``metrics.jsonl``), the
games against the random and the Nash player before and after, and the run's wall time.

Configurations (``--configs``):

- ``selfplay``: the recipe (the policy in both seats, each role its own group, beta 0.2);
- ``fixed_random``: the policy against the uniformly random player only (``game_opponent=random``);
- ``prompt_baseline``: plain GRPO's group, both seats of a deal against one baseline
  (``role_advantage=prompt``);
- ``rae``: SPIRAL's role baselines instead of role groups (``role_advantage=rae``);
- ``no_kl``: the recipe without the KL term (``beta=0``);
- ``pool``: against a pool of the policy's snapshots (``game_opponent=pool``: every 10 steps, the newest 4).

    python benchmarks/selfplay_kuhn.py --configs selfplay fixed_random prompt_baseline no_kl --seeds 0 1 2 \\
        --parallel 2 --json benchmarks/results/selfplay-kuhn-2026-12-04.json \\
        --plot benchmarks/results/selfplay-kuhn-2026-12-04.png

``--replot``: only the plot, from the runs' folders already under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "kuhn-selfplay.yaml"
CONFIGS = {
    "selfplay": [],
    "fixed_random": ["game_opponent=random"],
    "prompt_baseline": ["role_advantage=prompt"],
    "rae": ["role_advantage=rae"],
    "no_kl": ["beta=0.0"],
    "pool": ["game_opponent=pool"],
}
KEPT = ("game/exploitability", "game/random/win", "game/random/return", "game/expert/return",
        "game/legal_rate")  # fmt: skip


def run(config: str, seed: int, out: Path, threads: int) -> dict:
    """One run of ``config`` with ``seed``: its summary (module docstring)."""
    folder = out / f"{config}-seed{seed}"
    command = [
        sys.executable, "-m", "grpokit.cli", "train", str(RECIPE), f"seed={seed}", f"task_seed={seed}",
        f"output_dir={folder}", "overwrite_output_dir=true", "disable_tqdm=true", *CONFIGS[config],
    ]  # fmt: skip
    env = {"OMP_NUM_THREADS": str(threads), "PATH": "/usr/bin:/bin"}
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env={**env, **_python_env()})
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{config} seed {seed} failed:\n{done.stderr[-3000:]}")
    summary = json.loads((folder / "eval_summary.json").read_text())
    steps = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    curve = [step["selfplay/exploitability"] for step in steps]
    return {
        "config": config, "seed": seed, "wall_s": round(wall, 1), "overrides": CONFIGS[config],
        "before": {k: summary["before"][k] for k in KEPT}, "after": {k: summary["after"][k] for k in KEPT},
        "exploitability_min": min(curve), "exploitability_last20": statistics.fmean(curve[-20:]),
        "exploitability_curve": [round(value, 4) for value in curve],
    }  # fmt: skip


def _python_env() -> dict[str, str]:
    import os

    keep = ("HOME", "HF_HOME", "XDG_CACHE_HOME", "GRPOKIT_CACHE", "VIRTUAL_ENV", "PYTHONPATH")
    return {k: os.environ[k] for k in keep if k in os.environ}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", default=["selfplay"], choices=sorted(CONFIGS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--parallel", type=int, default=1, help="runs at a time (one thread each when > 1)")
    parser.add_argument("--out", default="runs/selfplay-kuhn", help="the runs' folders")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--plot", help="the exploitability curves (mean over seeds, min-max band) as a PNG")
    parser.add_argument("--replot", action="store_true", help="plot the runs under --out, run nothing")
    args = parser.parse_args()
    out = Path(args.out)
    if not args.replot:
        run_all(args, out)
    if args.plot:
        from grpokit.reporting.metrics_log import plot_runs

        folders = {c: [out / f"{c}-seed{s}" for s in args.seeds] for c in args.configs}
        plot_runs(folders, args.plot, names=["selfplay/exploitability", "selfplay/return/first_player"])


def run_all(args: argparse.Namespace, out: Path) -> None:
    """Every configuration x seed, ``args.parallel`` at a time; the results printed and written."""
    jobs = [(config, seed) for seed in args.seeds for config in args.configs]
    threads = 1 if args.parallel > 1 else 2
    with ThreadPoolExecutor(args.parallel) as pool:
        results = list(pool.map(lambda job: run(*job, out, threads), jobs))
    for r in results:
        before, after = r["before"]["game/exploitability"], r["after"]["game/exploitability"]
        low, last = r["exploitability_min"], r["exploitability_last20"]
        print(f"{r['config']:16s} seed {r['seed']}: exploitability {before:.3f} -> {after:.3f} "
              f"(min {low:.3f}, last 20 {last:.3f}); {r['wall_s']:.0f} s")
    if args.json:
        record = {"date": time.strftime("%Y-%m-%d"), "command": " ".join(sys.argv), "runs": results}
        Path(args.json).write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()

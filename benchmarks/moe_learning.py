"""A tiny mixture-of-experts policy learning the default task under a bf16 sampler, with and without routing
replay, beside the same run without the mismatch (an fp32 sampler).

The policy: a tiny Qwen3-MoE (2 layers, hidden 128, 8 experts of width 128, 2 per token; 0.95M parameters)
given the default task's supervised cold start (``cold_start_policy("arithmetic", arch="qwen3_moe")``,
cached like the dense one). The runs: the default recipe (``recipes/arithmetic-tiny.yaml``: 100 steps of 16
prompts x G = 8, lr 2e-5, beta 0.04), fp32 trainer, three samplers:

- ``fp32``: the policy itself samples (no mismatch: the sampler is pi_old);
- ``bf16``: a bfloat16 copy samples (``generation_dtype=bfloat16``; TRL's IS correction on), no replay;
- ``bf16-R3``: the same bfloat16 sampler, ``routing_replay=R3``.

Each run's held-out greedy accuracy before and after (500 questions, ``eval_summary.json``), and from its
``metrics.jsonl`` the mean per step of ``routing/sampler_mismatch`` (no replay) or ``_overridden`` (R3: the
tokens whose experts the sampler chose otherwise than the trainer's router would), of
``sampling/sampling_logp_difference/mean`` and of the step time. Two runs at a time, one torch thread each.

Usage (2 CPU cores; about 12 minutes for 3 seeds):

    python benchmarks/moe_learning.py --seeds 0 1 2 --runs runs/moe-learning \\
        --out benchmarks/results/moe-learning.json
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

RECIPE = Path(__file__).resolve().parents[1] / "src" / "grpokit" / "recipes" / "arithmetic-tiny.yaml"
COLD_START = {
    "arch": "qwen3_moe", "hidden_size": 128, "num_layers": 2, "num_heads": 4, "intermediate_size": 128,
}  # fmt: skip
SAMPLERS = {
    "fp32": [],
    "bf16": ["generation_dtype=bfloat16"],
    "bf16-R3": ["generation_dtype=bfloat16", "routing_replay=R3"],
}


def policy(seed: int, cache: Path) -> Path:
    """The cold-started tiny Qwen3-MoE of ``seed`` (built once, cached)."""
    from grpokit.tasks import cold_start_policy

    return cold_start_policy("arithmetic", cache_dir=cache, seed=seed, progress=False, **COLD_START)


def train(model: Path, out: Path, seed: int, sampler: str) -> dict:
    """One ``grpokit train`` run of the default recipe; its summary and the means of its metrics."""
    command = [sys.executable, "-m", "grpokit", "train", str(RECIPE), f"model={model}",
               f"output_dir={out}", f"seed={seed}", "disable_tqdm=true", "overwrite_output_dir=true",
               *SAMPLERS[sampler]]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(command, check=True, env=env, capture_output=True, text=True)
    return summarise(out, seed, sampler)


def summarise(out: Path, seed: int, sampler: str) -> dict:
    """A finished run's held-out accuracy before and after, and the means over its steps of its metrics."""
    summary = json.loads((out / "eval_summary.json").read_text())
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [s for s in steps if "reward" in s]

    def average(name: str) -> float | None:
        values = [s[name] for s in steps if name in s]
        return mean(values) if values else None

    return {
        "seed": seed,
        "sampler": sampler,
        "before": summary["before"]["accuracy"],
        "after": summary["after"]["accuracy"],
        "routing_mismatch": average("routing/sampler_mismatch"),
        "routing_overridden": average("routing/sampler_overridden"),
        "update_mismatch": average("routing/update_mismatch"),  # the update against the sampler's (mu 1)
        "logp_difference": average("sampling/sampling_logp_difference/mean"),
        "step_time_s": average("time/step"),
        "reward_last10": mean(s["reward"] for s in steps[-10:]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--runs", type=Path, default=Path("runs/moe-learning"))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/moe-learning.json"))
    parser.add_argument("--summarise-only", action="store_true", help="read the runs already in --runs")
    args = parser.parse_args()
    jobs = [(seed, sampler) for seed in args.seeds for sampler in SAMPLERS]
    if not args.summarise_only:
        models = {seed: policy(seed, args.runs / "cold-start") for seed in args.seeds}

    def run(job: tuple[int, str]) -> dict:
        seed, sampler = job
        if args.summarise_only:
            return summarise(args.runs / f"{sampler}-seed{seed}", seed, sampler)
        return train(models[seed], args.runs / f"{sampler}-seed{seed}", seed, sampler)

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(run, jobs))
    by_sampler = {
        sampler: {
            "before": mean(r["before"] for r in results if r["sampler"] == sampler),
            "after": mean(r["after"] for r in results if r["sampler"] == sampler),
        }
        for sampler in SAMPLERS
    }
    record = {"cold_start": COLD_START, "recipe": "arithmetic-tiny", "runs": results, "mean": by_sampler}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    def shown(value: float | None) -> str:
        return "-" if value is None else f"{value:.5f}"

    for r in results:  # the sampler's experts against the old-policy pass's choice: used, or overridden (R3)
        print(f"seed {r['seed']} {r['sampler']:<8} held-out {r['before']:.3f} -> {r['after']:.3f}  "
              f"routing: mismatch {shown(r['routing_mismatch'])} overridden {shown(r['routing_overridden'])}"
              f"  update mismatch {shown(r['update_mismatch'])}  logp gap {shown(r['logp_difference'])}  "
              f"step {r['step_time_s']:.2f} s")  # fmt: skip
    print(json.dumps(by_sampler, indent=2))


if __name__ == "__main__":
    main()

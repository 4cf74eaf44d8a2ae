"""Side-by-side GRPO step benchmark: grpokit vs TRL's GRPOTrainer on the same work.

Each (side, workload) run is its own subprocess (so peak RSS is per side), sides alternate run by run, the
first ``--warmup`` GRPO step of every run is excluded. Prints per-phase times, step-time ratios, peak RSS.
Normally started by ``bash benchmarks/run.sh`` (which also creates the TRL environment).

    python benchmarks/bench_grpo.py --trl-python benchmarks/.venv-trl/bin/python [--workloads W1,W2]
        [--rounds 2] [--steps 3] [--threads N] [--impl loop|trainer] [--work-dir DIR]
        [--sides trl,grpokit,trl-bf16,grpokit-bf16]

A side ``-bf16`` runs with ``bf16=True`` (autocast over the fp32 weights; grpokit: ``--impl trainer``). The
summary gives every grpokit side's step ratio against every TRL side's (``ratios``); ``step_ratio`` stays
grpokit / trl, both fp32.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from common import PHASES, WORKLOADS, length_summary, side_name  # noqa: E402


def run_side(python: str, script: str, args: list[str], env: dict, log_path: str) -> None:
    cmd = [python, os.path.join(HERE, script), *args]
    with open(log_path, "w") as log:
        proc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=HERE, check=False)
    if proc.returncode != 0:
        with open(log_path) as f:
            tail = f.read()[-4000:]
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}); log {log_path}:\n{tail}")


def summarise(results: list[dict]) -> dict:
    steps = [s for r in results for s in r["steps"]]
    lengths = [step for r in results for step in r.get("lengths") or []]
    real = {}
    if len(lengths) == len(steps) and lengths:  # tokens/s over the completions' real tokens, per step
        real = {
            "real_tokens_per_s": statistics.median(
                sum(n["completions"]) / s["step"] for n, s in zip(lengths, steps)
            ),
            "completion_lengths": [length_summary(n["completions"]) for n in lengths],
            "prompt_lengths": [length_summary(n["prompts"]) for n in lengths],
            "lengths": lengths,  # per timed step: each distinct prompt's and each completion's tokens
        }
    return {
        **real,
        "step_median": statistics.median(s["step"] for s in steps),
        "step_min": min(s["step"] for s in steps),
        "phases": {p: statistics.median(s.get(p, 0.0) for s in steps) for p in PHASES},
        "peak_rss_mib": max(r["peak_rss_mib"] for r in results),
        "num_steps": len(steps),
        "step_times": [round(s["step"], 3) for s in steps],
        "precision": results[0].get("precision", "fp32"),
        "old_logprobs_from_sampler": results[0].get("old_logprobs_from_sampler"),  # grpokit's trainer, mu > 1
    }


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trl-python", default=os.path.join(HERE, ".venv-trl", "bin", "python"))
    ap.add_argument("--grpokit-python", default=sys.executable)
    ap.add_argument("--workloads", default="W1,W2")
    ap.add_argument("--rounds", type=int, default=2, help="runs per side and workload (alternating order)")
    ap.add_argument("--steps", type=int, default=3, help="timed GRPO steps per run")
    ap.add_argument("--warmup", type=int, default=1, help="untimed GRPO steps at the start of each run")
    ap.add_argument(
        "--threads", type=int, default=os.cpu_count() or 1, help="torch/OpenMP threads, both sides"
    )
    ap.add_argument(
        "--impl", choices=("loop", "trainer"), default="loop", help="grpokit side, see side_grpokit.py"
    )
    ap.add_argument(
        "--sides",
        default="trl,grpokit",
        help="trl, grpokit, trl-bf16, grpokit-bf16 (bf16=True), comma-separated",
    )
    ap.add_argument(
        "--micro-batch-tokens",
        type=int,
        default=None,
        help="grpokit trainer sides: one optimizer step over all rows in micro-batches filled up to this "
        "many real tokens (GRPOConfig.micro_batch_tokens) instead of whole groups of a padded token budget",
    )
    ap.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        help="grpokit trainer sides: gradient_checkpointing=True, TRL GRPOConfig's default (grpokit's is "
        "False)",
    )
    ap.add_argument(
        "--fixed-samples",
        action="store_true",
        help="every side trains on the same completions: recorded once per workload and round from the "
        "initial model (fixed_samples.py) and replayed instead of sampling (grpokit: a rollout_backend; TRL: "
        "a rollout_func), the dataset read in order; the step ratio then compares the same work (generation "
        "excluded)",
    )
    ap.add_argument("--work-dir", default=os.path.join(tempfile.gettempdir(), "grpokit-bench"))
    ap.add_argument("--json", default=None, help="also write the summary here")
    a = ap.parse_args()
    if a.micro_batch_tokens is not None and a.impl != "trainer":
        raise SystemExit("--micro-batch-tokens runs with --impl trainer")
    if a.gradient_checkpointing and a.impl != "trainer":
        raise SystemExit("--gradient-checkpointing runs with --impl trainer")
    if a.fixed_samples and a.impl != "trainer":
        raise SystemExit("--fixed-samples runs with --impl trainer")

    os.makedirs(a.work_dir, exist_ok=True)
    model_dirs = {}  # per model kind: tiny_model.py's random Qwen2, smollm2.py's SmolLM2-135M-Instruct
    for kind in {WORKLOADS[w].model for w in a.workloads.split(",")}:
        model_dirs[kind] = os.path.join(a.work_dir, "model" if kind == "tiny" else kind)
        script = "tiny_model.py" if kind == "tiny" else f"{kind}.py"
        subprocess.run(
            [a.grpokit_python, os.path.join(HERE, script), model_dirs[kind]],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS=str(a.threads),
        MKL_NUM_THREADS=str(a.threads),
        TOKENIZERS_PARALLELISM="false",
        PYTHONWARNINGS="ignore",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_VERBOSITY="error",
    )
    sides = a.sides.split(",")
    kinds = {side: side_name(side) for side in sides}  # side -> (implementation, precision)
    if a.impl == "loop" and any(kinds[s] == ("grpokit", "bf16") for s in sides):
        raise SystemExit("grpokit-bf16 runs with --impl trainer (the loop is fp32)")
    pythons = {"trl": a.trl_python, "grpokit": a.grpokit_python}
    scripts = {"trl": "side_trl.py", "grpokit": "side_grpokit.py"}
    workloads = a.workloads.split(",")
    raw: dict[tuple[str, str], list[dict]] = {(s, w): [] for s in sides for w in workloads}
    started = time.time()
    for rnd in range(a.rounds):
        for w in workloads:
            samples = []
            if a.fixed_samples:  # this round's completions, the same for every side
                path = os.path.join(a.work_dir, f"fixed-samples-{w}-{rnd}.json")
                record = ["--model", model_dirs[WORKLOADS[w].model], "--workload", w, "--steps", str(a.steps)]
                record += ["--warmup", str(a.warmup), "--seed", str(rnd), "--out", path]
                run_side(a.grpokit_python, "fixed_samples.py", record, env, path + ".log")
                samples = ["--fixed-samples", path]
            order = sides if rnd % 2 == 0 else list(reversed(sides))
            for side in order:
                out = os.path.join(a.work_dir, f"{side}-{w}-{rnd}.json")
                args = [
                    "--model",
                    model_dirs[WORKLOADS[w].model],
                    "--workload",
                    w,
                    "--steps",
                    str(a.steps),
                    "--warmup",
                    str(a.warmup),
                    "--out",
                    out,
                    "--seed",
                    str(rnd),
                ]
                impl, precision = kinds[side]
                args += ["--precision", precision, *samples]
                if impl == "grpokit":
                    args += ["--impl", a.impl]
                    if a.micro_batch_tokens is not None:
                        args += ["--micro-batch-tokens", str(a.micro_batch_tokens)]
                    if a.gradient_checkpointing:
                        args += ["--gradient-checkpointing"]
                t0 = time.time()
                run_side(pythons[impl], scripts[impl], args, env, out + ".log")
                with open(out) as f:
                    result = json.load(f)
                raw[(side, w)].append(result)
                steps = ", ".join(f"{s['step']:.2f}" for s in result["steps"])
                print(
                    f"[round {rnd}] {w} {side:8s} steps: {steps} s   peak RSS"
                    f" {result['peak_rss_mib']:.0f} MiB"
                    f"   ({time.time() - t0:.0f} s)",
                    flush=True,
                )

    summary = {
        "machine": {
            "cpu": cpu_model(),
            "cores": os.cpu_count(),
            "threads": a.threads,
            "python": platform.python_version(),
        },
        "settings": {
            "rounds": a.rounds,
            "steps": a.steps,
            "warmup": a.warmup,
            "impl": a.impl,
            "micro_batch_tokens": a.micro_batch_tokens,
            "gradient_checkpointing": a.gradient_checkpointing,
            "fixed_samples": a.fixed_samples,
            "ld_preload": os.environ.get("LD_PRELOAD"),  # an allocator every side ran under (jemalloc)
        },
        "versions": {s: raw[(s, workloads[0])][0].get("versions") for s in sides},
        "workloads": {},
    }
    for w in workloads:
        entry = {s: summarise(raw[(s, w)]) for s in sides}
        if "trl" in entry and "grpokit" in entry:
            entry["step_ratio"] = entry["grpokit"]["step_median"] / entry["trl"]["step_median"]
            entry["rss_ratio"] = entry["grpokit"]["peak_rss_mib"] / entry["trl"]["peak_rss_mib"]
        if a.fixed_samples:  # whether every side trained on the recorded completions, step by step
            digests = {
                s: [step.get("digest") for r in raw[(s, w)] for step in r.get("lengths") or []] for s in sides
            }
            entry["same_completions"] = (
                len({tuple(d) for d in digests.values()}) == 1 and None not in digests[sides[0]]
            )
        pairs = [(g, t) for g in sides for t in sides if kinds[g][0] == "grpokit" and kinds[t][0] == "trl"]
        entry["ratios"] = {
            f"{g}/{t}": {
                "step": entry[g]["step_median"] / entry[t]["step_median"],
                "rss": entry[g]["peak_rss_mib"] / entry[t]["peak_rss_mib"],
            }
            for g, t in pairs
        }
        if entry.get("same_completions"):  # step k of both sides trained on the same completions
            for g, t in pairs:
                steps = zip(entry[g]["step_times"], entry[t]["step_times"], strict=True)
                entry["ratios"][f"{g}/{t}"]["per_step"] = [round(gs / ts, 3) for gs, ts in steps]
        summary["workloads"][w] = entry

    print(
        f"\nmachine: {summary['machine']['cpu']}, {summary['machine']['cores']} cores, {a.threads} threads;"
        f" {a.rounds} rounds x {a.steps} timed steps per side (warm-up {a.warmup} excluded);"
        f" total {time.time() - started:.0f} s"
    )
    for w in workloads:
        wl = WORKLOADS[w]
        entry = summary["workloads"][w]
        print(
            f"\n{w}: {wl.num_prompts} prompts x G={wl.num_generations}, prompt {wl.prompt_len} tokens, "
            f"{wl.max_new_tokens} new tokens, beta {wl.beta}, mu {wl.num_iterations}"
        )
        header = f"  {'phase (median s)':18s}" + "".join(f"{s:>14s}" for s in sides)
        if "step_ratio" in entry:
            header += f"{'grpokit/trl':>14s}"
        print(header)
        for p in (*PHASES, "step"):
            vals = [entry[s]["phases"][p] if p != "step" else entry[s]["step_median"] for s in sides]
            line = f"  {p:18s}" + "".join(f"{v:14.3f}" for v in vals)
            if "step_ratio" in entry:
                t, g = entry["trl"], entry["grpokit"]
                tv = t["phases"][p] if p != "step" else t["step_median"]
                gv = g["phases"][p] if p != "step" else g["step_median"]
                line += f"{(gv / tv if tv > 1e-9 else float('nan')):14.3f}"
            print(line)
        print(
            f"  {'peak RSS (MiB)':18s}"
            + "".join(f"{entry[s]['peak_rss_mib']:14.0f}" for s in sides)
            + (f"{entry['rss_ratio']:14.3f}" if "rss_ratio" in entry else "")
        )
        for s in sides:
            if "real_tokens_per_s" in entry[s]:
                spread = "; ".join(
                    f"{c['min']}/{c['median']}/{c['p90']}/{c['max']}" for c in entry[s]["completion_lengths"]
                )
                print(
                    f"  {s}: {entry[s]['real_tokens_per_s']:.1f} real completion tokens/s; completion "
                    f"lengths per step (min/median/p90/max): {spread}"
                )
        if "same_completions" in entry:
            same = "yes" if entry["same_completions"] else "NO: the step ratios compare different work"
            print(f"  every side trained on the same recorded completions at every timed step: {same}")
        for pair, ratio in entry["ratios"].items():
            if "per_step" in ratio:
                tokens = [sum(n["completions"]) for n in entry[sides[0]]["lengths"]]
                each = ", ".join(
                    f"{r:.3f} ({n} tokens)" for r, n in zip(ratio["per_step"], tokens, strict=True)
                )
                print(f"  {pair} step by step, on the same completions: {each}")
            if pair != "grpokit/trl":
                print(f"  => {pair}: step time ratio {ratio['step']:.3f}, peak RSS ratio {ratio['rss']:.3f}")
        if "step_ratio" in entry:
            print(
                f"  => grpokit step time = {entry['step_ratio']:.3f} x TRL's"
                f" ({1 / entry['step_ratio']:.2f}x faster);"
                f" peak RSS = {entry['rss_ratio']:.3f} x TRL's"
            )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)
    with open(os.path.join(a.work_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()

"""The memory plan against the measured peak of real GRPO steps on two CPU processes, for every placement.

For each placement (ddp, fsdp, zero2, zero3) and variant (fp32: float32 weights; bf16: bf16 autocast over
float32 weights; lora: LoRA r 16 on every linear layer, bf16 autocast), two CPU processes (``torchrun
--standalone --nproc_per_node 2``, gloo over loopback, one thread each) run two real ``GRPOTrainer`` steps
of a 34 M-parameter Llama (the model of tests/train/test_memory_plan.py; 2 prompts x G 4 per process,
16 + 96 tokens, a reference) with the fast sampler (EOS never ends a completion, so every completion has
``max_completion_length`` tokens, as the plan counts). Each process samples its anonymous memory
(``RssAnon``) every 0.2 ms from a thread, glibc returning freed blocks to the system
(``MALLOC_MMAP_THRESHOLD_``), and reports its peak above its baseline (taken after the imports, the process
group and a warm-up of the kernels, before the model is built) per phase: the trainer's ``PhaseTimer``
phases (generate, old_logprobs, reference, update: its backward, its optimizer step and the rest), "setup"
(building the model and the trainer), "other" (the steps outside the timed phases), "resident" (after the
steps). The plan is ``plan_memory(config, args, num_processes=2, strategy=..., device_type="cpu")``; the
ratio is the measured peak over the two steps / the plan's peak (setup apart: a CPU process first builds
the whole model in its own memory, which on a GPU is host memory). Exits 1 when a ratio is outside
``--band`` (0.8-1.25).

All placements of the chosen variants run in one launch, one after the other, each from a fresh model and
trainer (the baseline taken again before each): about 10 minutes for all on 2 cores, so this is a benchmark
(benchmarks/results/memory-placements-2core.txt), not a test.

    python benchmarks/memory_placements.py [--variants fp32,bf16,lora] [--placements ddp,fsdp,zero2,zero3]
        [--json OUT.json] [--band 0.8 1.25]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

PLACEMENTS = ("ddp", "fsdp", "zero2", "zero3")
VARIANTS = ("fp32", "bf16", "lora")
STRATEGY = {"ddp": "ddp", "fsdp": "fsdp", "zero2": "zero", "zero3": "zero3"}  # plan_memory's names
MODEL = dict(vocab_size=8192, hidden_size=512, num_hidden_layers=8, num_attention_heads=8)
MODEL |= dict(intermediate_size=1408, tie_word_embeddings=False, max_position_embeddings=512)
LORA_R = 16
PLAN_PHASES = {  # the trainer's timed phases -> the plan's phase they belong to
    "generate": "generation",
    "old_logprobs": "logprobs",
    "reference": "logprobs",
    "update": "update",
    "update.backward": "update",
    "update.step": "update",
}


def run_args(variant: str, placement: str, output_dir: str) -> dict[str, Any]:
    """The GRPOConfig values of one measured run: 2 prompts x G 4 per process, 16 prompt + 96 completion
    tokens (long enough that the update runs every row whole, as the plan counts: the shared-prefix forward
    would save less than its threshold), one micro-batch of 8 rows, a reference (beta 0.04) except with
    LoRA (the base is the reference, its pass still runs)."""
    args: dict[str, Any] = dict(num_generations=4, per_device_train_batch_size=8, max_prompt_length=16)
    args |= dict(max_completion_length=96, learning_rate=1e-5, disable_tqdm=True, max_steps=2, beta=0.04)
    args |= dict(output_dir=output_dir, use_cpu=True, cpu_memory_reuse=False, report_to=[], save_steps=0)
    args |= dict(generation_backend="fast", seed=0)
    args["bf16"] = variant in ("bf16", "lora")  # fp32 stated: no processor-chosen default
    if placement == "fsdp":
        args["fsdp"] = "full_shard"
    elif placement.startswith("zero"):
        args["deepspeed"] = placement
    return args


# ------------------------------------------------------------------------------------------------ worker
def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


class Sampler:
    """RssAnon every 0.2 ms, its peak per phase label (``phase``), from a thread."""

    def __init__(self) -> None:
        self.phase, self.peaks = "setup", {}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._done.is_set():
            self.record()
            time.sleep(0.0002)

    def record(self) -> None:
        value, phase = _status("RssAnon"), self.phase
        self.peaks[phase] = max(self.peaks.get(phase, 0), value)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._done.set()
        self._thread.join()
        self.record()


@contextmanager
def labelled(sampler: Sampler, name: str):
    """The sampler's label is ``name`` for the duration (then the outer one again)."""
    outer = sampler.phase
    sampler.record()
    sampler.phase = name
    try:
        yield
    finally:
        sampler.record()
        sampler.phase = outer


@contextmanager
def labelled_phases(sampler: Sampler):
    """The trainer's ``PhaseTimer`` phases set the sampler's label (nested phases: the innermost); within
    the update, the backward passes ("update.backward") and the optimizer steps ("update.step": DeepSpeed's
    engine step, which prepares its float32 gradients, or the optimizer's)."""
    import deepspeed
    import torch

    from grpokit.reporting.metrics import PhaseTimer

    patched = [
        (PhaseTimer, "phase", lambda name: name),
        (torch.autograd, "backward", lambda *a: "update.backward"),
        (torch.optim.AdamW, "step", lambda *a: "update.step"),
        (deepspeed.DeepSpeedEngine, "step", lambda *a: "update.step"),
    ]
    originals = [(owner, attr, getattr(owner, attr)) for owner, attr, _ in patched]

    def wrap(original, label, is_timer):
        if is_timer:

            @contextmanager
            def phase(self, name):
                with labelled(sampler, label(name)), original(self, name):
                    yield

            return phase

        def call(*args, **kwargs):
            if sampler.phase.startswith("update."):  # DeepSpeed's step calls AdamW's
                return original(*args, **kwargs)
            with labelled(sampler, label()):
                return original(*args, **kwargs)

        return call

    for (owner, attr, label), (_, _, original) in zip(patched, originals):
        setattr(owner, attr, wrap(original, label, owner is PhaseTimer))
    try:
        yield
    finally:
        for owner, attr, original in originals:
            setattr(owner, attr, original)


class NoStop:
    """A backend that never ends a completion at EOS: every completion is ``max_completion_length`` long."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def generate(self, prompt_ids, num_generations, params):
        return self.inner.generate(prompt_ids, num_generations, dataclasses.replace(params, eos_token_ids=()))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def reward(prompts, completions, completion_ids, **kwargs):
    return [float(i % 3) for i in range(len(completions))]


def measure(variant: str, placement: str, work: Path) -> dict[str, Any]:
    """One placement's two steps in this process: peak RssAnon above the baseline, per phase."""
    import torch
    from accelerate.state import AcceleratorState
    from transformers import AutoConfig, AutoModelForCausalLM

    from grpokit import GRPOConfig, GRPOTrainer
    from grpokit.models import build_char_tokenizer

    AcceleratorState._reset_state(reset_partial_state=False)  # each placement its own precision
    tokenizer = build_char_tokenizer()
    rows = [{"prompt": f"{i * 7919:016d}"} for i in range(16)]  # 16 tokens each
    args = GRPOConfig(**run_args(variant, placement, str(work / f"{variant}-{placement}")))
    peft = None
    if variant == "lora":
        from peft import LoraConfig

        peft = LoraConfig(r=LORA_R, lora_alpha=2 * LORA_R, target_modules="all-linear", task_type="CAUSAL_LM")
    gc.collect()
    base = _status("RssAnon")
    with Sampler() as sampler, labelled_phases(sampler):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **MODEL), dtype=torch.float32)
        trainer = GRPOTrainer(model, [reward], args, train_dataset=rows, processing_class=tokenizer,
                              peft_config=peft)  # fmt: skip
        del model
        trainer.backend = NoStop(trainer.backend)
        sampler.record()
        sampler.phase = "other"  # what the steps do outside the timed phases
        for _ in range(2):  # the second step has the optimizer state
            trainer.training_step()
        sampler.record()
        sampler.phase = "resident"  # after the steps: what every phase holds
    peaks = {phase: value - base for phase, value in sampler.peaks.items()}
    steps = max(v for k, v in peaks.items() if k != "setup")
    del trainer
    gc.collect()
    return {"variant": variant, "placement": placement, "peaks": peaks, "steps_peak": steps}


def worker(variants: list[str], placements: list[str], out: str) -> None:
    import torch

    torch.set_num_threads(1)
    import deepspeed  # noqa: F401  (imported before any baseline: its import is not the run's memory)
    import peft  # noqa: F401
    from accelerate.state import PartialState
    from transformers import AutoConfig, AutoModelForCausalLM

    from grpokit.parallel.distributed import end_processes

    state = PartialState(cpu=True)  # the process group (gloo) before any baseline
    # first use of the kernels (thread pools, workspaces) before the baseline
    warm = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", vocab_size=64, hidden_size=16,
        num_hidden_layers=1, num_attention_heads=2, intermediate_size=32))  # fmt: skip
    with torch.autocast("cpu", dtype=torch.bfloat16):
        warm(torch.tensor([[1, 2, 3]]), labels=torch.tensor([[1, 2, 3]])).loss.backward()
    warm(torch.tensor([[1, 2, 3]]), labels=torch.tensor([[1, 2, 3]])).loss.backward()
    del warm
    work = Path(out)
    results = []
    for variant in variants:
        for placement in placements:
            started = time.perf_counter()
            result = measure(variant, placement, work)
            result["seconds"] = time.perf_counter() - started
            results.append(result)
            torch.distributed.barrier()
    (work / f"rank{state.process_index}.json").write_text(json.dumps(results))
    end_processes()


# ------------------------------------------------------------------------------------------------ launcher
def plan_for(variant: str, placement: str):
    from transformers import AutoConfig

    from grpokit import GRPOConfig
    from grpokit.cli.memory_plan import plan_memory

    args = GRPOConfig(**run_args(variant, placement, "unused"))
    return plan_memory(
        AutoConfig.for_model("llama", **MODEL), args, num_processes=2, strategy=STRATEGY[placement],
        device_type="cpu", lora_r=LORA_R if variant == "lora" else None,
    )  # fmt: skip


def launch(variants: list[str], placements: list[str], work: str) -> list[list[dict[str, Any]]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_RANK"))}
    env |= {"OMP_NUM_THREADS": "1", "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    command = [*launcher, __file__, "--worker", "--variants", ",".join(variants)]
    command += ["--placements", ",".join(placements), "--out", work]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stderr[-6000:]}")
    return [json.loads((Path(work) / f"rank{k}.json").read_text()) for k in (0, 1)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--placements", default=",".join(PLACEMENTS))
    parser.add_argument("--json", help="write every measurement and plan here")
    parser.add_argument("--band", type=float, nargs=2, default=(0.8, 1.25), help="measured / planned bounds")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    options = parser.parse_args()
    variants, placements = options.variants.split(","), options.placements.split(",")
    if options.worker:
        worker(variants, placements, options.out)
        return
    mib = 2**20
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        ranks = launch(variants, placements, work)
    seconds = time.perf_counter() - started
    import deepspeed
    import torch

    lines = Path("/proc/cpuinfo").read_text().splitlines()
    cpu = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "?")
    print(f"{time.strftime('%Y-%m-%d')}, {cpu}, {os.cpu_count()} cores; torch {torch.__version__}, "
          f"deepspeed {deepspeed.__version__}; {seconds:.0f} s for the launch")  # fmt: skip
    print(f"python benchmarks/memory_placements.py --variants {options.variants} --placements "
          f"{options.placements}")  # fmt: skip
    print("MiB per process above its baseline. steps: the peak over the two steps; resident: after them;")
    print(
        "update: its backward / optimizer step / the rest (forward, DeepSpeed's reduction after the backward)"
    )
    print(f"{'variant':<8}{'placement':<10}{'rank':>5}{'setup':>7}{'resident':>9}{'steps':>7}{'plan':>7}"
          f"{'ratio':>7}  per phase, measured/planned")  # fmt: skip
    records, ratios = [], []
    for first, second in zip(*ranks):
        plan = plan_for(first["variant"], first["placement"])
        for rank, result in enumerate((first, second)):
            peaks = {k: v / mib for k, v in result["peaks"].items()}
            by_plan: dict[str, float] = {}
            for phase, planned in PLAN_PHASES.items():
                if phase in peaks:
                    by_plan[planned] = max(by_plan.get(planned, 0), peaks[phase])
            phases = "  ".join(
                f"{name} {by_plan.get(name, 0):.0f}/{value / mib:.0f}" for name, value in plan.phases.items()
            )
            update = "/".join(f"{peaks.get(k, 0):.0f}" for k in ("update.backward", "update.step", "update"))
            ratio = result["steps_peak"] / plan.peak
            ratios.append(ratio)
            print(f"{result['variant']:<8}{result['placement']:<10}{rank:>5}{peaks['setup']:>7.0f}"
                  f"{peaks['resident']:>9.0f}{result['steps_peak'] / mib:>7.0f}{plan.peak / mib:>7.0f}"
                  f"{ratio:>7.2f}  {phases}  (update {update})")  # fmt: skip
            records.append({**result, "rank": rank, "plan": plan.to_dict(), "ratio": ratio})
    low, high = options.band
    outside = [r for r in records if not low <= r["ratio"] <= high]
    print(f"ratios {min(ratios):.2f}-{max(ratios):.2f}; " + (
        f"{len(outside)} outside {low}-{high}" if outside else f"all within {low}-{high}"))  # fmt: skip
    if options.json:
        Path(options.json).write_text(json.dumps(records, indent=1))
    if outside:
        raise SystemExit(1)


if __name__ == "__main__":
    main()

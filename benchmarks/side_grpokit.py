"""grpokit side of the benchmark: one workload, the same GRPO configuration as side_trl.py.

Two implementations of the same step, chosen with ``--impl``:

- ``loop`` (default): the GRPO step of ``examples/grpo_minimal.py`` (grpokit's parts: ``FastSampler``, the
  lean ``completion_logprobs`` / ``no_grad_logprobs``, ``core.group_advantages``, ``core.PolicyLoss``), with
  the phases timed one by one.
- ``trainer``: ``grpokit.GRPOTrainer`` with the default generation backend (``auto``: the fast sampler for
  this Qwen2 model), phases from its ``time/*``
  metrics).

Usage: python side_grpokit.py --model DIR --workload W1 --steps 3 --warmup 1 --out result.json
    [--impl trainer] [--precision bf16] [--micro-batch-tokens N] [--gradient-checkpointing]
    [--fixed-samples FILE]
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import (
    NUM_DATASET_PROMPTS,
    WORKLOADS,
    FixedSamples,
    PhaseTimer,
    Workload,
    benchmark_rows,
    reward_fn,
    side_arguments,
    step_lengths,
    write_result,
)


def run_loop(model_dir: str, wl: Workload, steps: int, seed: int, timer: PhaseTimer) -> dict:
    """The GRPO step of examples/grpo_minimal.py (the library's one-file statement of the algorithm), with
    grpokit's fast sampler, phase by phase."""
    import torch
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from grpokit.rollout import FastSampler
    from grpokit.train.forward import micro_batch_rows

    minimal = _load_minimal()
    torch.manual_seed(seed)
    if wl.model != "tiny":
        raise SystemExit(f"{wl.name} (chat prompts) runs with --impl trainer")
    tokenizer = PreTrainedTokenizerFast.from_pretrained(model_dir)
    tokenizer.eos_token = None  # every completion runs to full length (TRL side: EOS suppressed)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ref = None
    if wl.beta > 0:
        ref = (
            AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval().requires_grad_(False)
        )
    optimizer = torch.optim.AdamW(model.parameters(), lr=wl.learning_rate, weight_decay=0.0)
    args = workload_config(wl, per_device_train_batch_size=wl.batch)
    rows = benchmark_rows(wl, NUM_DATASET_PROMPTS, seed)
    # One optimizer step over all rows, as on the TRL side, accumulated over micro-batches of whole groups
    # (the same gradient with less activation memory).
    micro = micro_batch_rows(wl.batch, wl.prompt_len, wl.max_new_tokens, wl.num_generations)
    sampler = FastSampler(model)
    for step in range(steps):
        first = (step * wl.num_prompts) % len(rows)
        batch_rows = [rows[(first + k) % len(rows)] for k in range(wl.num_prompts)]
        timer.start_step()
        minimal.grpo_step(
            model, ref, optimizer, sampler, tokenizer, [reward_fn], batch_rows, args,
            micro_batch_size=micro, phase=timer.phase,
        )  # fmt: skip
        timer.end_step()
    return {"torch_threads": torch.get_num_threads(), "versions": {"torch": torch.__version__}}


def workload_config(wl: Workload, **extra):
    """The workload's GRPO settings (the same as side_trl.py's) as a GRPOConfig."""
    from grpokit import GRPOConfig

    return GRPOConfig(
        num_generations=wl.num_generations,
        max_completion_length=wl.max_new_tokens,
        max_prompt_length=None,
        temperature=wl.temperature,
        beta=wl.beta,
        num_iterations=wl.num_iterations,
        learning_rate=wl.learning_rate,
        loss_type="grpo",
        **extra,
    )


def _load_minimal():
    """examples/grpo_minimal.py as a module."""
    path = Path(__file__).resolve().parents[1] / "examples" / "grpo_minimal.py"
    spec = importlib.util.spec_from_file_location("grpo_minimal", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class ReplayBackend:
    """A generation backend (grpokit's ``RolloutBackend`` protocol) that replays recorded completions
    (``common.FixedSamples``) instead of sampling."""

    def __init__(self, samples: FixedSamples) -> None:
        self.samples = samples

    def generate(self, prompt_ids, num_generations: int, params):
        from grpokit.rollout import GenerationOutput

        rows = [ids for ids in prompt_ids for _ in range(num_generations)]  # one row per completion
        completions = self.samples.completions(rows)
        ended = [bool(ids) and ids[-1] in params.eos_token_ids for ids in completions]
        return GenerationOutput(completions, truncated=[not e for e in ended])


def run_trainer(
    model_dir: str,
    wl: Workload,
    steps: int,
    seed: int,
    timer: PhaseTimer,
    precision: str = "fp32",
    warmup: int = 1,
    micro_batch_tokens: int | None = None,
    gradient_checkpointing: bool = False,
    backward_heap: bool = True,
    transient_heap: bool = True,
    fixed_samples: str | None = None,
) -> dict:
    """The same workload through grpokit.GRPOTrainer (fast backend); phases from its time/* metrics.
    ``precision`` bf16: ``bf16=True``, autocast over the fp32 weights (generation, log-prob passes and
    update). ``micro_batch_tokens``: the optimizer step's rows in micro-batches filled up to that many real
    tokens (``GRPOConfig.micro_batch_tokens``) instead of whole groups within ``micro_batch_rows``' budget.
    ``gradient_checkpointing``: the update's layers recompute their activations in the backward (TRL's
    default). ``backward_heap`` False: ``GRPOConfig.cpu_memory_reuse_in_backward=False``; ``transient_heap``
    False: ``GRPOConfig.cpu_memory_reuse_transient=False``. ``fixed_samples``: replay the completions recorded
    in that file (``ReplayBackend``) with the dataset read in order; no off-policy correction (the replay
    reports no log-probs; TRL applies none without vLLM either)."""
    import torch
    from transformers import PreTrainedTokenizerFast

    from grpokit import GRPOTrainer

    tokenizer = PreTrainedTokenizerFast.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    rows = benchmark_rows(wl, NUM_DATASET_PROMPTS, seed)
    from grpokit.train.forward import micro_batch_rows

    # One optimizer step over all wl.batch rows (as TRL), accumulated over micro-batches of whole groups.
    micro = micro_batch_rows(wl.batch, wl.prompt_len, wl.max_new_tokens, wl.num_generations)
    if micro_batch_tokens is not None:
        micro = wl.batch
    # The trainer saves its final model (517 MB for SmolLM2) into output_dir: a folder removed afterwards.
    with tempfile.TemporaryDirectory(prefix="bench-grpokit-") as output_dir:
        args = workload_config(
            wl,
            output_dir=output_dir,
            per_device_train_batch_size=micro,
            gradient_accumulation_steps=wl.batch // micro,
            micro_batch_tokens=micro_batch_tokens,
            gradient_checkpointing=gradient_checkpointing,
            cpu_memory_reuse_in_backward=backward_heap,
            cpu_memory_reuse_transient=transient_heap,
            max_steps=steps,
            logging_steps=1,
            report_to=[],
            seed=seed,
            disable_tqdm=True,
            bf16=precision == "bf16",
            shuffle_dataset=fixed_samples is None,
            vllm_importance_sampling_correction=fixed_samples is None,
        )
        if tokenizer.pad_token is None:  # SmolLM2: pad with its EOS token (before EOS may be switched off)
            tokenizer.pad_token = tokenizer.eos_token
        if not wl.eos:  # no EOS: every completion runs to max_completion_length (TRL side: EOS suppressed)
            tokenizer.eos_token = None
        trainer = GRPOTrainer(
            model=model_dir,
            reward_funcs=[reward_fn],
            args=args,
            train_dataset=rows,
            processing_class=tokenizer,
            rollout_backend=None if fixed_samples is None else ReplayBackend(FixedSamples(fixed_samples)),
        )
        history = trainer.train()
    for m in history:
        # The trainer times generate / reward / old log-probs / reference / update; the whole update
        # (forward + backward + optimizer) is reported under "backward".
        row = {"generate": m.get("time/generate", 0.0), "reward": m.get("time/reward", 0.0)}
        row.update(old_logps=m.get("time/old_logprobs", 0.0), ref_logps=m.get("time/reference", 0.0))
        row.update(policy_forward=0.0, backward=m.get("time/update", 0.0))
        row["other"] = max(0.0, m["time/step"] - sum(row.values()))
        row["step"] = m["time/step"]
        timer.steps.append(row)
    reused = [m["old_logprobs/from_sampler"] for m in history if "old_logprobs/from_sampler" in m]
    return {
        "torch_threads": torch.get_num_threads(),
        "versions": {"torch": torch.__version__},
        "old_logprobs_from_sampler": reused[-1] if reused else None,
        "lengths": step_lengths(tokenizer, warmup),
    }


def main() -> None:
    ap = side_arguments()
    ap.add_argument("--impl", choices=("loop", "trainer"), default="loop")
    ap.add_argument("--micro-batch-tokens", type=int, default=None, help="GRPOConfig.micro_batch_tokens")
    ap.add_argument("--gradient-checkpointing", action="store_true", help="GRPOConfig.gradient_checkpointing")
    ap.add_argument(
        "--no-backward-heap", action="store_true", help="GRPOConfig.cpu_memory_reuse_in_backward=False"
    )
    ap.add_argument(
        "--no-transient-heap", action="store_true", help="GRPOConfig.cpu_memory_reuse_transient=False"
    )
    a = ap.parse_args()
    wl = WORKLOADS[a.workload]
    timer = PhaseTimer()
    start = time.perf_counter()
    if a.impl == "loop":
        if a.precision != "fp32" or a.fixed_samples:
            raise SystemExit("--precision bf16 and --fixed-samples run with --impl trainer")
        extra = run_loop(a.model, wl, a.warmup + a.steps, a.seed, timer)
    else:
        extra = run_trainer(
            a.model, wl, a.warmup + a.steps, a.seed, timer, a.precision, a.warmup, a.micro_batch_tokens,
            a.gradient_checkpointing, not a.no_backward_heap, not a.no_transient_heap, a.fixed_samples,
        )  # fmt: skip
        extra["micro_batch_tokens"] = a.micro_batch_tokens
        extra["gradient_checkpointing"] = a.gradient_checkpointing
    extra["wall_s"] = time.perf_counter() - start
    extra["impl"] = a.impl
    extra["precision"] = a.precision
    write_result(a.out, "grpokit", wl, timer, a.warmup, extra)


if __name__ == "__main__":
    main()

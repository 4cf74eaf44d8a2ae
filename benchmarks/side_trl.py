"""TRL side of the benchmark: one workload through ``trl.GRPOTrainer``. Runs in benchmarks/.venv-trl only.

Usage: python side_trl.py --model DIR --workload W1 --steps 3 --warmup 1 --out result.json [--precision bf16]
    [--fixed-samples FILE]
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import (
    NUM_DATASET_PROMPTS,
    WORKLOADS,
    FixedSamples,
    PhaseTimer,
    benchmark_rows,
    prompt_token_ids,
    reward_fn,
    side_arguments,
    step_lengths,
    write_result,
)


def main() -> None:
    a = side_arguments().parse_args()

    import datasets
    import torch
    import trl
    from transformers import PreTrainedTokenizerFast, TrainerCallback

    wl = WORKLOADS[a.workload]
    tokenizer = PreTrainedTokenizerFast.from_pretrained(a.model)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:  # SmolLM2: pad with EOS (TRL's completion mask ends at the first EOS)
        tokenizer.pad_token = tokenizer.eos_token
    rows = benchmark_rows(wl, NUM_DATASET_PROMPTS, a.seed)
    dataset = datasets.Dataset.from_list(rows)
    total_steps = a.warmup + a.steps

    args = trl.GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench-trl-"),
        per_device_train_batch_size=wl.batch,
        gradient_accumulation_steps=1,
        num_generations=wl.num_generations,
        max_completion_length=wl.max_new_tokens,
        temperature=wl.temperature,
        beta=wl.beta,
        num_iterations=wl.num_iterations,
        learning_rate=wl.learning_rate,
        loss_type="grpo",
        scale_rewards="group",
        max_steps=total_steps * wl.num_iterations,  # TRL counts optimizer steps; one GRPO step = mu of them
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=a.precision == "bf16",  # autocast over the fp32 weights (accelerate's bf16 on the CPU)
        seed=a.seed,
        disable_tqdm=True,
        dataloader_num_workers=0,
        # Without wl.eos every completion runs to full length on both sides: EOS can never be sampled.
        generation_kwargs=None if wl.eos else {"suppress_tokens": [tokenizer.eos_token_id]},
        shuffle_dataset=a.fixed_samples is None,  # replaying: the recorded rows, in order
    )
    rollout_func = None
    if a.fixed_samples is not None:
        samples = FixedSamples(a.fixed_samples)
        os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"

        def rollout_func(prompts, trainer):
            """The recorded completions instead of sampling; ``prompts``: one per completion, each group's
            contiguous (TRL's repeat sampler)."""
            prompt_ids = [prompt_token_ids(tokenizer, prompt) for prompt in prompts]
            completion_ids = samples.completions(prompt_ids)
            return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}

    trainer = trl.GRPOTrainer(
        model=a.model, reward_funcs=[reward_fn], args=args, train_dataset=dataset, processing_class=tokenizer,
        rollout_func=rollout_func,
    )  # fmt: skip

    timer = PhaseTimer()

    def timed(obj, name, phase_of):
        original = getattr(obj, name, None)
        if original is None:  # another TRL version: that phase is then counted under "other"
            print(f"warning: {type(obj).__name__}.{name} not found; not timed separately", file=sys.stderr)
            return

        def wrapper(*args, **kwargs):
            with timer.phase(phase_of(*args, **kwargs)):
                return original(*args, **kwargs)

        setattr(obj, name, wrapper)

    timed(trainer, "_generate", lambda *a, **k: "generate")
    timed(trainer, "_calculate_rewards", lambda *a, **k: "reward")

    def logps_phase(model, *args, **kwargs):
        if torch.is_grad_enabled():
            return "policy_forward"
        return "ref_logps" if model is trainer.ref_model else "old_logps"

    timed(trainer, "_get_per_token_logps_and_entropies", logps_phase)
    timed(trainer.accelerator, "backward", lambda *a, **k: "backward")

    mu = wl.num_iterations

    class StepTimes(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step % mu == 0:
                timer.start_step()

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % mu == 0:  # global_step was incremented before this callback
                timer.end_step()

    trainer.add_callback(StepTimes())
    start = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - start
    shutil.rmtree(args.output_dir, ignore_errors=True)  # (save_strategy "no": nothing in it worth keeping)
    write_result(
        a.out,
        "trl",
        wl,
        timer,
        a.warmup,
        {
            "wall_s": wall,
            "versions": {
                "trl": trl.__version__,
                "torch": torch.__version__,
                "transformers": __import__("transformers").__version__,
            },
            "torch_threads": torch.get_num_threads(),
            "precision": a.precision,
            "lengths": step_lengths(tokenizer, a.warmup),
        },
    )


if __name__ == "__main__":
    main()

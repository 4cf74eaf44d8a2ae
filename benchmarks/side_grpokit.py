"""grpokit side of the benchmark: one workload, the same GRPO configuration as side_trl.py.

Two implementations of the same step, chosen with ``--impl``:

- ``loop`` (default): the GRPO step written out over grpokit's parts (``FastSampler``, the lean
  ``completion_logprobs`` / ``no_grad_logprobs``, ``core.group_advantages``, ``core.policy_loss``), with the
  phases timed one by one.
- ``trainer``: ``grpokit.GRPOTrainer`` with ``generation_backend="fast"`` (phases from its ``time/*``
  metrics).

Usage: python side_grpokit.py --model DIR --workload W1 --steps 3 --warmup 1 --out result.json
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import (
    NUM_DATASET_PROMPTS,
    WORKLOADS,
    PhaseTimer,
    Workload,
    reward_fn,
    side_arguments,
    write_result,
)
from tiny_model import synthetic_prompts


def run_loop(model_dir: str, wl: Workload, steps: int, seed: int, timer: PhaseTimer) -> dict:
    """The GRPO step over grpokit's parts, phase by phase (mirrors GRPOTrainer.training_step)."""
    import torch
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from grpokit.core import group_advantages, policy_loss
    from grpokit.rollout.base import SamplingParams
    from grpokit.rollout.fast import FastSampler
    from grpokit.train.forward import completion_logprobs, micro_batch_rows, no_grad_logprobs

    torch.manual_seed(seed)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    ref = None
    if wl.beta > 0:
        ref = (
            AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval().requires_grad_(False)
        )
    optimizer = torch.optim.AdamW(model.parameters(), lr=wl.learning_rate, weight_decay=0.0)
    sampler = FastSampler(model)
    # Every completion runs to full length: no EOS ends a completion (TRL side: EOS suppressed).
    params = SamplingParams(
        max_new_tokens=wl.max_new_tokens,
        temperature=wl.temperature,
        eos_token_ids=(),
        pad_token_id=tokenizer.pad_token_id,
    )
    texts = synthetic_prompts(NUM_DATASET_PROMPTS, wl.prompt_len, seed=seed)
    all_ids = [tokenizer(t)["input_ids"] for t in texts]
    group = wl.num_generations

    for step in range(steps):
        timer.start_step()
        first = (step * wl.num_prompts) % len(all_ids)
        prompt_ids = [all_ids[(first + k) % len(all_ids)] for k in range(wl.num_prompts)]
        # 1. sample G completions per prompt
        with timer.phase("generate"):
            out = sampler.generate(prompt_ids, group, params)
        # 2. score
        with timer.phase("reward"):
            completions = tokenizer.batch_decode(out.completion_ids, skip_special_tokens=True)
            prompts = [t for t in tokenizer.batch_decode(prompt_ids) for _ in range(group)]
            rewards = torch.tensor(reward_fn(prompts, completions, out.completion_ids), dtype=torch.float32)
        # 3. group-relative advantages, padded batch
        advantages = group_advantages(rewards, group)
        width = max(len(p) for p in prompt_ids)
        p_ids = torch.zeros(wl.batch, width, dtype=torch.long)
        p_mask = torch.zeros(wl.batch, width, dtype=torch.long)
        for row in range(wl.batch):
            p = prompt_ids[row // group]
            p_ids[row, width - len(p) :] = torch.tensor(p)
            p_mask[row, width - len(p) :] = 1
        c_len = max(len(c) for c in out.completion_ids)
        c_ids = torch.zeros(wl.batch, c_len, dtype=torch.long)
        c_mask = torch.zeros(wl.batch, c_len, dtype=torch.long)
        for row, c in enumerate(out.completion_ids):
            c_ids[row, : len(c)] = torch.tensor(c)
            c_mask[row, : len(c)] = 1
        # 4. fixed log-probs: pi_old only when mu > 1, pi_ref only when beta > 0 (no gradient, inference mode)
        old_logps = ref_logps = None
        if wl.num_iterations > 1:
            with timer.phase("old_logps"):
                old_logps = no_grad_logprobs(
                    model, p_ids, p_mask, c_ids, c_mask, temperature=wl.temperature, num_generations=group
                )
        if ref is not None:
            with timer.phase("ref_logps"):
                ref_logps = no_grad_logprobs(
                    ref, p_ids, p_mask, c_ids, c_mask, temperature=wl.temperature, num_generations=group
                )
        # 5. mu policy updates on the same samples. One optimizer step over all rows, as on the TRL side;
        # the rows go through in equal micro-batches of whole groups (same gradient, less activation memory).
        rows = micro_batch_rows(wl.batch, width, c_len, group)
        parts = range(0, wl.batch, rows)
        for _ in range(wl.num_iterations):
            for s in parts:
                sl = slice(s, s + rows)
                with timer.phase("policy_forward"):
                    logps, _entropy = completion_logprobs(
                        model,
                        p_ids[sl],
                        p_mask[sl],
                        c_ids[sl],
                        c_mask[sl],
                        temperature=wl.temperature,
                        with_entropy=True,
                        num_generations=group,
                    )
                    loss, _metrics = policy_loss(
                        logps,
                        None if old_logps is None else old_logps[sl],
                        advantages[sl],
                        c_mask[sl].float(),
                        loss_type="grpo",
                        beta=wl.beta,
                        ref_logps=None if ref_logps is None else ref_logps[sl],
                    )
                with timer.phase("backward"):
                    (loss / len(parts)).backward()  # grpo loss is a per-row mean: equal parts average exactly
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        timer.end_step()
    return {"torch_threads": torch.get_num_threads(), "versions": {"torch": torch.__version__}}


def run_trainer(model_dir: str, wl: Workload, steps: int, seed: int, timer: PhaseTimer) -> dict:
    """The same workload through grpokit.GRPOTrainer (fast backend); phases from its time/* metrics."""
    import torch
    from transformers import PreTrainedTokenizerFast

    from grpokit import GRPOConfig, GRPOTrainer

    tokenizer = PreTrainedTokenizerFast.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    rows = [{"prompt": p} for p in synthetic_prompts(NUM_DATASET_PROMPTS, wl.prompt_len, seed=seed)]
    from grpokit.train.forward import micro_batch_rows

    # One optimizer step over all wl.batch rows (as TRL), accumulated over micro-batches of whole groups.
    micro = micro_batch_rows(wl.batch, wl.prompt_len, wl.max_new_tokens, wl.num_generations)
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench-grpokit-"),
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=wl.batch // micro,
        num_generations=wl.num_generations,
        max_completion_length=wl.max_new_tokens,
        max_prompt_length=None,
        temperature=wl.temperature,
        beta=wl.beta,
        num_iterations=wl.num_iterations,
        learning_rate=wl.learning_rate,
        loss_type="grpo",
        max_steps=steps,
        logging_steps=1,
        report_to=[],
        seed=seed,
        generation_backend="fast",
        disable_tqdm=True,
    )
    # No EOS: every completion runs to max_completion_length (TRL side: EOS suppressed).
    tokenizer.eos_token = None
    trainer = GRPOTrainer(
        model=model_dir, reward_funcs=[reward_fn], args=args, train_dataset=rows, processing_class=tokenizer
    )
    history = trainer.train()
    for m in history:
        # The trainer reports generate / reward / update; the fixed log-prob passes fall under "other" and
        # the whole update (forward + backward + optimizer) is reported under "backward".
        row = {"generate": m.get("time/generate", 0.0), "reward": m.get("time/reward", 0.0)}
        row.update(old_logps=0.0, ref_logps=0.0, policy_forward=0.0, backward=m.get("time/update", 0.0))
        row["other"] = max(0.0, m["time/step"] - sum(row.values()))
        row["step"] = m["time/step"]
        timer.steps.append(row)
    return {"torch_threads": torch.get_num_threads(), "versions": {"torch": torch.__version__}}


def main() -> None:
    ap = side_arguments()
    ap.add_argument("--impl", choices=("loop", "trainer"), default="loop")
    a = ap.parse_args()
    wl = WORKLOADS[a.workload]
    timer = PhaseTimer()
    start = time.perf_counter()
    run = run_loop if a.impl == "loop" else run_trainer
    extra = run(a.model, wl, a.warmup + a.steps, a.seed, timer)
    extra["wall_s"] = time.perf_counter() - start
    extra["impl"] = a.impl
    write_result(a.out, "grpokit", wl, timer, a.warmup, extra)


if __name__ == "__main__":
    main()

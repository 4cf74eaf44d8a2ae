"""Run by tests/vllm/test_colocate_processes.py under ``torchrun --nproc_per_node 2``: two GRPO steps with a
colocated vLLM engine in each CPU process (vLLM's external launcher over the trainer's gloo group), each
writing what it saw to ``<out>/rank<k>.json``."""

from __future__ import annotations

import json
import sys

import torch

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.parallel.distributed import end_processes
from grpokit.rollout import SamplingParams
from tests.vllm.helpers import digits, encode, hf_greedy, tiny_policy


def main(out: str) -> None:
    model, tokenizer = tiny_policy(seed=4, sharpen=2.0)
    rows = [{"prompt": f"{a}+{b}="} for a in range(10) for b in range(10)]
    config = GRPOConfig(
        output_dir=f"{out}/run", use_vllm=True, generation_dtype="float32", max_steps=2, num_generations=4,
        per_device_train_batch_size=8, max_prompt_length=8, max_completion_length=8, temperature=0.7,
        learning_rate=3e-2, beta=0.0, logging_steps=1, disable_tqdm=True, seed=0,
    )  # fmt: skip
    trainer = GRPOTrainer(model, [digits], config, rows, processing_class=tokenizer)
    history = trainer.train()
    prompts = encode(tokenizer, ["3+4=", "9+9=", "1+0="])
    params = SamplingParams(max_new_tokens=8, do_sample=False, eos_token_ids=(tokenizer.eos_token_id,))
    engine = trainer.backend.generate(prompts, 1, params).completion_ids
    params_sum = torch.cat([p.detach().flatten() for p in trainer.model.parameters()]).abs().sum()
    record = {
        "rank": trainer.accelerator.process_index,
        "num_processes": trainer.accelerator.num_processes,
        "pushes": trainer.backend.pushes,
        "engine_greedy": engine,
        "policy_greedy": hf_greedy(trainer.model, prompts, 8, tokenizer.eos_token_id),
        "param_checksum": float(params_sum),
        "history": history,
    }
    with open(f"{out}/rank{record['rank']}.json", "w") as handle:
        json.dump(record, handle)
    trainer.backend.close()  # both processes: vLLM's shutdown also ends the process group
    end_processes()


if __name__ == "__main__":
    main(sys.argv[1])

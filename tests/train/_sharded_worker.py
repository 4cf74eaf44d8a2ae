"""Run by tests/train/test_sharding.py: GRPO steps with scripted completions, sharded (``fsdp="full_shard"``)
over the processes of a ``torchrun`` launch, or in one process (the comparison). Writes the final weights
(``save_model``) to ``<out>/model`` and what the run saw to ``<out>/rank<k>.json``."""

from __future__ import annotations

import json
import sys

import torch

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.models.parts import decoder_of
from grpokit.parallel.distributed import end_processes
from grpokit.rollout import ScriptedBackend, make_backend

ANSWERS = ["3", "31", "310", "42+", "7", "", "12", "5555"]


def respond(prompt: str, index: int) -> str:
    return ANSWERS[(index + len(prompt)) % len(ANSWERS)]


def reward(prompts, completions, completion_ids, solution, **kwargs):
    return [(1.0 if s in c else 0.0) + 0.1 * len(c) for c, s in zip(completions, solution)]


def run(policy_dir: str, out: str, num_processes: int, option: str = "") -> GRPOTrainer:
    """``option``: "resume" (interrupt after step 1, resume), "checkpointing" (gradient checkpointing),
    "lora" (LoRA adapters on q/v/down projections), "bf16" (bf16 mixed precision); "zero2", "zero3" and
    "zero2-resume", "zero3-resume": DeepSpeed ZeRO instead of FSDP, two micro-batches per optimizer step."""
    torch.set_num_threads(1)
    zero = option.startswith("zero") and num_processes > 1
    accumulation = 2 if zero else 1
    rows = [{"prompt": f"{a}+{b}+{a}{b}=", "solution": str(a + b)} for a in range(4) for b in range(4)]
    config = GRPOConfig(
        output_dir=out,
        max_steps=2,
        num_generations=4,
        per_device_train_batch_size=16 // num_processes // accumulation,  # 4 prompts x G=4 per step in all
        gradient_accumulation_steps=accumulation,
        max_completion_length=6,
        num_iterations=2,
        beta=0.04,
        sync_ref_model=not option.startswith("lora"),  # reference reset every step (LoRA: refused)
        ref_model_sync_steps=1,
        learning_rate=1e-2,
        fsdp="full_shard" if num_processes > 1 and not zero else "",
        deepspeed=option.split("-")[0] if zero else None,
        gradient_checkpointing=option == "checkpointing",
        bf16=option == "bf16",
        save_steps=1,
        shuffle_dataset=False,
        disable_tqdm=True,
        seed=0,
    )
    peft = None
    if option.startswith("lora"):
        from peft import LoraConfig

        targets = ["q_proj", "v_proj", "down_proj"]
        peft = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=targets, task_type="CAUSAL_LM")
        config.learning_rate = 5e-2
    trainer = GRPOTrainer(policy_dir, [reward], config, train_dataset=rows, peft_config=peft)
    trainer.backend = ScriptedBackend(trainer.tokenizer, respond)
    if option.endswith("resume"):
        trainer.max_steps = 1  # interrupted after the checkpoint at step 1 ...
        trainer.train()
        trainer = GRPOTrainer(policy_dir, [reward], config, train_dataset=rows, peft_config=peft)
        trainer.backend = ScriptedBackend(trainer.tokenizer, respond)
        trainer.train(resume_from_checkpoint=True)  # ... and resumed for step 2
    else:
        trainer.train()
    return trainer


def main(policy_dir: str, out: str, num_processes: str, option: str = "") -> None:
    trainer = run(policy_dir, out, int(num_processes), option)
    # generation from the gathered weights: greedy fast sampler on held-out prompts
    trainer.backend = make_backend("fast", trainer.generation_model)
    gathered = []
    original = trainer.backend.generate

    def recording(*args, **kwargs):  # the dtype the sampler sees its weights in
        gathered.append(str(decoder_of(trainer.model).layers[0].mlp.up_proj.weight.dtype))
        return original(*args, **kwargs)

    trainer.backend.generate = recording
    greedy = trainer.sample([{"prompt": "9+9+99="}, {"prompt": "1+2+12="}], greedy=True).texts
    rank = trainer.accelerator.process_index
    record = {
        "sharded": trainer.sharded,
        "strategy": trainer.strategy,
        "greedy": greedy,
        "step": trainer.step,
    }
    record["compute_dtype"] = gathered[0]
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
    end_processes()

"""Run by tests/train/test_placement_matrix.py: the invariants of every placement x precision x (full, LoRA)
x gradient checkpointing, all in one launch (two processes under ``torchrun``, or one: the single-process
column and the reference every other cell is compared with).

Per cell, three runs of a real ``GRPOTrainer`` on scripted completions (the same batch in every cell):

- ``lr0``: one step at learning rate 0, mu 2, beta 0.04: the logged ratio, KL, clip fractions and loss
  (and, under DDP, how many gradient all-reduces the two optimizer steps of two micro-batches each made);
- ``steps``: two steps at a real learning rate (one with gradient checkpointing), a checkpoint after the
  first: the weights after each; then greedy completions of the fast sampler from the weights generation
  reads, the dtype it saw them in, and how many elements the generation model still holds afterwards;
- ``resume`` (without gradient checkpointing): a fresh trainer resumed from that checkpoint (nothing of the
  first trainer survives but the checkpoint on disk) for the second step: its weights, and every file the
  resume read with where it was mapped (DeepSpeed's own files: the devices its tensors landed on).

Then ``ragged`` (two processes only): one optimizer step of three micro-batches where
``gradient_accumulation_steps`` is 2, through ``run_update`` under DDP, ZeRO-2 and ZeRO-3: the weights.

Writes ``<out>/<cell>/rank<k>.json`` and the weights as ``<out>/<cell>/<run>.safetensors``.
"""

from __future__ import annotations

import json
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from accelerate.state import AcceleratorState
from safetensors.torch import load_file, save_file

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.parallel.distributed import end_processes
from grpokit.rollout import ScriptedBackend

ANSWERS = ["3", "31", "310", "42+", "7", "", "12", "5555"]
PLACEMENTS = {1: ["single"], 2: ["ddp", "fsdp", "zero2", "zero3"]}
PRECISIONS = ["fp32", "bf16"]
MODES = ["full", "lora"]
CHECKPOINTING = [False, True]
ACCUMULATION = 2  # two micro-batches per optimizer step everywhere: no_sync and the boundary are exercised


def respond(prompt: str, index: int) -> str:
    return ANSWERS[(index + len(prompt)) % len(ANSWERS)]


def reward(prompts, completions, completion_ids, solution, **kwargs):
    return [(1.0 if s in c else 0.0) + 0.1 * len(c) for c, s in zip(completions, solution)]


ROWS = [{"prompt": f"{a}+{b}+{a}{b}=", "solution": str(a + b)} for a in range(4) for b in range(4)]


def cell_name(placement: str, precision: str, mode: str, checkpointing: bool) -> str:
    return f"{placement}-{precision}-{mode}-{'gc' if checkpointing else 'nogc'}"


def config(out: Path, placement: str, precision: str, mode: str, checkpointing: bool, **values: Any):
    processes = 1 if placement == "single" else 2
    base = dict(
        output_dir=str(out),
        max_steps=2,
        num_generations=4,
        per_device_train_batch_size=16 // processes // ACCUMULATION,  # 4 prompts x G=4 per step in all
        gradient_accumulation_steps=ACCUMULATION,
        max_completion_length=6,
        num_iterations=2,
        beta=0.04,
        sync_ref_model=mode == "full",  # the reference reset after every step (LoRA: it is the base)
        ref_model_sync_steps=1,
        learning_rate=5e-2 if mode == "lora" else 1e-2,
        fsdp="full_shard" if placement == "fsdp" else "",
        deepspeed=placement if placement.startswith("zero") else None,
        gradient_checkpointing=checkpointing,
        bf16=precision == "bf16",
        save_steps=1,
        logging_steps=1,
        shuffle_dataset=False,
        disable_tqdm=True,
        report_to=[],
        seed=0,
    )
    return GRPOConfig(**{**base, **values})


def lora_config():
    from peft import LoraConfig

    targets = ["q_proj", "v_proj", "down_proj"]
    return LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=targets, task_type="CAUSAL_LM")


def trainer_for(policy_dir: str, args: GRPOConfig, mode: str) -> GRPOTrainer:
    # each cell chooses its own precision: accelerate keeps one per process group unless its state is reset
    AcceleratorState._reset_state(reset_partial_state=False)
    peft = lora_config() if mode == "lora" else None
    trainer = GRPOTrainer(policy_dir, [reward], args, train_dataset=ROWS, peft_config=peft)
    trainer.backend = ScriptedBackend(trainer.tokenizer, respond)
    return trainer


def weights_file(directory: Path) -> Path:
    adapters = directory / "adapter_model.safetensors"
    return adapters if adapters.exists() else directory / "model.safetensors"


def count_all_reduces(ddp_model: Any) -> list[int]:
    """A DDP communication hook counting the all-reduce rounds (bucket 0 starts each round); returns the
    one-element counter."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    rounds = [0]

    def counting(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        rounds[0] += int(bucket.index() == 0)
        return allreduce_hook(state, bucket)

    # DDP checks the annotations as objects (this module's are strings: from __future__ import annotations)
    counting.__annotations__ = {"bucket": dist.GradBucket, "return": torch.futures.Future[torch.Tensor]}
    ddp_model.register_comm_hook(None, counting)
    return rounds


def tensor_devices(value: Any) -> set[str]:
    """The devices of every tensor inside ``value`` (dicts, lists, tuples)."""
    if isinstance(value, torch.Tensor):
        return {value.device.type}
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return set().union(*(tensor_devices(v) for v in value)) if value else set()
    return set()


@contextmanager
def recorded_loads(reads: list[list[str]]):
    """Every ``torch.load`` and safetensors ``load_file`` made inside, as [file, where it was mapped]."""
    import safetensors.torch

    torch_load, safetensors_load = torch.load, safetensors.torch.load_file

    def recording_torch_load(file, *args, **kwargs):
        loaded = torch_load(file, *args, **kwargs)
        if isinstance(file, (str, Path)):  # (torch.distributed unpickles objects from buffers too)
            where = kwargs.get("map_location")
            if callable(where):  # DeepSpeed's own files: a function keeping the storage where it is read
                where = (
                    "function -> " + ",".join(sorted(tensor_devices(loaded)))
                    if tensor_devices(loaded)
                    else "-"
                )
            reads.append([Path(file).name, str(where)])
        return loaded

    def recording_safetensors_load(file, device="cpu"):
        reads.append([Path(file).name, str(device)])
        return safetensors_load(file, device=device)

    torch.load, safetensors.torch.load_file = recording_torch_load, recording_safetensors_load
    try:
        yield
    finally:
        torch.load, safetensors.torch.load_file = torch_load, safetensors_load


def run_cell(policy_dir: str, out: Path, placement: str, precision: str, mode: str, gc: bool) -> None:
    cell = out / cell_name(placement, precision, mode, gc)
    record: dict[str, Any] = {}
    # lr0: the invariants before any update
    trainer = trainer_for(policy_dir, config(cell / "lr0", placement, precision, mode, gc,
                                             learning_rate=0.0, max_steps=1, save_steps=0), mode)  # fmt: skip
    rounds = count_all_reduces(trainer.policy) if placement == "ddp" else None
    history = trainer.train()
    record["lr0"] = {k: v for k, v in history[-1].items() if isinstance(v, (int, float))}
    record["allreduce_rounds"] = None if rounds is None else rounds[0]
    record["attention"] = trainer.model.config._attn_implementation  # packed passes ran: grpokit_packed_*
    record["optimizer_steps"] = 2  # mu 2, one optimizer step per generation
    # steps: two real steps, a checkpoint after each (with checkpointing one: the resume is the plain cell's)
    steps = 1 if gc else 2
    trainer = trainer_for(policy_dir, config(cell / "steps", placement, precision, mode, gc,
                                             max_steps=steps), mode)  # fmt: skip
    trainer.train()
    rank = trainer.accelerator.process_index
    record["greedy"], record["generation_dtype"] = greedy_generation(trainer)
    # what stays of the weights generation read (ZeRO-3: a copy filled for each generation, then released)
    record["generation_copy_elements"] = sum(p.numel() for p in trainer.generation_model.parameters())
    if rank == 0:
        shutil.copy(weights_file(cell / "steps" / "checkpoint-1"), cell / "step1.safetensors")
        if steps == 2:
            shutil.copy(weights_file(cell / "steps"), cell / "step2.safetensors")
    trainer.accelerator.wait_for_everyone()
    if gc:
        (cell / f"rank{rank}.json").write_text(json.dumps(record))
        return
    # resume: a fresh trainer from the first checkpoint
    resume_args = config(cell / "resumed", placement, precision, mode, gc,
                         resume_from_checkpoint=str(cell / "steps" / "checkpoint-1"))  # fmt: skip
    trainer = trainer_for(policy_dir, resume_args, mode)
    reads: list[list[str]] = []
    with recorded_loads(reads):
        trainer.run_state.resume(resume_args.resume_from_checkpoint, resume_args.output_dir)
    record["resume_reads"] = reads
    record["device"] = str(trainer.accelerator.device)
    trainer.train()  # the checkpoint is loaded again by train(): it continues from step 1
    if rank == 0:
        shutil.copy(weights_file(cell / "resumed"), cell / "resumed.safetensors")
    (cell / f"rank{rank}.json").write_text(json.dumps(record))
    trainer.accelerator.wait_for_everyone()


def greedy_generation(trainer: GRPOTrainer) -> tuple[list[str], str]:
    """Greedy completions of two held-out prompts by the fast sampler from the weights generation reads
    (FSDP: gathered; ZeRO-3: its filled copy), and the dtype of a weight as the sampler saw it."""
    from grpokit.models.parts import decoder_of
    from grpokit.rollout import make_backend

    trainer.backend = make_backend("fast", trainer.generation_model)
    seen: list[str] = []
    generate = trainer.backend.generate

    def recording(*args: Any, **kwargs: Any) -> Any:
        seen.append(str(decoder_of(trainer.generation_model).layers[0].mlp.up_proj.weight.dtype))
        return generate(*args, **kwargs)

    trainer.backend.generate = recording
    texts = trainer.sample([{"prompt": "9+9+99="}, {"prompt": "1+2+12="}], greedy=True).texts
    return texts, seen[0]


def run_ragged(policy_dir: str, out: Path) -> None:
    """One optimizer step of 3 micro-batches (12 rows, micro-batch 4, gradient_accumulation_steps 2: a full
    chunk of 2 and a partial one of 1) under DDP, ZeRO-2 and ZeRO-3, from the same weights."""
    from transformers import AutoModelForCausalLM

    from grpokit.parallel.distributed import make_accelerator, prepare_policy
    from grpokit.rollout.records import RolloutBatch
    from grpokit.train.forward import PolicyLogprobs
    from grpokit.train.update import UpdateContext, run_update

    for placement in ("ddp", "zero2", "zero3"):
        AcceleratorState._reset_state(reset_partial_state=False)
        args = GRPOConfig(
            output_dir=str(out / "ragged"), num_generations=4, per_device_train_batch_size=4,
            gradient_accumulation_steps=2, beta=0.0, learning_rate=1e-2, max_completion_length=5,
            deepspeed=placement if placement != "ddp" else None, shuffle_dataset=False,
        )  # fmt: skip
        accelerator = make_accelerator("no", use_cpu=True)
        model = AutoModelForCausalLM.from_pretrained(policy_dir)
        strategy = "zero" if placement != "ddp" else "ddp"
        placed = prepare_policy(model, PolicyLogprobs(model), args, accelerator, None, 4, strategy)
        generator = torch.Generator().manual_seed(accelerator.process_index)
        rows = 12
        batch = RolloutBatch(
            prompt_ids=torch.randint(4, 90, (rows, 3), generator=generator),
            prompt_mask=torch.ones(rows, 3, dtype=torch.long),
            completion_ids=torch.randint(4, 90, (rows, 5), generator=generator),
            completion_mask=torch.ones(rows, 5, dtype=torch.long),
            advantages=torch.randn(rows, generator=generator),
        )
        ctx = UpdateContext.from_accelerator(accelerator, args.policy_loss(), placed, torch.Generator())
        run_update(batch, args.resolved(), ctx)
        state = placed.zero.full_state_dict() if placed.zero is not None else None
        state = state if state is not None else {k: v.detach().clone() for k, v in model.named_parameters()}
        if accelerator.is_main_process:
            save_file(
                {k: v.contiguous() for k, v in state.items()}, str(out / f"ragged-{placement}.safetensors")
            )
        accelerator.wait_for_everyone()


def run_token_budget(policy_dir: str, out: Path) -> None:
    """One optimizer step over 16 rows per process under FSDP2 and ZeRO-3, from the same weights: in
    micro-batches filled by ``micro_batch_tokens`` (process 0's completions are long, process 1's short, so
    they need different numbers of micro-batches) and in one micro-batch of all 16. The weights, and each
    process's micro-batch counts (needed alone, and run)."""
    from transformers import AutoModelForCausalLM

    from grpokit.parallel.distributed import make_accelerator, prepare_policy
    from grpokit.rollout.records import RolloutBatch
    from grpokit.train.batch import token_budget_micro_batches
    from grpokit.train.forward import PolicyLogprobs
    from grpokit.train.update import UpdateContext, _micro_batches, run_update

    for placement in ("fsdp", "zero3"):
        for variant in ("budget", "whole"):
            AcceleratorState._reset_state(reset_partial_state=False)
            args = GRPOConfig(
                output_dir=str(out / "token-budget"), num_generations=4, per_device_train_batch_size=16,
                beta=0.0, learning_rate=1e-2, max_completion_length=8, shuffle_dataset=False,
                micro_batch_tokens=30 if variant == "budget" else None,
                fsdp="full_shard" if placement == "fsdp" else "",
                deepspeed="zero3" if placement == "zero3" else None,
            )  # fmt: skip
            accelerator = make_accelerator("no", use_cpu=True)
            model = AutoModelForCausalLM.from_pretrained(policy_dir)
            strategy = "fsdp" if placement == "fsdp" else "zero"
            placed = prepare_policy(model, PolicyLogprobs(model), args, accelerator, None, 4, strategy)
            rank = accelerator.process_index
            generator = torch.Generator().manual_seed(rank)
            lengths = torch.randint(5, 9, (16,), generator=generator) if rank == 0 else torch.full((16,), 2)
            batch = RolloutBatch(
                prompt_ids=torch.randint(4, 90, (16, 3), generator=generator),
                prompt_mask=torch.ones(16, 3, dtype=torch.long),
                completion_ids=torch.randint(4, 90, (16, 8), generator=generator),
                completion_mask=(torch.arange(8)[None, :] < lengths[:, None]).long(),
                advantages=torch.randn(16, generator=generator),
            )
            ctx = UpdateContext.from_accelerator(accelerator, args.policy_loss(), placed, torch.Generator())
            if variant == "budget":
                alone = token_budget_micro_batches(batch.backbone_tokens(4).tolist(), 4, 30)
                counts = {"needed": len(alone), "run": len(_micro_batches(batch, args.resolved(), ctx))}
                (out / f"token-budget-{placement}-rank{rank}.json").write_text(json.dumps(counts))
            run_update(batch, args.resolved(), ctx)
            state = placed.zero.full_state_dict() if placed.zero is not None else None
            if state is None:  # FSDP2: every process gathers the full weights
                from grpokit.parallel.fsdp import unwrap_tensor

                state = {k: unwrap_tensor(v.detach()).clone() for k, v in model.named_parameters()}
            if accelerator.is_main_process:
                path = out / f"token-budget-{placement}-{variant}.safetensors"
                save_file({k: v.contiguous() for k, v in state.items()}, str(path))
            accelerator.wait_for_everyone()


def main(policy_dir: str, out: str, processes: str, cells: str = "all") -> None:
    torch.set_num_threads(1)
    out_dir, count = Path(out), int(processes)
    chosen = None if cells == "all" else set(cells.split(","))
    for placement in PLACEMENTS[count]:
        for precision in PRECISIONS:
            for mode in MODES:
                for gc in CHECKPOINTING:
                    if chosen is None or cell_name(placement, precision, mode, gc) in chosen:
                        run_cell(policy_dir, out_dir, placement, precision, mode, gc)
    if count == 2 and (chosen is None or "ragged" in chosen):
        run_ragged(policy_dir, out_dir)
    if count == 2 and (chosen is None or "token_budget" in chosen):
        run_token_budget(policy_dir, out_dir)


def load_weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path))


if __name__ == "__main__":
    main(*sys.argv[1:])
    end_processes()

"""Saving and resuming a run under each strategy: what is written where (``parallel.checkpoint``), and how the
states are gathered first: FSDP's full weights and optimizer state (``parallel.fsdp``), DeepSpeed ZeRO's
partitioned optimizer state (each process writes its own part through the engine), every process's RNG
state."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import gather_object

from grpokit.data.records import drop_steps_after
from grpokit.parallel import checkpoint, fsdp
from grpokit.parallel.resume import OptimizerSettings, ResumePlan, config_record, plan_resume, run_identity

__all__ = ["RunState"]

ZERO_TAG = "deepspeed"
"""Subdirectory of a checkpoint holding the DeepSpeed engine's files (ZeRO runs)."""


@dataclass
class RunState:
    """The parts of a run a checkpoint holds, and the strategy they are placed by."""

    accelerator: Any
    model: torch.nn.Module  # the bare policy (transformers or PEFT)
    policy: torch.nn.Module  # what the update calls: PolicyLogprobs, DDP, the FSDP root or the engine
    tokenizer: Any
    optimizer: Any
    scheduler: Any
    reference: Any  # train.reference.Reference or None
    hooks: Any  # train.hooks.StepHooks
    prompts: Any  # train.prompts.PromptSampler
    generator: torch.Generator
    strategy: str  # "ddp", "fsdp" or "zero"
    zero: Any = None  # parallel.zero.ZeroEngine
    args: Any = None  # the run's GRPOConfig: saved with each checkpoint, compared on resume
    train_rows: Any = None  # the training rows: a resume must be on the same ones
    max_steps: int | None = None  # the run's GRPO steps: a checkpoint at or past them has nothing to train

    def __post_init__(self) -> None:
        self.identity = run_identity(self.train_rows, self.model)  # what a resume must share with this run

    def save_model(self, path: str | Path) -> None:
        """A standard ``transformers`` directory (model + tokenizer; a PEFT model writes its adapters);
        under FSDP the full weights are gathered first."""
        self.accelerator.wait_for_everyone()
        state = self._full_model_state()  # a collective
        if self.accelerator.is_main_process:
            with checkpoint.written_aside(path) as tmp:  # a kill mid-save leaves the folder's old files
                self.model.save_pretrained(tmp, state_dict=state)
                self.tokenizer.save_pretrained(tmp)

    def save(self, output_dir: str | Path, step: int, save_total_limit: int | None) -> Path:
        """Everything a resume needs, in ``<output_dir>/checkpoint-<step>``."""
        path = checkpoint.checkpoint_dir(output_dir, step)
        main = self.accelerator.is_main_process
        # collectives first (every process takes part), then the main process writes
        rng_states = gather_object([checkpoint.rng_state(self.generator)])  # [one per process]
        reference = None if self.reference is None else self.reference.state_dict()
        model_state, optimizer_state = self._full_model_state(), None
        if self.strategy == "fsdp":
            optimizer_state = fsdp.full_optimizer_state(self.policy, self.optimizer)
        staged = None
        if self.strategy == "zero":  # each process writes its optimizer partition into the staged dir
            staged = checkpoint.staging_dir(path, create=main)
            self.accelerator.wait_for_everyone()
            self.zero.engine.save_checkpoint(str(staged), tag=ZERO_TAG)
            self.accelerator.wait_for_everyone()
            optimizer_state = {}  # in the engine's files
        if main:
            checkpoint.save_checkpoint(
                path,
                model=self.model,
                tokenizer=self.tokenizer,
                optimizer=self.optimizer,
                scheduler=self.scheduler,
                trainer_state={"step": step, "prompts": self.prompts.state_dict(), "run": self.identity},
                rng_states=rng_states,
                extra_tensors={
                    "reference": reference,
                    "adapters": self._sharded_adapters(model_state),
                    **self.hooks.state_dict(),
                },
                model_state=model_state,
                optimizer_state=optimizer_state,
                staged=staged is not None,
                config_text=config_record(self.args) if self.args is not None else None,
            )
            checkpoint.prune_checkpoints(output_dir, save_total_limit)
        self.accelerator.wait_for_everyone()
        return path

    def _sharded_adapters(
        self, model_state: dict[str, torch.Tensor] | None
    ) -> dict[str, torch.Tensor] | None:
        """FSDP + PEFT: the trainable (adapter) weights under the model's own names, which a sharded resume
        loads (peft's adapter file drops the adapter name from its keys)."""
        if self.strategy != "fsdp" or not hasattr(self.model, "peft_config") or model_state is None:
            return None
        trainable = {name for name, p in self.model.named_parameters() if p.requires_grad}
        return {name: value for name, value in model_state.items() if name in trainable}

    def _full_model_state(self) -> dict[str, torch.Tensor] | None:
        """The full weights when they are split (FSDP, ZeRO-3; a collective), else None (the model's own)."""
        if self.strategy == "fsdp":
            return fsdp.full_state_dict(self.policy)
        if self.zero is not None:
            return self.zero.full_state_dict()
        return None

    def check_resume(
        self, resume: str | bool | None, output_dir: str | Path, *, steps_left: bool = True
    ) -> ResumePlan | None:
        """Every check a resume needs before anything runs (``parallel.resume``: the checkpoint exists and is
        whole, the process count, config changes, training rows, model shape and, with ``steps_left``, that
        the run's max_steps leaves steps to train); the plan, or None without ``resume``. Raises
        ``ResumeError`` naming what to change."""
        if not resume:
            return None
        return plan_resume(
            resume, self.args, output_dir, identity=self.identity,
            num_processes=self.accelerator.num_processes, max_steps=self.max_steps if steps_left else None,
        )  # fmt: skip

    def resume(self, resume: str | bool, output_dir: str | Path) -> int:
        """Load the checkpoint ``resume`` names (True / "latest": the newest in ``output_dir``), checked first
        (``check_resume``); this run's optimizer settings and schedule over the restored state (honoured
        changes, logged); returns its step."""
        plan = self.check_resume(resume, output_dir, steps_left=False)  # loading a finished run is allowed
        assert plan is not None
        if self.accelerator.is_main_process:
            plan.log()
        path = plan.path
        settings = OptimizerSettings.capture(self.optimizer, self.scheduler)
        load_optimizer_state = None  # the optimizer's own load_state_dict
        device, main = self.accelerator.device, self.accelerator.is_main_process
        sharded = self.strategy == "fsdp"  # full states read by the main process, sent to the shards
        partitioned = sharded or (self.zero is not None and self.zero.stage == 3)  # the reference too
        adapters = sharded and hasattr(self.model, "peft_config")
        if sharded:
            if not adapters:  # adapters come from extra_state.pt below
                fsdp.load_sharded_weights(self.policy, self.model, path, is_main=main)
            load_optimizer_state = partial(fsdp.load_full_optimizer_state, self.policy, self.optimizer)
        elif self.strategy == "zero":  # weights and this process's optimizer partition, from the engine
            self.zero.engine.load_checkpoint(str(path), tag=ZERO_TAG, load_lr_scheduler_states=False)
            load_optimizer_state = _loaded_by_the_engine
        else:
            checkpoint.load_model_weights(self.model, path, device)
        state, extra = checkpoint.load_checkpoint(
            path,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            generator=self.generator,
            process_index=self.accelerator.process_index,
            num_processes=self.accelerator.num_processes,
            load_optimizer_state=load_optimizer_state,
            device=device,
            read_full_states=main or not partitioned,
        )
        settings.restore(self.optimizer, self.scheduler)
        if adapters:
            fsdp.load_full_state_dict(
                self.policy, extra["adapters"] if main else {}, strict=False, from_main=True
            )
        self.prompts.load_state_dict(state["prompts"])
        if self.reference is not None:
            self.reference.load_state_dict(extra.get("reference"))
        self.hooks.load_state_dict(extra)
        step = int(state["step"])
        if self.accelerator.is_main_process:  # the logs hold each step once: later steps are written again
            for name in ("metrics.jsonl", "completions.jsonl"):
                drop_steps_after(Path(output_dir) / name, step)
        return step


def _loaded_by_the_engine(state: dict[str, Any]) -> None:
    """ZeRO: ``optimizer.pt`` is empty; the engine restored the optimizer from its own files."""

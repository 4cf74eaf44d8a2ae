"""GRPOTrainer: the GRPO loop, one step read top to bottom (sample, score, advantages, batch, update, log).

DeepSeekMath (arXiv:2402.03300), Algorithm 1: per step set pi_old <- pi_theta, sample G outputs per
question, score them, normalise rewards per group, then mu policy updates on the same samples.
"""

from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import gather_object, set_seed
from tqdm.auto import tqdm
from transformers import get_scheduler

from grpokit.config import GRPOConfig
from grpokit.core import combine_rewards, multi_reward_advantages
from grpokit.data.loading import load_rows, render_prompt
from grpokit.rewards import RewardModel, resolve_reward, reward_names
from grpokit.rollout.base import RolloutBackend, SamplingParams
from grpokit.train.checkpoint import (
    checkpoint_dir,
    latest_checkpoint,
    load_checkpoint,
    load_model_weights,
    prune_checkpoints,
    save_checkpoint,
)
from grpokit.train.completion_log import CompletionLog, completion_records
from grpokit.train.distributed import make_accelerator, merge_process_metrics
from grpokit.train.evaluation import evaluate_rewards
from grpokit.train.forward import PolicyLogprobs
from grpokit.train.iterative_loop import IterativeLoop
from grpokit.train.logging import MetricsLogger, plot_metrics
from grpokit.train.models import load_policy, load_tokenizer, make_backend
from grpokit.train.process import ProcessSupervision
from grpokit.train.prompts import PromptSampler
from grpokit.train.reference import make_reference, sync_reference
from grpokit.train.rollout import build_rollout_batch, completion_metrics
from grpokit.train.scoring import reward_metrics, score_rollout
from grpokit.train.update import UpdateContext, run_update


class GRPOTrainer:
    """Train a causal LM with GRPO.

    Args:
        model: a model directory / hub id, or a ``transformers`` PreTrainedModel.
        reward_funcs: one reward or a list: callables with the TRL signature
            ``fn(prompts, completions, completion_ids, **columns) -> list[float | None]``, built-in names,
            import paths, or reward-model directories.
        args: the GRPOConfig.
        train_dataset: a ``datasets.Dataset``, a list of dicts, or a json/jsonl/csv/parquet path.
        eval_dataset: optional, same forms; mean reward under greedy decoding every ``eval_steps``.
        processing_class: the tokenizer (default: loaded from ``model``).
        peft_config: a ``peft`` config to train adapters instead of all weights.
        rollout_backend: override the generation backend (anything with the RolloutBackend protocol).
        process_reward_funcs: process rewards (callables ``fn(prompts, completions, steps, **columns) ->
            list[list[float] | None]``, built-in verifier names, or process-reward-model directories).
            Advantages then become per token [n, C] (see ``grpokit.train.process``); ``reward_funcs`` may
            be empty for pure process supervision.
        iterative_reward_model: iterative GRPO (``GRPOConfig.iteration_steps``): an ``IterativeRewardModel``
            or a reward-model directory. Its scorer is appended to ``process_reward_funcs`` (process RM) or
            ``reward_funcs`` (outcome RM; weights, if given, list it last) and it is retrained every
            ``iteration_steps`` steps on the policy's samples labelled by ``rm_label_func``.
        rm_label_func: the verifier labelling those samples: a step verifier (process RM) or an outcome
            reward in [0, 1] (outcome RM), as a callable or a name.
    """

    def __init__(
        self,
        model: str | Path | torch.nn.Module,
        reward_funcs: Any,
        args: GRPOConfig | None = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        peft_config: Any = None,
        rollout_backend: RolloutBackend | None = None,
        *,
        process_reward_funcs: Any = None,
        iterative_reward_model: Any = None,
        rm_label_func: Any = None,
    ) -> None:
        self.args = args or GRPOConfig()
        for resets, name in (
            (self.args.sync_ref_model, "sync_ref_model"),
            (self.args.iteration_steps, "iteration_steps"),
        ):
            if peft_config is not None and resets:
                raise ValueError(
                    f"GRPOConfig.{name} is not supported with peft_config: the reference is the "
                    "base model with the adapter disabled, so there is nothing separate to reset"
                )
        set_seed(self.args.seed)
        self.accelerator = make_accelerator(self.args.mixed_precision, self.args.use_cpu)
        self.plan = self.args.batch_plan(self.accelerator.num_processes)
        self.train_rows = load_rows(train_dataset, name="train_dataset")
        self.eval_rows = load_rows(eval_dataset, name="eval_dataset") if eval_dataset is not None else None
        self.tokenizer = processing_class if processing_class is not None else load_tokenizer(model)
        self.model = load_policy(model, self.args, peft_config)
        device = self.accelerator.device
        self.iterative = _iterative_loop(iterative_reward_model, rm_label_func, self.args, device)
        process_specs = list(process_reward_funcs or [])
        outcome_specs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
        if self.iterative is not None:  # the reward model being trained is the one that scores
            kind_specs = process_specs if self.iterative.kind == "process" else outcome_specs
            kind_specs.append(self.iterative.reward_func)
        self.process = ProcessSupervision(process_specs, self.args, device) if process_specs else None
        self.reward_funcs = _resolve_rewards(outcome_specs, device, allow_empty=self.process is not None)
        self.reward_names = reward_names(self.reward_funcs)
        self.reward_weights = self._reward_weights()
        self.ref_model = make_reference(self.model) if self.args.beta > 0 and peft_config is None else None
        self.uses_peft_reference = self.args.beta > 0 and peft_config is not None
        self.max_steps = self._total_steps()
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=self.args.learning_rate,
            betas=(self.args.adam_beta1, self.args.adam_beta2),
            weight_decay=self.args.weight_decay,
        )
        total_optimizer_steps = self.max_steps * self.plan.optimizer_steps
        self.scheduler = get_scheduler(
            self.args.lr_scheduler_type,
            self.optimizer,
            num_warmup_steps=self.args.num_warmup_steps(total_optimizer_steps),
            num_training_steps=total_optimizer_steps,
        )
        # The policy is prepared (DDP under several processes) inside PolicyLogprobs, whose forward is the
        # lean log-prob pass, so DDP sees that pass; self.model stays the bare model, moved in place.
        self.policy, self.optimizer, self.scheduler = self.accelerator.prepare(
            PolicyLogprobs(self.model), self.optimizer, self.scheduler
        )
        if self.ref_model is not None:
            self.ref_model.to(self.accelerator.device)
        self.backend = rollout_backend or make_backend(self.unwrapped_model, self.args)
        self.prompts = PromptSampler(len(self.train_rows), self.plan.prompts, self.args)
        self.generator = torch.Generator().manual_seed(self.args.seed)
        self.completion_log = CompletionLog(
            self.args.output_dir,
            self.args.log_completions,
            self.args.num_completions_to_print,
            self.accelerator.is_main_process,
        )
        self._completions: list[dict[str, Any]] = []
        self.logger = MetricsLogger(
            self.args.output_dir, self.args.report_to, self.accelerator.is_main_process
        )
        self.step = 0

    # ------------------------------------------------------------------------------------------------
    @property
    def unwrapped_model(self) -> torch.nn.Module:
        """The policy itself (a ``transformers`` or PEFT model), not wrapped by DDP."""
        return self.model

    def sampling_params(self, greedy: bool = False) -> SamplingParams:
        eos = self.tokenizer.eos_token_id
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos
        return SamplingParams(
            max_new_tokens=self.args.max_completion_length,
            temperature=self.args.temperature,
            top_p=self.args.top_p,
            top_k=self.args.top_k,
            min_p=self.args.min_p,
            repetition_penalty=self.args.repetition_penalty,
            do_sample=not greedy,
            eos_token_ids=(eos,) if eos is not None else (),
            pad_token_id=pad if pad is not None else 0,
        )

    # ------------------------------------------------------------------------------------------------
    def train(self, resume_from_checkpoint: str | bool | None = None) -> list[dict[str, float]]:
        """Run ``max_steps`` GRPO steps; returns the logged metrics. Saves the final model to output_dir."""
        resume = resume_from_checkpoint or self.args.resume_from_checkpoint
        if resume:
            self._resume(resume)
        history: list[dict[str, float]] = []
        bar = tqdm(
            total=self.max_steps,
            initial=self.step,
            desc="GRPO",
            disable=self.args.disable_tqdm or not self.accelerator.is_local_main_process,
        )
        while self.step < self.max_steps:
            metrics = self.training_step()
            self.step += 1
            if self.eval_rows is not None and self.args.eval_steps and self.step % self.args.eval_steps == 0:
                metrics.update(evaluate_rewards(self, self.eval_rows))
            bar.update(1)
            bar.set_postfix(
                reward=f"{metrics['reward']:.3f}",
                kl=f"{metrics.get('kl', 0.0):.4f}",
                loss=f"{metrics['loss']:.4f}",
            )
            if self._is_logged(self.step):
                self.logger.log(self.step, metrics)
                self.completion_log.log(self.step, self._completions)
                history.append({"step": self.step, **metrics})
            if self.args.save_steps and self.step % self.args.save_steps == 0:
                self.save_checkpoint()
        bar.close()
        self.save_model(self.args.output_dir)
        if self.iterative is not None and self.accelerator.is_main_process:
            self.iterative.save(Path(self.args.output_dir) / "reward_model")
        if self.accelerator.is_main_process:
            plot_metrics(self.logger.read(), Path(self.args.output_dir) / "metrics.png")
        return history

    def training_step(self) -> dict[str, float]:
        """One GRPO step on this process's share of the prompts."""
        start = time.perf_counter()
        # 1. sample a batch of prompts (each will get G completions)
        rows = self.prompts.next_local_rows(self.train_rows, self.accelerator)
        prompt_ids = [self.encode_prompt(row["prompt"]) for row in rows]
        # 2. generate G completions per prompt with the current policy (pi_old = pi_theta)
        with self.accelerator.autocast():  # mixed precision applies to every model pass, not only the update
            generated = self.backend.generate(prompt_ids, self.args.num_generations, self.sampling_params())
        time_generate = time.perf_counter() - start
        # 3. score every completion with every reward function -> [n, F]
        repeated_rows = [row for row in rows for _ in range(self.args.num_generations)]
        texts, rewards, failures = self.decode_and_score(repeated_rows, generated.completion_ids)
        process = (
            self.process.score(repeated_rows, texts, generated.completion_ids, self.tokenizer)
            if self.process
            else None
        )
        time_reward = time.perf_counter() - start - time_generate
        # 4. group-relative advantages over the whole batch (all processes), then this process's rows
        all_rewards = self.accelerator.gather(rewards.to(self.accelerator.device))  # [N, F]
        advantages = multi_reward_advantages(
            all_rewards,
            self.reward_weights.to(all_rewards.device),
            self.args.num_generations,
            scale=self.args.scale_rewards,
            aggregation=self.args.multi_objective_aggregation,
            eps=self.args.advantage_epsilon,
        )
        first = self.accelerator.process_index * len(repeated_rows)
        local_advantages = advantages[first : first + len(repeated_rows)]  # [n]
        # 5. one RolloutBatch: padded ids, masks, advantages, old (mu > 1) and reference (beta > 0) log-probs
        with self.accelerator.autocast():
            batch = build_rollout_batch(self, prompt_ids, generated, local_advantages)
        if process is not None:  # process supervision: per-token advantages [n, C] (train/process.py)
            batch.advantages = self.process.advantages(process, local_advantages, batch.completion_mask)
        # 6. mu epochs of clipped policy-gradient updates
        update_start = time.perf_counter()
        update_metrics = run_update(batch, self.args, self._update_context())
        time_update = time.perf_counter() - update_start
        syncing = self.ref_model is not None and self.args.sync_ref_model
        if syncing and (self.step + 1) % self.args.ref_model_sync_steps == 0:
            sync_reference(self.ref_model, self.unwrapped_model, self.args.ref_model_mixup_alpha)
        iterative_metrics: dict[str, float] = {}
        if self.iterative is not None:  # iterative GRPO: update the reward model, reset pi_ref to pi_theta
            self.iterative.observe(repeated_rows, texts, generated.completion_ids)
            if self.iterative.due(self.step + 1):
                gather = gather_object if self.accelerator.num_processes > 1 else None
                iterative_metrics = self.iterative.update(gather)
                sync_reference(self.ref_model, self.unwrapped_model, 1.0)
            iterative_metrics.update(self.iterative.step_metrics())
        # 7. metrics
        combined = combine_rewards(all_rewards, self.reward_weights.to(all_rewards.device))  # [N]
        elapsed = time.perf_counter() - start
        metrics = {
            **reward_metrics(all_rewards.cpu(), combined.cpu(), self.reward_names, self.args.num_generations),
            **failures,
            **completion_metrics(generated),
            **update_metrics,
            **(self.process.metrics(process, batch.advantages, batch.completion_mask) if process else {}),
            **iterative_metrics,
            "learning_rate": self.scheduler.get_last_lr()[0],
            "time/generate": time_generate,
            "time/reward": time_reward,
            "time/update": time_update,
            "time/step": elapsed,
            "tokens_per_second": batch.num_completion_tokens() / max(elapsed, 1e-9),
        }
        if self.accelerator.num_processes > 1:  # describe the whole batch, the same on every process
            metrics = merge_process_metrics(gather_object([metrics]))
        if self.completion_log.wanted and self._is_logged(self.step + 1):
            self._completions = self._completion_records(
                repeated_rows, texts, all_rewards, combined, advantages
            )
        return metrics

    def _is_logged(self, step: int) -> bool:
        """Whether the metrics (and sample completions) of GRPO step ``step`` (1-based) are logged."""
        return step % self.args.logging_steps == 0 or step == self.max_steps

    def _completion_records(self, rows, texts, rewards, combined, advantages) -> list[dict[str, Any]]:
        """Records of the whole batch: this process's prompts and texts gathered in process order, which
        is the order of the gathered rewards [N, F], combined [N] and advantages [N]."""
        pairs = [(row["prompt"], text) for row, text in zip(rows, texts)]
        if self.accelerator.num_processes > 1:
            pairs = gather_object(pairs)
        prompts, completions = [p for p, _ in pairs], [t for _, t in pairs]
        return completion_records(prompts, completions, self.reward_names, rewards, combined, advantages)

    # ------------------------------------------------------------------------------------------------
    def decode_and_score(
        self, rows: list[dict[str, Any]], completion_ids: list[list[int]]
    ) -> tuple[list[str], torch.Tensor, dict[str, int]]:
        """Decode completions (one per row) and score them with every reward function: ``(texts, rewards
        [n, F] with NaN for None, failures per reward name)``, under the run's ``reward_failure`` policy."""
        texts = self.tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
        rewards, failures = score_rollout(
            self.reward_funcs,
            rows,
            texts,
            completion_ids,
            trainer_state={"global_step": self.step, "max_steps": self.max_steps},
            on_error=self.args.reward_failure,
        )
        return texts, rewards, failures

    def encode_prompt(self, prompt: Any) -> list[int]:
        """Token ids of a prompt (chat template for message lists), cut from the left to max_prompt_length."""
        text = render_prompt(prompt, self.tokenizer, self.args.chat_template_kwargs)
        ids = self.tokenizer(text, add_special_tokens=isinstance(prompt, str))["input_ids"]
        limit = self.args.max_prompt_length
        return ids[-limit:] if limit is not None and len(ids) > limit else ids

    def reference_logprobs_context(self):
        """Context under which ``self.reference_model`` gives pi_ref (PEFT: the adapter disabled)."""
        if self.uses_peft_reference:
            return self.unwrapped_model.disable_adapter()
        return contextlib.nullcontext()

    @property
    def reference_model(self) -> torch.nn.Module | None:
        if self.ref_model is not None:
            return self.ref_model
        return self.unwrapped_model if self.uses_peft_reference else None

    def _update_context(self) -> UpdateContext:
        def clip(max_norm: float) -> torch.Tensor | None:
            params = [p for p in self.model.parameters() if p.requires_grad]
            if max_norm and max_norm > 0:
                return self.accelerator.clip_grad_norm_(params, max_norm)
            return torch.nn.utils.clip_grad_norm_(params, float("inf"))

        return UpdateContext(
            policy=self.policy,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            backward=self.accelerator.backward,
            clip_grad_norm=clip,
            sum_across_processes=lambda t: self.accelerator.reduce(t.to(self.accelerator.device), "sum"),
            num_processes=self.accelerator.num_processes,
            generator=self.generator,
        )

    def _reward_weights(self) -> torch.Tensor:
        weights = self.args.reward_weights
        if weights is None:
            return torch.ones(len(self.reward_funcs))
        if len(weights) != len(self.reward_funcs):
            raise ValueError(
                f"GRPOConfig.reward_weights has {len(weights)} values but there are "
                f"{len(self.reward_funcs)} reward functions ({', '.join(self.reward_names)})"
            )
        return torch.tensor(weights, dtype=torch.float32)

    def _total_steps(self) -> int:
        if self.args.max_steps > 0:
            return self.args.max_steps
        per_epoch = len(self.train_rows) / self.plan.prompts
        return max(1, math.ceil(self.args.num_train_epochs * per_epoch))

    # ------------------------------------------------------------------------------------------------
    def save_model(self, path: str | Path) -> None:
        """Write a standard ``transformers`` checkpoint directory (model + tokenizer)."""
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            Path(path).mkdir(parents=True, exist_ok=True)
            self.unwrapped_model.save_pretrained(path)
            self.tokenizer.save_pretrained(path)

    def save_checkpoint(self) -> Path:
        """Everything a resume needs, in ``<output_dir>/checkpoint-<step>``."""
        path = checkpoint_dir(self.args.output_dir, self.step)
        if self.accelerator.is_main_process:
            save_checkpoint(
                path,
                model=self.unwrapped_model,
                tokenizer=self.tokenizer,
                optimizer=self.optimizer,
                scheduler=self.scheduler,
                trainer_state={"step": self.step, "prompts": self.prompts.state_dict()},
                extra_tensors={
                    "generator": self.generator.get_state(),
                    "reference": None if self.ref_model is None else self.ref_model.state_dict(),
                    "iterative": None if self.iterative is None else self.iterative.state_dict(),
                },
            )
            prune_checkpoints(self.args.output_dir, self.args.save_total_limit)
        self.accelerator.wait_for_everyone()
        return path

    def _resume(self, resume: str | bool) -> None:
        path = latest_checkpoint(self.args.output_dir) if resume in (True, "latest") else Path(str(resume))
        if path is None:
            raise FileNotFoundError(
                f"resume_from_checkpoint: no checkpoint-* found in {self.args.output_dir}"
            )
        load_model_weights(self.unwrapped_model, path)
        state, extra = load_checkpoint(path, optimizer=self.optimizer, scheduler=self.scheduler)
        self.step = int(state["step"])
        self.prompts.load_state_dict(state["prompts"])
        self.generator.set_state(extra["generator"])
        if self.ref_model is not None and extra.get("reference") is not None:
            self.ref_model.load_state_dict(extra["reference"])
        if self.iterative is not None and extra.get("iterative") is not None:
            self.iterative.load_state_dict(extra["iterative"])


def _resolve_rewards(reward_funcs: Any, device: torch.device, allow_empty: bool = False) -> list[Any]:
    """Callables, built-in names, import paths or reward-model directories -> callables; reward models
    are moved to the trainer's device. Empty (or None) only with process rewards."""
    funcs = [
        f
        for f in (reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs])
        if f is not None
    ]
    if not funcs and not allow_empty:
        raise ValueError("reward_funcs: at least one reward function is required (or process_reward_funcs)")
    resolved = [resolve_reward(func) for func in funcs]
    return [func.to(device) if isinstance(func, RewardModel) else func for func in resolved]


def _iterative_loop(
    spec: Any, label_func: Any, args: GRPOConfig, device: torch.device
) -> IterativeLoop | None:
    """The iterative-GRPO loop, or None; iteration_steps and an iterative reward model go together."""
    if spec is None:
        if args.iteration_steps > 0:
            raise ValueError(
                "GRPOConfig.iteration_steps > 0 needs an iterative_reward_model (to reset the reference "
                "model alone, use sync_ref_model and ref_model_sync_steps)"
            )
        return None
    return IterativeLoop.build(spec, label_func, args, device)

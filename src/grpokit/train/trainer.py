"""GRPOTrainer: the GRPO loop, one step read top to bottom (sample, score, advantages, batch, update, log).

DeepSeekMath (arXiv:2402.03300), Algorithm 1: per step set pi_old <- pi_theta, sample G outputs per
question, score them, normalise rewards per group, then mu policy updates on the same samples. The same step
without the trainer's machinery is ``examples/grpo_minimal.py``; optional behaviour (process supervision,
reference resets, iterative reward models) is in step hooks (``grpokit.train.hooks``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from accelerate.utils import set_seed
from tqdm.auto import tqdm

from grpokit.config import GRPOConfig
from grpokit.config.trl_fields import refuse_trainer_arguments
from grpokit.core import PolicyLoss
from grpokit.data.chat import encode_prompt
from grpokit.data.loading import load_dataset_rows
from grpokit.parallel.cpu_runtime import apply_cpu_runtime
from grpokit.parallel.distributed import (
    any_process,
    gather_across_processes,
    make_accelerator,
    merged_across_processes,
    placement,
    prepare_policy,
)
from grpokit.parallel.run_state import RunState
from grpokit.parallel.threads import ThreadPolicy
from grpokit.reporting.callbacks import Callbacks
from grpokit.reporting.completion_log import CompletionLog
from grpokit.reporting.metrics import PhaseTimer, progress_fields, step_metrics
from grpokit.reporting.metrics_log import MetricsLogger, plot_metrics
from grpokit.reporting.publish import Publisher
from grpokit.rewards.base import refuse_missing_columns
from grpokit.rollout import RolloutBackend, SamplingParams
from grpokit.rollout.records import Samples, Scores
from grpokit.rollout.vllm_backend import require_vllm
from grpokit.sampling.async_draw import async_drawer, check_async_generation
from grpokit.sampling.groups import GroupDrawer, prompt_statistics
from grpokit.sampling.off_policy import make_sampler
from grpokit.train import environment as episodes
from grpokit.train.batch import LogprobPass, pad_samples, score_samples
from grpokit.train.evaluation import greedy_reward_means
from grpokit.train.forward import PolicyLogprobs
from grpokit.train.guards import NonfiniteGuard, StopSignals
from grpokit.train.hooks import StepHooks, run_hooks
from grpokit.train.policy import check_special_tokens, load_policy, load_tokenizer
from grpokit.train.prompts import PromptSampler, check_prompt_lengths
from grpokit.train.reference import Reference, refuse_resets_of_adapter_reference
from grpokit.train.run_rewards import run_rewards
from grpokit.train.schedule import RunSchedule
from grpokit.train.update import UpdateContext, run_update

__all__ = ["GRPOTrainer"]


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
        callbacks: ``transformers.TrainerCallback`` objects (``grpokit.reporting.callbacks``).
        optimizers: TRL's ``(optimizer, lr_scheduler)``; either may be None (default AdamW from ``args``;
            the ``lr_scheduler_type`` schedule over the run's optimizer steps). Not with ``fsdp`` or
            ``deepspeed``, which build the optimizer over the parameters they place.
        peft_config: a ``peft`` config to train adapters instead of all weights.
        tools: TRL's tool functions: episodes in a ``ToolEnvironment`` over them (``grpokit.envs.tools``).
        reward_processing_classes, quantization_config, rollout_func, environment_factory: TRL's
            arguments that grpokit does not support; anything but None is refused with the reason.
        rollout_backend: override the generation backend (anything with the RolloutBackend protocol).
        environment: G multi-turn episodes per prompt (default ``args.environment``; docs/environments.md);
            ``reward_funcs`` may then be None: the environment's own reward scores them.
        process_reward_funcs: process rewards (callables ``fn(prompts, completions, steps, **columns) ->
            list[list[float] | None]``, built-in verifier names, or process-reward-model directories).
            Advantages then become per token [n, C] (``grpokit.train.process_supervision``);
            ``reward_funcs`` may be empty for pure process supervision.
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
        reward_processing_classes: Any = None,
        callbacks: list[Any] | None = None,
        optimizers: tuple[Any, Any] = (None, None),
        quantization_config: Any = None,
        peft_config: Any = None,
        tools: Any = None,
        rollout_func: Any = None,
        environment_factory: Any = None,
        *,
        rollout_backend: RolloutBackend | None = None,
        environment: Any = None,
        process_reward_funcs: Any = None,
        iterative_reward_model: Any = None,
        rm_label_func: Any = None,
    ) -> None:
        self.args = args or GRPOConfig()
        refuse_trainer_arguments(
            reward_processing_classes=reward_processing_classes, quantization_config=quantization_config,
            rollout_func=rollout_func, environment_factory=environment_factory,
        )  # fmt: skip
        refuse_resets_of_adapter_reference(self.args, peft_config)
        if self.args.use_vllm:  # no vLLM or no GPU: refused before any weights load
            require_vllm(self.args.vllm_mode)
        set_seed(self.args.seed)  # the same initial weights (LoRA adapters, heads) on every process
        self.accelerator = make_accelerator(self.args.mixed_precision, self.args.use_cpu)
        cpu = self.accelerator.device.type == "cpu"  # CPU runs: torch threads, allocator, attention settings
        self.threads = ThreadPolicy.for_run(self.args, cpu=cpu)
        apply_cpu_runtime(self.args, cpu=cpu)
        main = self.accelerator.is_main_process
        self.publisher = Publisher(self.args, model, train_dataset, is_main=main)  # checks hub access
        self.plan = self.args.batch_plan(self.accelerator.num_processes)
        remote = self.args.trust_remote_code
        self.tokenizer = processing_class if processing_class is not None else load_tokenizer(model, remote)
        check_special_tokens(self.tokenizer)
        self.train_rows = self._load_rows(train_dataset, "train_dataset")
        self.eval_rows = self._load_rows(eval_dataset, "eval_dataset") if eval_dataset is not None else None
        self.environment = episodes.EnvironmentEpisodes.for_run(
            self.args, environment, self.tokenizer, self.train_rows, tools
        )
        self.model = load_policy(model, self.args, peft_config)
        device = self.accelerator.device
        rewards = run_rewards(
            self.args, reward_funcs, process_reward_funcs, iterative_reward_model, rm_label_func,
            self.tokenizer, device, has_environment=self.environment is not None,
        )  # fmt: skip
        self.iterative, self.process, self.reward_weights = (
            rewards.iterative,
            rewards.process,
            rewards.weights,
        )
        self.reward_funcs, self.reward_names = rewards.funcs, rewards.names
        if self.environment is None:  # (episodes add columns of their own)
            refuse_missing_columns(self.reward_names, self.reward_funcs, self.train_rows, "train_dataset")
        self.reference = Reference.for_run(self.model, self.args, adapter_disabled=peft_config is not None)
        self.schedule = RunSchedule.from_config(self.args, len(self.train_rows), self.plan)
        self.max_steps = self.schedule.max_steps
        self.strategy = placement(self.args, self.accelerator.num_processes)  # ddp, fsdp or zero
        total = self.max_steps * self.plan.optimizer_steps  # optimizer steps of the run
        self.placed = prepare_policy(
            self.model, PolicyLogprobs(self.model), self.args, self.accelerator, self.reference, total,
            self.strategy, optimizers,
        )  # fmt: skip
        placed = self.placed
        self.policy, self.optimizer, self.scheduler = placed.policy, placed.optimizer, placed.scheduler
        self.zero = placed.zero
        # the sampler (the policy, its copy in generation_dtype, or rollout_backend) and its IS correction
        self.backend, self.correction = make_sampler(
            self.args, self.generation_model, rollout_backend, self.strategy
        )
        self.prompt_stats, curriculum = prompt_statistics(self.args, len(self.train_rows))
        self.prompts = PromptSampler(len(self.train_rows), self.plan.prompts, self.args, curriculum)
        self.gather = gather_across_processes(self.accelerator)  # lists from every process, or None
        # From here each process draws its own random numbers (sampling, row order): seed + process index.
        set_seed(self.args.seed, device_specific=True)
        self.generator = torch.Generator().manual_seed(self.args.seed + self.accelerator.process_index)
        self.loss = PolicyLoss.from_config(self.args)
        self.logprob_pass = LogprobPass.from_config(self.args)
        self.update_context = UpdateContext.from_accelerator(
            self.accelerator, self.loss, placed, self.generator
        )
        self.hooks = StepHooks(run_hooks(self))
        self.completion_log = CompletionLog(
            self.args.output_dir, self.args.log_completions, self.args.num_completions_to_print,
            reward_names=self.reward_names, is_logged=self.schedule.logs, gather=self.gather,
            enabled=self.accelerator.is_main_process,
        )  # fmt: skip
        check_async_generation(self.args, self.accelerator.num_processes, self.strategy, rollout_backend)
        # which groups each step trains on (dynamic sampling, adaptive G), drawn ahead with async_generation
        self.groups = async_drawer(self, GroupDrawer(self))
        self.logger = MetricsLogger.from_config(self.args, enabled=self.accelerator.is_main_process)
        self.callbacks = Callbacks(
            callbacks, self.args, model=self.model, processing_class=self.tokenizer,
            optimizer=self.optimizer, lr_scheduler=self.scheduler,
        )  # fmt: skip
        self.step = 0
        self.guard = NonfiniteGuard(self.args.max_nonfinite_steps)  # NaN/inf steps in a row stop the run
        self.stopped_by: str | None = None  # the signal that ended train() early (SIGTERM, SIGINT)
        self.run_state = RunState(
            self.accelerator, self.model, self.policy, self.tokenizer, self.optimizer, self.scheduler,
            self.reference, self.hooks, self.prompts, self.generator, self.strategy, self.zero,
            args=self.args, train_rows=self.train_rows, max_steps=self.max_steps,
        )  # fmt: skip
        # a resume is checked now, before any evaluation or step (parallel.resume): refused in one sentence
        self.run_state.check_resume(self.args.resume_from_checkpoint, self.args.output_dir)
        self.callbacks.event("on_init_end")

    @property
    def unwrapped_model(self) -> torch.nn.Module:
        """The policy itself (a ``transformers`` or PEFT model), not wrapped by DDP."""
        return self.model

    @property
    def generation_model(self) -> torch.nn.Module:
        """The model generation reads (``PreparedPolicy.generation_model``)."""
        return self.placed.generation_model

    @property
    def sharded(self) -> bool:
        """Whether the weights are sharded (FSDP)."""
        return self.placed.sharded

    # ------------------------------------------------------------------------------------------------
    def train(self, resume_from_checkpoint: str | bool | None = None) -> list[dict[str, float]]:
        """Run ``max_steps`` GRPO steps; returns the logged metrics. Saves the final model to output_dir.
        SIGTERM/SIGINT end it after the current step with a checkpoint (``stopped_by`` names the signal)."""
        resume = resume_from_checkpoint or self.args.resume_from_checkpoint
        self.run_state.refuse_to_overwrite(self.args, resume, self.step)
        if resume:
            self.step = self.run_state.resume(resume, self.args.output_dir)
        history: list[dict[str, float]] = []
        main = self.accelerator.is_main_process
        hide = self.args.disable_tqdm or not self.accelerator.is_local_main_process
        bar = tqdm(total=self.max_steps, initial=self.step, desc="GRPO", disable=hide)
        schedule, callbacks = self.schedule, self.callbacks
        callbacks.begin(
            max_steps=self.max_steps, step=self.step, epoch=schedule.epoch(self.step),
            logging_steps=self.args.logging_steps, is_main=main,
        )  # fmt: skip
        if self.args.eval_on_start and self.eval_rows is not None and self.step == 0:
            self._log(0, self._evaluate_with_callbacks(), history)
        # the trackers are finished when the loop ends (marked failed if it raised)
        with self.logger, StopSignals(any_process(self.accelerator)) as signals:
            while self.step < self.max_steps:
                self.stopped_by = signals.stop_here(self.step, self.save_checkpoint, announce=main)
                if self.stopped_by is not None:
                    break
                callbacks.step_begin()
                metrics = self.training_step()
                if self.threads is not None:  # no more torch threads than the cores left idle
                    self.threads.after_step()
                self.step += 1
                self.guard.check(self.step, metrics)
                control = callbacks.step_end(self.step, schedule.epoch(self.step))
                if self.eval_rows is not None and (schedule.evaluates(self.step) or control.should_evaluate):
                    metrics.update(self._evaluate_with_callbacks())
                bar.update(1)
                bar.set_postfix(progress_fields(metrics))
                if schedule.logs(self.step) or control.should_log:
                    self._log(self.step, metrics, history)
                if schedule.ends_epoch(self.step):
                    callbacks.event("on_epoch_end")
                if schedule.saves(self.step) or control.should_save:
                    self.publisher.checkpoint_saved(self.save_checkpoint(), self)
                if control.should_training_stop:
                    break
        bar.close()
        self.groups.close()  # no more draws ahead
        if self.stopped_by is None:
            self.save_model(self.args.output_dir)
            if self.iterative is not None and main:
                self.iterative.save(Path(self.args.output_dir) / "reward_model")
            if main:
                plot_metrics(self.logger.read(), Path(self.args.output_dir) / "metrics.png")
            self.publisher.run_finished(self)
        callbacks.event("on_train_end")
        return history

    def _log(self, step: int, metrics: dict[str, float], history: list[dict[str, float]]) -> None:
        """Write one step's metrics to every sink and tell the callbacks."""
        self.logger.log(step, metrics)
        history.append({"step": step, **metrics})
        self.callbacks.log(metrics)

    def _evaluate_with_callbacks(self) -> dict[str, float]:
        metrics = self.evaluate(batch_size=self.args.per_device_eval_batch_size)
        self.callbacks.event("on_evaluate", metrics=metrics)
        return metrics

    def training_step(self) -> dict[str, float]:
        """One GRPO step on this process's share of the prompts; the metrics of the whole batch."""
        timer, step = PhaseTimer(), self.step + 1
        # 1-3. sample prompts and G completions for each from the current policy (pi_old = pi_theta), score
        #      them with every reward function, group-relative advantages over all processes; dynamic
        #      sampling repeats 1-2 until the step holds enough informative groups (sampling.groups)
        draw = self.groups.draw(timer)
        samples, scores = draw.samples, draw.scores
        with timer.phase("reward"):
            self.hooks.on_scored(step, draw.sampled, draw.sampled_scores)  # process rewards, RM samples
            self.completion_log.record(step, draw.sampled, draw.sampled_scores)  # at the logged steps
        update, num_tokens = {}, 0
        if samples.texts:  # empty only when dynamic sampling found no informative group: nothing to train on
            update, num_tokens = self.learn(samples, scores, timer)  # 4-6: batch, fixed log-probs, update
        # 7. what follows the update (reference reset, RM update), then metrics describing the whole batch
        with timer.phase("after_update"):
            self.hooks.after_update(step)
        metrics = step_metrics(
            scores=draw.sampled_scores,
            reward_names=self.reward_names,
            group_size=None,
            group_sizes=draw.sampled_scores.group_sizes,
            generated=draw.sampled.generated,
            update=update,
            extra={**self.hooks.metrics(), **draw.metrics},
            learning_rate=self.scheduler.get_last_lr()[0],
            num_tokens=num_tokens,
            timer=timer,
        )
        return merged_across_processes(self.accelerator, metrics)

    def learn(self, samples: Samples, scores: Scores, timer: PhaseTimer) -> tuple[dict[str, float], int]:
        """Steps 4-6 on this process's groups; returns the update's metrics and the completion tokens."""
        # 4. one RolloutBatch: padded ids and masks, this process's advantages
        with timer.phase("batch"):
            batch = pad_samples(samples, scores.advantages[scores.local], **self._padding())
            self.hooks.on_batch(batch)  # process supervision: per-token advantages [n, C]
        # 5. fixed log-probs: pi_old only when the update is off-policy (mu > 1, several optimizer steps per
        #    generation, or a sampler that is not pi_old: IS weights pi_old / pi_sampler), pi_ref if beta > 0
        with timer.phase("old_logprobs"), self.accelerator.autocast():
            off_policy = self.plan.optimizer_steps > 1 or self.correction.applies(batch)
            batch.old_logps = self.logprob_pass(self.placed.scorer, batch) if off_policy else None
            correction = self.correction(
                batch
            )  # batch.importance_weights, their metrics (sampling.off_policy)
        with timer.phase("reference"), self.accelerator.autocast():
            batch.ref_logps = self.reference.logprobs(batch, self.logprob_pass) if self.reference else None
        # 6. mu epochs of clipped policy-gradient updates
        with timer.phase("update"):
            update = run_update(batch, self.args, self.update_context)
        return {**update, **correction}, batch.num_completion_tokens()

    # ------------------------------------------------------------------------------------------------
    def sample(
        self, rows: list[dict[str, Any]], *, greedy: bool = False, group_sizes: list[int] | None = None,
        backend: RolloutBackend | None = None,
    ) -> Samples:  # fmt: skip
        """G completions (one when ``greedy``; ``group_sizes[k]`` for row k when given) for each row's
        prompt from the current policy (or ``backend``), decoded."""
        sizes = group_sizes or [1 if greedy else self.args.num_generations] * len(rows)
        prompt_ids = [self.encode_prompt(row["prompt"]) for row in rows]
        # mixed precision applies to every model pass, not only the update; full weights to generate from
        with self.accelerator.autocast(), self.placed.generation_weights():  # episodes with an environment
            generated, rows, run = episodes.sample_groups(
                self.environment,
                backend or self.backend,
                rows,
                prompt_ids,
                sizes,
                self.sampling_params(greedy),
            )
        texts = self.tokenizer.batch_decode(generated.completion_ids, skip_special_tokens=True)
        return Samples(rows, prompt_ids, generated, texts, group_sizes=sizes, episodes=run)

    def reward_matrix(self, samples: Samples) -> tuple[torch.Tensor, dict[str, float]]:
        """``(rewards [n, F] with NaN for None, rewards/<name>/failures)`` under ``reward_failure`` and
        ``reward_timeout``."""
        state = {"global_step": self.step, "max_steps": self.max_steps}
        return score_samples(
            self.reward_funcs, samples, state, self.args.reward_failure, self.args.reward_timeout
        )

    def evaluate(self, eval_dataset: Any = None, batch_size: int = 64) -> dict[str, float]:
        """``eval/reward`` and ``eval/rewards/<name>/mean`` of greedy completions of ``eval_dataset``
        (default: the trainer's), every row counted once across processes (``train.evaluation``)."""
        rows = self.eval_rows if eval_dataset is None else self._load_rows(eval_dataset, "eval_dataset")
        if rows is None:
            raise ValueError("evaluate: no eval_dataset (give one here or to GRPOTrainer)")
        return greedy_reward_means(self, rows, batch_size)

    def _load_rows(self, source: Any, name: str) -> list[dict[str, Any]]:
        """Rows of a data set in any form (``grpokit.data``: names, files, folders, Datasets, lists), with the
        configured split and columns; prompts over ``max_prompt_length`` refused if so configured."""
        rows = load_dataset_rows(source, self.args, name=name)
        check_prompt_lengths(rows, self.tokenizer, self.args, name=name)
        return rows

    def encode_prompt(self, prompt: Any) -> list[int]:
        """Token ids of a prompt (chat template for message lists), cut from the left to max_prompt_length."""
        kwargs = episodes.template_kwargs(
            self.environment, self.args.chat_template_kwargs
        )  # an environment's tools
        return encode_prompt(prompt, self.tokenizer, self.args.max_prompt_length, kwargs)

    def sampling_params(self, greedy: bool = False) -> SamplingParams:
        return SamplingParams.from_config(self.args, self.tokenizer, greedy=greedy)

    # ------------------------------------------------------------------------------------------------
    def _padding(self) -> dict[str, Any]:
        return {
            "pad_token_id": self.sampling_params().pad_token_id,
            "mask_truncated": self.args.mask_truncated_completions,
            "device": self.accelerator.device,
        }

    # ------------------------------------------------------------------------------------------------
    def save_model(self, path: str | Path) -> None:
        """Write a standard ``transformers`` checkpoint directory (model + tokenizer; a PEFT model writes
        its adapters). Under FSDP the full weights are gathered first."""
        self.run_state.save_model(path)

    def save_checkpoint(self) -> Path:
        """Everything a resume needs, in ``<output_dir>/checkpoint-<step>`` (``parallel.run_state``)."""
        path = self.run_state.save(self.args.output_dir, self.step, self.args.save_total_limit)
        self.callbacks.event("on_save")
        return path

    def add_callback(self, callback: Any) -> None:
        """Add a ``TrainerCallback`` (an instance or a class), as in TRL."""
        self.callbacks.add(callback)

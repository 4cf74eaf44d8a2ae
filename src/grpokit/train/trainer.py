"""GRPOTrainer: the GRPO loop, one step read top to bottom (draw, score, advantages, batch, fixed log-probs,
update, log).

DeepSeekMath (arXiv:2402.03300), Algorithm 1: per step set pi_old <- pi_theta, sample G outputs per
question, score them, normalise rewards per group, then mu policy updates on the same samples. The same step
without the trainer's machinery is ``examples/grpo_minimal.py``. Which groups a step draws and keeps
(dynamic sampling, adaptive G, curriculum, drawing ahead) is ``grpokit.sampling``, around the plain draw
``draw_round``; optional behaviour (process supervision, reference resets, iterative reward models) is in
step hooks (``grpokit.train.hooks``). Helpers get what they need as arguments; none changes the trainer.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import gather_object, set_seed
from tqdm.auto import tqdm
from transformers import TrainerState

from grpokit.config import GRPOConfig
from grpokit.config.resolution import precision_unset
from grpokit.config.trl_fields import refuse_trainer_arguments
from grpokit.core import entropy_threshold, multi_reward_advantages, off_policy_sequence_mask
from grpokit.data.chat import encode_prompt
from grpokit.data.images import check_image_rows
from grpokit.data.integrity import InputError
from grpokit.data.loading import load_dataset_rows
from grpokit.data.run_folder import claim_run_folder, expand_path, refuse_another_runs_folder
from grpokit.envs.factories import EMPTY_PROMPT, EnvironmentFactories
from grpokit.envs.sampler import EpisodeSampler, sample_groups, start_episodes, template_kwargs
from grpokit.models.moe import router_loss_for
from grpokit.models.packing import refuse_unrunnable
from grpokit.models.policy import check_special_tokens, load_policy, processing_class_of
from grpokit.models.routing_replay import TAGS, RoutingUse, replayed_tags, routing_for_run
from grpokit.models.vision import (
    PromptImages,
    is_processor,
    is_vision_language,
    placeholder_token_ids,
    trains_vision_encoder,
)
from grpokit.parallel.checkpoint import STATE_FILE, checkpoint_dir
from grpokit.parallel.cpu_runtime import apply_cpu_runtime
from grpokit.parallel.distributed import (
    any_process,
    decided_by_main,
    end_processes,
    gather_across_processes,
    make_accelerator,
    merged_across_processes,
    placement,
    prepare_policy,
)
from grpokit.parallel.hardware import default_mixed_precision, log_bf16_support
from grpokit.parallel.resume import plan_resume
from grpokit.parallel.run_state import RunState
from grpokit.parallel.stopping import NonfiniteGuard, StopSignals
from grpokit.parallel.threads import ThreadPolicy
from grpokit.reporting.callbacks import Callbacks, TrainHistory, run_summary
from grpokit.reporting.completion_log import CompletionLog
from grpokit.reporting.metrics import PhaseTimer, progress_fields, reward_means, step_metrics
from grpokit.reporting.metrics_log import MetricsLogger, plot_metrics
from grpokit.reporting.publish import Publisher
from grpokit.reporting.tracking import require_sink_packages, resolve_sinks
from grpokit.rewards.base import refuse_missing_columns
from grpokit.rewards.reward_logs import RewardLogs
from grpokit.rollout import RolloutBackend, SamplingParams
from grpokit.rollout.records import RolloutBatch, Samples
from grpokit.rollout.vllm_common import require_vllm
from grpokit.sampling.async_draw import AsyncDrawer, check_async_generation, draws_ahead
from grpokit.sampling.groups import DrawSettings, GroupDrawer, GroupSizes, Round, prompt_statistics
from grpokit.sampling.off_policy import SamplerLogprobs, WeightSync, make_sampler, sampler_copy
from grpokit.train.batch import LogprobPass, pad_samples, score_samples
from grpokit.train.entropy_control import EntropyControl
from grpokit.train.evaluation import eval_advantages, eval_loss
from grpokit.train.forward import PolicyLogprobs
from grpokit.train.hooks import StepHooks, run_hooks
from grpokit.train.preflight import (
    as_config,
    check_output_folder,
    check_policy_fits,
    check_rows_per_step,
    longest_prompt,
    output_folder_reads,
    read_model_config,
    resumes_in,
)
from grpokit.train.process_supervision import EpisodeSupervision
from grpokit.train.prompts import ImagePrompts, PromptSampler, check_prompt_lengths
from grpokit.train.reference import Reference, refuse_resets_of_adapter_reference
from grpokit.train.run_rewards import run_rewards
from grpokit.train.schedule import RunSchedule
from grpokit.train.selfplay import SelfPlay, game_yardstick
from grpokit.train.update import UpdateContext, run_update

__all__ = ["GRPOTrainer"]

logger = logging.getLogger(__name__)


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
        reward_processing_classes: TRL's: the tokenizer of each reward model in ``reward_funcs`` (one, or
            one per reward function; None: the model's own).
        environment_factory: TRL's environments (a class or a dict of them by the rows' ``environment``):
            public methods as tools, ``reset(**row)`` ending the prompt, ``get_reward()`` as a reward
            (``grpokit.envs.factories``); ``train_dataset`` may then be None (``max_steps`` rows).
        quantization_config, rollout_func: TRL's arguments that grpokit does not support; anything but
            None is refused with the reason.
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
        reward_funcs: Any = None,
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
        args = as_config(args)  # (a dict of fields is taken too)
        args.check_eval_dataset(eval_dataset is not None, "pass eval_dataset to GRPOTrainer")
        # every derived value written out, once; a config that chooses no precision gets the processor's
        self.args = args.resolved(default_mixed_precision(args.use_cpu))
        refuse_trainer_arguments(quantization_config=quantization_config, rollout_func=rollout_func)
        refuse_resets_of_adapter_reference(self.args, peft_config)
        if self.args.use_vllm:  # no vLLM or no device for its engine: refused before any weights load
            require_vllm(self.args.vllm_mode)
        set_seed(self.args.seed)  # the same initial weights (LoRA adapters, heads) on every process
        self.accelerator = make_accelerator(self.args.mixed_precision, self.args.use_cpu)
        cpu = self.accelerator.device.type == "cpu"  # CPU runs: torch threads, allocator, attention settings
        self.threads = ThreadPolicy.for_run(self.args, cpu=cpu)
        apply_cpu_runtime(self.args, cpu=cpu)
        main = self.accelerator.is_main_process
        if self.args.resume_from_checkpoint:  # the checkpoint and the config's changes, before anything loads
            plan_resume(self.args.resume_from_checkpoint, self.args, self.args.output_dir,
                        num_processes=self.accelerator.num_processes)  # fmt: skip
        # the output folder: another run's results, a live run, a file or no permission, refused before
        # anything loads (the main process reads it; every process stops); train() claims it
        reads = output_folder_reads(model, train_dataset, eval_dataset)
        decided_by_main(
            self.accelerator, lambda: check_output_folder(self.args, reads, resume_may_follow=True)
        )
        # the processor chose bf16 (the config chose no precision)
        self.bf16_by_default = precision_unset(args) and self.args.mixed_precision == "bf16"
        if main:  # bf16 matrix units (AMX, Arm BF16, tensor cores) and whether this run computes in bf16
            log_bf16_support(self.accelerator.device, self.args.mixed_precision, self.bf16_by_default)
        self.publisher = Publisher(self.args, model, train_dataset, is_main=main)  # checks hub access
        self.plan = self.args.batch_plan(self.accelerator.num_processes)
        remote = self.args.trust_remote_code
        # a tokenizer, or a vision-language model's processor (its tokenizer does the text's work)
        if processing_class is None:
            processing_class = processing_class_of(model, remote)
        self.processing_class = processing_class
        self.tokenizer = processing_class.tokenizer if is_processor(processing_class) else processing_class
        check_special_tokens(self.tokenizer)
        self.image_prompts = None  # prompts with images (a vision-language policy): grpokit.models.vision
        if is_processor(processing_class):
            self.image_prompts = ImagePrompts(
                processing_class, self.args.max_prompt_length, self.args.chat_template_kwargs,
                truncation=self.args.prompt_truncation,
            )  # fmt: skip
        self.train_dataset, self.eval_dataset = train_dataset, eval_dataset  # as given (TRL's attributes)
        # TRL's environment_factory: methods as tools, reset(**row) ends the prompts (grpokit.envs.factories)
        factory = environment_factory
        self.factories = EnvironmentFactories(factory, tools) if factory is not None else None
        self.tools = self.factories.tools if self.factories else list(tools or [])  # TRL's attribute
        if train_dataset is None and self.factories is not None:  # the environment owns the data
            train_dataset = self.factories.placeholder_rows(self.args.max_steps, self.plan.prompts)
        self.train_rows = self._load_rows(train_dataset, "train_dataset")
        self.eval_rows = self._load_eval_sets(eval_dataset)  # rows, {name: rows} (named sets) or None
        episodic = environment is not None or tools or self.factories is not None
        if self.image_prompts is not None and episodic:
            raise InputError(
                "a vision-language policy with an environment or tools: episodes carry no images yet; "
                "train it on single-turn prompts"
            )
        # G episodes per prompt instead of G completions when the run has an environment (grpokit.envs)
        self.episodes = EpisodeSampler.for_run(
            environment, tools, self.train_rows, self.tokenizer, self.args.episode_settings(), self.factories
        )
        episode_hook = EpisodeSupervision.for_run(self.args, self.episodes is not None)  # env/*, turn rewards
        # what the model's config says (vocabulary, positions, LoRA targets), read without its weights
        # (a prompt with images is measured, and refused if too long, when it is encoded with its images)
        longest = 0 if self.image_prompts else longest_prompt(self.train_rows, self.tokenizer, self.args)
        model_config = read_model_config(model, remote)
        if self.image_prompts is not None and not is_vision_language(model_config):
            raise InputError(
                f"processing_class is a processor for images, but the model ({type(model_config).__name__}) "
                "has no vision encoder; pass the model's tokenizer, or a vision-language model"
            )
        check_policy_fits(
            model_config, self.tokenizer, self.args, peft_config=peft_config, prompt_tokens=longest,
            skeleton=model if isinstance(model, torch.nn.Module) else None,
        )  # fmt: skip
        self.gather = gather_across_processes(self.accelerator)  # lists from every process, or None
        # the rewards (names, import paths, reward models) before the policy's weights
        rewards = run_rewards(
            self.args, reward_funcs, process_reward_funcs, iterative_reward_model, rm_label_func,
            self.tokenizer, self.accelerator.device,
            has_environment=self.episodes is not None and self.factories is None, gather=self.gather,
            reward_processing_classes=reward_processing_classes,
            environment_rewards=None if self.factories is None else self.factories.reward_funcs,
        )  # fmt: skip
        self.iterative, self.process = rewards.iterative, rewards.process  # optional step hooks
        self.reward_funcs, self.reward_names = rewards.funcs, rewards.names
        self.reward_weights = rewards.weights  # [F]
        self.gold = rewards.gold  # a watching gold reward (proxy_gold/* metrics), or None
        if self.episodes is None:  # (episodes add columns of their own)
            refuse_missing_columns(self.reward_names, self.reward_funcs, self.train_rows, "train_dataset")
        check_rows_per_step(len(self.train_rows), self.plan.prompts)
        self.model = load_policy(model, self.args, peft_config)
        self.router_loss = router_loss_for(self.model, self.args.router_aux_loss_coef)  # MoE policies
        if self.router_loss is not None and self.args.micro_batch_tokens is not None:
            raise ValueError(
                "GRPOConfig.micro_batch_tokens cannot be used with a mixture-of-experts policy's "
                "load-balancing loss, which is a statistic of each micro-batch's tokens: set "
                "router_aux_loss_coef=0 or use per_device_train_batch_size"
            )
        # an MoE policy's routing: recorded while sampling, compared (routing/*), replayed (routing_replay);
        # installed before the reference and the sampler copy the policy, which then share it
        replay = self.args.routing_replay
        self.routing = routing_for_run(self.model, replay, {
            "with images: a mixture-of-experts vision-language model is not supported": self.image_prompts
            is not None,
            "with use_vllm for R3: vLLM returns the experts it chose only with enable_return_routed_experts "
            "on its V2 model runner, which needs Triton (not its CPU engine), and grpokit does not read them "
            "yet; use the fast sampler or model.generate, or R2": replay == "R3" and self.args.use_vllm,
            "with rollout_backend for R3: an outside sampler reports no experts; use R2":
                replay == "R3" and rollout_backend is not None,
            "with an environment for R3: episodes record no experts yet; use R2":
                replay == "R3" and self.episodes is not None,
        })  # fmt: skip
        if self.args.padding_free:  # (None: the passes pack wherever they can)
            replayed, images = self.routing is not None and replay != "off", self.image_prompts is not None
            refuse_unrunnable(self.model.config, images=images, routing_replay=replayed)
        self.reference = Reference.for_run(self.model, self.args, adapter_disabled=peft_config is not None)
        self.schedule = RunSchedule.from_config(self.args, len(self.train_rows), self.plan)
        self.max_steps = self.schedule.max_steps
        self.strategy = placement(self.args, self.accelerator.num_processes)  # ddp, fsdp or zero
        total = self.max_steps * self.plan.optimizer_steps  # optimizer steps of the run
        # FSDP shards the policy's weights: the sampler's generation_dtype copy is made before, whole
        fsdp_copy = self.strategy == "fsdp" and rollout_backend is None
        copied = sampler_copy(self.args, self.model) if fsdp_copy else None
        self.placed = prepare_policy(
            self.model, PolicyLogprobs(self.model), self.args, self.accelerator, self.reference, total,
            self.strategy, optimizers, find_unused_parameters=trains_vision_encoder(self.model),
        )  # fmt: skip
        placed = self.placed
        self.policy, self.optimizer, self.scheduler = placed.policy, placed.optimizer, placed.scheduler
        self.zero = placed.zero
        check_async_generation(
            self.args, self.accelerator.num_processes, self.strategy, rollout_backend,
            environment_factory=self.factories is not None,
        )  # fmt: skip
        # the sampler (the policy, its copy in generation_dtype, or rollout_backend) and its IS correction,
        # on for every batch when the samples are drawn ahead from older copies of the policy
        ahead = draws_ahead(self.args)
        with self.placed.generation_weights():  # full weights for a sampler that copies them (ZeRO-3: filled)
            self.backend, self.correction = make_sampler(
                self.args, self.generation_model, rollout_backend, self.strategy, step_sync=True,
                drawn_ahead=ahead, copied=copied,
            )  # fmt: skip
        if self.image_prompts is not None and not getattr(self.backend, "accepts_images", False):
            raise InputError(
                "a vision-language policy samples with model.generate or, for LLaVA-style models, the fast "
                "sampler (generation_backend='transformers', 'fast' or 'auto'); "
                f"{type(self.backend).__name__} takes no images (use_vllm with images: not yet)"
            )
        # pi_old's log-probs from the sampler where they are pi_old's (the old-policy pass skipped)
        self.sampler_logprobs = SamplerLogprobs.for_run(
            self.args, self.model, self.backend, self.correction, environment=self.episodes is not None
        )
        if self.plan.optimizer_steps > 1 and main:  # the update needs pi_old: say where it comes from
            logger.info("grpokit: %s", self.sampler_logprobs.describe())
        # a sampler with its own copy of the weights (vLLM) gets them once per step, after the update
        self.weight_sync = WeightSync(self.backend, self.placed.generation_weights)
        self.prompt_stats, curriculum = prompt_statistics(self.args, len(self.train_rows))
        self.prompts = PromptSampler(len(self.train_rows), self.plan.prompts, self.args, curriculum)
        self.group_sizes = GroupSizes.from_config(self.args, self.prompt_stats)  # G of each prompt
        # From here each process draws its own random numbers (sampling, row order): seed + process index.
        set_seed(self.args.seed, device_specific=True)
        self.generator = torch.Generator().manual_seed(self.args.seed + self.accelerator.process_index)
        self.loss = self.args.policy_loss()
        self.logprob_pass = LogprobPass.from_config(self.args)
        self.entropy_control = EntropyControl.from_config(self.args)  # entropy_coef, adaptive or not
        self.update_context = UpdateContext.from_accelerator(
            self.accelerator, self.loss, placed, self.generator, entropy=self.entropy_control,
            off_policy_sampler=self.correction.off_policy, router=self.router_loss,
            routing_replay=None if self.routing is None else replay, routing=self.routing,
        )  # fmt: skip
        game = None if self.episodes is None else self.episodes.game  # a game's seats (grpokit.envs.selfplay)
        self.selfplay = None  # a game's advantages, metrics, snapshot pool (train.selfplay)
        if game is not None:  # Kuhn poker: its exploitability after each update, after the run's prompt
            prompt = self.encode_prompt(self.train_rows[0]["prompt"], self.train_rows[0])
            measure = game_yardstick(game, self.model, self.tokenizer, prompt, self.accelerator.autocast)
            self.selfplay = SelfPlay(game, self.args, measure, policy=self.model, placement=self.strategy)
        self.hooks = StepHooks(run_hooks(
            self.args, episodes=episode_hook, process=self.process, reference=self.reference,
            iterative=self.iterative, prompt_stats=self.prompt_stats, curriculum=curriculum,
            entropy=self.entropy_control, selfplay=self.selfplay,
        ))  # fmt: skip
        self.completion_log = CompletionLog(
            self.args.output_dir, self.args.log_completions, self.args.num_completions_to_print,
            reward_names=self.reward_names, is_logged=self.schedule.logs, gather=self.gather,
            enabled=self.accelerator.is_main_process, log_images=self.args.log_multimodal,
        )  # fmt: skip
        # which groups each step trains on: rounds of draw_round (dynamic sampling, adaptive G, curriculum)
        process_rewards = self.process is not None  # dynamic sampling and adaptive G are refused with them
        roles = 1 if game is None else game.num_roles
        settings = DrawSettings.from_config(self.args, self.plan.prompts, process_rewards=process_rewards,
                                            roles=roles)  # fmt: skip
        self.groups = GroupDrawer(
            self.draw_round, settings, self.reward_weights, rank=self.accelerator.process_index,
            num_processes=self.accelerator.num_processes, gather=self.gather, prompt_stats=self.prompt_stats,
        )  # fmt: skip
        # with async_generation the steps' groups are drawn ahead, in the background
        self.draws: GroupDrawer | AsyncDrawer = self.groups
        if ahead:
            self.draws = AsyncDrawer.from_config(self.args, self.groups.draw, self.generation_model)
        # metrics.jsonl (read here; written, and the trackers opened, once train() holds output_dir)
        self.logger = MetricsLogger.from_config(self.args, enabled=False)
        if self.accelerator.is_main_process:  # a tracker's missing package: refused now, not at train()
            require_sink_packages(resolve_sinks(self.args.report_to))
        self.callbacks = Callbacks(
            callbacks, self.args, model=self.model, processing_class=self.processing_class,
            optimizer=self.optimizer, lr_scheduler=self.scheduler,
        )  # fmt: skip
        self.callbacks.state.max_steps = self.max_steps  # (TRL's trainer.state, read by reward functions)
        self.step = 0
        self.guard = NonfiniteGuard(self.args.max_nonfinite_steps)  # NaN/inf steps in a row stop the run
        self.stopped_by: str | None = None  # the signal that ended train() early (SIGTERM, SIGINT)
        self.finished = False  # train() ran to max_steps and saved the model
        self._saved_step = -1  # the step of the last checkpoint this trainer saved
        self._run_id: str | None = None  # the run (grpokit_run.json) this trainer's train() wrote
        self.run_state = RunState(
            self.accelerator, self.model, self.policy, self.processing_class, self.optimizer, self.scheduler,
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
    def state(self) -> TrainerState:
        """transformers' ``TrainerState`` of the run, as TRL's ``trainer.state``: ``global_step``,
        ``max_steps``, ``log_history`` (every logged step, then the run's summary with ``train_loss``)."""
        return self.callbacks.state

    @property
    def aux_loss_enabled(self) -> bool:
        """TRL's: whether a mixture-of-experts load-balancing loss is added to the loss
        (``router_aux_loss_coef``, ``grpokit.models.moe``); its value is logged as ``aux_loss``."""
        return self.router_loss is not None

    @property
    def _logs(self) -> dict[str, Any]:
        """TRL's table of the last logged completions: ``prompt``, ``completion``, ``rewards`` (per function),
        ``advantages``, ``extra`` (the reward functions' ``log_extra`` columns) and ``images`` (with
        ``log_multimodal``, each image-prompted completion's image names, where TRL keeps the images
        themselves), lists over the completions of the last step written to the completion log
        (``log_completions``)."""
        records = self.completion_log.last
        extra_names = list(dict.fromkeys(name for r in records for name in r.get("extra", {})))
        return {
            "prompt": [r["prompt"] for r in records],
            "completion": [r["completion"] for r in records],
            "rewards": {name: [r["rewards"][name] for r in records] for name in self.reward_names},
            "advantages": [r["advantage"] for r in records],
            "extra": {name: [r.get("extra", {}).get(name) for r in records] for name in extra_names},
            "images": [r["images"] for r in records if "images" in r],
        }

    @property
    def reward_processing_classes(self) -> list[Any]:
        """TRL's: the tokenizer of each reward function that is a reward model (given in
        ``reward_processing_classes`` or the model's own), None for the others; one per reward function."""
        return [getattr(func, "tokenizer", None) for func in self.reward_funcs]

    @property
    def reward_func_names(self) -> list[str]:
        """The reward functions' metric names (TRL's attribute; an environment's reward: its class name)."""
        return list(self.reward_names)

    @property
    def environments(self) -> list[Any] | None:
        """TRL's ``environment_factory``: the latest batch's environment instances, in completion order."""
        return None if self.factories is None else self.factories.environments

    @property
    def _env_tools(self) -> dict[Any, list[Any]]:
        """TRL's: the tools of each environment of ``environment_factory`` ({} without one)."""
        return {} if self.factories is None else self.factories.env_tools

    @property
    def _environment_pool(self) -> dict[Any, list[Any]]:
        """TRL's: the reusable instances of each environment of ``environment_factory``."""
        return {} if self.factories is None else self.factories.pool

    @property
    def ref_model(self) -> torch.nn.Module | None:
        """The frozen reference model (TRL's ``trainer.ref_model``): None when ``beta`` is 0 or the policy is
        a PEFT model (its reference is the base with the adapters disabled)."""
        return None if self.reference is None else self.reference.model

    @property
    def entropy_coef(self) -> float:
        """The entropy bonus's coefficient now (TRL's ``trainer.entropy_coef``): ``args.entropy_coef``, or
        where adaptive entropy control has moved it."""
        return self.entropy_control.coef

    def get_high_entropy_mask(
        self, entropies: torch.Tensor, mask: torch.Tensor, threshold: float
    ) -> torch.Tensor:
        """TRL's: bool [B, T], True where a non-pad token's entropy is >= the ``threshold``-quantile of the
        entropies of every process's non-pad tokens (``grpokit.core.entropy_threshold``; TRL passes
        1 - top_entropy_quantile). entropies, mask: [B, T]."""
        local = entropies[mask.bool()].float()  # [M]
        pad = -1e9  # entropies are >= 0, so this marks padding added to equalise the processes' lengths
        everywhere = self.accelerator.gather(
            self.accelerator.pad_across_processes(local, dim=0, pad_index=pad)
        )
        everywhere = everywhere[everywhere != pad]  # [sum of M]
        if everywhere.numel() == 0:
            return torch.zeros_like(entropies, dtype=torch.bool)
        return (entropies >= entropy_threshold(everywhere, threshold)) & mask.bool()

    @staticmethod
    def get_off_policy_mask(
        advantages: torch.Tensor,
        per_token_logps: torch.Tensor,
        sampling_per_token_logps: torch.Tensor,
        mask: torch.Tensor,
        off_policy_threshold: float,
    ) -> torch.Tensor:
        """TRL's off-policy sequence mask (DeepSeek-V3.2): [B, 1] in ``mask``'s dtype, 1 = keep, 0 = a
        negative-advantage sequence whose mean KL exceeds the threshold (``grpokit.core.
        off_policy_sequence_mask``)."""
        keep = off_policy_sequence_mask(
            advantages, per_token_logps, sampling_per_token_logps, mask, off_policy_threshold
        )
        return keep.to(mask.dtype)

    @property
    def sharded(self) -> bool:
        """Whether the weights are sharded (FSDP)."""
        return self.placed.sharded

    # ------------------------------------------------------------------------------------------------
    def train(self, resume_from_checkpoint: str | bool | None = None) -> TrainHistory:
        """Run ``max_steps`` GRPO steps; returns the logged metrics (a list, with transformers'
        ``TrainOutput`` fields as attributes: ``global_step``, ``training_loss``, ``metrics``). Saves the
        final model to output_dir. The run owns output_dir while it trains (``data.run_folder``: a lock
        and the manifest ``grpokit_run.json``; ``overwrite_output_dir`` deletes another run's results first).
        SIGTERM/SIGINT end it after the current step with a checkpoint (``stopped_by`` names the signal); a
        signal during a checkpoint or the final save lets it finish. The run's summary (``train_loss``: the
        mean loss of the steps trained, ``train_runtime``, ``train_steps_per_second``, ``epoch``) ends
        ``state.log_history``. A second call continues from where the first stopped (a signal, or
        ``max_steps`` raised on the trainer); one with nothing left to train is refused."""
        if self.step >= self.max_steps and self.step > 0:  # an earlier train() trained them all
            raise InputError(
                f"train() already ran to step {self.step} of max_steps={self.max_steps} on this trainer (the "
                f"model is in {self.args.output_dir}); to train further, raise trainer.max_steps, or build a "
                "new GRPOTrainer with a larger max_steps and resume_from_checkpoint"
            )
        continuing = self.step > 0  # an earlier train() stopped (a signal) or max_steps was raised: go on
        resume = None if continuing else resume_from_checkpoint or self.args.resume_from_checkpoint
        self.stopped_by = None
        announce = self.accelerator.is_main_process and StopSignals.current() is None  # (else the caller's)
        resumes_here = continuing or resumes_in(resume, self.args.output_dir)  # (its results are its own)
        with self._claim_output_dir(resumes_here) as claim, StopSignals.in_force() as signals:
            self._run_id = claim.run_id
            self.accelerator.wait_for_everyone()  # (an overwrite's deletions are done before any write)
            with signals.deferred(any_process(self.accelerator)):  # a signal waits for the step boundary
                history = self._train_steps(resume, signals, announce)
                if self.stopped_by is None:  # the final save, not cut by a signal (noted for the caller)
                    self._save_final()
                # `finished` and the manifest agree with what was saved, whenever a signal comes
                self.finished = self.stopped_by is None
                outcome = "finished" if self.finished else "interrupted"
                # the run's state is the outermost claim's to say (grpokit train's evaluates after training)
                claim.update(
                    training=outcome, step=self.step, max_steps=self.max_steps, model_saved=self.finished,
                    stopped_by=self.stopped_by, **({"state": outcome} if claim.depth == 1 else {}),
                )  # fmt: skip
            if self.finished and signals.received and announce:
                print(
                    f"grpokit: {signals.received} came during the last step or the final save, which "
                    f"completed: the run is finished (model in {self.args.output_dir})", flush=True,
                )  # fmt: skip
        return history

    def _claim_output_dir(self, resume: bool) -> Any:
        """output_dir held while the run writes it (the main process), joining ``grpokit train``'s claim."""
        config = dataclasses.replace(self.args, hub_token=None)
        return claim_run_folder(
            self.args.output_dir, "train", config_text=config.to_yaml(), resume=resume,
            overwrite=self.args.overwrite_output_dir and not resume, enabled=self.accelerator.is_main_process,
            details={"command": "GRPOTrainer.train"},
        )  # fmt: skip

    def _train_steps(self, resume: str | bool | None, signals: StopSignals, announce: bool) -> TrainHistory:
        """The loop of ``train``: a resume, then steps until ``max_steps`` or a stop signal."""
        if resume:
            self.step = self.run_state.resume(resume, self.args.output_dir)
            self.weight_sync.mark_changed()  # the restored weights reach vLLM before its next generation
        history: list[dict[str, float]] = []
        started, first_step, losses = time.perf_counter(), self.step, []
        last_metrics: dict[str, float] = {}
        main = self.accelerator.is_main_process
        hide = self.args.disable_tqdm or not self.accelerator.is_local_main_process
        bar = tqdm(total=self.max_steps, initial=self.step, desc="GRPO", disable=hide)
        schedule, callbacks = self.schedule, self.callbacks
        callbacks.begin(
            max_steps=self.max_steps, step=self.step, epoch=schedule.epoch(self.step),
            logging_steps=schedule.logging_steps, is_main=main,
        )  # fmt: skip
        # the trackers are finished when the loop ends (marked failed if it raised)
        self.logger = MetricsLogger.from_config(self.args, enabled=main)
        with self.logger:
            if self.args.eval_on_start and self.eval_rows is not None and self.step == 0:
                self._log(0, self._evaluate_with_callbacks(), history)
            while self.step < self.max_steps:
                self.stopped_by = signals.stop_here(self.step, self._checkpoint_for_stop, announce=announce)
                if self.stopped_by is not None:
                    break
                callbacks.step_begin()
                metrics = self.training_step()
                losses.append(metrics.get("loss", math.nan))
                last_metrics = metrics
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
                    path = self.save_checkpoint()
                    self.publisher.checkpoint_saved(path, self.step, self.reward_names, self.logger.read)
                if control.should_training_stop:
                    break
        bar.close()
        self.draws.close()  # no more draws ahead
        summary = run_summary(losses, time.perf_counter() - started, self.step - first_step,
                              schedule.epoch(self.step))  # fmt: skip
        # the last entry of state.log_history, as transformers' Trainer writes it; like TRL's, it also carries
        # the metrics of the last step (reward, rewards/*, kl, ...; its loss is in train_loss)
        callbacks.log({**{k: v for k, v in last_metrics.items() if k != "loss"}, **summary})
        callbacks.event("on_train_end")
        return TrainHistory(history, self.step, summary)

    def _save_final(self) -> None:
        """The end of a run: the model (written aside, then moved into output_dir), the iterative reward
        model, the metrics plot, the model card and its push."""
        self.save_model(self.args.output_dir)
        main = self.accelerator.is_main_process
        if self.iterative is not None and main:
            self.iterative.save(Path(self.args.output_dir) / "reward_model")
        if main:
            plot_metrics(self.logger.read(), Path(self.args.output_dir) / "metrics.png")
        self.publisher.run_finished(self.reward_names, self.logger.read)

    def _checkpoint_for_stop(self) -> Path:
        """The checkpoint a stop signal leaves: this step's, saved now unless it was saved just before."""
        path = checkpoint_dir(self.args.output_dir, self.step)
        if self._saved_step == self.step and (path / STATE_FILE).exists():
            return path
        return self.save_checkpoint()

    def _log(self, step: int, metrics: dict[str, float], history: list[dict[str, float]]) -> None:
        """Write one step's metrics to every sink and tell the callbacks."""
        self.logger.log(step, metrics)
        history.append({"step": step, **metrics})
        self.callbacks.log(metrics)

    def _evaluate_with_callbacks(self) -> dict[str, float]:
        metrics = self.evaluate()
        self.callbacks.event("on_evaluate", metrics=metrics)
        return metrics

    def training_step(self) -> dict[str, float]:
        """One GRPO step on this process's share of the prompts; the metrics of the whole batch."""
        timer, step = PhaseTimer(), self.step + 1
        # 1-2. draw prompts and G completions of each from the current policy (pi_old = pi_theta) and score
        #      them, every process's rewards [M, F] in process-major order: ``draw_round`` once, or until the
        #      step holds enough informative groups (dynamic sampling); drawn ahead with async_generation
        drawn = self.draws.draw(timer)
        # 3. group-relative advantages over the groups the step trains on (all of them; with dynamic
        #    sampling the informative ones, spread evenly over the processes)
        with timer.phase("reward"):
            kept = self.groups.kept_groups(drawn)
            if self.selfplay is not None:  # a game: each role its own group, or role baselines (RAE)
                advantages = self.selfplay.advantages(kept.rewards, self.reward_weights, kept.sizes)  # [N]
            else:
                advantages = multi_reward_advantages(
                    kept.rewards, self.reward_weights, group_sizes=kept.sizes, scale=self.args.scale_rewards,
                    aggregation=self.args.multi_objective_aggregation, eps=self.args.advantage_epsilon,
                )  # [N]  # fmt: skip
            scores, drawn_scores = self.groups.scores(drawn, kept, advantages, step)
            samples = self.groups.local_groups(drawn, kept)  # this process's share of the kept groups
            self.hooks.on_scored(step, drawn.samples, drawn_scores)  # process rewards, episodes, RM samples
            self.completion_log.record(step, drawn.samples, drawn_scores)  # at the logged steps
        update, num_tokens = {}, 0
        if samples.texts:  # empty only when dynamic sampling found no informative group: nothing to train on
            # 4. one RolloutBatch: padded ids and masks, this process's advantages
            with timer.phase("batch"):
                batch = self.rollout_batch(samples, scores.advantages[scores.local])
            # 5. fixed log-probs [n, C]: pi_old only when the update is off-policy (mu > 1, several
            #    optimizer steps per generation, or a sampler that is not pi_old: IS weights
            #    pi_old / pi_sampler); pi_ref if beta > 0. (vLLM's sleep mode: the engine's memory to them)
            self.weight_sync.release()
            with timer.phase("old_logprobs"), self.accelerator.autocast():
                replay = self.args.routing_replay  # R2 replays the experts of the old-policy pass
                off_policy = self.plan.optimizer_steps > 1 or self.correction.applies(batch) or replay == "R2"
                batch.old_logps, old = self.old_logprobs(batch) if off_policy else (None, {})
                correction = {**self.correction(batch), **old}  # batch.importance_weights [n, C], metrics
            with timer.phase("reference"), self.accelerator.autocast():
                ref, routing = self.reference, self._routing("reference", batch)
                batch.ref_logps = ref.logprobs(batch, self.logprob_pass, routing) if ref is not None else None
            # 6. mu epochs of clipped policy-gradient updates on the same samples
            with timer.phase("update"):
                update = {**run_update(batch, self.args, self.update_context), **correction}
            self.weight_sync.push(timer)  # vLLM: the updated weights into the engine, once (time/weight_push)
            num_tokens = batch.num_completion_tokens()
        update = {**update, **self.routing_metrics()}  # an MoE policy's routing/* (every process's counts)
        # 7. what follows the update (reference reset, RM update), then metrics describing the whole batch
        with timer.phase("after_update"):
            self.hooks.after_update(step)
        metrics = step_metrics(
            scores=drawn_scores, reward_names=self.reward_names, group_size=None,
            group_sizes=drawn_scores.group_sizes, generated=drawn.samples.generated, update=update,
            extra={**self.hooks.metrics(), **self.groups.metrics(drawn, kept, advantages), **drawn.metrics},
            learning_rate=self.scheduler.get_last_lr()[0], num_tokens=num_tokens, timer=timer, gold=self.gold,
        )  # fmt: skip
        return merged_across_processes(self.accelerator, metrics)

    def old_logprobs(self, batch: RolloutBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """log pi_old [n, C] of ``batch``: the sampler's own where they are pi_old's
        (``reuse_sampler_logprobs``), else the old-policy pass; and ``old_logprobs/from_sampler`` (1 or 0)."""
        reused = None if self.args.routing_replay == "R2" else self.sampler_logprobs(batch, self.backend)
        if reused is not None:
            return reused, {"old_logprobs/from_sampler": 1.0}
        logps = self.logprob_pass(self.placed.scorer, batch, self._routing("old", batch))
        if self.routing is not None:  # the experts the pass used (R2 replays them in the update)
            batch.old_experts = self.routing.take_recorded()
        return logps, {"old_logprobs/from_sampler": 0.0}

    def _routing(self, name: str, batch: RolloutBatch) -> RoutingUse | None:
        """How pass ``name`` routes an MoE policy (``RoutingUse.for_pass``); None for a dense one."""
        if self.routing is None:
            return None
        return RoutingUse.for_pass(self.args.routing_replay, name, batch.routed_experts, batch.old_experts)

    def routing_metrics(self) -> dict[str, float]:
        """``routing/*`` of the step's passes over every process's tokens (``ExpertRouting.metrics``); {} for
        a dense policy. Every process calls it (a collective)."""
        if self.routing is None:
            return {}
        counts = self.routing.take_counts()
        empty = torch.zeros(self.routing.num_layers, 2, dtype=torch.long)
        stacked = torch.stack([counts.get(tag, empty) for tag in TAGS])  # [tags, L, 2]
        summed = self.accelerator.reduce(stacked.to(self.accelerator.device), "sum").cpu()
        return self.routing.metrics(dict(zip(TAGS, summed)), replayed_tags(self.args.routing_replay))

    def draw_round(
        self, count: int | None, timer: PhaseTimer, backend: RolloutBackend | None = None
    ) -> Round:
        """Steps 1-2 once (the plain draw): this process's share of the next ``count`` prompts of all
        processes (None: a step's), G completions of each (``group_sizes``) from the current policy (or
        ``backend``), their reward matrix, and every process's."""
        indices = self.prompts.next_local_indices(self.accelerator, count)
        sizes = self.group_sizes(indices)  # num_generations each, or the adaptive allocation
        # 1. draw
        with timer.phase("generate"):
            samples = self.sample([self.train_rows[i] for i in indices], group_sizes=sizes, backend=backend)
        # 2. score: every reward function on every completion; the reward matrix of every process
        with timer.phase("reward"):
            logs = RewardLogs()  # what the reward functions log with log_metric / log_extra
            rewards, failures = self.reward_matrix(
                samples, logs
            )  # [n, F], NaN where a function returned None
            every = self.accelerator.gather(rewards.to(self.accelerator.device)).cpu()  # [P * n, F]
            logged, samples.extra = logs.take()
            return Round(samples, every, self._gathered(sizes), self._gathered(indices), failures, logged)

    def rollout_batch(self, samples: Samples, advantages: torch.Tensor) -> RolloutBatch:
        """Step 4: prompts left-padded, completions right-padded, ``advantages`` [n] (this process's);
        the hooks may then change them (process supervision: per-token advantages [n, C])."""
        experts = None if self.routing is None else self.routing.num_experts
        batch = pad_samples(samples, advantages, **self._padding(), num_experts=experts)
        self.hooks.on_batch(batch)
        return batch

    # ------------------------------------------------------------------------------------------------
    def sample(
        self, rows: list[dict[str, Any]], *, greedy: bool = False, group_sizes: list[int] | None = None,
        backend: RolloutBackend | None = None,
    ) -> Samples:  # fmt: skip
        """G completions (one when ``greedy``; ``group_sizes[k]`` for row k when given) for each row's
        prompt from the current policy (or ``backend``), decoded."""
        roles = 1 if self.episodes is None else self.episodes.num_roles  # a game: one greedy game per seat
        sizes = group_sizes or [roles if greedy else self.args.num_generations] * len(rows)
        rows = start_episodes(self.episodes, rows, sizes)  # environment_factory: reset(**row) ends the prompt
        images = None  # the prompts' image inputs, one row per prompt (a vision-language policy)
        if self.image_prompts is None:
            prompt_ids = [self.encode_prompt(row["prompt"], row) for row in rows]
        else:
            prompt_ids, images = self.image_prompts.encode(rows, [1] * len(rows), "the step's prompts:")
        # mixed precision applies to every model pass, not only the update; full weights to generate from
        with self.accelerator.autocast(), self.placed.generation_weights():  # episodes with an environment
            generated, rows, run = sample_groups(
                self.episodes, backend or self.backend, rows, prompt_ids, sizes, self.sampling_params(greedy),
                images,
            )  # fmt: skip
        texts = self.tokenizer.batch_decode(generated.completion_ids, skip_special_tokens=True)
        row_images = None if images is None else PromptImages.of_prompts(images.tensors, sizes,
                                                                         images.token_type_key)  # fmt: skip
        return Samples(rows, prompt_ids, generated, texts, group_sizes=sizes, episodes=run, images=row_images)

    def reward_matrix(
        self, samples: Samples, reward_logs: RewardLogs
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """``(rewards [n, F] with NaN for None, rewards/<name>/failures)`` under ``reward_failure`` and
        ``reward_timeout``; the functions' ``log_metric`` / ``log_extra`` go to ``reward_logs``."""
        state = self.callbacks.snapshot()  # TRL passes the TrainerState (global_step, max_steps, ...)
        return score_samples(
            self.reward_funcs, samples, state, self.args.reward_failure, self.args.reward_timeout,
            reward_logs=reward_logs,
        )  # fmt: skip

    def evaluate(self, eval_dataset: Any = None, batch_size: int | None = None) -> dict[str, float]:
        """``eval/reward``, ``eval/rewards/<name>/mean`` and ``eval_loss`` of the eval prompts (default: the
        trainer's eval set): one greedy completion per prompt, or ``num_generations_eval`` sampled ones
        (``grpokit.train.evaluation``). Named eval sets (a dict or ``DatasetDict``, as TRL takes them) give
        ``eval/<set>/reward``, ... and ``eval_<set>_loss`` for each. Each process completes every
        ``num_processes``-th prompt and the results are gathered, so every prompt counts once.
        ``batch_size``: prompts per generation call (default ``per_device_eval_batch_size``)."""
        sets = self.eval_rows if eval_dataset is None else self._load_eval_sets(eval_dataset)
        if sets is None:
            raise ValueError("evaluate: no eval_dataset (give one here or to GRPOTrainer)")
        size = batch_size or self.args.per_device_eval_batch_size
        if isinstance(sets, dict):
            return {k: v for name, rows in sets.items() for k, v in self._evaluate_rows(
                rows, size, prefix=f"eval/{name}/", loss_key=f"eval_{name}_loss").items()}  # fmt: skip
        return self._evaluate_rows(sets, size, prefix="eval/", loss_key="eval_loss")

    def _evaluate_rows(
        self, rows: list[dict[str, Any]], batch_size: int, prefix: str, loss_key: str
    ) -> dict[str, float]:
        num_funcs, num_processes = len(self.reward_funcs), self.accelerator.num_processes
        per_prompt = self.args.num_generations_eval  # None: one greedy completion
        share = rows[self.accelerator.process_index :: num_processes]
        parts, weighted_loss, tokens = [torch.empty(0, num_funcs)], 0.0, 0
        logs = RewardLogs()  # the reward functions' log_metric values: eval metrics of their own
        for start in range(0, len(share), batch_size):
            chunk = share[start : start + batch_size]
            sizes = None if per_prompt is None else [per_prompt] * len(chunk)
            samples = self.sample(chunk, greedy=per_prompt is None, group_sizes=sizes)
            rewards = self.reward_matrix(samples, logs)[0]  # [n, F]
            parts.append(rewards)
            advantages = eval_advantages(rewards, self.reward_weights, samples.group_sizes, self.args)
            with self.accelerator.autocast():
                loss, count = eval_loss(
                    samples, advantages, loss=self.loss, scorer=self.placed.scorer, reference=self.reference,
                    temperature=self.args.temperature, micro_batch_size=batch_size, padding=self._padding(),
                )  # fmt: skip
            weighted_loss, tokens = weighted_loss + loss * count, tokens + count
        matrix = torch.cat(parts)  # [len(share) * completions per prompt, F]
        if num_processes > 1:  # every process's rows, in process order
            matrix = torch.tensor(gather_object(matrix.tolist()), dtype=torch.float32).reshape(-1, num_funcs)
            totals = gather_object([(weighted_loss, tokens)])
            weighted_loss, tokens = sum(t[0] for t in totals), sum(t[1] for t in totals)
        metrics = reward_means(matrix, self.reward_weights, self.reward_names, prefix=prefix)
        metrics.update(
            {f"{prefix}{name}": value for name, value in logs.take()[0].items()}
        )  # (this process's)
        metrics[loss_key] = weighted_loss / tokens if tokens else math.nan  # token-weighted over the batches
        return metrics

    def _load_eval_sets(self, source: Any) -> list[dict[str, Any]] | dict[str, list[dict[str, Any]]] | None:
        """An eval set's rows, or named eval sets: a dict of name -> data set, a ``DatasetDict`` or an
        ``IterableDatasetDict`` is evaluated set by set, as TRL's (transformers') ``eval_dataset``."""
        if source is None:
            return None
        if isinstance(source, dict):  # named sets (DatasetDict and IterableDatasetDict are dicts)
            if not source:
                raise ValueError("eval_dataset: an empty dict of named eval sets; give at least one")
            return {
                str(name): self._load_rows(data, f"eval_dataset[{name!r}]") for name, data in source.items()
            }
        return self._load_rows(source, "eval_dataset")

    def _load_rows(self, source: Any, name: str) -> list[dict[str, Any]]:
        """Rows of a data set in any form (``grpokit.data``: names, files, folders, Datasets, lists), with the
        configured split and columns; prompts over ``max_prompt_length`` refused if so configured."""
        blank = EMPTY_PROMPT if self.factories is not None else None  # (prompts written by reset)
        rows = load_dataset_rows(source, self.args.data_settings(), name=name, missing_prompt=blank)
        with_images = check_image_rows(rows, name)  # every image loads (a broken file named now)
        if with_images and self.image_prompts is None:
            raise InputError(
                f"{name}: {with_images} row(s) have images ('image' / 'images'), but the model is a text "
                "model (its processing_class is a tokenizer); give a vision-language model, or drop the "
                "image columns"
            )
        if self.image_prompts is None:  # (a prompt with images is measured when it is encoded)
            check_prompt_lengths(rows, self.tokenizer, self.args, name=name)
        return rows

    def encode_prompt(self, prompt: Any, row: dict[str, Any] | None = None) -> list[int]:
        """Token ids of a prompt (chat template for message lists), cut from the left to max_prompt_length;
        ``row``: its data-set row (with environment_factory, its environment's tools go in the template)."""
        kwargs = template_kwargs(self.episodes, self.args.chat_template_kwargs, row)  # an environment's tools
        return encode_prompt(prompt, self.tokenizer, self.args.max_prompt_length, kwargs)

    def sampling_params(self, greedy: bool = False) -> SamplingParams:
        params = self.args.sampling_params(self.tokenizer, greedy=greedy)
        if self.image_prompts is not None:  # image placeholders are the processor's to place, never drawn
            params = dataclasses.replace(params, suppress_token_ids=placeholder_token_ids(self.model.config))
        return params

    # ------------------------------------------------------------------------------------------------
    def _gathered(self, values: list[int]) -> list[int]:
        """``values`` of every process, in process order."""
        return list(values) if self.gather is None else list(self.gather(list(values)))

    def _padding(self) -> dict[str, Any]:
        return {
            "pad_token_id": self.sampling_params().pad_token_id,
            "mask_truncated": self.args.mask_truncated_completions,
            "device": self.accelerator.device,
            "multiple": pad
            if isinstance(pad := self.args.pad_to_multiple_of, int)
            else None,  # ("auto": none)
        }

    # ------------------------------------------------------------------------------------------------
    def save_model(self, path: str | Path | None = None) -> None:
        """Write a standard ``transformers`` checkpoint directory (model + tokenizer; a PEFT model writes
        its adapters) to ``path``, default output_dir (TRL's); written aside, then moved into place. Under
        FSDP the full weights are gathered first. A folder holding another grpokit run is refused."""
        target = Path(expand_path(path)) if path is not None else Path(self.args.output_dir)
        decided_by_main(self.accelerator, lambda: refuse_another_runs_folder(target, self._run_id))
        self.run_state.save_model(target)

    @property
    def hub_model_id(self) -> str | None:
        """TRL's: the Hub repository pushes go to (``hub_model_id``, or ``<account>/<output_dir's name>`` once
        resolved by a push); None before that without ``hub_model_id``."""
        return self.publisher.repo_id or self.args.hub_model_id

    def push_to_hub(
        self, commit_message: str = "End of training", blocking: bool = True, token: str | None = None,
        revision: str | None = None, **kwargs: Any,
    ) -> str | None:  # fmt: skip
        """TRL's (transformers' ``Trainer.push_to_hub``): the model card (``dataset_name`` from ``kwargs``)
        and the saved model in output_dir uploaded to ``hub_model_id``; the repository's URL (None on the
        other processes). Whether or not the config has ``push_to_hub``. The Hub's access is checked first:
        no token, a read-only one or no network is refused with the reason. (Always blocking.)"""
        args = dataclasses.replace(
            self.args, push_to_hub=True, hub_token=token or self.args.hub_token,
            hub_revision=revision or self.args.hub_revision,
        )  # fmt: skip
        publisher = Publisher(args, self.model, self.train_dataset, is_main=self.accelerator.is_main_process)
        publisher.write_card(args.output_dir, self.reward_names, self.logger.read,
                             dataset_name=kwargs.get("dataset_name"))  # fmt: skip
        self.publisher.repo_id = self.publisher.repo_id or publisher.repo_id
        return publisher.push(args.output_dir, commit_message)

    def end(self) -> None:
        """TRL's (transformers >= 5.18): the run's end: the trackers closed (train() has closed them), a vLLM
        engine in this process shut down, the processes' group left together."""
        self.logger.close()
        close = getattr(self.backend, "close", None)
        if callable(close):  # a vLLM engine in this process: shut down before the process group is left
            close()
        end_processes()

    def save_checkpoint(self) -> Path:
        """Everything a resume needs, in ``<output_dir>/checkpoint-<step>`` (``parallel.run_state``)."""
        path = self.run_state.save(self.args.output_dir, self.step, self.args.save_total_limit)
        self._saved_step = self.step
        self.callbacks.event("on_save")
        return path

    def add_callback(self, callback: Any) -> None:
        """Add a ``TrainerCallback`` (an instance or a class), as in TRL."""
        self.callbacks.add(callback)

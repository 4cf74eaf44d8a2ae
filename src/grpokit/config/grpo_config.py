"""GRPOConfig: every knob of a GRPO run in one typed dataclass, validated at construction, YAML in and out.

Field names follow TRL's ``GRPOConfig`` where TRL has the concept, so a TRL config migrates unchanged.
Defaults follow the DeepSeekMath paper (loss_type "grpo", beta 0.04, epsilon 0.2, scale_rewards "group",
num_iterations 1, learning_rate 1e-6) with G = 8; TRL's defaults differ (see docs/migrating-from-trl.md).

Batch sizing, in one place (see ``GRPOConfig.batch_plan``). One *step* (the unit of ``max_steps``,
``logging_steps`` and ``save_steps``) is one round of: sample ``generation_batch_size / num_generations``
prompts, generate ``num_generations`` completions for each, score them, compute advantages, then train
``num_iterations`` (mu) epochs over those completions. Each epoch is ``steps_per_generation`` optimizer
steps; each optimizer step accumulates gradients over ``gradient_accumulation_steps`` micro-batches of
``per_device_train_batch_size`` completions per process:

    generation_batch_size = per_device_train_batch_size x gradient_accumulation_steps
                            x steps_per_generation x num_processes
    optimizer steps per step = num_iterations x steps_per_generation
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from grpokit.config.batch_plan import BatchPlan, plan_batch
from grpokit.config.environment import EnvironmentFields, validate_environment_fields
from grpokit.config.generation import GenerationFields, validate_generation_fields
from grpokit.config.integrations import IntegrationFields, resolve_integration_fields
from grpokit.config.sampling import SamplingFields, validate_sampling_fields
from grpokit.config.trl_fields import split_trl_fields
from grpokit.config.validation import require, validate_fields

LossType = Literal["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo"]
ScaleRewards = Literal["group", "batch", "none"]


@dataclass
class GRPOConfig(IntegrationFields, EnvironmentFields, SamplingFields, GenerationFields):
    """Configuration of a GRPO run. Invalid combinations raise ``ValueError`` saying why.

    Also accepts every other field of TRL's ``GRPOConfig``: one grpokit does not implement is refused with
    the reason when set to turn its feature on, never with a TypeError (``config.trl_fields``). The data,
    evaluation, checkpoint, tracking and hub fields are in ``grpokit.config.integrations``; the fields
    choosing which groups a step trains on (dynamic sampling, curriculum, adaptive G) in
    ``grpokit.config.sampling``; the sampler's dtype and the off-policy correction in
    ``grpokit.config.generation``."""

    # ---- output and schedule -------------------------------------------------------------------
    output_dir: str = "runs/grpo"
    """Directory for metrics.jsonl, checkpoints and the final model."""
    max_steps: int = -1
    """Number of GRPO steps (generation rounds; see ``max_steps_unit``) to run; -1 derives it from
    ``num_train_epochs``."""
    num_train_epochs: float = 1.0
    """Passes over the training prompts, used when ``max_steps`` is -1."""
    logging_steps: int = 1
    """Write metrics every this many steps."""
    save_steps: int = 0
    """Save a resumable checkpoint every this many steps; 0 saves none until the end."""
    save_total_limit: int | None = None
    """Keep at most this many checkpoints (oldest deleted first); None keeps all."""
    seed: int = 42
    """Seed for model init, data order and sampling."""
    resume_from_checkpoint: str | None = None
    """Path of a checkpoint-<step> directory (or "latest" in output_dir) to continue a run from."""
    overwrite_output_dir: bool = False
    """Start a new run in an output_dir that holds another run's checkpoints (TRL's name); without it such
    a start is refused (resume it with ``resume_from_checkpoint``, or choose another output_dir)."""
    disable_tqdm: bool = False
    """Hide the progress bar."""
    log_completions: bool = False
    """At each logged step, append every completion (prompt, text, each reward, advantage) to
    ``<output_dir>/completions.jsonl`` (TRL's name; TRL sends them to W&B as a table)."""
    num_completions_to_print: int | None = None
    """At each logged step, print this many of the step's completions with their rewards (None: none)."""

    # ---- batch sizing -----------------------------------------------------------------------------
    num_generations: int = 8
    """G: completions sampled per prompt (the group). At least 2."""
    per_device_train_batch_size: int = 8
    """Completions per micro-batch (one forward/backward) on each process."""
    gradient_accumulation_steps: int = 1
    """Micro-batches accumulated into one optimizer step."""
    steps_per_generation: int | None = None
    """Optimizer steps per epoch over one generation batch. None: derived from ``generation_batch_size``,
    or 1 (the paper's one update per exploration) if that is unset too."""
    generation_batch_size: int | None = None
    """Completions generated per step (all processes). Must be a multiple of ``num_generations``. None:
    per_device_train_batch_size x gradient_accumulation_steps x steps_per_generation x num_processes."""
    shuffle_dataset: bool = True
    """Shuffle the training prompts each epoch."""

    # ---- GRPO objective -----------------------------------------------------------------------------
    beta: float = 0.04
    """KL coefficient (k3 estimator, added to the loss). 0 means no reference model is loaded or run."""
    epsilon: float = 0.2
    """Lower clip range: the ratio is clipped to [1 - epsilon, 1 + epsilon_high]."""
    epsilon_high: float | None = None
    """Upper clip range (DAPO clip-higher uses 0.28). None: equal to ``epsilon``."""
    delta: float | None = None
    """Optional upper cap on the unclipped ratio (two-sided clipping); must exceed 1 + epsilon_high."""
    loss_type: LossType = "grpo"
    """grpo: per-sequence token mean, then mean over sequences (paper). bnpo: token mean over the local
    batch. dr_grpo: token sum / (sequences x max_completion_length). dapo: token sum / completion tokens in
    the whole global batch. cispo: clipped, stop-gradient IS weight (MiniMax-M1). sapo: soft gate (Qwen)."""
    importance_sampling_level: Literal["token", "sequence"] = "token"
    """token: one ratio per token. sequence: GSPO, one length-normalised ratio per sequence."""
    use_bias_correction_kl: bool = False
    """Weight the per-token KL by the importance ratio pi_theta / pi_old (TRL's name; TRL defaults to True,
    grpokit to the paper's plain k3 KL). It changes the gradient even on-policy (KL * grad log pi)."""
    scale_rewards: ScaleRewards = "group"
    """Divide centred rewards by the group std (paper), the batch std, or not at all (Dr. GRPO)."""
    num_iterations: int = 1
    """mu: policy-update epochs per generation batch. Old log-probs are computed only when mu > 1."""
    mask_truncated_completions: bool = False
    """Exclude completions that hit max_completion_length without EOS from the loss (DAPO)."""
    top_entropy_quantile: float = 1.0
    """Train only on the highest-entropy fraction of tokens (1.0 = all tokens)."""
    sapo_temperature_pos: float = 1.0
    """SAPO gate temperature for positive advantages."""
    sapo_temperature_neg: float = 1.05
    """SAPO gate temperature for negative advantages."""
    reward_weights: list[float] | None = None
    """One weight per reward function (default all 1.0)."""
    multi_objective_aggregation: Literal["sum_then_normalize", "normalize_then_sum"] = "sum_then_normalize"
    """How several reward functions become one advantage: weighted sum then group-normalise (default), or
    normalise each reward within its group, then weighted sum (GDPO)."""
    reward_failure: Literal["raise", "none"] = "raise"
    """A reward function that raises, returns NaN/inf or runs past ``reward_timeout``: stop with an error
    ("raise"), or count and log it as rewards/<name>/failures and treat the value as None ("none")."""
    reward_timeout: float | None = None
    """Seconds one call of a reward function (outcome or process) may take; a slower call is a failure
    handled by ``reward_failure`` and is abandoned on a daemon thread (it never keeps the run from
    exiting). None (the default): unbounded, and reward functions run in the trainer's own thread as
    written: a limit runs them on a worker thread, where functions that bound themselves with
    ``signal.alarm`` (math-verify's own timeouts, many sympy-based graders) cannot, and legitimate calls
    (a reward model on a large batch, an LLM judge) vary too much for one default to fit. Set it (e.g. 60)
    when a reward calls a service or untrusted code that may hang."""
    advantage_epsilon: float = 1e-4
    """Added to the std before dividing."""

    # ---- reference model ---------------------------------------------------------------------------------
    sync_ref_model: bool = False
    """Periodically reset (or mix) the reference model towards the current policy."""
    ref_model_sync_steps: int = 400
    """Steps between reference syncs (R1-Zero replaced the reference every 400 steps)."""
    ref_model_mixup_alpha: float = 1.0
    """ref <- alpha * policy + (1 - alpha) * ref at each sync; 1.0 is a hard reset."""

    # ---- generation --------------------------------------------------------------------------------------
    max_prompt_length: int | None = 512
    """Prompts longer than this many tokens are cut from the left; None keeps them whole."""
    max_completion_length: int = 256
    """Completion limit in tokens."""
    temperature: float = 1.0
    """Sampling temperature (also applied to the logits when computing training log-probs)."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    top_k: int = 0
    """Top-k filter; 0 disables."""
    min_p: float = 0.0
    """Min-p filter; 0 disables."""
    repetition_penalty: float = 1.0
    """Repetition penalty (1.0 disables)."""
    chat_template_kwargs: dict[str, str | int | float | bool] | None = None
    """Extra variables for the chat template of conversational prompts (TRL's name), e.g.
    ``{"enable_thinking": False}`` for Qwen3."""
    generation_backend: Literal["auto", "transformers", "fast"] = "auto"
    """auto: the fast sampler where its shared-prefix decode supports the model (Llama, Qwen2/3, Mistral
    without a sliding window, plain or LoRA, any dtype), else ``model.generate``; the choice is logged
    once. transformers: ``model.generate``. fast: grpokit's sampler (shared prompt prefill, KV cache)."""
    generation_micro_batch_size: int | None = None
    """Prompts per generation call (None: all prompts of the step at once)."""

    # ---- optimisation ------------------------------------------------------------------------------------
    learning_rate: float = 1e-6
    """AdamW peak learning rate (DeepSeekMath-RL: 1e-6; R1-Zero: 3e-6)."""
    lr_scheduler_type: Literal["constant", "constant_with_warmup", "linear", "cosine"] = "constant"
    """Learning-rate schedule over the optimizer steps of the run."""
    warmup_ratio: float = 0.0
    """Fraction of optimizer steps spent warming up linearly from 0."""
    warmup_steps: int = 0
    """Optimizer steps of linear warm-up; when > 0 it replaces warmup_ratio (as in transformers)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    adam_beta1: float = 0.9
    """AdamW beta1."""
    adam_beta2: float = 0.999
    """AdamW beta2."""
    max_grad_norm: float = 1.0
    """Gradient clipping by global norm; 0 disables."""
    max_nonfinite_steps: int = 3
    """An optimizer step whose loss or gradient is NaN/inf is skipped (counted as ``nonfinite_steps``);
    this many GRPO steps in a row with such a skip stop the run with an error saying what to check."""
    mixed_precision: Literal["no", "fp16", "bf16"] = "no"
    """accelerate mixed precision (autocast over generation, log-prob passes and the update)."""
    bf16: bool = False
    """TRL/transformers name for ``mixed_precision="bf16"``."""
    fp16: bool = False
    """TRL/transformers name for ``mixed_precision="fp16"``."""
    model_init_kwargs: dict[str, str | int | float | bool] | None = None
    """Keyword arguments of ``from_pretrained`` when the policy is given as a path or hub id (TRL's name),
    e.g. ``{"dtype": "bfloat16", "attn_implementation": "sdpa"}``. Without ``dtype`` the weights load in
    float32. Strings ``"true"``/``"false"`` become booleans. Command line:
    ``model_init_kwargs={dtype: bfloat16}``."""
    use_cpu: bool = False
    """Train on the CPU even when a GPU is present (TRL's name). A multi-process launch (``torchrun``,
    ``accelerate launch``) on a machine without an accelerator runs on CPU processes talking over gloo
    either way."""
    torch_num_threads: int | None = None
    """Threads of torch's CPU operations in this process (CPU runs). None: torch's default, lowered to the
    cores found idle when the trainer starts, shared among this machine's processes, so a run that shares its
    cores with other jobs does not oversubscribe them (``parallel/threads.py``). 0: torch's default as is."""
    cpu_memory_reuse: bool = True
    """CPU runs on Linux: keep freed memory in the process for the next step (glibc's mmap and trim
    thresholds raised to 1 GiB), as the CUDA caching allocator does on GPUs, instead of page-faulting
    every step's large tensors afresh. Faster (the SmolLM2 benchmark's update: -10%), at the price of
    resident memory; process-wide (``parallel/cpu_runtime.py``)."""
    gradient_checkpointing: bool = False
    """Trade compute for memory in the policy's backward: each decoder layer keeps only its input and is run
    again in the backward. Exact on every forward path (the shared-prefix one included)."""
    gradient_checkpointing_kwargs: dict[str, str | int | float | bool] | None = None
    """Keyword arguments of ``torch.utils.checkpoint.checkpoint`` (TRL's name). ``use_reentrant`` must stay
    False (the default): reentrant checkpointing gives no gradient to the prompt keys/values that the
    shared-prefix forward passes from the prompt to the completions."""
    ref_model_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Dtype of the reference model's weights. auto: the policy's weights' dtype (a bf16 policy gets a bf16
    reference, never an fp32 copy); bfloat16/float16 halve an fp32 policy's reference."""
    ref_model_offload: bool = False
    """Keep the reference model's weights on the CPU and move them to the device only for its log-prob pass
    (frees one copy of the weights on the device between uses, costs two host<->device copies per step)."""
    fsdp: str = ""
    """Fully sharded data parallel (TRL/transformers name): ``"full_shard"`` shards the weights, gradients
    and optimizer state of the policy (and the reference) over the processes with PyTorch FSDP2
    (``fully_shard`` per decoder layer); "" replicates them (DDP). ``accelerate launch`` with an FSDP config
    (``recipes/accelerate/fsdp.yaml``) turns it on too. See docs/scaling.md."""
    deepspeed: str | None = None
    """DeepSpeed ZeRO (TRL/transformers name): ``"zero1"`` / ``"zero2"`` / ``"zero3"``, or a DeepSpeed JSON
    file (from Python also a dict) whose ``zero_optimization`` stage partitions AdamW's state (1), the
    gradients (2) and the weights (3) over the processes; grpokit sets the batch sizes, clipping and
    optimizer itself. ``accelerate launch`` with a DeepSpeed config
    (``recipes/accelerate/deepspeed_zero{2,3}.yaml``) turns it on too. See docs/scaling.md."""
    disable_dropout: bool = False
    """Set every dropout probability of the policy to 0 (TRL's name), so the update's log-probs match the
    sampling ones."""

    # ---- process supervision (docs/process-supervision.md) ---------------------------------------------
    step_delimiter: str = "\n"
    """What ends a reasoning step in a completion (default: one step per line; or a step tag such as
    "<step>"). Used by process rewards, process reward models and iterative reward-model labels."""
    process_reward_weights: list[float] | None = None
    """One weight per process reward function (default all 1.0): a step's reward is their weighted sum."""
    outcome_advantage_weight: float = 1.0
    """With process rewards, token advantage = outcome_advantage_weight x A_outcome (group-normalised
    outcome reward, same for every token) + process_advantage_weight x A_process (sum of the group-normalised
    rewards of the steps ending at or after the token). 0 = pure process supervision."""
    process_advantage_weight: float = 1.0
    """Weight of the process part of the token advantage (see outcome_advantage_weight)."""

    # ---- iterative GRPO (reward model keeps learning; DeepSeekMath section 4.2) ---------------------------
    iteration_steps: int = 0
    """Every this many steps, label the policy's recent samples, update the iterative reward model on them
    (with replay) and reset the reference model to the current policy. 0 = off (static reward model)."""
    replay_ratio: float = 0.1
    """Fraction of each reward-model update's samples replayed from history (the paper: 10%)."""
    rm_learning_rate: float = 1e-4
    """AdamW learning rate of the iterative reward-model updates."""
    rm_epochs: int = 1
    """Passes over fresh + replayed samples per reward-model update."""
    rm_batch_size: int = 16
    """Samples per reward-model optimizer step (and per scoring forward pass)."""
    rm_buffer_capacity: int | None = None
    """Most samples the replay buffer keeps (a uniform reservoir of all history); None keeps all."""

    def __post_init__(self) -> None:
        self._none_means_default()
        self._resolve_precision_aliases()
        resolve_integration_fields(self)
        self._validate()

    def _none_means_default(self) -> None:
        """TRL writes None for "not set" where grpokit has a concrete default (``output_dir``, ``min_p``,
        ``fsdp``, ``bf16``, ``disable_tqdm``): None there means grpokit's default."""
        for f in dataclasses.fields(self):
            if getattr(self, f.name) is None and "None" not in str(f.type):
                default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
                setattr(self, f.name, default)

    def _resolve_precision_aliases(self) -> None:
        """bf16/fp16 (TRL's booleans) -> mixed_precision, refusing contradictions."""
        require(not (self.bf16 and self.fp16), "bf16", "and fp16 cannot both be true")
        for flag, mode in ((self.bf16, "bf16"), (self.fp16, "fp16")):
            if flag:
                require(
                    self.mixed_precision in ("no", mode),
                    mode,
                    f"=True contradicts mixed_precision={self.mixed_precision!r}",
                )
                self.mixed_precision = mode

    def num_warmup_steps(self, total_optimizer_steps: int) -> int:
        """Warm-up length in optimizer steps: warmup_steps if > 0, else ceil(warmup_ratio * total)."""
        return self.warmup_steps or math.ceil(self.warmup_ratio * total_optimizer_steps)

    def _validate_loss(self) -> None:
        """The loss fields are validated where the loss is defined: by building the run's PolicyLoss.
        (Imported here, not at the top, so that ``import grpokit`` does not import torch.)"""
        from grpokit.core.losses import LossConfigError, PolicyLoss

        try:
            PolicyLoss.from_config(self)
        except LossConfigError as err:
            raise ValueError(f"GRPOConfig.{err.field} {err.why}") from None

    # -- validation ------------------------------------------------------------------------------------------
    def _validate(self) -> None:
        """Every field's range and the fields' agreement (``grpokit.config.validation``); the loss fields by
        building the run's loss; the batch sizes by planning a step."""
        validate_fields(self)
        validate_sampling_fields(self)
        validate_generation_fields(self)
        validate_environment_fields(self)
        self._validate_loss()
        self.batch_plan(num_processes=1)  # checks the sizes fit together

    def batch_plan(self, num_processes: int = 1) -> BatchPlan:
        """The counts of one step (``config.batch_plan``). Raises ValueError when the batch sizes do not fit
        together."""
        return plan_batch(self, num_processes)

    # -- YAML ------------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Every field, the GRPO knobs first, then the generation, sampling and data/tracking/hub ones."""
        values = dataclasses.asdict(self)
        integration = [
            f.name
            for group in (GenerationFields, SamplingFields, EnvironmentFields, IntegrationFields)
            for f in dataclasses.fields(group)
        ]
        order = [name for name in values if name not in integration] + integration
        return {name: values[name] for name in order}

    def to_yaml(self, path: str | Path | None = None) -> str:
        text = yaml.safe_dump(self.to_dict(), sort_keys=False)
        if path is not None:
            Path(path).write_text(text)
        return text

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> GRPOConfig:
        values = split_trl_fields(values, _FIELD_NAMES)
        unknown = sorted(set(values) - _FIELD_NAMES)
        if unknown:
            raise ValueError(f"unknown GRPOConfig field(s): {', '.join(unknown)}")
        return cls(**values)

    @classmethod
    def from_yaml(cls, path: str | Path) -> GRPOConfig:
        values = yaml.safe_load(Path(path).read_text()) or {}
        if not isinstance(values, dict):
            raise ValueError(f"{path}: expected a mapping of GRPOConfig fields, got {type(values).__name__}")
        return cls.from_dict(values)


_FIELD_NAMES = {f.name for f in dataclasses.fields(GRPOConfig)}
_dataclass_init = GRPOConfig.__init__


@functools.wraps(_dataclass_init)
def _init_accepting_trl_fields(self: GRPOConfig, *args: Any, **kwargs: Any) -> None:
    """The dataclass ``__init__``, after checking TRL-only keyword arguments (``config.trl_fields``)."""
    _dataclass_init(self, *args, **split_trl_fields(kwargs, _FIELD_NAMES))


GRPOConfig.__init__ = _init_accepting_trl_fields  # type: ignore[method-assign]

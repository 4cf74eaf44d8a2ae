"""A memory plan: the bytes one device needs for a GRPO run, per part and per phase, from the model's config
alone (no weights are loaded).

What is counted, per device (process), and how exactly:

- **weights, gradients, optimizer state, reference** are exact for Llama-family decoders (``llama``,
  ``qwen2``, ``qwen3``, ``mistral``): parameters counted from the config (``count_parameters``), in the
  weights' dtype (``model_init_kwargs["dtype"]``, float32 without it, as ``from_pretrained`` loads them);
  gradients and AdamW's two states in each trainable parameter's dtype (peft keeps LoRA adapters in float32).
  FSDP divides them by the process count. DDP with several processes adds its gradient buckets (one more
  copy of the gradients: ``gradient_as_bucket_view`` is off).
- **activations** of the update's micro-batch: the tensors a decoder layer keeps for its backward, per
  token, counted from the ``transformers`` Llama code and checked against ``saved_tensors_hooks``
  (``layer_activation_bytes``). An upper bound: every row is taken as ``max_prompt_length +
  max_completion_length`` tokens, and the shared-prefix forward (each group's prompt run once) is ignored.
- **transients** (estimates): the LM head's float32 logits chunk, AdamW's temporaries (none with the fused
  kernel, ``optim="adamw_torch_fused"``, the default; plain AdamW: ``foreach`` on CUDA, one
  trainable-sized temporary, per tensor on the CPU, two of the largest), the low-precision weight copies
  autocast keeps, the weights FSDP and ZeRO-3 gather, the no-grad log-prob passes, the prefill and sampling
  logits of generation. What is not counted: allocator fragmentation and the CUDA context (leave ~2-4 GiB),
  the buffers of the collectives (NCCL's; gloo's temporaries on the CPU), the activation gradients of one
  layer, small tensors, and building the trainer (each process loads the whole model before it is
  sharded or partitioned).
- **KV cache**: exact for the fast sampler (pre-allocated buffers); for ``transformers`` ``generate`` the
  cache at full length. Keys/values are in the compute dtype (bf16/fp16 under autocast, else the weights').
- **The fast sampler's weights**: its fused [q; k; v] and [gate; up] copies, under autocast a cast of every
  weight its decode applies; on a CPU where ``call_packs`` holds (``device_type="cpu"``, this machine's
  processor), also a copy of each packed for oneDNN, for the call.
- **FSDP** (``parallel.fsdp``) gathers a unit's weights in the compute dtype under mixed precision (so
  autocast keeps no casts for the backward): generation holds the full weights in that dtype for its call;
  the passes and the update the root (embeddings, LM head) and two layers at a time. A root unit stays
  gathered after its forward (FSDP's default): the reference's root, from its pass on, in every phase.
- **DeepSpeed** (``parallel.zero``; the ZeRO section of the run's DeepSpeed config, else DeepSpeed's
  defaults: ``ZERO_DEFAULTS``): AdamW steps a float32 copy of this process's partition (``master_weights``,
  a copy even of float32 weights) and keeps its states in float32; the step makes a float32 gradient of
  the partition (ZeRO-3: of one ``sub_group_size`` group at a time). ZeRO-2 keeps the weights and the
  reference whole; its backward fills a reduce bucket (``reduce_bucket_size`` elements) and this process's
  gradient partition, both freed after the step. ZeRO-3 keeps, in every phase, its float32 gradient
  partitions and the reduce bucket; generation reads a copy of the policy in the weights' dtype, filled one
  gathered parameter at a time before the generation call and released after it (generation phase only);
  the passes and the update gather module by module, and DeepSpeed keeps what the order it recorded uses
  again within ``stage3_max_reuse_distance`` parameters (``zero3_gathered``: all of a small model). The
  reduce bucket is allocated whole on a GPU; on the CPU only its written pages count (``device_type``).
- **vLLM** (``use_vllm``): in colocate mode the engine reserves ``vllm_gpu_memory_utilization`` of the
  device (its weights and KV cache; ``device_bytes``), in every phase unless sleep mode frees it during the
  log-prob passes and the update; in-process generation buffers (KV cache, fused copies) are then not
  used, but FSDP's gathered weights and ZeRO-3's copy still are, on top of the engine (generation and the
  weight push run in the same full-weights context). A server holds nothing on the training devices.
  Either way the off-policy correction (``vllm_importance_sampling_correction``) forces the old-policy pass
  at mu = 1.

Phases: ``generation`` (also the vLLM weight push), ``logprobs`` (reference and old-policy passes; absent
when neither runs) and ``update``; ``peak`` is the largest. Gradients are freed after each optimizer step
(``set_to_none``), so they count in the update only (ZeRO-3's partitions and bucket: in every phase).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import torch

from grpokit.config import GRPOConfig
from grpokit.models.cpu_linear import onednn_available
from grpokit.models.lean_layers import LEAN_MODEL_TYPES
from grpokit.models.shape import (
    DTYPE_BYTES,
    ModelShape,
    adapted_expert_parameters,
    count_lora_parameters,
    dtype_name,
    largest_lora_tensor,
    lora_targets,
)
from grpokit.parallel.hardware import default_mixed_precision
from grpokit.rollout.native_decode import call_packs
from grpokit.train.lm_head import WEIGHT_GRADIENT_ROWS, head_chunk_rows

__all__ = [
    "FAST_PREFILL_PROMPTS",
    "GIB",
    "ZERO_DEFAULTS",
    "MemoryPlan",
    "layer_activation_bytes",
    "plan_memory",
    "zero3_gathered",
    "zero_settings",
]

GIB = 1024**3
FAST_PREFILL_PROMPTS = 16
"""Prompts the fast sampler prefills per forward (``FastSampler``'s ``prefill_batch_size`` default)."""


def layer_activation_bytes(
    shape: ModelShape,
    seq_len: int,
    *,
    residual_bytes: int,
    compute_bytes: int,
    attention: str = "sdpa",
    kv_copies: bool = True,
    moe: bool | None = None,
    lean_norms: bool = False,
    lean_mlp: bool = False,
    norm_outputs_kept: bool = True,
) -> int:
    """Bytes one decoder layer keeps for its backward, per token of a [rows, seq_len] training forward
    (``moe``: of an MoE layer, ``moe_mlp_bytes``; None: the model's largest layer).

    Counted from ``transformers``' Llama layer (the same for qwen2/qwen3/mistral), with r = the residual
    stream's bytes (the weights' dtype) and c = the compute dtype's (autocast's, else r):
    each RMSNorm keeps its input in float32 (or a float32 copy) [H], x/rms [H] r and 1/rms; the norms'
    outputs feed q/k/v and gate/up (2 x [H] r; under autocast each of the 5 linears keeps its own cast
    [H] c); attention keeps q and k, v repeated to all heads and its output (4 x [heads*d] c; with
    ``kv_copies=False``, as CPU runs attend (``parallel/cpu_runtime.py``), k and v at [kv_heads*d]) plus, for
    sdpa, a float32 logsumexp [heads] and the layer's copy of the padding mask [T] c, for eager the float32
    softmax [heads, T] (and its cast [heads, T] c); the MLP keeps gate, up, act(gate), act(gate)*up
    (4 x [I] c); qwen3's q/k norms keep their inputs in float32 and x/rms [heads + kv_heads, d].
    ``lean_norms`` / ``lean_mlp``: the layers of ``grpokit.models.lean_layers`` (``lean_activations``): each
    RMSNorm keeps its input as it comes and 1/rms; the MLP keeps gate and up (2 x [I] c) and, under
    autocast, one cast of its input for both linears. ``norm_outputs_kept=False``: the update's forward
    without checkpointing, where the lean norms' outputs are made again in the backward
    (``grpokit.models.recompute``): the linears after them keep nothing of their own (under autocast each
    norm output's cast is made once for all of them and made again too).
    """
    hidden, heads, kv, d = shape.hidden_size, shape.num_heads, shape.num_kv_heads, shape.head_dim
    r, c = residual_bytes, compute_bytes
    norms = 2 * (r * hidden + 4) if lean_norms else 2 * (4 * hidden + r * hidden + 4)
    linear_inputs = 2 * r * hidden if c == r else (4 if lean_mlp else 5) * c * hidden
    if lean_norms and not norm_outputs_kept:
        linear_inputs = 0
    attn = (4 * heads if kv_copies or attention == "eager" else 2 * heads + 2 * kv) * d * c
    if attention == "eager":
        attn += heads * seq_len * 4 + (heads * seq_len * c if c != 4 else 0)
    else:  # sdpa / flash kernels: no [T, T] probabilities
        attn += 4 * heads + seq_len * c
    qk_norm = (heads + kv) * (d * (c if lean_norms else 4 + c) + 4) if shape.qk_norm else 0
    if moe if moe is not None else shape.is_moe:  # the router's casts replace gate's and up's
        linear_inputs = 2 * r * hidden if c == r else 4 * c * hidden
        return (
            norms + linear_inputs + attn + qk_norm + moe_mlp_bytes(shape, residual_bytes=r, compute_bytes=c)
        )
    return norms + linear_inputs + attn + qk_norm + (2 if lean_mlp else 4) * shape.intermediate_size * c


def moe_mlp_bytes(shape: ModelShape, *, residual_bytes: int, compute_bytes: int) -> int:
    """Bytes an MoE block keeps for its backward, per token (an estimate, within a few percent of what
    autograd saves in ``transformers``' grouped-matmul experts: tests/train/test_memory_plan.py): the
    router's logits [E] (c) and float32 probabilities [E], the top-k weights and ids; per routed copy of
    the token (k of them) its gathered input [H], gate/up [2 I_e], act(gate) and the product [2 I_e] and the
    weighted output [H], in the weights' dtype (the grouped matmul runs in it, also under autocast); the
    shared expert (qwen2_moe) as a dense MLP [4 I_s] (c), its output [H] for the sigmoid gate's product and,
    under autocast, the casts of its three linears' input [H]."""
    r, c, k = residual_bytes, compute_bytes, shape.experts_per_token
    router = shape.num_experts * (c + 4) + k * (4 + 8)
    routed = k * (2 * shape.hidden_size + 4 * shape.expert_intermediate_size) * r
    shared = 0
    if shape.shared_expert_intermediate_size:
        shared = 4 * shape.shared_expert_intermediate_size * c + shape.hidden_size * c + 2 * c
        shared += 3 * shape.hidden_size * c if c != r else 0
    return router + routed + shared


def _pass_bytes_per_token(shape: ModelShape, seq_len: int, r: int, c: int, attention: str) -> int:
    """Transient bytes per token of a no-grad forward (one layer alive): residual and norm [H], q/k/v/output,
    act(gate), up and their product [I] (eager: the [heads, T] scores)."""
    hidden, heads, d = shape.hidden_size, shape.num_heads, shape.head_dim
    scores = heads * seq_len * (4 + c) if attention == "eager" else 0
    mlp = 3 * shape.intermediate_size * c
    if shape.is_moe:  # the routed copies of the token and their expert activations, the shared expert
        k = shape.experts_per_token
        mlp = max(
            mlp,
            k * (hidden + 3 * shape.expert_intermediate_size) * r
            + 3 * shape.shared_expert_intermediate_size * c,
        )
    return 2 * r * hidden + 4 * hidden + 4 * heads * d * c + mlp + scores


def _count(number: int) -> str:
    return f"{number / 1e9:.2f} B" if number >= 10**8 else f"{number / 1e6:.2f} M"


def _part(note: str) -> Any:
    """A MemoryPlan part: bytes on one device, with the note the table prints next to it."""
    return field(default=0, metadata={"note": note})


@dataclass(frozen=True)
class MemoryPlan:
    """Per-device bytes of a GRPO run, per part and per phase (see the module docstring for what is exact)."""

    model_type: str
    num_parameters: int
    active_parameters: int  # per token: all of a dense model; a mixture of experts' top-k experts only
    experts: str  # "" (dense), or e.g. "8 experts, 2 per token, in 2 of 2 layers"
    trainable_parameters: int
    strategy: str
    num_processes: int
    lora: bool
    weights_dtype: str
    compute_dtype: str
    gradient_checkpointing: bool
    tokens_per_row: int  # max_prompt_length + max_completion_length
    micro_batch_rows: int  # per_device_train_batch_size
    reference_offloaded: bool
    micro_batch_tokens: int | None = None  # with GRPOConfig.micro_batch_tokens: the most tokens one update
    # micro-batch holds (the budget, or one unit over it)
    weights: int = _part("policy weights (FSDP, ZeRO-3: this device's shard)")
    master_weights: int = _part("DeepSpeed: float32 copy of this device's partition (the optimizer's)")
    gradients: int = _part("update: gradients (ZeRO-2: reduce bucket + partition; ZeRO-3: one unreduced)")
    grad_buckets: int = _part("DDP buckets (a gradient copy); ZeRO-3 gradient partitions + reduce bucket")
    optimizer: int = _part("AdamW exp_avg + exp_avg_sq (DeepSpeed: float32, on its partition)")
    optimizer_step: int = _part("optimizer.step(): AdamW temporaries, DeepSpeed's float32 gradient")
    reference: int = _part("reference model (offload: on the device only in its pass; FSDP: + its root)")
    activations: int = _part("kept for the backward of one micro-batch, as configured")
    activations_other: int = _part("the same with gradient_checkpointing switched (not in the phases)")
    lora_merged: int = _part("LoRA on MoE experts or routers: the merged W + BA that the backward keeps")
    autocast_copies: int = _part("low-precision copies of float32 weights autocast keeps for the backward")
    head: int = _part("chunked LM head: float32 [chunk, V] logits, [M, H] hidden states and gradient")
    logprob_pass: int = _part("a no-grad reference / old-policy pass over one micro-batch")
    gathered: int = _part("FSDP, ZeRO-3: weights gathered in the passes and the update")
    generation_copy: int = _part("generation_dtype's copy of the policy, kept in every phase")
    generation_weights: int = _part(
        "full weights (FSDP gathered, ZeRO-3 copied), fused/autocast/packed copies"
    )
    kv_cache: int = _part("generation KV cache")
    generation_activations: int = _part("prefill of one batch of prompts, float32 sampling logits")
    vllm_engine: int = _part(
        "colocated vLLM engine: vllm_gpu_memory_utilization of the device (sleep mode: generation only)"
    )
    phases: dict[str, int] = field(default_factory=dict)

    @property
    def peak(self) -> int:
        """The largest phase: what one device must hold."""
        return max(self.phases.values())

    def fits(self, device_bytes: float) -> bool:
        """Whether the peak fits in ``device_bytes``."""
        return self.peak <= device_bytes

    def parts(self) -> dict[str, int]:
        """Part name -> bytes, in the table's order."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if "note" in f.metadata}

    def biggest_parts(self, count: int = 3) -> list[tuple[str, int]]:
        """The ``count`` largest parts that count in the phases, largest first."""
        parts = [(k, v) for k, v in self.parts().items() if k != "activations_other"]
        return sorted(parts, key=lambda kv: -kv[1])[:count]

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "peak": self.peak}

    def _micro_batch(self) -> str:
        """The update's micro-batch as planned, in words."""
        if self.micro_batch_tokens is not None:
            return f"micro-batches of at most {self.micro_batch_tokens} real tokens"
        return f"micro-batch {self.micro_batch_rows} x {self.tokens_per_row} tokens"

    def table(self) -> str:
        """Human-readable: what was planned, then one line per part and per phase, in GiB."""
        n = self.num_processes
        checkpointing = "on" if self.gradient_checkpointing else "off"
        experts = ""
        if self.experts:  # every expert is resident; a token computes with its top k
            experts = f", {self.experts}: {_count(self.active_parameters)} active per token"
        lines = [
            f"memory plan: {self.model_type}, {_count(self.num_parameters)} parameters{experts} "
            f"({_count(self.trainable_parameters)} trainable{', LoRA' if self.lora else ''}); "
            f"{self.strategy} over {n} process{'es' if n > 1 else ''}; weights {self.weights_dtype}, "
            f"compute {self.compute_dtype}; {self._micro_batch()}, gradient checkpointing {checkpointing}; "
            "per device, GiB:"
        ]
        notes = {f.name: f.metadata.get("note") for f in dataclasses.fields(self)}
        if self.reference_offloaded:
            notes["reference"] += " [offloaded]"
        lines += [f"  {name:<24}{value / GIB:>9.2f}  {notes[name]}" for name, value in self.parts().items()]
        lines.append("phases:")
        lines += [f"  {name:<24}{value / GIB:>9.2f}" for name, value in self.phases.items()]
        lines.append(f"  {'peak':<24}{self.peak / GIB:>9.2f}")
        return "\n".join(lines)


ZERO_DEFAULTS = {
    "reduce_bucket_size": 500_000_000,
    "stage3_max_reuse_distance": 1_000_000_000,
    "sub_group_size": 1_000_000_000,
}
"""DeepSpeed's defaults (elements) for the ZeRO settings the plan reads."""


def zero_settings(args: GRPOConfig) -> dict[str, int]:
    """The run's ZeRO sizes (``ZERO_DEFAULTS``' keys, in elements): its DeepSpeed config's
    ``zero_optimization`` section (``GRPOConfig.deepspeed`` or an ``accelerate launch`` config), DeepSpeed's
    defaults for what it leaves out."""
    from grpokit.parallel.zero import deepspeed_config

    section = deepspeed_config(args)["zero_optimization"]
    return {key: int(float(section.get(key, default))) for key, default in ZERO_DEFAULTS.items()}


def zero3_gathered(shape: ModelShape, reuse_distance: int) -> int:
    """Parameters (elements) ZeRO-3 holds gathered in the update's forward and backward: DeepSpeed records
    the order modules run in and keeps a module's weights after its use when that order uses them again
    within ``reuse_distance`` parameters (``stage3_max_reuse_distance``). At the backward's start that is
    the LM head (a parameter of the root, gathered for the whole pass), the last layers, whose backward
    comes within the distance, and the layer running plus the one fetched ahead; all of them when twice the
    model (a forward and a backward) fits the distance. ``reuse_distance`` 0 (no recorded order): the head
    and two layers. An upper bound for the no-grad passes."""
    total = shape.total_parameters()
    if 2 * total <= reuse_distance:
        return total
    head = shape.vocab_size * shape.hidden_size + shape.hidden_size  # and the final norm
    layer = shape.layer_parameters()
    return head + min(shape.num_layers, reuse_distance // (2 * layer) + 2) * layer


def weights_dtype(args: GRPOConfig, shape: ModelShape) -> str:
    """The policy weights' dtype as ``load_policy`` loads them (``models.policy.model_init_kwargs``: the
    ``dtype``, float32 without one); "auto": the config's dtype (float32 if it names none)."""
    from grpokit.models.policy import model_init_kwargs

    dtype = model_init_kwargs(args)["dtype"]
    if dtype == "auto":
        return shape.config_dtype or "float32"
    return dtype_name(dtype)


def plan_memory(
    model_config: Any,
    args: GRPOConfig,
    *,
    num_processes: int = 1,
    strategy: str = "ddp",
    lora_r: int | None = None,
    lora_target_modules: list[str] | None = None,
    device_type: str = "cuda",
    device_bytes: float | None = None,
) -> MemoryPlan:
    """The memory plan of ``args`` on the model ``model_config`` describes, per device of ``num_processes``.

    ``strategy``: "ddp" (every process holds everything), "fsdp" (weights, gradients, optimizer state and
    reference sharded), "zero" (DeepSpeed ZeRO-2: AdamW state and the reduced gradients partitioned, the
    weights and the reference replicated) or "zero3" (DeepSpeed ZeRO-3: split like FSDP; generation reads
    a full copy of the policy that exists only during the generation call). ``lora_r``: train LoRA adapters
    of that rank on ``lora_target_modules`` (None: all linear layers but the LM head). ``device_type``:
    "cuda" or "cpu" (plain AdamW's temporaries; attention's key/value copies; the written pages of
    DeepSpeed's reduce bucket). ``device_bytes``: the device's memory, which a colocated vLLM engine takes
    its fraction of (None: the engine's reservation is not counted).
    """
    if strategy not in ("ddp", "fsdp", "zero", "zero3"):
        raise ValueError(f"strategy must be 'ddp', 'fsdp', 'zero' or 'zero3', got {strategy!r}")
    if not isinstance(num_processes, int) or num_processes < 1:
        raise ValueError(f"num_processes must be an integer >= 1, got {num_processes!r}")
    if device_type not in ("cuda", "cpu"):
        raise ValueError(f"device_type must be 'cuda' or 'cpu', got {device_type!r}")
    # as the run will use it: bf16 -> mixed_precision (unset: the processor's), generation_kwargs
    args = args.resolved(default_mixed_precision(args.use_cpu))
    shape = ModelShape.from_config(model_config)
    # fsdp: the weights (and everything with them) split; ZeRO-3 splits them the same way
    n, fsdp, lora = num_processes, strategy in ("fsdp", "zero3"), lora_r is not None
    layers, vocab, hidden = shape.num_layers, shape.vocab_size, shape.hidden_size

    def shard(nbytes: int) -> int:
        return math.ceil(nbytes / n) if fsdp else nbytes

    w_name = weights_dtype(args, shape)
    w = DTYPE_BYTES[w_name]
    autocast = args.mixed_precision in ("bf16", "fp16")
    c = 2 if autocast else w  # compute dtype bytes
    compute_name = {"bf16": "bfloat16", "fp16": "float16"}.get(args.mixed_precision, w_name)
    attention = str((args.model_init_kwargs or {}).get("attn_implementation", "sdpa"))
    total, linear_layer = shape.total_parameters(), shape.layer_linear_parameters()
    dense_layers = layers - shape.moe_layers
    linear_all = dense_layers * shape.layer_linear_parameters(False) + shape.moe_layers * linear_layer
    # the largest single tensor: the embedding, a dense MLP's weight, or an MoE layer's gate/up experts
    largest_tensor = max(vocab * hidden, shape.intermediate_size * hidden)
    largest_tensor = max(largest_tensor, shape.num_experts * 2 * shape.expert_intermediate_size * hidden)
    p: dict[str, int] = {}  # the parts, bytes per device

    # --- parameters, gradients, optimizer state, reference ---------------------------------------------
    trainable = count_lora_parameters(shape, lora_r, lora_target_modules) if lora else total
    grad_bytes = 4 if lora else w  # peft upcasts bf16/fp16 adapters to float32
    trainable_bytes = trainable * grad_bytes
    full_weights = total * w + (trainable_bytes if lora else 0)
    zero, zero3 = strategy == "zero", strategy == "zero3"
    # the largest trainable tensor (LoRA: an adapter's)
    lora_largest = 4 * largest_lora_tensor(shape, lora_r, lora_target_modules) if lora else 0
    largest = lora_largest if lora else w * largest_tensor
    fused = args.optim == "adamw_torch_fused"  # one pass per tensor, no temporaries
    # plain AdamW: foreach on CUDA (one temporary per parameter), per tensor on the CPU (two of one tensor)
    temporaries = 0 if fused else {"cuda": 1, "cpu": 2}[device_type]
    p["weights"], p["gradients"] = shard(full_weights), shard(trainable_bytes)
    p["grad_buckets"] = trainable_bytes if strategy == "ddp" and n > 1 else 0
    p["optimizer"] = shard(2 * trainable_bytes)
    p["optimizer_step"] = temporaries * (shard(trainable_bytes) if device_type == "cuda" else largest)
    if zero or zero3:  # DeepSpeed: AdamW steps a float32 master copy of this process's partition
        ds = zero_settings(args)
        part = math.ceil(trainable / n)  # this process's trainable elements
        # the reduce bucket: allocated whole on a GPU, only its written pages count on the CPU
        bucket = grad_bytes * (ds["reduce_bucket_size"] if device_type == "cuda" else
                               min(ds["reduce_bucket_size"], trainable))  # fmt: skip
        group = math.ceil(min(trainable, ds["sub_group_size"]) / n) if zero3 else part  # stepped at once
        p["master_weights"], p["optimizer"] = 4 * part, 2 * 4 * part
        p["optimizer_step"] = 4 * group * (1 + temporaries)  # the group's float32 gradient, AdamW's
        if zero:  # the update's reduce bucket and the reduced partition of this process
            p["gradients"] = bucket + grad_bytes * part
        else:  # gradient partitions (float32) and the reduce bucket, kept; one gradient before its reduction
            p["grad_buckets"] = 4 * part + bucket
            p["gradients"] = largest
    if args.beta > 0 and not lora:  # with LoRA the reference is the base model, adapters disabled
        ref = w_name if args.ref_model_dtype == "auto" else args.ref_model_dtype
        p["reference"] = shard(total * DTYPE_BYTES[ref])
        if strategy == "fsdp":  # a root unit stays gathered after its forward (FSDP's default), in c
            p["reference"] += shape.root_parameters() * (c if autocast else DTYPE_BYTES[ref])
    offloaded = args.ref_model_offload and p.get("reference", 0) > 0

    # --- update: one micro-batch of [rows, T] tokens ------------------------------------------------------
    batch = args.batch_plan(n)
    completion = args.max_completion_length
    prompt = args.max_prompt_length or shape.max_positions - completion  # None: as long as the model allows
    if prompt < 1:
        raise ValueError(
            "max_prompt_length is None and the model config's max_position_embeddings leaves no room for a "
            "prompt: set max_prompt_length"
        )
    seq, rows = prompt + completion, args.per_device_train_batch_size
    tokens = rows * seq  # one micro-batch's backbone tokens, padded (an upper bound when packed)
    budget = args.micro_batch_tokens
    if budget is not None:  # filled by real tokens from the optimizer step's rows: the budget, or one unit
        step_rows = rows * args.gradient_accumulation_steps
        unit = prompt + args.num_generations * completion if rows % args.num_generations == 0 else seq
        tokens = min(step_rows * seq, max(budget, unit))
    copies = (
        device_type != "cpu"
    )  # CPU runs give sdpa the key/value heads as they are (parallel/cpu_runtime.py)
    # lean_activations: the lean norms and MLP of dense llama/qwen2/qwen3/mistral layers, the MLP where no
    # LoRA adapter wraps its linears
    lean_norms = args.lean_activations and shape.model_type in LEAN_MODEL_TYPES
    mlp_linears = {"gate_proj", "up_proj", "down_proj"}
    mlp_adapted = lora and bool(mlp_linears & set(lora_targets(lora_target_modules, shape.model_type)))
    lean_mlp = lean_norms and not mlp_adapted
    lean = {"lean_norms": lean_norms, "lean_mlp": lean_mlp}
    layer = layer_activation_bytes(  # the layer checkpointing recomputes in the backward keeps them
        shape, seq, residual_bytes=w, compute_bytes=c, attention=attention, kv_copies=copies, **lean
    )
    every_layer = layers * layer_activation_bytes(  # the update's forward makes its norms' outputs again
        shape, seq, residual_bytes=w, compute_bytes=c, attention=attention, kv_copies=copies,
        norm_outputs_kept=False, **lean,
    )  # fmt: skip
    if shape.is_moe:  # its dense layers keep their own
        dense_layer = layer_activation_bytes(
            shape, seq, residual_bytes=w, compute_bytes=c, attention=attention, kv_copies=copies, moe=False
        )
        every_layer = shape.moe_layers * layer + dense_layers * dense_layer
    final_norm = w * hidden + 4 if lean_norms else 4 * hidden + w * hidden + 4
    outside = 8 + 2 * shape.head_dim * w + final_norm  # ids, cos/sin, final norm
    full = tokens * (every_layer + outside)
    # checkpointing: each layer's input [T, H], one layer recomputed, the mask [T, T] passed to every layer
    checkpointed = tokens * (layers * w * hidden + outside + layer) + tokens * seq * w
    kept = {True: checkpointed, False: full}
    p["activations"], p["activations_other"] = (
        kept[args.gradient_checkpointing],
        kept[not args.gradient_checkpointing],
    )
    # LoRA on an MoE layer's experts or router (peft's target_parameters): each forward of the layer merges
    # W + BA in the weights' dtype, and the backward keeps it (the no-grad passes one layer's at a time)
    merged_layer = w * adapted_expert_parameters(shape, lora_target_modules) if lora else 0
    p["lora_merged"] = merged_layer * (1 if args.gradient_checkpointing else shape.moe_layers)
    # autocast over float32 weights: the backward keeps each linear's low-precision weight (FSDP under mixed
    # precision gathers the weights in c for the forward and again for the backward: nothing to cast)
    if c != w and strategy != "fsdp":  # (the lean MLP casts its weights again in the backward instead)
        mlp = 3 * shape.hidden_size * shape.intermediate_size if lean_mlp else 0
        kept_layers = 1 if args.gradient_checkpointing else layers
        p["autocast_copies"] = c * (linear_layer if args.gradient_checkpointing else linear_all)
        p["autocast_copies"] -= c * kept_layers * mlp
    completion_tokens = rows * completion if budget is None else min(tokens, step_rows * completion)
    chunk = min(head_chunk_rows(vocab), completion_tokens)
    p["head"] = 2 * completion_tokens * hidden * w + 2 * chunk * vocab * 4  # h, grad_h; z and e (or coef)
    if c != 4:  # a chunk's bf16 product before its cast into z (a float32 one is z: oneDNN's or in place)
        p["head"] += chunk * vocab * c
    if c != w:  # autocast: h and the weight cast once per pass
        p["head"] += (completion_tokens + vocab) * hidden * c
    if c != 4 and not lora:  # a chunk's bf16 weight-gradient product before its sum into float32
        p["head"] += vocab * hidden * c
    if c == 4 and not lora and device_type == "cpu" and onednn_available():  # oneDNN's product, a block of
        p["head"] += min(vocab, WEIGHT_GRADIENT_ROWS) * hidden * 4  # the weight gradient's rows at a time
    if w != 4 and not lora:  # a float32 [V, H] weight-gradient buffer
        p["head"] += vocab * hidden * 4

    # --- no-grad log-prob passes (reference, old policy) over max(micro-batch, G) rows --------------------
    pass_rows = max(rows, args.num_generations)
    p["logprob_pass"] = (
        pass_rows * seq * (_pass_bytes_per_token(shape, seq, w, c, attention) + w * hidden)
        + pass_rows * seq * seq * w  # the padding mask
        + pass_rows * completion * hidden * w
        + 2 * min(head_chunk_rows(vocab), pass_rows * completion) * vocab * 4
        + merged_layer
    )
    # FSDP under mixed precision gathers the weights in the compute dtype (no autocast casts needed then)
    g = c if strategy == "fsdp" else w  # bytes per gathered / generation weight
    policy_casts = c * (linear_all + vocab * hidden) if c != g and not lora else 0
    if strategy == "fsdp":  # the root (embeddings, head) and two layers gathered, one layer's gradients
        p["gathered"] = g * (shape.root_parameters() + (2 if lora else 3) * shape.layer_parameters())
    # pi_old's pass: off-policy updates, or a sampler that is not pi_old (another dtype, vLLM) with the
    # correction on (sampling.off_policy)
    sampler_dtype = getattr(args, "generation_dtype", "auto")
    vllm = args.use_vllm  # vLLM generates: its weights in its own reservation, no in-process buffers
    corrected = (vllm or sampler_dtype not in ("auto", w_name)) and args.vllm_importance_sampling_correction
    old_pass = batch.optimizer_steps > 1 or corrected
    if zero3:  # DeepSpeed keeps what the order it recorded uses again within stage3_max_reuse_distance; a
        # no-grad pass through the policy's engine (pi_old's, LoRA's reference) breaks that order, so the
        # update's first micro-batch after it releases each module after use: with one micro-batch per
        # generation, nothing is kept
        engine_pass = old_pass or (lora and args.beta > 0)
        micro_batches = batch.optimizer_steps * batch.micro_batches_per_optimizer_step
        keeps = not engine_pass or micro_batches > 1
        p["gathered"] = w * zero3_gathered(shape, ds["stage3_max_reuse_distance"] if keeps else 0)

    # --- generation: this process's prompts x G ------------------------------------------------------------
    prompts, group = math.ceil(batch.prompts / n), args.num_generations
    kv_per_token = 2 * layers * shape.num_kv_heads * shape.head_dim * c  # keys/values come out in c
    # the full weights generation reads, for the generation call (and a vLLM push): FSDP gathers its units
    # in g; ZeRO-3 fills a copy in the weights' dtype one gathered parameter at a time
    full_copy = 0
    if strategy == "fsdp":
        full_copy = total * g + (trainable_bytes if lora else 0)
    elif zero3:
        full_copy = full_weights + w * largest_tensor
    p["generation_weights"] = full_copy
    if sampler_dtype not in ("auto", w_name) and not vllm:  # the sampler's copy (sampling.off_policy)
        p["generation_copy"] = total * DTYPE_BYTES[sampler_dtype]
    # fast (and auto, which picks it for the architectures planned here): fused [q; k; v] and, in a dense
    # layer, [gate; up] (an MoE block runs as its own module); each prompt's cache once
    if args.generation_backend in ("fast", "auto"):

        def weights_of(names: tuple[str, ...], moe: bool) -> int:
            return sum(i * o for name, (i, o) in shape.linear_shapes(moe).items() if name in names)

        qkv, gate_up = ("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")
        fused_proj = dense_layers * weights_of(qkv + gate_up, False)
        fused_proj += shape.moe_layers * weights_of(qkv, True)
        applied = dense_layers * weights_of(("o_proj", "down_proj"), False)  # what the decode applies as is
        applied += shape.moe_layers * weights_of(("o_proj",), True) + vocab * hidden
        if c != g:  # autocast: the decode casts every weight it applies once per call, the head included
            p["generation_weights"] += c * (fused_proj + applied)
        else:
            p["generation_weights"] += g * fused_proj
        call_prompts = min(args.generation_micro_batch_size or prompts, prompts)  # prompts per call
        call_rows, compute_dtype = call_prompts * group, getattr(torch, compute_name)
        if device_type == "cpu" and call_packs(torch.device("cpu"), compute_dtype, call_rows, completion):
            # and packs each of them once per call for oneDNN (a LoRA layer outside autocast runs itself)
            adapted = set(lora_targets(lora_target_modules, shape.model_type)) if lora and c == g else set()
            own = applied - dense_layers * weights_of(tuple(adapted & {"o_proj", "down_proj"}), False)
            own -= shape.moe_layers * weights_of(tuple(adapted & {"o_proj"}), True)
            p["generation_weights"] += c * (fused_proj + own)
        prefill_rows = min(FAST_PREFILL_PROMPTS, call_prompts)
        kv_tokens = call_prompts * prompt + call_prompts * group * completion
        extra_cache = call_prompts * prompt * kv_per_token  # prefill chunks joined into one copy
    else:  # generate() on the prompts repeated G times, generation_micro_batch_size prompts per call
        p["generation_weights"] += policy_casts
        call_prompts = min(args.generation_micro_batch_size or prompts, prompts)
        prefill_rows = call_prompts * group
        kv_tokens = call_prompts * group * (prompt + completion)
        extra_cache = kv_tokens * kv_per_token // layers  # one layer's torch.cat as the cache grows
    p["kv_cache"] = kv_tokens * kv_per_token
    p["generation_activations"] = (
        prefill_rows * prompt * (_pass_bytes_per_token(shape, prompt, w, c, attention) + prompt * w)
        + 3 * call_prompts * group * vocab * 4  # logits, processed scores, CDF: float32 [rows, V]
        + extra_cache
        + merged_layer
    )
    if vllm:  # the engine batches and caches in its reservation; the full weights are still read to push
        p["kv_cache"] = p["generation_activations"] = 0
        p["generation_weights"] = full_copy
        colocated = args.vllm_mode == "colocate" and device_bytes is not None
        p["vllm_engine"] = math.ceil(args.vllm_gpu_memory_utilization * device_bytes) if colocated else 0

    # --- phases -------------------------------------------------------------------------------------------
    resident = p["weights"] + p.get("master_weights", 0) + p["optimizer"] + p["grad_buckets"]
    resident += (0 if offloaded else p.get("reference", 0)) + p.get("generation_copy", 0)
    # generation (and a vLLM push, in the same full-weights context): the engine awake, even in sleep mode
    phases = {"generation": resident + p["generation_weights"] + p["kv_cache"] + p["generation_activations"]}
    phases["generation"] += p.get("vllm_engine", 0)
    if not args.vllm_enable_sleep_mode:  # else the engine sleeps through the passes and the update
        resident += p.get("vllm_engine", 0)
    passes = []
    if args.beta > 0:
        passes.append(p["logprob_pass"] + (p["reference"] if offloaded else 0))
    if old_pass:
        passes.append(p["logprob_pass"] + policy_casts)
    if passes:
        phases["logprobs"] = resident + p.get("gathered", 0) + max(passes)
    # The backward's peak is at its start (activations at their largest), with the gradients already there:
    # earlier micro-batches' (DDP, FSDP; the LM head's comes first), ZeRO-2's reduce bucket (allocated
    # whole on a GPU) and partition, the one gradient ZeRO-3 has not reduced yet. Then the gradients
    # alone, then optimizer.step() with the gradients it reads.
    accumulating = args.gradient_accumulation_steps > 1
    if zero:
        bucket_first = bucket if device_type == "cuda" else 0
        grads_there = bucket_first + (grad_bytes * part if accumulating else 0) + largest
        step_grads = grad_bytes * part  # the bucket is released at the end of the backward
    elif zero3:
        grads_there, step_grads = p["gradients"], 0
    else:
        grads_there = p["gradients"] if accumulating else (0 if lora else shard(vocab * hidden * w))
        step_grads = p["gradients"]
    backward = p["activations"] + p["lora_merged"] + p["head"] + p.get("autocast_copies", 0) + grads_there
    phases["update"] = (
        resident + p.get("gathered", 0) + max(backward, p["gradients"], step_grads + p["optimizer_step"])
    )
    compute = compute_name + (" (autocast)" if autocast else "")
    # fmt: off
    experts = "" if not shape.is_moe else (f"{shape.num_experts} experts, {shape.experts_per_token} per "
                                           f"token, in {shape.moe_layers} of {layers} layers")
    meta = dict(model_type=shape.model_type, num_parameters=total, experts=experts,
                active_parameters=shape.active_parameters(), trainable_parameters=trainable,
                strategy=strategy, num_processes=n, lora=lora, weights_dtype=w_name, compute_dtype=compute,
                gradient_checkpointing=args.gradient_checkpointing, tokens_per_row=seq, micro_batch_rows=rows,
                reference_offloaded=offloaded, micro_batch_tokens=None if budget is None else tokens)
    # fmt: on
    return MemoryPlan(**meta, **p, phases=phases)

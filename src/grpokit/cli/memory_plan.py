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
- **transients** (estimates): the LM head's float32 logits chunk, AdamW's ``foreach`` temporaries, the
  low-precision weight copies autocast keeps, FSDP's gathered layers, the no-grad log-prob passes, the
  prefill and sampling logits of generation. What is not counted: allocator fragmentation and the CUDA
  context (leave ~2-4 GiB), the activation gradients of one layer, small tensors.
- **KV cache**: exact for the fast sampler (pre-allocated buffers); for ``transformers`` ``generate`` the
  cache at full length. Keys/values are in the compute dtype (bf16/fp16 under autocast, else the weights').
- **FSDP** gathers a unit's weights in the compute dtype under mixed precision (``parallel.fsdp``): the
  generation phase holds the full weights in that dtype, the update two layers and the root at a time.
- **vLLM** (``use_vllm``): in colocate mode the engine reserves ``vllm_gpu_memory_utilization`` of the
  device (its weights and KV cache; ``device_bytes``), in every phase unless sleep mode frees it during the
  log-prob passes and the update; in-process generation buffers (KV cache, fused copies) are then not
  used. A server holds nothing on the training devices. Either way the off-policy correction
  (``vllm_importance_sampling_correction``) forces the old-policy pass at mu = 1.

Phases: ``generation``, ``logprobs`` (reference and old-policy passes; absent when neither runs) and
``update``; ``peak`` is the largest. Gradients are freed after each optimizer step (``set_to_none``), so they
count in the update only.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from grpokit.config import GRPOConfig
from grpokit.models.shape import DTYPE_BYTES, ModelShape, count_lora_parameters, dtype_name
from grpokit.train.lm_head import head_chunk_rows

__all__ = ["FAST_PREFILL_PROMPTS", "GIB", "MemoryPlan", "layer_activation_bytes", "plan_memory"]

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
) -> int:
    """Bytes one decoder layer keeps for its backward, per token of a [rows, seq_len] training forward.

    Counted from ``transformers``' Llama layer (the same for qwen2/qwen3/mistral), with r = the residual
    stream's bytes (the weights' dtype) and c = the compute dtype's (autocast's, else r):
    each RMSNorm keeps its input in float32 (or a float32 copy) [H], x/rms [H] r and 1/rms; the norms'
    outputs feed q/k/v and gate/up (2 x [H] r; under autocast each of the 5 linears keeps its own cast
    [H] c); attention keeps q and k, v repeated to all heads and its output (4 x [heads*d] c; with
    ``kv_copies=False``, as CPU runs attend (``parallel/cpu_runtime.py``), k and v at [kv_heads*d]) plus, for
    sdpa, a float32 logsumexp [heads] and the layer's copy of the padding mask [T] c, for eager the float32
    softmax [heads, T] (and its cast [heads, T] c); the MLP keeps gate, up, act(gate), act(gate)*up
    (4 x [I] c); qwen3's q/k norms keep their inputs in float32 and x/rms [heads + kv_heads, d].
    """
    hidden, heads, kv, d = shape.hidden_size, shape.num_heads, shape.num_kv_heads, shape.head_dim
    r, c = residual_bytes, compute_bytes
    norms = 2 * (4 * hidden + r * hidden + 4)
    linear_inputs = 2 * r * hidden if c == r else 5 * c * hidden
    attn = (4 * heads if kv_copies or attention == "eager" else 2 * heads + 2 * kv) * d * c
    if attention == "eager":
        attn += heads * seq_len * 4 + (heads * seq_len * c if c != 4 else 0)
    else:  # sdpa / flash kernels: no [T, T] probabilities
        attn += 4 * heads + seq_len * c
    qk_norm = (heads + kv) * (d * (4 + c) + 4) if shape.qk_norm else 0
    return norms + linear_inputs + attn + qk_norm + 4 * shape.intermediate_size * c


def _pass_bytes_per_token(shape: ModelShape, seq_len: int, r: int, c: int, attention: str) -> int:
    """Transient bytes per token of a no-grad forward (one layer alive): residual and norm [H], q/k/v/output,
    act(gate), up and their product [I] (eager: the [heads, T] scores)."""
    hidden, heads, d = shape.hidden_size, shape.num_heads, shape.head_dim
    scores = heads * seq_len * (4 + c) if attention == "eager" else 0
    return 2 * r * hidden + 4 * hidden + 4 * heads * d * c + 3 * shape.intermediate_size * c + scores


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
    weights: int = _part("policy weights (FSDP: this device's shard)")
    gradients: int = _part("gradients of the trainable parameters (update only)")
    grad_buckets: int = _part("DDP gradient buckets: one more copy of the gradients")
    optimizer: int = _part("AdamW exp_avg + exp_avg_sq")
    optimizer_step: int = _part("AdamW temporaries during optimizer.step()")
    reference: int = _part("reference model (ref_model_offload: on the device only in its pass)")
    activations: int = _part("kept for the backward of one micro-batch, as configured")
    activations_other: int = _part("the same with gradient_checkpointing switched (not in the phases)")
    autocast_copies: int = _part("low-precision copies of float32 weights autocast keeps for the backward")
    head: int = _part("chunked LM head: float32 [chunk, V] logits, [M, H] hidden states and gradient")
    logprob_pass: int = _part("a no-grad reference / old-policy pass over one micro-batch")
    fsdp_gathered: int = _part("FSDP/ZeRO-3: embeddings/head + two layers gathered, one layer's gradients")
    generation_copy: int = _part(
        "copies of the policy generation reads, kept in every phase: ZeRO-3's full copy, generation_dtype's"
    )
    generation_weights: int = _part("FSDP's full weights, fast sampler's fused copies, autocast copies")
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

    def table(self) -> str:
        """Human-readable: what was planned, then one line per part and per phase, in GiB."""
        n = self.num_processes
        checkpointing = "on" if self.gradient_checkpointing else "off"
        lines = [
            f"memory plan: {self.model_type}, {_count(self.num_parameters)} parameters "
            f"({_count(self.trainable_parameters)} trainable{', LoRA' if self.lora else ''}); "
            f"{self.strategy} over {n} process{'es' if n > 1 else ''}; weights {self.weights_dtype}, "
            f"compute {self.compute_dtype}; micro-batch {self.micro_batch_rows} x {self.tokens_per_row} "
            f"tokens, gradient checkpointing {checkpointing}; per device, GiB:"
        ]
        notes = {f.name: f.metadata.get("note") for f in dataclasses.fields(self)}
        if self.reference_offloaded:
            notes["reference"] += " [offloaded]"
        lines += [f"  {name:<24}{value / GIB:>9.2f}  {notes[name]}" for name, value in self.parts().items()]
        lines.append("phases:")
        lines += [f"  {name:<24}{value / GIB:>9.2f}" for name, value in self.phases.items()]
        lines.append(f"  {'peak':<24}{self.peak / GIB:>9.2f}")
        return "\n".join(lines)


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
    reference sharded) or "zero" (DeepSpeed ZeRO-2: AdamW state and the reduced gradients partitioned, the
    weights and the reference replicated; the full-size gradients of the backward counted before their
    reduction, an upper bound) or "zero3" (DeepSpeed ZeRO-3: split like FSDP, plus the full copy of the
    policy that generation reads, kept in every phase). ``lora_r``: train LoRA adapters of that rank on
    ``lora_target_modules`` (None: all linear layers but the LM head). ``device_type``: "cuda" (AdamW's
    foreach step: one trainable-sized temporary) or "cpu" (per-tensor step: two copies of the largest
    tensor). ``device_bytes``: the device's memory, which a colocated vLLM engine takes its fraction of
    (None: the engine's reservation is not counted).
    """
    if strategy not in ("ddp", "fsdp", "zero", "zero3"):
        raise ValueError(f"strategy must be 'ddp', 'fsdp', 'zero' or 'zero3', got {strategy!r}")
    if not isinstance(num_processes, int) or num_processes < 1:
        raise ValueError(f"num_processes must be an integer >= 1, got {num_processes!r}")
    if device_type not in ("cuda", "cpu"):
        raise ValueError(f"device_type must be 'cuda' or 'cpu', got {device_type!r}")
    args = args.resolved()  # as the run will use it: bf16 -> mixed_precision, generation_kwargs
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
    p: dict[str, int] = {}  # the parts, bytes per device

    # --- parameters, gradients, optimizer state, reference ---------------------------------------------
    trainable = count_lora_parameters(shape, lora_r, lora_target_modules) if lora else total
    trainable_bytes = trainable * (4 if lora else w)  # peft upcasts bf16/fp16 adapters to float32
    full_weights = total * w + (trainable_bytes if lora else 0)
    zero = strategy == "zero"
    p["weights"], p["gradients"] = shard(full_weights), shard(trainable_bytes)
    p["grad_buckets"] = trainable_bytes if strategy == "ddp" and n > 1 else 0
    p["optimizer"] = math.ceil(2 * trainable_bytes / n) if zero else shard(2 * trainable_bytes)
    if lora:  # the largest trainable tensor (on the CPU AdamW steps tensor by tensor)
        largest = 4 * lora_r * max(max(s) for s in shape.linear_shapes().values())
    else:
        largest = w * max(vocab * hidden, shape.intermediate_size * hidden)
    p["optimizer_step"] = shard(trainable_bytes) if device_type == "cuda" else 2 * largest
    if zero:  # the optimizer steps this process's partition: its fp32 gradient and temporaries
        p["optimizer_step"] = math.ceil(2 * trainable_bytes / n)
    if args.beta > 0 and not lora:  # with LoRA the reference is the base model, adapters disabled
        ref = w_name if args.ref_model_dtype == "auto" else args.ref_model_dtype
        p["reference"] = shard(total * DTYPE_BYTES[ref])
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
    copies = (
        device_type != "cpu"
    )  # CPU runs give sdpa the key/value heads as they are (parallel/cpu_runtime.py)
    layer = layer_activation_bytes(
        shape, seq, residual_bytes=w, compute_bytes=c, attention=attention, kv_copies=copies
    )
    outside = 8 + 2 * shape.head_dim * w + (4 * hidden + w * hidden + 4)  # ids, cos/sin, final norm
    full = rows * seq * (layers * layer + outside)
    # checkpointing: each layer's input [T, H], one layer recomputed, the mask [T, T] passed to every layer
    checkpointed = rows * seq * (layers * w * hidden + outside + layer) + rows * seq * seq * w
    kept = {True: checkpointed, False: full}
    p["activations"], p["activations_other"] = (
        kept[args.gradient_checkpointing],
        kept[not args.gradient_checkpointing],
    )
    if c != w:  # autocast over float32 weights: the backward keeps each linear's low-precision weight
        p["autocast_copies"] = c * linear_layer * (1 if args.gradient_checkpointing else layers)
    completion_tokens = rows * completion
    chunk = min(head_chunk_rows(vocab), completion_tokens)
    p["head"] = 2 * completion_tokens * hidden * w + 2 * chunk * vocab * 4  # h, grad_h; z and e (or coef)
    if w != 4:  # the chunk's gradient cast to the weights' dtype; a float32 [V, H] weight-gradient buffer
        p["head"] += chunk * vocab * w + (0 if lora else vocab * hidden * 4)

    # --- no-grad log-prob passes (reference, old policy) over max(micro-batch, G) rows --------------------
    pass_rows = max(rows, args.num_generations)
    p["logprob_pass"] = (
        pass_rows * seq * (_pass_bytes_per_token(shape, seq, w, c, attention) + w * hidden)
        + pass_rows * seq * seq * w  # the padding mask
        + pass_rows * completion * hidden * w
        + 2 * min(head_chunk_rows(vocab), pass_rows * completion) * vocab * 4
    )
    # FSDP under mixed precision gathers the weights in the compute dtype (no autocast casts needed then)
    g = c if strategy == "fsdp" else w  # bytes per gathered / generation weight
    policy_casts = c * (layers * linear_layer + vocab * hidden) if c != g and not lora else 0
    if fsdp:
        gathered = shape.root_parameters() + (2 if lora else 3) * shape.layer_parameters()
        p["fsdp_gathered"] = gathered * g

    # --- generation: this process's prompts x G ------------------------------------------------------------
    prompts, group = math.ceil(batch.prompts / n), args.num_generations
    kv_per_token = 2 * layers * shape.num_kv_heads * shape.head_dim * c  # keys/values come out in c
    p["generation_weights"] = (total * g + (trainable_bytes if lora else 0)) if strategy == "fsdp" else 0
    if strategy == "zero3":  # a persistent full copy, refreshed before each generation
        p["generation_copy"] = full_weights
    sampler_dtype = getattr(args, "generation_dtype", "auto")
    vllm = args.use_vllm  # vLLM generates: its weights in its own reservation, no in-process buffers
    if sampler_dtype not in ("auto", w_name) and not vllm:  # the sampler's copy (sampling.off_policy)
        p["generation_copy"] = p.get("generation_copy", 0) + total * DTYPE_BYTES[sampler_dtype]
    # fast (and auto, which picks it for the architectures planned here): fused [q; k; v] and [gate; up];
    # each prompt's cache once
    if args.generation_backend in ("fast", "auto"):
        shapes = shape.linear_shapes()
        fused = sum(i * o for name, (i, o) in shapes.items() if name not in ("o_proj", "down_proj"))
        p["generation_weights"] += layers * fused * g
        if c != g and not lora:  # autocast caches casts of the weights applied as modules
            p["generation_weights"] += c * (layers * (linear_layer - fused) + vocab * hidden)
        call_prompts = min(args.generation_micro_batch_size or prompts, prompts)  # prompts per call
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
    )
    if vllm:  # the engine batches and caches in its reservation; FSDP still gathers the weights to push
        p["kv_cache"] = p["generation_activations"] = 0
        p["generation_weights"] = total * g + (trainable_bytes if lora else 0) if strategy == "fsdp" else 0
        colocated = args.vllm_mode == "colocate" and device_bytes is not None
        p["vllm_engine"] = math.ceil(args.vllm_gpu_memory_utilization * device_bytes) if colocated else 0

    # --- phases -------------------------------------------------------------------------------------------
    resident = p["weights"] + p["optimizer"] + p["grad_buckets"] + (0 if offloaded else p.get("reference", 0))
    resident += p.get("generation_copy", 0)
    phases = {"generation": resident + p["generation_weights"] + p["kv_cache"] + p["generation_activations"]}
    phases["generation"] += p.get("vllm_engine", 0)
    if not args.vllm_enable_sleep_mode:  # else the engine sleeps through the passes and the update
        resident += p.get("vllm_engine", 0)
    passes = []
    if args.beta > 0:
        passes.append(p["logprob_pass"] + (p["reference"] if offloaded else 0))
    # pi_old: off-policy updates, or a sampler that is not pi_old (another dtype, vLLM) with the correction
    # on (sampling.off_policy)
    corrected = (vllm or sampler_dtype not in ("auto", w_name)) and args.vllm_importance_sampling_correction
    if batch.optimizer_steps > 1 or corrected:
        passes.append(p["logprob_pass"] + policy_casts)
    if passes:
        phases["logprobs"] = resident + p.get("fsdp_gathered", 0) + max(passes)
    # gradients grow while activations are freed: the backward's peak is at its start, unless earlier
    # micro-batches of the same optimizer step left their gradients (the LM head's gradient comes first)
    grads_there = (
        p["gradients"] if args.gradient_accumulation_steps > 1 else (0 if lora else shard(vocab * hidden * w))
    )
    backward = p["activations"] + p["head"] + p.get("autocast_copies", 0) + grads_there
    phases["update"] = (
        resident + p.get("fsdp_gathered", 0) + max(backward, p["gradients"] + p["optimizer_step"])
    )
    compute = compute_name + (" (autocast)" if autocast else "")
    # fmt: off
    meta = dict(model_type=shape.model_type, num_parameters=total, trainable_parameters=trainable,
                strategy=strategy, num_processes=n, lora=lora, weights_dtype=w_name, compute_dtype=compute,
                gradient_checkpointing=args.gradient_checkpointing, tokens_per_row=seq, micro_batch_rows=rows,
                reference_offloaded=offloaded)
    # fmt: on
    return MemoryPlan(**meta, **p, phases=phases)

"""The sizes of a Llama-family decoder (``llama``, ``qwen2``, ``qwen3``, ``mistral``, and the mixtures of
experts built on it: ``qwen2_moe``, ``qwen3_moe``, ``mixtral``) read from its config alone, no weights:
parameter counts (all resident, and those one token computes with), LoRA adapter counts, the shapes of one
layer's linear layers. The memory plan (``grpokit.cli.memory_plan``) is built on them; tests check the
counts against real models.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "DTYPE_BYTES",
    "EXPERT_TARGETS",
    "LINEARS",
    "SUPPORTED_MODEL_TYPES",
    "ModelShape",
    "adapted_expert_parameters",
    "count_lora_parameters",
    "count_parameters",
    "dtype_name",
    "expert_lora_parameters",
    "largest_lora_tensor",
    "lora_targets",
]

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral", "qwen2_moe", "qwen3_moe", "mixtral")
MOE_MODEL_TYPES = ("qwen2_moe", "qwen3_moe", "mixtral")
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "float64": 8}


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a Llama-family decoder that its memory depends on."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_positions: int
    tied: bool
    qkv_bias: bool  # qwen2: always; llama/qwen3: attention_bias
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool  # qwen3: RMSNorm over each head's queries and keys
    config_dtype: str | None
    num_experts: int = 0  # a mixture of experts: experts per MoE layer (0: every MLP is dense)
    experts_per_token: int = 0  # the router's top k
    expert_intermediate_size: int = 0  # each expert's MLP width
    shared_expert_intermediate_size: int = 0  # qwen2_moe: the always-on shared expert's width
    moe_layers: int = 0  # layers whose MLP is the experts (the others: a dense MLP of intermediate_size)

    @classmethod
    def from_config(cls, config: Any) -> ModelShape:
        """From a ``transformers`` config or a config.json mapping (missing fields: the type's defaults)."""
        if isinstance(config, Mapping):
            from transformers import AutoConfig

            values = dict(config)
            if "torch_dtype" in values:  # config.json's older name
                values.setdefault("dtype", values.pop("torch_dtype"))
            model_type = values.pop("model_type", None)
            _check_model_type(model_type)
            config = AutoConfig.for_model(model_type, **values)
        model_type = getattr(config, "model_type", None)
        _check_model_type(model_type)
        hidden, heads = config.hidden_size, config.num_attention_heads
        attention_bias = bool(getattr(config, "attention_bias", False))
        dtype = config.dtype if hasattr(config, "dtype") else getattr(config, "torch_dtype", None)
        experts = _experts(config, model_type)
        return cls(
            model_type=model_type,
            vocab_size=config.vocab_size,
            hidden_size=hidden,
            intermediate_size=config.intermediate_size,
            num_layers=config.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=getattr(config, "head_dim", None) or hidden // heads,
            max_positions=getattr(config, "max_position_embeddings", 0) or 0,
            tied=bool(getattr(config, "tie_word_embeddings", False)),
            qkv_bias=model_type in ("qwen2", "qwen2_moe") or attention_bias,
            o_bias=model_type in ("llama", "qwen3") and attention_bias,
            mlp_bias=model_type == "llama" and bool(getattr(config, "mlp_bias", False)),
            qk_norm=model_type in ("qwen3", "qwen3_moe"),
            config_dtype=None if dtype is None else dtype_name(dtype),
            **experts,
        )

    @property
    def is_moe(self) -> bool:
        return self.moe_layers > 0

    def linear_shapes(self, moe: bool | None = None) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear layer of one decoder layer: a dense layer's, or (``moe``; None:
        the model's largest layer) an MoE layer's attention and, where it has one, its shared expert's MLP
        (qwen2_moe). The experts themselves are 3-D parameters, not linear layers, and the router too
        (transformers 5)."""
        h, q, kv = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        moe = self.is_moe if moe is None else moe
        i = self.shared_expert_intermediate_size if moe else self.intermediate_size
        sizes = [(h, q), (h, kv), (h, kv), (q, h)] + ([(h, i), (h, i), (i, h)] if i else [])
        return dict(zip(LINEARS, sizes))

    def layer_linear_parameters(self, moe: bool | None = None) -> int:
        """Weights of one layer's linear layers and, in an MoE layer, its router (the weights autocast casts:
        the experts run their grouped matmul in the weights' own dtype)."""
        shared_gate = self.hidden_size * bool(self.shared_expert_intermediate_size)  # qwen2_moe: [1, H]
        router = self.num_experts * self.hidden_size + shared_gate
        moe = self.is_moe if moe is None else moe
        return sum(i * o for i, o in self.linear_shapes(moe).values()) + (router if moe else 0)

    def expert_parameters(self) -> int:
        """One expert's weights: gate, up and down, 3 * H * I_e."""
        return 3 * self.hidden_size * self.expert_intermediate_size

    def layer_parameters(self, moe: bool | None = None) -> int:
        """All parameters of one decoder layer (None: the largest): linear weights and biases, RMSNorm
        weights, and in an MoE layer its router and every expert."""
        moe = self.is_moe if moe is None else moe
        shapes = self.linear_shapes(moe)
        biases = (shapes["q_proj"][1] + 2 * shapes["k_proj"][1]) * self.qkv_bias
        biases += self.hidden_size * self.o_bias
        if not moe:
            biases += (2 * self.intermediate_size + self.hidden_size) * self.mlp_bias
        norms = 2 * self.hidden_size + 2 * self.head_dim * self.qk_norm
        experts = self.num_experts * self.expert_parameters() if moe else 0
        return self.layer_linear_parameters(moe) + biases + norms + experts

    def root_parameters(self) -> int:
        """Embeddings, final norm and the LM head (counted once when tied)."""
        embedding = self.vocab_size * self.hidden_size
        return embedding * (1 if self.tied else 2) + self.hidden_size

    def total_parameters(self) -> int:
        """Every parameter: all experts of every MoE layer are resident."""
        dense = self.num_layers - self.moe_layers
        return dense * self.layer_parameters(False) + self.moe_layers * self.layer_parameters(True) + (
            self.root_parameters())  # fmt: skip

    def active_parameters(self) -> int:
        """The parameters one token computes with: in each MoE layer its router, its top-k experts and the
        shared expert, not the others (the embedding row it reads counts whole, as usual)."""
        idle = (self.num_experts - self.experts_per_token) * self.expert_parameters()
        return self.total_parameters() - self.moe_layers * idle


def _experts(config: Any, model_type: str) -> dict[str, int]:
    """The mixture-of-experts fields of ``ModelShape`` for a config (nothing for a dense one)."""
    if model_type not in MOE_MODEL_TYPES:
        return {}
    if model_type == "mixtral":
        count, width, layers = config.num_local_experts, config.intermediate_size, config.num_hidden_layers
    else:  # qwen2_moe / qwen3_moe: every decoder_sparse_step-th layer, but mlp_only_layers
        count, width = config.num_experts, config.moe_intermediate_size
        dense = set(getattr(config, "mlp_only_layers", None) or [])
        step = getattr(config, "decoder_sparse_step", 1) or 1
        layers = sum(
            1 for i in range(config.num_hidden_layers) if i not in dense and count and (i + 1) % step == 0
        )
    return {
        "num_experts": count,
        "experts_per_token": config.num_experts_per_tok,
        "expert_intermediate_size": width,
        "shared_expert_intermediate_size": getattr(config, "shared_expert_intermediate_size", 0) or 0,
        "moe_layers": layers,
    }


def _check_model_type(model_type: Any) -> None:
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"model_config.model_type {model_type!r} is not supported by the memory plan "
            f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
        )


def dtype_name(dtype: Any) -> str:
    """``torch.bfloat16`` / ``"bfloat16"`` -> ``"bfloat16"``, refusing what is not a float dtype."""
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPE_BYTES:
        raise ValueError(
            f"model_init_kwargs: dtype {dtype!r} is not a float dtype the plan knows ({DTYPE_BYTES})"
        )
    return name


def count_parameters(model_config: Any) -> int:
    """Parameters of the decoder ``model_config`` describes (a ``transformers`` config or config.json dict):
    embeddings V*H, per layer q/k/v/o (with ``num_key_value_heads`` and ``head_dim``) and their biases where
    the architecture has them, the gated MLP 3*H*I, two RMSNorms (and qwen3's q/k norms), the final norm and
    an untied LM head."""
    return ModelShape.from_config(model_config).total_parameters()


_QWEN_EXPERTS = {
    "gate": "router", "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj", "down_proj": "down_proj"
}  # fmt: skip
EXPERT_TARGETS: dict[str, dict[str, str]] = {
    "mixtral": {"gate": "router", "w1": "gate_up_proj", "w3": "gate_up_proj", "w2": "down_proj"},
    "qwen2_moe": _QWEN_EXPERTS,
    "qwen3_moe": _QWEN_EXPERTS,
}
"""LoRA target names that peft (0.22) maps onto the parameters of an MoE layer, per model type: transformers 5
stores each layer's experts as stacked 3-D parameters (``experts.gate_up_proj`` [E, 2 I_e, H],
``experts.down_proj`` [E, H, I_e]) and its router as a module holding a [E, H] weight, where version 4 had a
linear layer per expert (``gate_proj``/``up_proj``/``down_proj``, Mixtral's ``w1``/``w3``/``w2``) and a linear
``gate``. A target with an old name adapts the parameter (peft's ``target_parameters``); the gate and up
names only together, at rank 2r (one adapter over the fused weight). Qwen2-MoE's shared expert keeps its
linear layers: a target naming them adapts both."""


def lora_targets(target_modules: str | list[str] | None, model_type: str = "") -> list[str]:
    """The names LoRA adapts: ``target_modules`` as given, or for None or ``"all-linear"`` (peft's
    ``all-linear``) every linear layer of the decoder but the LM head (``LINEARS``, Qwen2-MoE's
    ``shared_expert_gate``) and, in a mixture of experts, the experts and the router (``EXPERT_TARGETS``)."""
    if target_modules not in (None, "all-linear", ["all-linear"]):
        return list(target_modules)
    shared_gate = ["shared_expert_gate"] if model_type == "qwen2_moe" else []
    return [*LINEARS, *shared_gate, *EXPERT_TARGETS.get(model_type, {})]


def count_lora_parameters(model_config: Any, r: int, target_modules: list[str] | None = None) -> int:
    """Trainable LoRA parameters, as peft (0.22) makes them: r * (in + out) per targeted linear layer, and in
    an MoE layer the adapters of the parameters ``EXPERT_TARGETS`` names (``expert_lora_parameters``).
    ``target_modules`` None (or ``"all-linear"``): the names ``lora_targets`` lists."""
    shape = model_config if isinstance(model_config, ModelShape) else ModelShape.from_config(model_config)
    if r < 1:
        raise ValueError(f"lora_r must be >= 1, got {r}")
    targets = lora_targets(target_modules, shape.model_type)
    shared_gate = {"shared_expert_gate"} if shape.shared_expert_intermediate_size else set()
    known = {*LINEARS, *shared_gate, *EXPERT_TARGETS.get(shape.model_type, {}), "lm_head", "embed_tokens"}
    unknown = sorted(set(targets) - known)
    if unknown:
        raise ValueError(
            f"lora_target_modules: {unknown} are not modules of a {shape.model_type} decoder "
            f"(known: {', '.join(sorted(known))})"
        )

    def per_layer(moe: bool) -> int:
        shapes = shape.linear_shapes(moe)
        if moe and shared_gate:
            shapes["shared_expert_gate"] = (shape.hidden_size, 1)
        linears = sum(r * sum(shapes[name]) for name in set(targets) & set(shapes))
        return linears + (expert_lora_parameters(shape, r, targets) if moe else 0)

    dense = shape.num_layers - shape.moe_layers
    layers = dense * per_layer(False) + shape.moe_layers * per_layer(True)
    edges = sum(
        r * (shape.vocab_size + shape.hidden_size) for t in ("lm_head", "embed_tokens") if t in targets
    )
    return layers + edges


def expert_lora_parameters(shape: ModelShape, r: int, targets: list[str]) -> int:
    """One MoE layer's LoRA parameters on its experts and router (``EXPERT_TARGETS``). peft adapts a stacked
    [E, out, in] parameter with A [r E, in] and B [out, r E]: r E (in + out); the router's [E, H] weight with
    A [r, H], B [E, r]. Naming only one of the fused gate and up projections is refused, as peft refuses
    it."""
    names = EXPERT_TARGETS.get(shape.model_type, {})
    adapted: dict[str, set[str]] = {}  # parameter -> the target names that adapt it
    for target in targets:
        if target in names:
            adapted.setdefault(names[target], set()).add(target)
    fused = {name for name, parameter in names.items() if parameter == "gate_up_proj"}
    if adapted.get("gate_up_proj", fused) != fused:
        given, missing = sorted(adapted["gate_up_proj"]), sorted(fused - adapted["gate_up_proj"])
        raise ValueError(
            f"lora_target_modules: {given} without {missing}: in a {shape.model_type} MoE layer they are one "
            "fused parameter (experts.gate_up_proj), which peft adapts only when both are named"
        )
    return sum(sum(a * b for a, b in adapters) for adapters in _expert_adapters(shape, r, adapted).values())


def adapted_expert_parameters(shape: ModelShape, target_modules: list[str] | None) -> int:
    """Elements of the parameters LoRA adapts in one MoE layer (``EXPERT_TARGETS``): the experts' stacked
    gate/up [E, 2 I_e, H] and down [E, H, I_e], the router's [E, H]. peft computes each merged W + B A in
    every forward of the layer (a parametrization), and the backward keeps it."""
    h, e, i = shape.hidden_size, shape.num_experts, shape.expert_intermediate_size
    sizes = {"gate_up_proj": e * 2 * i * h, "down_proj": e * h * i, "router": e * h}
    return sum(sizes[parameter] for parameter in _adapted_in_moe_layer(shape, target_modules))


def _adapted_in_moe_layer(shape: ModelShape, target_modules: list[str] | None) -> set[str]:
    """The MoE-layer parameters (gate_up_proj, down_proj, router) ``target_modules`` adapts; none in a dense
    model."""
    names = EXPERT_TARGETS.get(shape.model_type, {}) if shape.is_moe else {}
    return {names[t] for t in lora_targets(target_modules, shape.model_type) if t in names}


def _expert_adapters(shape: ModelShape, r: int, adapted: Iterable[str]) -> dict[str, list[tuple[int, int]]]:
    """The shapes of A and B of each adapted MoE-layer parameter (gate_up_proj, down_proj, router)."""
    h, e, i = shape.hidden_size, shape.num_experts, shape.expert_intermediate_size
    shapes = {
        "gate_up_proj": [(2 * r * e, h), (2 * i, 2 * r * e)],  # rank 2r: gate and up, one adapter
        "down_proj": [(r * e, i), (h, r * e)],
        "router": [(r, h), (e, r)],
    }
    return {parameter: shapes[parameter] for parameter in adapted}


def largest_lora_tensor(shape: ModelShape, r: int, target_modules: list[str] | None) -> int:
    """Elements of the largest adapter tensor peft makes: a linear layer's A [r, in] or B [out, r] (the
    largest linear of a layer, whether targeted or not), or an adapted MoE parameter's
    (``EXPERT_TARGETS``)."""
    largest = r * max(max(s) for s in shape.linear_shapes().values())
    adapted = _adapted_in_moe_layer(shape, target_modules)
    tensors = [a * b for adapters in _expert_adapters(shape, r, adapted).values() for a, b in adapters]
    return max([largest, *tensors])

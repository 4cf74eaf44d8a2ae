"""Loading the policy to train and its tokenizer: TRL's ``model_init_kwargs``, gradient checkpointing, PEFT
adapters, ``disable_dropout``, ``cast_lm_head_to_fp32``, oneDNN's float32 linears, ``lean_activations``."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, PreTrainedModel

from grpokit.data.integrity import InputError, check_model_dir
from grpokit.models.cpu_linear import use_onednn_linears
from grpokit.models.lean_layers import use_lean_layers
from grpokit.models.loading import load_processor, load_tokenizer
from grpokit.models.vision import VISION_MODULE_NAMES, is_vision_language, vision_modules

__all__ = [
    "FP32_HEAD",
    "PolicyOptions",
    "cast_lm_head_to_fp32",
    "check_model_source",
    "check_special_tokens",
    "check_target_modules",
    "disable_dropout",
    "enable_gradient_checkpointing",
    "exclude_vision_modules",
    "is_checkpointing",
    "load_policy",
    "model_init_kwargs",
    "peft_parameter_targets",
    "processing_class_of",
    "tokenizer_of",
]


class PolicyOptions(Protocol):
    """The fields of ``GRPOConfig`` that say how the policy loads."""

    model_init_kwargs: dict[str, Any] | None
    trust_remote_code: bool
    gradient_checkpointing: bool
    lean_activations: bool
    gradient_checkpointing_kwargs: dict[str, Any] | None
    disable_dropout: bool
    cast_lm_head_to_fp32: bool
    freeze_vision_tower: bool | None


def check_model_source(model: str | Path | torch.nn.Module) -> None:
    """A model given as a local path must exist and be whole (a hub id is left to ``from_pretrained``): a
    clear error naming ``model`` instead of the hub client's complaint about repo ids or a JSON traceback."""
    if not isinstance(model, (str, Path)):
        return
    text = str(model)
    looks_like_path = isinstance(model, Path) or text.startswith(("/", ".", "~")) or text.count("/") > 1
    if looks_like_path and not Path(text).expanduser().exists():
        raise InputError(
            f"model: {text!r} does not exist; give a model directory (config.json and weights) or a hub id "
            "such as 'Qwen/Qwen2.5-0.5B-Instruct'"
        )
    check_model_dir(text, "model")  # a damaged config.json or weights file: named, before from_pretrained


def check_special_tokens(tokenizer: Any) -> None:
    """Generation must know where a completion ends and how to pad: a pad token, else the EOS token as
    padding (set here); neither is refused."""
    if tokenizer.pad_token_id is None and tokenizer.eos_token_id is None:
        raise InputError(
            "processing_class: the tokenizer has neither a pad nor an EOS token; set tokenizer.eos_token "
            "(where a completion ends) before training"
        )
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token


def processing_class_of(model: str | Path | torch.nn.Module, trust_remote_code: bool = False) -> Any:
    """What prepares the policy's inputs, saved with ``model``: a vision-language model's processor
    (``AutoProcessor``: its tokenizer, image processor and chat template; the tokenizer with a pad token),
    else :func:`tokenizer_of`."""
    check_model_source(model)
    source = model if isinstance(model, (str, Path)) else getattr(model, "name_or_path", None)
    config = getattr(model, "config", None)
    if config is None and source:
        config = AutoConfig.from_pretrained(str(source), trust_remote_code=trust_remote_code)
    if config is None or not is_vision_language(config):
        return tokenizer_of(model, trust_remote_code)
    if not source:
        raise InputError("processing_class is required when model is an in-memory module without a path")
    processor = load_processor(str(source), trust_remote_code=trust_remote_code)
    check_special_tokens(processor.tokenizer)
    return processor


def tokenizer_of(model: str | Path | torch.nn.Module, trust_remote_code: bool = False) -> Any:
    """The tokenizer saved with the policy ``model`` (a path/hub id, or a model whose config names its
    path), loaded by :func:`grpokit.models.loading.load_tokenizer`, with a pad token."""
    check_model_source(model)
    source = model if isinstance(model, (str, Path)) else getattr(model, "name_or_path", None)
    if not source:
        raise InputError("processing_class is required when model is an in-memory module without a path")
    tokenizer = load_tokenizer(str(source), trust_remote_code=trust_remote_code)
    check_special_tokens(tokenizer)
    return tokenizer


def model_init_kwargs(args: PolicyOptions) -> dict[str, Any]:
    """``from_pretrained`` keyword arguments: ``args.model_init_kwargs`` with ``dtype`` (or TRL's older
    ``torch_dtype``) as a torch dtype (``"auto"`` kept; default float32), "true"/"false" as booleans, and
    ``trust_remote_code`` when the config's field says so."""
    kwargs: dict[str, Any] = {"trust_remote_code": True} if args.trust_remote_code else {}
    for key, value in (args.model_init_kwargs or {}).items():
        if isinstance(value, str) and value.lower() in ("true", "false"):
            value = value.lower() == "true"
        kwargs["dtype" if key == "torch_dtype" else key] = value
    dtype = kwargs.get("dtype", torch.float32)
    if isinstance(dtype, str) and dtype != "auto":
        resolved = getattr(torch, dtype.removeprefix("torch."), None)
        if not isinstance(resolved, torch.dtype):
            raise InputError(f"model_init_kwargs: dtype {dtype!r} is not a torch dtype ('bfloat16', 'auto')")
        dtype = resolved
    kwargs["dtype"] = dtype
    return kwargs


def disable_dropout(model: torch.nn.Module) -> None:
    """p = 0 for every ``nn.Dropout``, and 0.0 for every float attribute named ``*dropout*`` of a module or of
    the model's config (attention layers keep their rate as a plain attribute, e.g. ``attention_dropout``)."""
    config = getattr(model, "config", None)
    for holder in [*model.modules(), *([config] if config is not None else [])]:
        if isinstance(holder, torch.nn.Dropout):
            holder.p = 0.0
        for name, value in list(vars(holder).items()):
            if "dropout" in name and isinstance(value, float):
                setattr(holder, name, 0.0)


FP32_HEAD = "_grpokit_fp32_head"
"""Attribute set (True) on an LM head made float32 by :func:`cast_lm_head_to_fp32`: the training forward
(``grpokit.train.lm_head``) then computes its logits in float32 even under autocast."""


def cast_lm_head_to_fp32(model: torch.nn.Module) -> None:
    """TRL's ``cast_lm_head_to_fp32`` (ScaleRL): the LM head's weight (and bias) become float32 and its input
    is cast to the weight's dtype, so the logits are computed in float32 whatever the model's dtype. A head
    tied to the input embeddings (Gemma) shares their weight, which becomes float32 too: the embeddings'
    output is cast back to the model's dtype. A head carrying a PEFT adapter is refused (as TRL)."""
    head = model.get_output_embeddings()
    if head is None or not isinstance(getattr(head, "weight", None), torch.Tensor):
        raise InputError("GRPOConfig.cast_lm_head_to_fp32=True: the model has no LM head with a weight")
    if hasattr(head, "base_layer"):  # a PEFT tuner layer
        raise InputError(
            "GRPOConfig.cast_lm_head_to_fp32=True is not supported when the LM head carries a PEFT adapter: "
            "remove lm_head from the adapter's target_modules, or set cast_lm_head_to_fp32=False"
        )
    dtype = head.weight.dtype
    embed = model.get_input_embeddings()
    tied = embed is not None and getattr(embed, "weight", None) is head.weight
    head.float()
    head.register_forward_pre_hook(_input_to_weight_dtype)
    if tied and dtype != torch.float32:
        embed.register_forward_hook(_OutputTo(dtype))
    setattr(head, FP32_HEAD, True)


def _input_to_weight_dtype(module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Forward pre-hook: the hidden states in the head's weight dtype (float32), the other inputs as given."""
    return (args[0].to(module.weight.dtype), *args[1:])


class _OutputTo:
    """Forward hook: the module's output in ``dtype`` (a tied embedding made float32 with its head keeps
    feeding the decoder in the model's dtype). A class, so that ``copy.deepcopy`` of the model (the
    reference) keeps working."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype

    def __call__(self, module: torch.nn.Module, args: Any, output: torch.Tensor) -> torch.Tensor:
        return output.to(self.dtype)


def enable_gradient_checkpointing(model: torch.nn.Module, kwargs: dict[str, Any] | None = None) -> None:
    """Checkpoint every decoder layer (non-reentrant, so the shared-prefix forward stays exact)."""
    kwargs = {**(kwargs or {}), "use_reentrant": False}
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise InputError(f"gradient_checkpointing: {type(model).__name__} does not support it")
    enable = getattr(model, "activation_checkpointing_enable", None)  # transformers >= 5.x
    if enable is not None:
        enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.config.use_cache = False


def is_checkpointing(model: torch.nn.Module) -> bool:
    """Whether ``model``'s layers are activation-checkpointed: ``is_activation_checkpointing`` where
    transformers has it (5.x; its older name ``is_gradient_checkpointing`` warns there and goes in 6)."""
    missing = object()
    checkpointing = getattr(model, "is_activation_checkpointing", missing)
    if checkpointing is missing:
        checkpointing = getattr(model, "is_gradient_checkpointing", False)
    return bool(checkpointing)


def check_target_modules(model: torch.nn.Module, peft_config: Any) -> None:
    """Refuse LoRA target module names that match no module of ``model``, listing the linear ones it has.
    (A regular expression or ``"all-linear"`` is left to peft.) Names peft maps onto a mixture of experts'
    parameters (``peft_parameter_targets``) are not modules; what peft refuses there is refused here."""
    targets = getattr(peft_config, "target_modules", None)
    if not targets or isinstance(targets, str):
        return
    targets = sorted(set(targets) - peft_parameter_targets(model, peft_config))
    names = [name for name, _ in model.named_modules()]
    missing = [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        linear = sorted(
            {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
        )
        raise InputError(
            f"peft_config.target_modules: {', '.join(map(repr, sorted(missing)))} match no module of "
            f"{type(model).__name__}; its linear modules are: {', '.join(linear)}"
        )


def peft_parameter_targets(model: torch.nn.Module, peft_config: Any) -> set[str]:
    """The target names peft turns into parameter targets for ``model`` (peft >= 0.21 on a transformers-5
    mixture of experts, whose experts are stacked parameters: ``gate_proj``/``up_proj``/``down_proj`` onto
    ``experts.gate_up_proj``/``down_proj``, ``gate`` onto the router's weight), as peft's own conversion
    finds them; empty where peft converts nothing. Its refusals (half of a fused gate/up pair) are raised
    as an ``InputError`` naming the field."""
    import copy

    try:
        from peft.utils.transformers_weight_conversion import convert_peft_config_for_transformers
    except ImportError:  # an older peft: no conversion
        return set()
    converted = copy.deepcopy(peft_config)
    converted.target_modules = set(peft_config.target_modules)
    try:
        convert_peft_config_for_transformers(converted, model, None)
    except ValueError as err:
        raise InputError(f"peft_config.target_modules: {err}") from err
    return set(peft_config.target_modules) - set(converted.target_modules or ())


def exclude_vision_modules(peft_config: Any) -> Any:
    """A copy of ``peft_config`` whose ``exclude_modules`` also covers the vision encoder (a module path
    through one of ``VISION_MODULE_NAMES``)."""
    import copy

    if not hasattr(peft_config, "exclude_modules"):
        raise InputError("freeze_vision_tower needs a peft config with exclude_modules (peft >= 0.14)")
    vision = rf".*\.({'|'.join(VISION_MODULE_NAMES)})\..*"
    excluded = peft_config.exclude_modules
    if isinstance(excluded, str):
        pattern = f"(?:{excluded})|(?:{vision})"
    elif excluded:  # names: matched as suffixes by peft; kept as alternatives of one expression
        names = "|".join(rf"(?:.*\.)?{name}" for name in excluded)
        pattern = f"(?:{names})|(?:{vision})"
    else:
        pattern = vision
    updated = copy.copy(peft_config)
    updated.exclude_modules = pattern
    return updated


def vision_tower_frozen(freeze_vision_tower: bool | None, uses_peft: bool) -> bool:
    """Whether a vision-language policy's encoder stays fixed: ``freeze_vision_tower`` when set; None: with
    PEFT (adapters on the language model only), not in full fine-tuning (TRL's: every weight trains)."""
    return uses_peft if freeze_vision_tower is None else freeze_vision_tower


def load_policy(
    model: str | Path | torch.nn.Module, args: PolicyOptions, peft_config: Any = None
) -> torch.nn.Module:
    """A causal LM from a path / hub id (``from_pretrained`` with ``args.model_init_kwargs``; float32 weights
    unless they name a ``dtype``; accelerate handles mixed precision) or the module as given."""
    if isinstance(model, (str, Path)):
        check_model_source(model)
        remote = {"trust_remote_code": True} if args.trust_remote_code else {}
        vision = is_vision_language(AutoConfig.from_pretrained(str(model), **remote))
        auto = AutoModelForImageTextToText if vision else AutoModelForCausalLM
        policy = auto.from_pretrained(str(model), **model_init_kwargs(args))
    elif isinstance(model, (PreTrainedModel, torch.nn.Module)):
        policy = model
    else:
        raise TypeError(f"model: expected a path, a hub id or a PreTrainedModel, got {type(model).__name__}")
    frozen_vision = is_vision_language(policy) and vision_tower_frozen(
        getattr(args, "freeze_vision_tower", None), peft_config is not None
    )
    if frozen_vision:
        for module in vision_modules(policy):
            module.requires_grad_(False)
    if args.gradient_checkpointing:
        enable_gradient_checkpointing(policy, args.gradient_checkpointing_kwargs)
    if peft_config is not None:
        try:
            from peft import get_peft_model
        except ImportError as err:
            raise ImportError("peft_config needs `pip install grpokit[peft]`") from err
        check_target_modules(policy, peft_config)
        if frozen_vision:  # no adapter inside the vision encoder
            peft_config = exclude_vision_modules(peft_config)
        policy = get_peft_model(policy, peft_config)
    if args.disable_dropout:  # after PEFT, so adapter dropout (lora_dropout) goes too
        disable_dropout(policy)
    if getattr(args, "cast_lm_head_to_fp32", False):
        cast_lm_head_to_fp32(policy)
    use_onednn_linears(policy)  # float32 products through oneDNN on x86 CPUs (after PEFT: its base layers)
    if getattr(args, "lean_activations", False):  # after PEFT: an adapted MLP keeps its own forward
        use_lean_layers(policy)
    return policy

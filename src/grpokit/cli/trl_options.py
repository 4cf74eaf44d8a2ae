"""TRL's script options in ``grpokit train``: beside ``GRPOConfig``'s fields, a TRL user's YAML (``trl grpo
--config grpo.yaml``) and flags hold those of TRL's ``ScriptArguments`` (``GRPOScriptArguments``),
``ModelConfig`` and ``DatasetMixtureConfig``. Each is mapped to ``grpokit train``'s option of the same
meaning, or refused with the reason when it asks for something grpokit does not do; all are checked at
once, field by field:

* ``model_name_or_path`` -> ``model``; ``dataset_name`` -> ``dataset`` (``dataset_config``,
  ``dataset_train_split``, ``dataset_test_split`` are the same names);
* ``reward_model_name_or_path`` -> the first of ``reward_funcs`` (TRL's script puts it first);
* ``dtype`` (``torch_dtype``), ``attn_implementation``, ``model_revision`` -> ``model_init_kwargs``'s
  ``dtype``, ``attn_implementation``, ``revision``;
* ``use_peft``, ``lora_r``, ``lora_alpha``, ``lora_dropout``, ``lora_target_modules``: the same names;
* the others (``DEFAULT_ONLY``): accepted at TRL's default, refused otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from grpokit.data.integrity import InputError

__all__ = ["DEFAULT_ONLY", "MODEL_INIT", "RENAMED", "TRL_SCRIPT_OPTIONS", "from_trl_script_options"]

RENAMED = {"model_name_or_path": "model", "dataset_name": "dataset"}
"""TRL's name -> ``grpokit train``'s option of the same meaning."""

MODEL_INIT = {"dtype": "dtype", "torch_dtype": "dtype", "attn_implementation": "attn_implementation",
              "model_revision": "revision"}  # fmt: skip
"""``ModelConfig`` fields TRL's script passes to ``from_pretrained``: keys of ``model_init_kwargs``."""

_QUANTISED = "quantised (bitsandbytes) policies are not supported; load bfloat16 weights and train LoRA"
_PEFT = "grpokit's LoRA takes lora_r, lora_alpha, lora_dropout and lora_target_modules"
DEFAULT_ONLY: dict[str, tuple[Any, str]] = {
    "dataset_streaming": (False, "grpokit reads the training rows into memory"),
    "streaming": (False, "grpokit reads the training rows into memory"),
    "datasets": ([], "data set mixtures are not supported: give one dataset (a file, folder or name)"),
    "test_split_size": (None, "give the held-out rows as eval_dataset"),
    "ignore_bias_buffers": (False, "a DDP option for boolean buffers; grpokit wraps the policy itself"),
    "lora_target_parameters": (None, _PEFT),
    "lora_modules_to_save": (None, _PEFT),
    "lora_task_type": ("CAUSAL_LM", "the policy is a causal LM"),
    "use_rslora": (False, _PEFT),
    "use_dora": (False, _PEFT),
    "load_in_8bit": (False, _QUANTISED),
    "load_in_4bit": (False, _QUANTISED),
    "bnb_4bit_quant_type": ("nf4", _QUANTISED),
    "use_bnb_nested_quant": (False, _QUANTISED),
    "bnb_4bit_quant_storage": (None, _QUANTISED),
}
"""TRL's script options grpokit accepts only at TRL's default, with the reason (a no-op otherwise)."""

TRL_SCRIPT_OPTIONS = frozenset({*RENAMED, "reward_model_name_or_path", *MODEL_INIT, *DEFAULT_ONLY})
"""Every option of TRL's script dataclasses that ``grpokit train`` does not have by the same name."""

_WORDS = {"true": True, "false": False, "yes": True, "no": False, "1": True, "0": False}


def from_trl_script_options(values: Mapping[str, Any], source: str) -> dict[str, Any]:
    """``values`` with TRL's script options turned into ``grpokit train``'s (see the module docstring); every
    refusal at once, naming ``source`` (the YAML file or the command line) and each field."""
    out = {k: v for k, v in values.items() if k not in TRL_SCRIPT_OPTIONS}
    refused = [
        f"{name}={values[name]!r} ({why})"
        for name, (default, why) in DEFAULT_ONLY.items()
        if name in values and not _same(values[name], default)
    ]
    for trl_name, name in RENAMED.items():
        if trl_name in values:
            if name in values and values[name] != values[trl_name]:
                refused.append(f"{trl_name}={values[trl_name]!r} and {name}={values[name]!r} (give one)")
            out[name] = values[trl_name]
    if values.get("reward_model_name_or_path"):  # TRL's script scores with it first
        out["reward_funcs"] = [values["reward_model_name_or_path"], *(values.get("reward_funcs") or [])]
    init = {MODEL_INIT[k]: v for k, v in values.items() if k in MODEL_INIT and v is not None}
    init = {k: v for k, v in init.items() if (k, v) != ("revision", "main")}  # (from_pretrained's own)
    if init:
        out["model_init_kwargs"] = {**init, **dict(values.get("model_init_kwargs") or {})}
    if refused:
        raise InputError(
            f"{source}: TRL's option(s) {'; '.join(refused)} cannot be honoured by grpokit train"
        )
    return out


def _same(value: Any, default: Any) -> bool:
    if isinstance(default, bool) and isinstance(value, str) and value.strip().lower() in _WORDS:
        return _WORDS[value.strip().lower()] is default
    if isinstance(default, list):
        return value in (None, [], ())
    return value == default

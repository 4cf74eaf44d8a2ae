"""Loading the policy and tokenizer, and choosing the generation backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from grpokit.config import GRPOConfig
from grpokit.models.loading import load_tokenizer as load_saved_tokenizer
from grpokit.rollout.base import RolloutBackend
from grpokit.rollout.hf import TransformersBackend


def load_tokenizer(model: str | Path | torch.nn.Module) -> Any:
    """The tokenizer saved with ``model`` (a path/hub id, or a model whose config names its path)."""
    source = model if isinstance(model, (str, Path)) else getattr(model, "name_or_path", None)
    if not source:
        raise ValueError("processing_class is required when model is an in-memory module without a path")
    tokenizer = load_saved_tokenizer(str(source))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_policy(
    model: str | Path | torch.nn.Module, args: GRPOConfig, peft_config: Any = None
) -> torch.nn.Module:
    """A causal LM from a path / hub id (float32 weights; accelerate handles mixed precision) or as given."""
    if isinstance(model, (str, Path)):
        policy = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32)
    elif isinstance(model, (PreTrainedModel, torch.nn.Module)):
        policy = model
    else:
        raise TypeError(f"model: expected a path, a hub id or a PreTrainedModel, got {type(model).__name__}")
    if args.gradient_checkpointing:
        policy.gradient_checkpointing_enable()
        policy.config.use_cache = False
    if peft_config is not None:
        try:
            from peft import get_peft_model
        except ImportError as err:
            raise ImportError("peft_config needs `pip install grpokit[peft]`") from err
        policy = get_peft_model(policy, peft_config)
    return policy


def make_backend(model: torch.nn.Module, args: GRPOConfig) -> RolloutBackend:
    """The generation backend named by ``args.generation_backend``."""
    if args.generation_backend == "transformers":
        return TransformersBackend(model, micro_batch_size=args.generation_micro_batch_size)
    from grpokit.rollout.fast import FastSampler

    return FastSampler(model)

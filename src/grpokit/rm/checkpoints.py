"""Reward-model checkpoints: a tiny reward model built locally, loading any checkpoint with a one-logit head,
saving the standard ``transformers`` directory that ``grpokit train-rm`` writes, and telling its kind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from grpokit.models import verifier
from grpokit.models.loading import load_tokenizer
from grpokit.rewards.process_rewards.steps import DEFAULT_STEP_DELIMITER
from grpokit.rm.samples import check_kind
from grpokit.rm.training import classifier_pad_id

__all__ = [
    "build_tiny_reward_model",
    "freeze_bottom",
    "load_reward_model",
    "reward_model_kind",
    "save_reward_model",
]


def _model_class(kind: str):
    from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification

    return AutoModelForSequenceClassification if kind == "outcome" else AutoModelForTokenClassification


def build_tiny_reward_model(
    tokenizer: Any,
    kind: str = "process",
    *,
    arch: str = "qwen2",
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    max_position_embeddings: int = 256,
    seed: int = 0,
) -> torch.nn.Module:
    """A randomly initialised tiny reward model (the backbone config of ``grpokit.models.tiny``) with a
    one-logit head: sequence classification (outcome) or token classification (process)."""
    check_kind(kind)
    from grpokit.models.tiny import build_tiny_model

    config = build_tiny_model(
        tokenizer,
        arch=arch,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        max_position_embeddings=max_position_embeddings,
        seed=seed,
    ).config
    config.num_labels = 1
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = _model_class(kind).from_config(config, dtype=torch.float32)
    model.config.pad_token_id = tokenizer.pad_token_id
    return model


def load_reward_model(
    path: str, kind: str, *, extra_layers: int = 0, policy_features: bool = False
) -> tuple[torch.nn.Module, Any]:
    """(model, tokenizer) from a directory. A checkpoint that already has the right head is loaded as is; any
    other (e.g. a causal LM policy) gets a new one-logit head on its backbone, and with ``extra_layers`` that
    many new transformer layers (randomly initialised from torch's generator, as ``transformers`` initialises
    missing weights) between its last layer and the head. ``policy_features`` (a causal LM only): a policy
    verifier instead (:mod:`grpokit.models.verifier`): the frozen policy, what it predicted at every token,
    and ``extra_layers`` new layers judging from both."""
    check_kind(kind)
    from transformers import AutoConfig

    if extra_layers < 0:
        raise ValueError(f"extra_layers must be >= 0, got {extra_layers}")
    config = AutoConfig.from_pretrained(path)
    if policy_features:
        from transformers import AutoModelForCausalLM

        if not any(a.endswith("ForCausalLM") for a in (getattr(config, "architectures", None) or [])):
            raise ValueError(f"policy_features: {path} is not a causal LM (a policy) to read predictions of")
        if extra_layers < 1:
            raise ValueError("policy_features: the verifier needs extra_layers >= 1 to judge the features")
        policy = AutoModelForCausalLM.from_pretrained(path)
        model = verifier.build_policy_verifier(policy, kind, extra_layers=extra_layers)
        tokenizer = load_tokenizer(path)
        classifier_pad_id(model, tokenizer)
        return model, tokenizer
    suffix = "ForSequenceClassification" if kind == "outcome" else "ForTokenClassification"
    has_head = any(a.endswith(suffix) for a in (getattr(config, "architectures", None) or []))
    if has_head and extra_layers:
        raise ValueError(
            f"extra_layers: {path} is already a {kind} reward model; new layers go on a backbone (e.g. the "
            "policy), not on a trained reward model"
        )
    if has_head:
        model = _model_class(kind).from_pretrained(path)
    else:
        config.num_labels = 1
        if extra_layers:
            layers = config.num_hidden_layers
            config.num_hidden_layers = layers + extra_layers
            kinds = getattr(config, "layer_types", None)
            if isinstance(kinds, list) and len(kinds) == layers:  # per-layer attention kinds, one more each
                config.layer_types = kinds + [kinds[-1]] * extra_layers
        model = _model_class(kind).from_pretrained(path, config=config)
    tokenizer = load_tokenizer(path)
    classifier_pad_id(model, tokenizer)
    return model, tokenizer


def freeze_bottom(model: torch.nn.Module, num_layers: int) -> None:
    """Freeze a reward model's input embeddings and its first ``num_layers`` transformer layers; the layers
    above, the final norm and the head train. Recorded in ``config.grpokit_frozen_layers``, so a saved model
    keeps them frozen when it trains again (``IterativeRewardModel``). A policy verifier keeps its policy
    frozen (its ``config.freeze_policy``) and has no other layers to freeze: ``num_layers`` must be 0."""
    model.requires_grad_(True)
    if verifier.is_policy_verifier(model):
        if num_layers:
            raise ValueError("a policy verifier freezes its whole policy (freeze_policy), not some layers")
        model.policy.requires_grad_(not model.config.freeze_policy)
        return
    if num_layers:
        layers = getattr(getattr(model, "base_model", None), "layers", None)
        if layers is None:
            raise ValueError(f"{type(model).__name__} has no base_model.layers to freeze")
        if not 0 < num_layers <= len(layers):
            raise ValueError(f"can freeze 0 to {len(layers)} layers of this model, got {num_layers}")
        model.get_input_embeddings().requires_grad_(False)
        for layer in layers[:num_layers]:
            layer.requires_grad_(False)
    model.config.grpokit_frozen_layers = num_layers


def save_reward_model(
    model: torch.nn.Module,
    tokenizer: Any,
    output_dir: str | Path,
    *,
    kind: str,
    delimiter: str = DEFAULT_STEP_DELIMITER,
) -> Path:
    """Save a standard ``transformers`` checkpoint (model + tokenizer). The config also records
    ``grpokit_reward_kind`` and, for process models, ``step_delimiter`` (read by ``ProcessRewardModel``)."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.config.grpokit_reward_kind = kind
    if kind == "process":
        model.config.step_delimiter = delimiter
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def reward_model_kind(path: str | Path) -> str:
    """``"process"`` or ``"outcome"`` for a reward-model checkpoint: ``grpokit_reward_kind`` in its config
    (written by ``grpokit train-rm``), else its architecture (token / sequence classification)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(path))
    kind = getattr(config, "grpokit_reward_kind", None)
    if kind in ("outcome", "process"):
        return kind
    architectures = getattr(config, "architectures", None) or []
    if any(a.endswith("ForTokenClassification") for a in architectures):
        return "process"
    if any(a.endswith("ForSequenceClassification") for a in architectures):
        return "outcome"
    raise ValueError(
        f"{path}: not a reward model (no grpokit_reward_kind and architectures {architectures}); train one "
        "with `grpokit train-rm`"
    )

"""A mixture-of-experts policy's load-balancing loss, as ``transformers`` adds it and TRL keeps it in GRPO.

An MoE causal LM (Mixtral, Qwen2-MoE, Qwen3-MoE, GPT-OSS, ...) declares ``output_router_logits`` and
``router_aux_loss_coef`` in its config; its own ``forward`` adds ``router_aux_loss_coef * aux`` to the loss,
``aux`` the Switch Transformer load-balancing loss of the routers' logits over the attended tokens
(``load_balancing_loss_func`` in the model's ``transformers`` module). TRL adds the same term to the GRPO
loss (``router_aux_loss_coef``: None takes the config's coefficient, 0 turns it off). grpokit runs the
backbone itself (``grpokit.train.forward``), so it asks the backbone for the router logits and calls the
model's own function on them: :class:`RouterLoss`.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from grpokit.models.parts import hf_model

__all__ = ["RouterLoss", "is_mixture_of_experts", "router_loss_for"]

logger = logging.getLogger("grpokit")


@dataclass(frozen=True)
class RouterLoss:
    """``coefficient * loss_function(router_logits, num_experts, top_k, attention_mask)``: the policy's
    load-balancing term, computed by its own ``transformers`` function."""

    coefficient: float
    num_experts: int
    top_k: int
    loss_function: Callable[..., torch.Tensor]

    def __call__(self, router_logits: tuple[torch.Tensor, ...], attention_mask: torch.Tensor) -> torch.Tensor:
        """The load-balancing loss (without the coefficient). router_logits: one [B * T, E] per MoE layer;
        attention_mask [B, T]: the tokens that were routed."""
        return self.loss_function(router_logits, self.num_experts, self.top_k, attention_mask)


def is_mixture_of_experts(config: Any) -> bool:
    """Whether a model config (a multimodal model's text config) is a mixture of experts': it declares
    ``output_router_logits``."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return hasattr(text, "output_router_logits")


def router_loss_for(model: torch.nn.Module, coefficient: float | None) -> RouterLoss | None:
    """The load-balancing loss a run adds for ``model`` (a causal LM, possibly a PEFT model), or None.

    ``coefficient`` (``GRPOConfig.router_aux_loss_coef``): None takes the model config's (0 when it declares
    none), 0 turns it off. A non-zero value for a model that returns no router logits is refused (TRL's
    rule); an MoE model whose ``transformers`` module has no load-balancing function trains without it,
    with a warning."""
    causal = hf_model(model)
    config = causal.config.get_text_config() if hasattr(causal.config, "get_text_config") else causal.config
    coef = getattr(config, "router_aux_loss_coef", 0.0) if coefficient is None else coefficient
    name = type(causal).__name__
    if not is_mixture_of_experts(config):
        if coefficient:
            raise ValueError(
                f"GRPOConfig.router_aux_loss_coef={coefficient} but {name} is not a mixture-of-experts model "
                "that returns its router logits, so there is no load-balancing loss to weight; leave it None"
            )
        return None
    if not coef:
        return None
    loss_function = getattr(sys.modules.get(type(causal).__module__), "load_balancing_loss_func", None)
    num_experts = _first(causal, config, ("num_experts", "num_local_experts", "n_routed_experts"))
    top_k = _first(causal, config, ("num_experts_per_tok", "num_experts_per_token", "top_k"))
    if loss_function is None or num_experts is None or top_k is None:
        logger.warning(
            "%s declares router_aux_loss_coef=%s, but its transformers module has no "
            "load_balancing_loss_func (or its expert counts are not found): grpokit trains it without the "
            "load-balancing loss",
            name, coef,
        )  # fmt: skip
        return None
    return RouterLoss(float(coef), int(num_experts), int(top_k), loss_function)


def _first(model: Any, config: Any, names: tuple[str, ...]) -> Any:
    for owner in (model, config):
        for name in names:
            value = getattr(owner, name, None)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    return None

"""A reward model that reads a policy's own predictions: the frozen policy, what it predicted at each token,
and new transformer layers that judge the completion from that.

A causal LM already knows, at every position, how likely each next token was. When it samples a wrong digit,
that digit was usually unlikely under its own prediction; a reward model built on its hidden states alone has
to re-derive that by comparing each token with the prediction made before it. This model hands it over:

    h_t      = policy's last hidden state at t                        [B, L, H]  (frozen)
    p_t      = softmax(policy's logits at t - 1)                      [B, L, V]  (frozen; t = 0: none)
    f_t      = [log p_t(x_t), log p_t(x_t) - max_v log p_t(v), entropy(p_t)] / FEATURE_SCALE   [B, L, 3]
    z_t      = h_t + W_f f_t                                          [B, L, H]
    s        = judge(z)   (``extra_layers`` new causal layers of the policy's architecture)   [B, L, H]
    logit_t  = w . s_t                                                [B, L]

Outcome (``PolicyVerifierForSequenceClassification``): the logit at each row's last non-pad token, [B, 1].
Process (``PolicyVerifierForTokenClassification``): every token's logit, [B, L, 1]. Both are ``transformers``
models registered with the ``Auto`` classes under ``model_type = "grpokit_policy_verifier"``: saved with
``save_pretrained``, loaded with ``AutoModelForSequenceClassification`` / ``AutoModelForTokenClassification``
once this module is imported (importing ``grpokit.models`` does). The policy stays frozen unless
``freeze_policy`` is off.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    PretrainedConfig,
    PreTrainedModel,
)
from transformers.modeling_outputs import SequenceClassifierOutput, TokenClassifierOutput

__all__ = [
    "FEATURE_SCALE",
    "PolicyVerifierConfig",
    "PolicyVerifierForSequenceClassification",
    "PolicyVerifierForTokenClassification",
    "build_policy_verifier",
    "is_policy_verifier",
    "token_prediction_features",
]

FEATURE_SCALE = 5.0
"""The features are divided by this, so that a log-probability of -5 (a token the policy gave ~0.7%) enters
the new layers at -1, the scale of their normalised inputs."""
NUM_FEATURES = 3


def token_prediction_features(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """What the policy predicted for each token: ``[log p(x_t), log p(x_t) - max log p, entropy]`` of the
    distribution given at ``t - 1`` (all 0 at ``t = 0``), in float32, divided by :data:`FEATURE_SCALE`.

    logits: [B, L, V] the policy's (position t predicts t + 1); input_ids: [B, L]. Returns [B, L, 3]."""
    logp = logits[:, :-1].float().log_softmax(-1)  # [B, L-1, V]: the distribution over x_1 .. x_{L-1}
    token = logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)  # [B, L-1]
    gap = token - logp.max(-1).values  # [B, L-1], <= 0; 0 where x_t was the policy's top choice
    entropy = -(logp.exp() * logp).sum(-1)  # [B, L-1]
    features = torch.stack([token, gap, entropy], -1) / FEATURE_SCALE  # [B, L-1, 3]
    return torch.nn.functional.pad(features, (0, 0, 1, 0))  # [B, L, 3]: nothing was predicted for x_0


class PolicyVerifierConfig(PretrainedConfig):
    """A policy verifier: the policy's config (``policy``, a dict), the new layers (``extra_layers``) and
    whether the policy stays frozen when the model trains (``freeze_policy``)."""

    model_type = "grpokit_policy_verifier"

    def __init__(
        self,
        policy: dict[str, Any] | None = None,
        extra_layers: int = 2,
        freeze_policy: bool = True,
        num_labels: int = 1,
        **kwargs: Any,
    ) -> None:
        self.policy = dict(policy or {})
        self.extra_layers = int(extra_layers)
        self.freeze_policy = bool(freeze_policy)
        super().__init__(num_labels=num_labels, **kwargs)

    def policy_config(self) -> PretrainedConfig:
        """The policy's own config object."""
        settings = dict(self.policy)
        return AutoConfig.for_model(settings.pop("model_type"), **settings)

    def judge_config(self) -> PretrainedConfig:
        """The new layers: the policy's architecture with ``extra_layers`` layers, fed embeddings only (a
        one-token vocabulary, no pad id)."""
        config = self.policy_config()
        config.num_hidden_layers = self.extra_layers
        kinds = getattr(config, "layer_types", None)
        if isinstance(kinds, list) and kinds:  # per-layer attention kinds: the last one for each new layer
            config.layer_types = [kinds[-1]] * self.extra_layers
        config.vocab_size, config.pad_token_id = 1, None
        config.tie_word_embeddings = False
        return config


class _PolicyVerifier(PreTrainedModel):
    config_class = PolicyVerifierConfig
    base_model_prefix = "verifier"
    _supports_sdpa = True

    def __init__(self, config: PolicyVerifierConfig) -> None:
        super().__init__(config)
        if config.extra_layers < 1:
            raise ValueError(f"a policy verifier needs extra_layers >= 1, got {config.extra_layers}")
        self.policy = AutoModelForCausalLM.from_config(config.policy_config())
        self.judge = AutoModel.from_config(config.judge_config())
        hidden = self.judge.config.hidden_size
        self.features = torch.nn.Linear(NUM_FEATURES, hidden, bias=False)
        self.score = torch.nn.Linear(hidden, config.num_labels, bias=False)
        self.post_init()
        torch.nn.init.normal_(self.features.weight, std=0.02)
        torch.nn.init.normal_(self.score.weight, std=0.02)
        if config.freeze_policy:
            self.policy.requires_grad_(False)

    def _init_weights(self, module: torch.nn.Module) -> None:
        """Nothing: the policy and the new layers are initialised by their own classes (``from_config``),
        the feature projection and the head in ``__init__``; a loaded checkpoint has every weight."""

    def token_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """[B, L, num_labels]: the logits of every token."""
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.config.freeze_policy):
            out = self.policy(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
            hidden = out.hidden_states[-1]  # [B, L, H], after the policy's final norm
            features = token_prediction_features(out.logits, input_ids)  # [B, L, 3]
        embeds = hidden + self.features(features.to(hidden.dtype))  # [B, L, H]
        judged = self.judge(inputs_embeds=embeds, attention_mask=attention_mask)
        return self.score(judged.last_hidden_state)  # [B, L, num_labels]


class PolicyVerifierForTokenClassification(_PolicyVerifier):
    """Process reward model: one logit per token (``logits`` [B, L, 1])."""

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs: Any
    ) -> TokenClassifierOutput:
        return TokenClassifierOutput(logits=self.token_logits(input_ids, attention_mask))


class PolicyVerifierForSequenceClassification(_PolicyVerifier):
    """Outcome reward model: the logit at each row's last non-pad token (``logits`` [B, 1])."""

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs: Any
    ) -> SequenceClassifierOutput:
        logits = self.token_logits(input_ids, attention_mask)  # [B, L, 1]
        if attention_mask is None:
            pad = self.config.pad_token_id
            attention_mask = (input_ids != pad) if pad is not None else torch.ones_like(input_ids)
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)  # [L]
        last = (attention_mask.bool() * positions).argmax(-1)  # [B]: the rightmost kept token
        return SequenceClassifierOutput(logits=logits[torch.arange(len(last), device=last.device), last])


_CLASSES = {
    "outcome": PolicyVerifierForSequenceClassification,
    "process": PolicyVerifierForTokenClassification,
}

AutoConfig.register(PolicyVerifierConfig.model_type, PolicyVerifierConfig, exist_ok=True)
AutoModelForSequenceClassification.register(PolicyVerifierConfig, _CLASSES["outcome"], exist_ok=True)
AutoModelForTokenClassification.register(PolicyVerifierConfig, _CLASSES["process"], exist_ok=True)


def build_policy_verifier(policy: torch.nn.Module, kind: str, *, extra_layers: int = 2) -> _PolicyVerifier:
    """A verifier of ``kind`` ("outcome" or "process") over ``policy`` (a causal LM, copied: its weights
    are loaded into the verifier's frozen copy); the new layers, feature projection and head initialised
    from torch's generator."""
    config = PolicyVerifierConfig(
        policy=policy.config.to_dict(),
        extra_layers=extra_layers,
        pad_token_id=getattr(policy.config, "pad_token_id", None),
    )
    model = _CLASSES[kind](config)
    model.policy.load_state_dict(policy.state_dict())
    return model.to(next(policy.parameters()).dtype)


def is_policy_verifier(model: torch.nn.Module) -> bool:
    """Whether ``model`` is a policy verifier (whose policy part stays frozen when it trains)."""
    return isinstance(model, _PolicyVerifier)

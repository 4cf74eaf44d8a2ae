"""Neural reward models: a frozen ``transformers`` sequence-classification model as a reward function.

    r_i = logits(prompt_i + completion_i)[label_index]      (the score head at the last non-pad token)

or, for an outcome reward model trained by ``grpokit train-rm`` (``grpokit_reward_kind: outcome`` in its
config), ``sigmoid`` of that logit: the probability it gives the completion of being right, the score the
iterative reward model gives too (``grpokit.rm.outcome_scores``). ``output`` chooses either explicitly.
Conversational rows are rendered with the tokenizer's chat template (prompt messages + the completion's
messages, no generation prompt); plain rows are the concatenation ``prompt + completion``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch

from grpokit.core import pad_right
from grpokit.data.chat import render_conversation


class RewardModel:
    """Score completions with a sequence-classification model; has the reward-function signature.

    Args:
        model: a local directory / hub id (loaded with ``AutoModelForSequenceClassification``), or a loaded
            ``PreTrainedModel`` (then pass ``tokenizer``).
        tokenizer: tokenizer or its path; default: loaded from ``model`` when that is a path.
        device: where the model runs (``RewardModel.to`` moves it later, e.g. to the trainer's device).
        batch_size: sequences scored per forward pass.
        max_length: keep at most this many tokens per sequence, dropping from the left (the completion's end,
            which the score head reads, is kept); None: no truncation.
        label_index: which logit is the reward (0 for the usual ``num_labels=1`` heads).
        output: ``"logit"`` (the raw score) or ``"prob"`` (its sigmoid); None: ``"prob"`` for a grpokit
            outcome reward model, else ``"logit"``.
        name: metric name; default: the model directory's base name, else the model class name.

    The model is frozen: ``eval()``, ``requires_grad_(False)``, scored under ``torch.inference_mode()``.
    """

    def __init__(
        self,
        model: str | os.PathLike[str] | torch.nn.Module,
        tokenizer: Any = None,
        *,
        device: str | torch.device | None = None,
        batch_size: int = 8,
        max_length: int | None = None,
        label_index: int = 0,
        dtype: torch.dtype | None = None,
        output: str | None = None,
        name: str | None = None,
    ) -> None:
        from transformers import AutoModelForSequenceClassification

        from grpokit.models.loading import load_tokenizer

        if isinstance(model, (str, os.PathLike)):
            path = os.fspath(model)
            kwargs = {"dtype": dtype} if dtype is not None else {}
            model = AutoModelForSequenceClassification.from_pretrained(path, **kwargs)
            tokenizer = tokenizer if tokenizer is not None else path
            default_name = os.path.basename(os.path.normpath(path))
        else:
            default_name = type(model).__name__
        if tokenizer is None:
            raise ValueError("RewardModel: pass a tokenizer along with a loaded model")
        if isinstance(tokenizer, (str, os.PathLike)):
            tokenizer = load_tokenizer(os.fspath(tokenizer))
        if tokenizer.pad_token_id is None:
            raise ValueError("RewardModel: the tokenizer has no pad token (set tokenizer.pad_token)")
        if getattr(model.config, "pad_token_id", None) is None:
            model.config.pad_token_id = tokenizer.pad_token_id  # the score head finds the last non-pad token
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if output is None:
            output = "prob" if getattr(model.config, "grpokit_reward_kind", None) == "outcome" else "logit"
        if output not in ("logit", "prob"):
            raise ValueError(f"RewardModel: output must be 'logit' or 'prob', got {output!r}")
        self.output = output
        self.model = model.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.max_length = max_length
        self.label_index = label_index
        self.__name__ = name or default_name
        if device is not None:
            self.to(device)

    @property
    def device(self) -> torch.device:
        """The device the model's parameters live on."""
        return next(self.model.parameters()).device

    def to(self, device: str | torch.device) -> RewardModel:
        """Move the model to ``device``; returns self."""
        self.model.to(device)
        return self

    def text(self, prompt: Any, completion: Any) -> str:
        """The scored text: chat template over prompt + completion messages, or plain concatenation."""
        try:
            return render_conversation(prompt, completion, self.tokenizer)
        except ValueError as err:
            raise ValueError(f"{self.__name__}: {err}") from None

    def _encode(self, texts: list[str]) -> dict[str, torch.Tensor]:
        """Token ids (left-truncated to ``max_length``), right-padded into a batch on the model's device."""
        ids = [self.tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
        if self.max_length is not None:
            ids = [row[-self.max_length :] for row in ids]
        input_ids, mask = pad_right(ids, self.tokenizer.pad_token_id, self.device)  # [B, T] each
        return {"input_ids": input_ids, "attention_mask": mask}

    def __call__(
        self, prompts: Sequence[Any], completions: Sequence[Any], completion_ids: Any = None, **kwargs: Any
    ) -> list[float | None]:
        """One score per completion, ``batch_size`` sequences per forward pass."""
        if len(prompts) != len(completions):
            raise ValueError(f"{self.__name__}: {len(prompts)} prompts but {len(completions)} completions")
        texts = [self.text(prompt, completion) for prompt, completion in zip(prompts, completions)]
        scores: list[float | None] = []
        with torch.inference_mode():
            for start in range(0, len(texts), self.batch_size):
                logits = self.model(**self._encode(texts[start : start + self.batch_size])).logits  # [B, L]
                values = logits[:, self.label_index].float()  # [B]
                values = torch.sigmoid(values) if self.output == "prob" else values
                scores.extend(values.cpu().tolist())
        return scores

    def __repr__(self) -> str:
        return f"RewardModel({self.__name__!r}, device={self.device})"

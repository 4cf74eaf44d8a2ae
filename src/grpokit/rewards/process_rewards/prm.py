"""A neural process reward model (PRM): a frozen ``transformers`` token classifier read at each step's end.

Model choice: ``AutoModelForTokenClassification`` with ``num_labels=1`` (one logit per token; sigmoid gives
P(step correct)). ``num_labels=2`` checkpoints work too (the score is softmax P(label 1), i.e.
sigmoid(logit_1 - logit_0)). On a decoder-only backbone (Llama, Qwen2, ...) attention is causal, so the
score at the token ending step j depends on the prompt and steps 1..j only, as a PRM should. Training:
``grpokit.rm.train_reward_model(kind="process")`` or ``grpokit train-rm --kind process``.

Input layout, shared by training and scoring (``encode_prompt_completion``): the prompt's ids followed by
the completion's ids, each tokenized on its own without special tokens (the same boundary the policy
generated across); the PRM is read at ``len(prompt_ids) + step_token_ends(...)`` for each step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from grpokit.core import pad_right
from grpokit.data.chat import completion_text, render_prompt
from grpokit.models.loading import load_tokenizer, pad_token_id
from grpokit.rewards.process_rewards.steps import DEFAULT_STEP_DELIMITER, split_steps, step_token_ends

__all__ = ["ProcessRewardModel", "encode_prompt_completion", "scalar_logits"]


def encode_prompt_completion(
    tokenizer: Any,
    prompt: str,
    completion: str,
    delimiter: str | None = DEFAULT_STEP_DELIMITER,
    max_length: int | None = None,
) -> tuple[list[int], list[int]]:
    """``(input_ids, step_positions)``: prompt ids + completion ids, and the position in ``input_ids`` of the
    token ending each step (``[]`` when ``delimiter`` is None). If longer than ``max_length`` the sequence
    is cut from the left (prompt first); a step end cut off is clamped to position 0."""
    p_ids = list(tokenizer(prompt, add_special_tokens=False)["input_ids"]) if prompt else []
    c_ids = list(tokenizer(completion, add_special_tokens=False)["input_ids"]) if completion else []
    ends = step_token_ends(completion, c_ids, tokenizer, delimiter) if delimiter is not None else []
    ids = p_ids + c_ids
    positions = [len(p_ids) + e for e in ends]
    if max_length is not None and len(ids) > max_length:
        cut = len(ids) - max_length
        ids = ids[cut:]
        positions = [max(p - cut, 0) for p in positions]
    if not ids:
        raise ValueError("prompt and completion are both empty: nothing to score")
    return ids, positions


def scalar_logits(logits: torch.Tensor) -> torch.Tensor:
    """One logit per item from a classifier head: [..., 1] -> [...]; [..., 2] -> logit_1 - logit_0."""
    if logits.shape[-1] == 1:
        return logits[..., 0]
    if logits.shape[-1] == 2:
        return logits[..., 1] - logits[..., 0]
    raise ValueError(f"reward model head must have 1 or 2 labels, got {logits.shape[-1]}")


class ProcessRewardModel:
    """A process reward function backed by a token-classification model.

    ``ProcessRewardModel("path/to/checkpoint")`` or ``ProcessRewardModel(module, tokenizer)``. Callable
    with the process-reward signature ``(prompts, completions, steps, **columns) -> list[list[float]]``:
    one score per step, sigmoid of the logit at the step's end token (``output="logit"`` for raw logits).
    The model is put in eval mode and frozen (``requires_grad_(False)``); scoring runs under
    ``torch.no_grad`` in batches of ``batch_size``. Steps are found with ``delimiter`` (default: the
    checkpoint's ``config.step_delimiter`` written by ``train-rm``, else a newline), which must be the
    delimiter the trainer uses, so scores line up with the trainer's steps (checked when ``step_spans``
    are passed).
    """

    def __init__(
        self,
        model: str | torch.nn.Module,
        tokenizer: Any | None = None,
        *,
        delimiter: str | None = None,
        batch_size: int = 16,
        max_length: int | None = None,
        output: str = "prob",
        device: str | torch.device | None = None,
        freeze: bool = True,
        name: str | None = None,
    ) -> None:
        if isinstance(model, str):
            from transformers import AutoModelForTokenClassification

            path = model
            model = AutoModelForTokenClassification.from_pretrained(path)
            if tokenizer is None:
                tokenizer = load_tokenizer(path)
            name = name or f"prm:{path.rstrip('/').split('/')[-1]}"
        if tokenizer is None:
            raise ValueError("ProcessRewardModel(module) needs the module's tokenizer")
        if output not in ("prob", "logit"):
            raise ValueError(f"output must be 'prob' or 'logit', got {output!r}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model = model
        self.tokenizer = tokenizer
        self.delimiter = delimiter or getattr(model.config, "step_delimiter", None) or DEFAULT_STEP_DELIMITER
        self.batch_size = batch_size
        self.max_length = max_length
        self.output = output
        self.__name__ = name or "prm"
        if device is not None:
            self.model.to(device)
        self.model.eval()
        if freeze:
            self.model.requires_grad_(False)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def __call__(
        self,
        prompts: Sequence[Any],
        completions: Sequence[Any],
        steps: Sequence[Sequence[str]] | None = None,
        step_spans: Sequence[Sequence[tuple[int, int]]] | None = None,
        **columns: Any,
    ) -> list[list[float]]:
        texts = [completion_text(c) for c in completions]
        if step_spans is not None:
            for i, (text, spans) in enumerate(zip(texts, step_spans)):
                if [tuple(s) for s in spans] != split_steps(text, self.delimiter):
                    raise ValueError(
                        f"{self.__name__}: completion {i} splits into different steps with the PRM's "
                        f"delimiter "
                        f"{self.delimiter!r}; use the same step delimiter for the trainer and the PRM"
                    )
        return self.score([render_prompt(p, self.tokenizer) for p in prompts], texts)

    @torch.no_grad()
    def score(self, prompts: Sequence[str], completions: Sequence[str]) -> list[list[float]]:
        """Per-step scores for text prompts and completions."""
        encoded = [
            encode_prompt_completion(self.tokenizer, p, c, self.delimiter, self.max_length)
            for p, c in zip(prompts, completions)
        ]
        pad = pad_token_id(self.tokenizer, self.model)
        out: list[list[float]] = []
        for start in range(0, len(encoded), self.batch_size):
            chunk = encoded[start : start + self.batch_size]
            ids, mask = pad_right([e[0] for e in chunk], pad)
            logits = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).logits
            values = scalar_logits(logits.float())  # [B, L]
            if self.output == "prob":
                values = torch.sigmoid(values)
            values = values.cpu()
            for b, (_, positions) in enumerate(chunk):
                out.append([float(values[b, p]) for p in positions])
        return out

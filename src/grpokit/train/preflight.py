"""Every check of a run that needs no weights, in the order ``GRPOTrainer`` runs them before any weights load
(and ``grpokit train`` before its cold start): the config itself, the output folder, the model's config read
without its weights (vocabulary, positions, LoRA targets), and how many rows a step takes. Each refusal is an
``InputError`` of one sentence naming the field, file or row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from grpokit.config import GRPOConfig
from grpokit.data.chat import render_prompt
from grpokit.data.integrity import InputError
from grpokit.data.run_folder import check_run_folder, expand_path
from grpokit.models.policy import check_model_source, check_target_modules
from grpokit.models.vision import is_vision_language

__all__ = [
    "as_config",
    "check_output_folder",
    "check_policy_fits",
    "check_rows_per_step",
    "longest_prompt",
    "model_skeleton",
    "output_folder_reads",
    "read_model_config",
    "resumes_in",
]


def as_config(args: Any) -> GRPOConfig:
    """``GRPOTrainer``'s ``args``: a GRPOConfig, None (the defaults) or a mapping of its fields."""
    if args is None:
        return GRPOConfig()
    if isinstance(args, GRPOConfig):
        return args
    if isinstance(args, Mapping):
        return GRPOConfig(**dict(args))
    raise InputError(f"args: expected a GRPOConfig (or a dict of its fields), got {type(args).__name__}")


def output_folder_reads(model: Any, *datasets: Any) -> list[str]:
    """The local paths a run reads (its model, its data files): ``overwrite_output_dir`` must keep them."""
    return [str(value) for value in (model, *datasets) if isinstance(value, (str, Path))]


def check_output_folder(
    args: GRPOConfig, reads: Sequence[str | Path] = (), *, resume_may_follow: bool = False
) -> None:
    """``args.output_dir`` may take this run: not a file, writable, holding no other run's results unless
    the run resumes them or overwrites them (``grpokit.data.run_folder``), not written by a live
    process. ``resume_may_follow``: a folder with checkpoints passes (``train(resume_from_checkpoint=...)``,
    TRL's way to resume, is only known when it is called)."""
    resume = resumes_in(args.resume_from_checkpoint, args.output_dir)
    if args.overwrite_output_dir and resume:
        raise InputError(
            "overwrite_output_dir=true would delete the checkpoint resume_from_checkpoint="
            f"{args.resume_from_checkpoint!r} resumes; give one of the two"
        )
    check_run_folder(
        args.output_dir, "train", resume=resume, overwrite=args.overwrite_output_dir, reads=reads,
        resume_may_follow=resume_may_follow and not args.resume_from_checkpoint,
    )  # fmt: skip


def resumes_in(resume: Any, output_dir: str) -> bool:
    """Whether the checkpoint ``resume`` names lies in ``output_dir`` ("latest" always does)."""
    if not resume:
        return False
    if resume is True or str(resume) == "latest":
        return True
    try:
        return Path(expand_path(str(resume))).resolve().parent == Path(output_dir).resolve()
    except OSError:
        return False


def read_model_config(model: Any, trust_remote_code: bool = False) -> Any:
    """The policy's ``transformers`` config without its weights: a module's own, or ``config.json`` of a
    path / hub id (``AutoConfig``); the path is checked first (``check_model_source``)."""
    if isinstance(model, torch.nn.Module):
        return getattr(model, "config", None)
    check_model_source(model)
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(expand_path(str(model)), trust_remote_code=trust_remote_code)
    except ValueError as error:
        if "trust_remote_code" in str(error):
            raise  # the custom-code refusal speaks for itself
        raise InputError(f"model: {model}: {str(error).splitlines()[0]}") from error
    except OSError as error:
        raise InputError(
            f"model: {model!r} is neither a model directory nor a hub id found offline or online "
            f"({str(error).splitlines()[0]})"
        ) from error


def model_skeleton(model_config: Any) -> torch.nn.Module:
    """The model's modules built on the meta device: names and shapes, no memory, no weights read."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    auto = AutoModelForImageTextToText if is_vision_language(model_config) else AutoModelForCausalLM
    with torch.device("meta"):
        return auto.from_config(model_config)


def longest_prompt(rows: Sequence[dict[str, Any]], tokenizer: Any, args: GRPOConfig) -> int:
    """The longest prompt of ``rows`` in tokens as the run encodes it (chat template for message lists,
    special tokens for strings), at most ``max_prompt_length`` (longer ones are cut to it)."""
    longest = 0
    for start in range(0, len(rows), 1024):
        chunk = [row["prompt"] for row in rows[start : start + 1024]]
        for standard in (True, False):  # plain strings get special tokens, rendered chats already have them
            texts = [render_prompt(p, tokenizer, args.chat_template_kwargs) for p in chunk
                     if isinstance(p, str) == standard]  # fmt: skip
            if texts:
                ids = tokenizer(texts, add_special_tokens=standard)["input_ids"]
                longest = max(longest, *(len(i) for i in ids))
    limit = args.max_prompt_length
    return longest if limit is None else min(longest, limit)


def check_policy_fits(
    model_config: Any,
    tokenizer: Any,
    args: GRPOConfig,
    *,
    prompt_tokens: int,
    peft_config: Any = None,
    skeleton: torch.nn.Module | None = None,
) -> None:
    """What the model's config says the run needs, checked before its weights load: every token id the
    tokenizer can give has an embedding; the longest prompt plus ``max_completion_length`` fits in its
    positions; LoRA target modules exist (on ``skeleton``, or the modules built on the meta device)."""
    if model_config is None:
        return
    text = model_config.get_text_config() if hasattr(model_config, "get_text_config") else model_config
    vocab = getattr(text, "vocab_size", None)
    if isinstance(vocab, int) and vocab > 0 and len(tokenizer) > vocab:
        raise InputError(
            f"processing_class: the tokenizer has {len(tokenizer)} token ids but the model's embedding has "
            f"{vocab} rows, so an id >= {vocab} (a pad or added token) would fail the forward; use the "
            "model's own tokenizer, or resize the model's embeddings first (model.resize_token_embeddings("
            "len(tokenizer)))"
        )
    positions = getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", None)
    if (
        isinstance(positions, int)
        and positions > 0
        and prompt_tokens + args.max_completion_length > positions
    ):
        raise InputError(
            f"GRPOConfig.max_completion_length={args.max_completion_length}: the longest prompt "
            f"({prompt_tokens} tokens) plus the completion would reach position "
            f"{prompt_tokens + args.max_completion_length}, beyond the model's max_position_embeddings="
            f"{positions}; lower max_completion_length to {max(positions - prompt_tokens, 0)} or less, or "
            "set max_prompt_length"
        )
    targets = getattr(peft_config, "target_modules", None)
    if peft_config is not None and targets and not isinstance(targets, str):
        check_target_modules(skeleton if skeleton is not None else model_skeleton(model_config), peft_config)


def check_rows_per_step(num_rows: int, prompts_per_step: int, name: str = "train_dataset") -> None:
    """A data set with fewer rows than a step's prompts would train on the same rows several times in each
    step, without a word: refused."""
    if num_rows < prompts_per_step:
        raise InputError(
            f"{name} has {num_rows} row(s) but each step takes {prompts_per_step} distinct prompts (the "
            "batch plan), so every step would repeat rows; give at least that many rows, or lower "
            "per_device_train_batch_size x gradient_accumulation_steps (or generation_batch_size) to "
            f"{num_rows} x num_generations"
        )

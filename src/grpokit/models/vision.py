"""Vision-language policies: what sets them apart from a text model, in one place.

A vision-language model (``AutoModelForImageTextToText``: LLaVA, Gemma 3, Qwen2-VL, ...) reads a prompt
whose image placeholders the processor has expanded into image tokens, plus the processor's pixel values and
the architecture's extra tensors (``image_grid_thw``, ``image_sizes``, ...). Those tensors travel through a
step as one typed record, :class:`PromptImages`: the tensors of each distinct prompt once, and which prompt
each of the N = prompts x G rows has. The rows of a group share their prompt's tensors; nothing is copied
G times until a forward asks for the rows' inputs.

- :func:`is_vision_language`: whether a model or config is one; :func:`is_processor`: whether a
  ``processing_class`` is a processor;
- :func:`encode_row` / :func:`encode_rows`: a data-set row as the policy reads it (its images placed in its
  chat messages, the chat template, the placeholders expanded): the one encoding training and evaluation
  share; :func:`encode_prompt_images` below it (a rendered prompt and its images -> ids and tensors);
- :func:`placeholder_token_ids`: the image/video placeholder ids a sampler must never draw;
- :func:`token_types`: the per-token modality ids (``token_type_ids`` / ``mm_token_type_ids``) some
  architectures read, rebuilt from the ids for any row (prompt and completion alike);
- :func:`image_features`: the vision encoder once per distinct prompt, its features handed to every row
  of the prompt (``mm_encoder_outputs``), so G completions do not run the encoder G times;
- :func:`multimodal_backbone`, :func:`vision_modules`: the parts of a model the step reaches into.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from grpokit.data.chat import encode_prompt, is_conversational
from grpokit.data.images import has_images, row_images, with_image_parts
from grpokit.data.integrity import InputError
from grpokit.models.parts import hf_model

__all__ = [
    "TOKEN_TYPE_KEYS",
    "VISION_MODULE_NAMES",
    "PromptImages",
    "encode_prompt_images",
    "encode_row",
    "encode_rows",
    "image_features",
    "image_special_ids",
    "image_token_id",
    "is_processor",
    "is_vision_language",
    "multimodal_backbone",
    "placeholder_token_ids",
    "takes_encoder_outputs",
    "token_types",
    "trains_vision_encoder",
    "vision_modules",
]

TOKEN_TYPE_KEYS = ("token_type_ids", "mm_token_type_ids")
"""Per-token processor outputs (one value per prompt token): rebuilt from the ids for every row."""

TEXT_KEYS = ("input_ids", "attention_mask", *TOKEN_TYPE_KEYS)
"""Processor outputs that are not the prompt's image tensors."""

VISION_MODULE_NAMES = ("vision_tower", "visual", "vision_model")
"""Attribute names of the vision encoder under a model's multimodal backbone (LLaVA/Gemma 3, Qwen-VL,
Idefics3/SmolVLM)."""


def is_vision_language(model_or_config: Any) -> bool:
    """True for a model (or its config) with a vision encoder (``config.vision_config``)."""
    config = getattr(model_or_config, "config", model_or_config)
    return getattr(config, "vision_config", None) is not None


def image_token_id(config: Any) -> int | None:
    """The id of the token an image's features replace (``image_token_id``, older ``image_token_index``)."""
    for name in ("image_token_id", "image_token_index"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None


def placeholder_token_ids(config: Any) -> tuple[int, ...]:
    """The ids of the image and video placeholder tokens (which a completion must never contain: the model
    would look for image features for them)."""
    video = getattr(config, "video_token_id", None)
    return tuple(i for i in (image_token_id(config), video) if isinstance(i, int))


def token_types(ids: torch.Tensor, config: Any) -> torch.Tensor:
    """[B, L] long: 1 on image tokens, 2 on video tokens, 0 elsewhere (what the processors' per-token
    modality outputs hold; a completion's tokens are text, 0)."""
    types = torch.zeros_like(ids)
    image = image_token_id(config)
    if image is not None:
        types = types.masked_fill(ids == image, 1)
    video = getattr(config, "video_token_id", None)
    if isinstance(video, int):
        types = types.masked_fill(ids == video, 2)
    return types


@dataclass(frozen=True)
class PromptImages:
    """The image inputs of a batch: each distinct prompt's tensors once, and the prompt of every row.

    ``tensors[k]`` holds prompt k's processor outputs other than ids and masks (``pixel_values``,
    ``image_grid_thw``, ``image_sizes``, ...), its images along dim 0, or None for a prompt without images.
    ``rows`` [N] long: the prompt of each row (a group's G rows point at one prompt). ``token_type_key``:
    the per-token modality input the architecture reads (``token_type_ids`` or ``mm_token_type_ids``,
    rebuilt from the ids by :func:`token_types`), or None.
    """

    tensors: tuple[dict[str, torch.Tensor] | None, ...]
    rows: torch.Tensor
    token_type_key: str | None = None

    @classmethod
    def of_prompts(
        cls,
        tensors: Sequence[dict[str, torch.Tensor] | None],
        sizes: Sequence[int],
        token_type_key: str | None,
    ) -> PromptImages | None:
        """The record for prompts with ``sizes[k]`` rows each (None when no prompt has an image)."""
        if all(t is None for t in tensors):
            return None
        rows = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(list(sizes), dtype=torch.long))
        return cls(tuple(tensors), rows, token_type_key)

    def __getitem__(self, index: torch.Tensor | slice) -> PromptImages:
        """Rows ``index`` (the prompts' tensors are shared, not copied)."""
        return dataclasses.replace(self, rows=self.rows[index.cpu() if torch.is_tensor(index) else index])

    def prompts(self) -> list[int]:
        """The distinct prompts of the rows, in order of first appearance."""
        return list(dict.fromkeys(int(k) for k in self.rows.tolist()))

    def row_inputs(self, device: torch.device | str, *, pixels: bool = True) -> dict[str, torch.Tensor]:
        """The model's image inputs for the rows, as a batch of them: each row's prompt tensors, concatenated
        along dim 0 in row order (images of row 0, then of row 1, ...), on ``device``. ``pixels=False``:
        without the ``pixel_*`` tensors (the image's description only: ``image_grid_thw``, ...)."""
        parts = [self.tensors[int(k)] for k in self.rows.tolist()]
        if not pixels:
            parts = [None if p is None else {k: v for k, v in p.items() if not k.startswith("pixel_")}
                     for p in parts]  # fmt: skip
        return _concatenated(parts, device)

    def prompt_inputs(self, prompts: Sequence[int], device: torch.device | str) -> dict[str, torch.Tensor]:
        """The image inputs of the distinct ``prompts``, concatenated along dim 0."""
        return _concatenated([self.tensors[k] for k in prompts], device)

    def images_per_prompt(self, prompts: Sequence[int]) -> list[int]:
        """How many images each of ``prompts`` has."""
        return [_count_images(self.tensors[k]) for k in prompts]


def _count_images(tensors: dict[str, torch.Tensor] | None) -> int:
    """Images of one prompt: the rows of ``image_grid_thw`` / ``image_sizes`` when given, else of
    ``pixel_values``."""
    if not tensors:
        return 0
    for key in ("image_grid_thw", "image_sizes", "pixel_values"):
        if key in tensors:
            return int(tensors[key].shape[0])
    return 0


def _concatenated(parts: Sequence[dict[str, torch.Tensor] | None], device: torch.device | str) -> dict:
    present = [p for p in parts if p]
    if not present:
        return {}
    keys = list(present[0])
    out = {}
    for key in keys:
        values = [p[key] for p in present]
        try:
            out[key] = torch.cat(values, dim=0).to(device)
        except RuntimeError as err:  # e.g. images of different tile counts in one batch
            shapes = sorted({tuple(v.shape[1:]) for v in values})
            raise ValueError(
                f"the prompts' {key} differ in shape beyond their first dimension ({shapes}): this "
                "architecture's processor gives images of different sizes different shapes; resize the "
                "images to one size"
            ) from err
    return out


def encode_prompt_images(
    processor: Any, text: str, images: Sequence[Any]
) -> tuple[list[int], dict[str, torch.Tensor] | None, str | None]:
    """The token ids of a rendered prompt ``text`` with its image placeholders expanded by ``processor``,
    the prompt's image tensors (None without images) and the per-token modality key it returned (or None).
    The text carries the chat template's special tokens already: none are added."""
    if not images:
        ids = processor.tokenizer(text, add_special_tokens=False)["input_ids"]
        return list(ids), None, None
    out = processor(text=[text], images=list(images), return_tensors="pt", add_special_tokens=False)
    ids = out["input_ids"][0].tolist()
    key = next((k for k in TOKEN_TYPE_KEYS if k in out), None)
    tensors = {k: v for k, v in out.items() if k not in TEXT_KEYS and torch.is_tensor(v)}
    return ids, tensors, key


def is_processor(processing_class: Any) -> bool:
    """True for a vision-language processor (a tokenizer and an image processor), False for a tokenizer."""
    return hasattr(processing_class, "image_processor") and hasattr(processing_class, "tokenizer")


def encode_row(
    processor: Any,
    row: Mapping[str, Any],
    where: str,
    *,
    max_prompt_length: int | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    truncation: str = "left",
) -> tuple[list[int], dict[str, torch.Tensor] | None, str | None]:
    """One data-set row's prompt as a vision-language policy reads it (TRL's way): its images (``image`` /
    ``images``, ``grpokit.data.images``) as image parts of its chat messages, the processor's chat template,
    the placeholders expanded into image tokens. Returns (ids, the prompt's image tensors or None, the
    per-token modality key or None).

    ``max_prompt_length`` bounds a prompt's text, as in a text run: longer text is cut from the left
    (``truncation="left"``) or refused naming ``where`` (``"error"``). A prompt's image tokens
    (:func:`image_special_ids`) are never cut and do not count against it (TRL 1.16 has no prompt limit,
    and an image alone can be hundreds of tokens): cutting keeps every one of them and drops the earliest
    text tokens around them."""
    images = row_images(row, where) if has_images(row) else []
    prompt, kwargs = row["prompt"], dict(chat_template_kwargs or {})
    if not images and not is_conversational(prompt):
        ids: list[int] = encode_prompt(prompt, processor.tokenizer, None, kwargs)
        tensors, key = None, None
    else:
        messages = with_image_parts(prompt, len(images), where)
        text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
        ids, tensors, key = encode_prompt_images(processor, text, images)
    limit = max_prompt_length
    protected = image_special_ids(processor) if images else set()
    is_text = [t not in protected for t in ids]
    text = sum(is_text)
    if limit is not None and text > limit:
        if truncation == "error":
            besides = f" besides its {len(ids) - text} image tokens" if images else ""
            raise InputError(
                f"{where}: the prompt is {text} tokens{besides}, longer than max_prompt_length={limit} "
                "(prompt_truncation='error'; raise max_prompt_length or set prompt_truncation='left')"
            )
        drop = text - limit  # the earliest text tokens; every image token stays
        dropped = set([i for i, t in enumerate(is_text) if t][:drop])
        ids = [t for i, t in enumerate(ids) if i not in dropped]
    return ids, tensors, key


def image_special_ids(processor: Any) -> set[int]:
    """The ids a processor writes for images: the image token its placeholders expand to and the tokens
    around an image (Gemma's ``<start_of_image>`` / ``<end_of_image>``, Qwen's ``<|vision_start|>`` /
    ``<|vision_end|>``, ...), the tokenizer's named ones that exist."""
    tokenizer = processor.tokenizer
    names = ("image_token", "boi_token", "eoi_token", "vision_bos_token", "vision_eos_token",
             "image_start_token", "image_end_token", "start_image_token", "end_image_token")  # fmt: skip
    ids = {getattr(processor, "image_token_id", None)}
    for name in names:
        token = getattr(tokenizer, name, None) or getattr(processor, name, None)
        if isinstance(token, str):
            ids.add(tokenizer.convert_tokens_to_ids(token))
    unknown = tokenizer.unk_token_id
    return {i for i in ids if isinstance(i, int) and i != unknown}


def encode_rows(
    processor: Any,
    rows: Sequence[Mapping[str, Any]],
    sizes: Sequence[int],
    where: str,
    first: int = 0,
    **options: Any,
) -> tuple[list[list[int]], PromptImages | None]:
    """:func:`encode_row` of every row: (prompt ids [K], the prompts' ``PromptImages`` with ``sizes[k]``
    rows each, or None when no prompt has an image). Row k is named ``<where> row <first + k>`` in a
    refusal. ``options``: :func:`encode_row`'s."""
    ids, tensors, key = [], [], None
    for index, row in enumerate(rows):
        row_ids, row_tensors, row_key = encode_row(processor, row, f"{where} row {first + index}", **options)
        ids.append(row_ids)
        tensors.append(row_tensors)
        key = key or row_key
    return ids, PromptImages.of_prompts(tensors, sizes, key)


def multimodal_backbone(model: torch.nn.Module) -> torch.nn.Module:
    """The module that turns ids and image inputs into hidden states (``model.model`` of an
    ``XxxForConditionalGeneration``; a PEFT model's base model's)."""
    base = hf_model(model)
    backbone = getattr(base, "model", None)
    if backbone is None or not hasattr(backbone, "get_image_features"):
        raise TypeError(f"{type(base).__name__} has no multimodal backbone with get_image_features")
    return backbone


def takes_encoder_outputs(backbone: torch.nn.Module) -> bool:
    """Whether the backbone's forward takes image features computed beforehand (``mm_encoder_outputs``,
    transformers >= 5.2x); an older release's runs its encoder on the pixel values it is given."""
    return _takes_encoder_outputs(type(backbone))


@functools.cache
def _takes_encoder_outputs(backbone_class: type) -> bool:
    return "mm_encoder_outputs" in inspect.signature(backbone_class.forward).parameters


def vision_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The vision encoder(s) of a vision-language model (``VISION_MODULE_NAMES`` under its backbone)."""
    backbone = multimodal_backbone(model)
    return [getattr(backbone, n) for n in VISION_MODULE_NAMES if isinstance(getattr(backbone, n, None),
                                                                           torch.nn.Module)]  # fmt: skip


def trains_vision_encoder(model: torch.nn.Module) -> bool:
    """Whether any weight of ``model``'s vision encoder trains (False for a text model)."""
    if not is_vision_language(model):
        return False
    return any(p.requires_grad for module in vision_modules(model) for p in module.parameters())


def image_features(backbone: torch.nn.Module, images: PromptImages, device: torch.device | str) -> Any:
    """The encoder's output for the rows of ``images``, computed once per distinct prompt: a
    ``BaseModelOutputWithPooling`` whose ``pooler_output`` holds, in row order, each row's prompt's image
    features, in the container the architecture returns (a list or tuple of per-image tensors, or one
    tensor [images, tokens, hidden]). Passed as ``mm_encoder_outputs={"image": ...}`` it gives the same
    hidden states as the model's own encoder call on the rows' pixel values; the backward of the repeat
    sums the G rows' gradients into the one encoder pass."""
    prompts = images.prompts()
    counts = images.images_per_prompt(prompts)
    out = backbone.get_image_features(**images.prompt_inputs(prompts, device), return_dict=True)
    pooled = out.pooler_output
    per_image = list(pooled) if isinstance(pooled, (list, tuple)) else list(pooled.unbind(0))
    if len(per_image) != sum(counts):
        raise ValueError(f"the vision encoder gave {len(per_image)} image features for {sum(counts)} images")
    starts = dict(zip(prompts, torch.tensor([0, *counts]).cumsum(0).tolist()))
    by_prompt = {k: per_image[starts[k] : starts[k] + n] for k, n in zip(prompts, counts)}
    rows = [feature for k in images.rows.tolist() for feature in by_prompt[int(k)]]
    if isinstance(pooled, tuple):
        out.pooler_output = tuple(rows)
    elif isinstance(pooled, list):
        out.pooler_output = rows
    else:
        out.pooler_output = torch.stack(rows)
    return out

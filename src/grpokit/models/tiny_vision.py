"""Tiny vision-language models built entirely locally: the character tokenizer plus image tokens, a small
vision tower and text model, and the architecture's own processor.

``grpokit.models.tiny`` gives a text policy for tests and CPU recipes without a model hub; this module does
the same for image+text prompts. ``build_tiny_vlm`` returns a seeded, randomly initialised
``XxxForConditionalGeneration`` (float32) and its real ``transformers`` processor, so prompts go through the
same path as a hub VLM's: ``processor.apply_chat_template`` renders a conversation with image parts,
``processor(text=..., images=...)`` expands each image placeholder to the model's image tokens and makes the
pixel values, and ``model(**inputs)`` / ``model.generate(**inputs)`` run. Both save with ``save_pretrained``
and load back with ``AutoProcessor`` / ``AutoModelForImageTextToText`` exactly as built (same ids, pixel
values and logits), and the processor's tokenizer comes back encoding text exactly as built, so no special
loader is needed (unlike a character tokenizer next to a Qwen2 config, see
``grpokit.models.loading.load_tokenizer``).

Architectures (``VISION_ARCHITECTURES``):

- ``"llava"``: ``LlavaForConditionalGeneration`` = CLIP vision tower + Llama, ``LlavaProcessor`` with the
  LLaVA image processor (resize the shortest edge, centre crop). An image is written ``<image>`` and
  expands to ``(image_size // patch_size) ** 2`` ``<image>`` tokens (the CLS feature is dropped).
- ``"gemma3"``: ``Gemma3ForConditionalGeneration`` = SigLIP vision tower + Gemma 3 text model,
  ``Gemma3Processor`` with the Gemma 3 image processor (resize to a square). An image is written
  ``<start_of_image>`` and expands to ``"\\n\\n<start_of_image>" + (image_size // patch_size) ** 2 x
  "<image_soft_token>" + "<end_of_image>\\n\\n"``. Its processor also returns ``token_type_ids`` (1 on
  the soft image tokens), which the model uses for bidirectional attention inside an image.
- ``"qwen2_vl"`` / ``"qwen2_5_vl"``: ``Qwen2VLForConditionalGeneration`` /
  ``Qwen2_5_VLForConditionalGeneration`` = Qwen's vision transformer (3-D patches, 2x2 patch merger;
  Qwen2.5-VL with window attention and a full-attention block) + the Qwen2 text model with multimodal
  rotary positions, ``Qwen2VLProcessor`` / ``Qwen2_5_VLProcessor`` with Qwen's image processor, which keeps
  the aspect ratio (sides rounded to multiples of ``2 * patch_size``, at most ``image_size ** 2`` pixels).
  An image is written ``<|vision_start|><|image_pad|><|vision_end|>`` and ``<|image_pad|>`` expands to one
  token per 2x2 patches: ``(image_size // patch_size) ** 2 // 4`` for a square image; the processor also
  returns ``image_grid_thw`` and ``mm_token_type_ids``.

The image processors are transformers' torchvision backend where torchvision imports and its PIL backend
otherwise, the class ``AutoProcessor`` loads back in that environment. The Qwen architectures need
torchvision (``QWEN_NEEDS``): transformers' Qwen processors type-check a video processor, a class that exists
only where torchvision imports. ``available_architectures()`` lists what this environment can build.
torchvision does not import beside the CPU build of torch this project pins, so the default test run covers
Qwen at the model level (``tests/vision/test_qwen_vl_forward.py``) and a second environment with
torchvision runs the vision suite on them (``.ci/run``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import torch
from tokenizers import AddedToken
from transformers import (
    AutoConfig,
    AutoModelForImageTextToText,
    Gemma3Processor,
    LlavaProcessor,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    ProcessorMixin,
)
from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil
from transformers.models.llava.image_processing_pil_llava import LlavaImageProcessorPil

from grpokit.models.tiny import DEFAULT_ALPHABET, DEFAULT_TAGS, build_char_tokenizer, with_generation_ids

__all__ = [
    "IMAGE_PLACEHOLDERS",
    "IMAGE_SPECIAL_TOKENS",
    "QWEN_NEEDS",
    "VISION_ARCHITECTURES",
    "available_architectures",
    "build_tiny_vlm",
    "build_vision_tokenizer",
    "num_image_tokens",
    "vision_chat_template",
]

VISION_ARCHITECTURES: tuple[str, ...] = ("llava", "gemma3", "qwen2_vl", "qwen2_5_vl")
QWEN_ARCHITECTURES: tuple[str, ...] = ("qwen2_vl", "qwen2_5_vl")
QWEN_NEEDS = (
    "the Qwen2-VL / Qwen2.5-VL processors need torchvision (transformers type-checks their video processor, "
    "a class that exists only where torchvision imports); install a torch + torchvision pair that import "
    "together (e.g. torch==2.14.1 torchvision==0.29.1)"
)

# The tokenizer's model-specific special tokens per architecture, as the processor reads them
# (``tokenizer.image_token``, ``tokenizer.boi_token`` ...). They get ids after the character tokenizer's.
IMAGE_SPECIAL_TOKENS: dict[str, dict[str, str]] = {
    "llava": {"image_token": "<image>"},
    "gemma3": {
        "boi_token": "<start_of_image>",
        "image_token": "<image_soft_token>",
        "eoi_token": "<end_of_image>",
    },
    **{
        arch: {
            "vision_bos_token": "<|vision_start|>",
            "image_token": "<|image_pad|>",
            "vision_eos_token": "<|vision_end|>",
            "video_token": "<|video_pad|>",
        }
        for arch in QWEN_ARCHITECTURES
    },
}

# What an image part of a chat message renders as: the string the processor expands to the image tokens.
IMAGE_PLACEHOLDERS: dict[str, str] = {
    "llava": "<image>",
    "gemma3": "<start_of_image>",
    **dict.fromkeys(QWEN_ARCHITECTURES, "<|vision_start|><|image_pad|><|vision_end|>"),
}


@functools.cache  # an import attempt once per process (a mismatched build fails slowly)
def _torchvision_imports() -> bool:
    try:
        import torchvision  # noqa: F401
    except Exception:  # absent, or a build that does not match the installed torch
        return False
    return True


def _image_processor_class(arch: str) -> type:
    """The image processor ``AutoProcessor`` loads back for ``arch`` in this environment: transformers'
    torchvision backend where torchvision imports, its PIL backend otherwise (the two differ in the last
    bits of the pixel values, so a saved processor reloads exactly only as the class it would load)."""
    if _torchvision_imports():
        if arch == "llava":
            from transformers.models.llava.image_processing_llava import LlavaImageProcessor

            return LlavaImageProcessor
        from transformers.models.gemma3.image_processing_gemma3 import Gemma3ImageProcessor

        return Gemma3ImageProcessor
    return LlavaImageProcessorPil if arch == "llava" else Gemma3ImageProcessorPil


def available_architectures() -> tuple[str, ...]:
    """The architectures ``build_tiny_vlm`` can build in this environment: all of ``VISION_ARCHITECTURES``
    where torchvision imports, else those whose processor needs no torchvision (``QWEN_NEEDS``)."""
    if _torchvision_imports():
        return VISION_ARCHITECTURES
    return tuple(a for a in VISION_ARCHITECTURES if a not in QWEN_ARCHITECTURES)


def _check_arch(arch: str) -> None:
    if arch not in VISION_ARCHITECTURES:
        raise ValueError(f"arch must be one of {VISION_ARCHITECTURES}, got {arch!r}")


def vision_chat_template(image_placeholder: str) -> str:
    """``grpokit.models.tiny.CHAT_TEMPLATE`` extended to multimodal content.

    A message's content is either a string or a list of parts: ``{"type": "text", "text": ...}`` renders as
    its text, ``{"type": "image", ...}`` as ``image_placeholder`` (any other key of an image part, such as
    ``"image"`` or ``"url"``, is for ``apply_chat_template(tokenize=True)`` to load); parts are joined without
    separators. As in the text template, a user message renders as its content alone, a system message ends
    with a newline, an assistant message ends with EOS, and the generation prompt is empty: a text-only
    conversation renders exactly as with ``CHAT_TEMPLATE``. Any other part type is an error.
    """
    if "'" in image_placeholder or "\\" in image_placeholder:
        raise ValueError(f"image_placeholder may not contain quotes or backslashes: {image_placeholder!r}")
    return (
        "{%- for message in messages -%}"
        "{%- if message['content'] is string -%}{{ message['content'] }}"
        "{%- else -%}"
        "{%- for part in message['content'] -%}"
        f"{{%- if part['type'] == 'image' -%}}{{{{ '{image_placeholder}' }}}}"
        "{%- elif part['type'] == 'text' -%}{{ part['text'] }}"
        "{%- else -%}{{ raise_exception('unsupported content part type: ' + part['type']) }}"
        "{%- endif -%}"
        "{%- endfor -%}"
        "{%- endif -%}"
        "{%- if message['role'] == 'system' -%}{{ '\\n' }}"
        "{%- elif message['role'] == 'assistant' -%}{{ eos_token }}"
        "{%- endif -%}"
        "{%- endfor -%}"
    )


def build_vision_tokenizer(
    arch: str = "llava",
    alphabet: str = DEFAULT_ALPHABET,
    tags: Iterable[str] = DEFAULT_TAGS,
    model_max_length: int = 256,
) -> PreTrainedTokenizerFast:
    """``build_char_tokenizer(alphabet, tags, model_max_length)`` plus ``arch``'s image special tokens.

    Every id of the character tokenizer is unchanged (text encodes to the same ids); the image tokens
    (``IMAGE_SPECIAL_TOKENS[arch]``, in that order) come after it and are also set as the tokenizer's named
    model-specific tokens (``tokenizer.image_token`` / ``image_token_id``, for Gemma 3 also ``boi_token`` and
    ``eoi_token``), which the processor reads and ``save_pretrained`` keeps. Being special, they are dropped
    by ``decode(..., skip_special_tokens=True)``. The chat template is ``vision_chat_template`` with
    ``IMAGE_PLACEHOLDERS[arch]``.
    """
    _check_arch(arch)
    base = build_char_tokenizer(alphabet=alphabet, tags=tags, model_max_length=model_max_length)
    specials = IMAGE_SPECIAL_TOKENS[arch]
    backend = base.backend_tokenizer
    backend.add_special_tokens(
        [AddedToken(token, special=True, normalized=False) for token in specials.values()]
    )
    # Named model-specific tokens can only be given to the constructor, so the character tokenizer's
    # backend (its vocabulary, tags and the new tokens) is wrapped again with the same settings.
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=base.bos_token,
        eos_token=base.eos_token,
        pad_token=base.pad_token,
        unk_token=base.unk_token,
        model_max_length=model_max_length,
        padding_side="left",
        clean_up_tokenization_spaces=False,
        chat_template=vision_chat_template(IMAGE_PLACEHOLDERS[arch]),
        **specials,
    )


def num_image_tokens(image_size: int = 32, patch_size: int = 8, arch: str = "llava") -> int:
    """The image tokens one image expands to in ``build_tiny_vlm``: one per patch, for Qwen one per 2x2
    patches (its merger)."""
    patches = (image_size // patch_size) ** 2
    return patches // 4 if arch in QWEN_ARCHITECTURES else patches


def build_tiny_vlm(
    arch: str = "llava",
    *,
    tokenizer: PreTrainedTokenizerFast | None = None,
    seed: int = 0,
    image_size: int = 32,
    patch_size: int = 8,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    intermediate_size: int | None = None,
    vision_hidden_size: int = 32,
    vision_num_layers: int = 2,
    vision_num_heads: int = 2,
    max_position_embeddings: int = 256,
    tie_word_embeddings: bool = True,
) -> tuple[PreTrainedModel, ProcessorMixin]:
    """A randomly initialised tiny ``arch`` VLM and its processor.

    ``tokenizer`` defaults to ``build_vision_tokenizer(arch)`` (pass one built by it to change the alphabet or
    tags). The vision tower (CLIP for LLaVA, SigLIP for Gemma 3) reads ``image_size`` x ``image_size`` RGB
    images in ``patch_size`` patches with ``vision_hidden_size`` / ``vision_num_layers`` /
    ``vision_num_heads``; every image becomes ``num_image_tokens(image_size, patch_size)`` tokens (16 by
    default). The text model has ``hidden_size`` / ``num_layers`` / ``num_heads``, ``intermediate_size``
    defaulting to 4 x ``hidden_size``. The processor resizes any image to ``image_size`` (LLaVA: shortest edge
    then centre crop; Gemma 3: straight to the square) and carries the tokenizer's chat template.

    Weights come from ``torch.manual_seed(seed)`` (the global RNG is restored afterwards); the model is
    float32. Gemma 3 initialises its image projection to zeros, which would make the model blind to the
    image; here it is drawn like the other weights (normal, std ``initializer_range``) so images change the
    logits. bos/eos/pad ids are written into the config (top level and text config) and the generation
    config, so ``generate`` stops at EOS and pads with pad.
    """
    _check_arch(arch)
    if arch in QWEN_ARCHITECTURES and not _torchvision_imports():
        raise ImportError(f"build_tiny_vlm({arch!r}): {QWEN_NEEDS}")
    step = 2 * patch_size if arch in QWEN_ARCHITECTURES else patch_size
    if image_size % step:
        raise ValueError(f"image_size ({image_size}) must be divisible by {step} for {arch}")
    if hidden_size % num_heads:
        raise ValueError(f"hidden_size ({hidden_size}) must be divisible by num_heads ({num_heads})")
    if vision_hidden_size % vision_num_heads:
        raise ValueError(
            f"vision_hidden_size ({vision_hidden_size}) must be divisible by "
            f"vision_num_heads ({vision_num_heads})"
        )
    if tokenizer is None:
        tokenizer = build_vision_tokenizer(arch)
    missing = [t for t in IMAGE_SPECIAL_TOKENS[arch].values() if t not in tokenizer.get_vocab()]
    if missing:
        raise ValueError(
            f"tokenizer lacks {arch}'s image tokens {missing}: build it with build_vision_tokenizer"
        )
    special_ids = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    tokens_per_image = num_image_tokens(image_size, patch_size, arch)
    text = dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        intermediate_size=intermediate_size or 4 * hidden_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        **special_ids,
    )
    vision = dict(
        hidden_size=vision_hidden_size,
        intermediate_size=4 * vision_hidden_size,
        num_hidden_layers=vision_num_layers,
        num_attention_heads=vision_num_heads,
        image_size=image_size,
        patch_size=patch_size,
    )
    image_token_id = tokenizer.convert_tokens_to_ids(IMAGE_SPECIAL_TOKENS[arch]["image_token"])
    processor: ProcessorMixin
    if arch == "llava":
        config = AutoConfig.for_model(
            "llava",
            text_config={"model_type": "llama", **text},
            vision_config={"model_type": "clip_vision_model", **vision},
            image_token_index=image_token_id,
            image_seq_length=tokens_per_image,
            # The last layer's patch features, CLS dropped: every vision weight takes part.
            vision_feature_layer=-1,
            vision_feature_select_strategy="default",
            tie_word_embeddings=tie_word_embeddings,
            **special_ids,
        )
        image_processor = _image_processor_class("llava")(
            size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size}
        )
        processor = LlavaProcessor(
            image_processor=image_processor,
            tokenizer=tokenizer,
            patch_size=patch_size,
            vision_feature_select_strategy="default",
            num_additional_image_tokens=1,  # CLIP's CLS, which the "default" strategy drops again
            chat_template=tokenizer.chat_template,
        )
    elif arch in QWEN_ARCHITECTURES:
        config, processor = _qwen_config_and_processor(
            arch, tokenizer, text, vision, special_ids, image_size, tie_word_embeddings
        )
    else:
        head_dim = hidden_size // num_heads
        config = AutoConfig.for_model(
            "gemma3",
            text_config={
                "model_type": "gemma3_text",
                **text,
                "head_dim": head_dim,
                "query_pre_attn_scalar": head_dim,
                # Gemma 3 interleaves local and global layers; a tiny model alternates them, ending global.
                "layer_types": [
                    "full_attention" if (num_layers - 1 - i) % 2 == 0 else "sliding_attention"
                    for i in range(num_layers)
                ],
            },
            vision_config={"model_type": "siglip_vision_model", **vision},
            mm_tokens_per_image=tokens_per_image,
            boi_token_index=tokenizer.boi_token_id,
            eoi_token_index=tokenizer.eoi_token_id,
            image_token_index=image_token_id,
            tie_word_embeddings=tie_word_embeddings,
            **special_ids,
        )
        image_processor = _image_processor_class("gemma3")(size={"height": image_size, "width": image_size})
        processor = Gemma3Processor(
            image_processor=image_processor,
            tokenizer=tokenizer,
            image_seq_length=tokens_per_image,
            chat_template=tokenizer.chat_template,
        )
    rng_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
        if arch == "gemma3":
            with torch.no_grad():
                projector = model.model.multi_modal_projector
                projector.mm_input_projection_weight.normal_(std=config.initializer_range)
    finally:
        torch.random.set_rng_state(rng_state)
    return with_generation_ids(model, tokenizer), processor


def _qwen_config_and_processor(
    arch: str,
    tokenizer: PreTrainedTokenizerFast,
    text: dict,
    vision: dict,
    special_ids: dict,
    image_size: int,
    tie_word_embeddings: bool,
) -> tuple[Any, ProcessorMixin]:
    """Qwen2-VL / Qwen2.5-VL: the config (vision transformer over 2 x patch x patch x 3 patches, 2x2
    merger, multimodal rotary sections summing to half the head dimension) and the processor, which keeps an
    image's aspect ratio within ``image_size ** 2`` pixels (at least one merged patch)."""
    from transformers import Qwen2_5_VLProcessor, Qwen2VLProcessor
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    patch_size = vision["patch_size"]
    half_head = text["hidden_size"] // text["num_attention_heads"] // 2
    temporal = half_head // 4
    sections = [temporal, (half_head - temporal) // 2, half_head - temporal - (half_head - temporal) // 2]
    vision_config = dict(
        depth=vision["num_hidden_layers"],
        num_heads=vision["num_attention_heads"],
        patch_size=patch_size,
        spatial_merge_size=2,
        temporal_patch_size=2,
        in_channels=3,
    )
    if arch == "qwen2_5_vl":
        vision_config.update(
            hidden_size=vision["hidden_size"],
            intermediate_size=vision["intermediate_size"],
            out_hidden_size=text["hidden_size"],
            # One window covers the whole tiny image; the last block attends fully, as in the real model.
            window_size=image_size,
            fullatt_block_indexes=[vision["num_hidden_layers"] - 1],
        )
    else:
        vision_config.update(embed_dim=vision["hidden_size"], hidden_size=text["hidden_size"], mlp_ratio=4)
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in IMAGE_SPECIAL_TOKENS[arch].items()}
    config = AutoConfig.for_model(
        arch,
        text_config={**text, "rope_scaling": {"type": "mrope", "mrope_section": sections}},
        vision_config=vision_config,
        image_token_id=ids["image_token"],
        video_token_id=ids["video_token"],
        vision_start_token_id=ids["vision_bos_token"],
        vision_end_token_id=ids["vision_eos_token"],
        tie_word_embeddings=tie_word_embeddings,
        **special_ids,
    )
    pixels = dict(min_pixels=(2 * patch_size) ** 2, max_pixels=image_size * image_size)
    sizes = dict(patch_size=patch_size, merge_size=2, temporal_patch_size=2)
    image_processor = Qwen2VLImageProcessor(**pixels, **sizes)
    video_processor = Qwen2VLVideoProcessor(**pixels, **sizes)
    processor_class = Qwen2_5_VLProcessor if arch == "qwen2_5_vl" else Qwen2VLProcessor
    processor = processor_class(
        image_processor=image_processor,
        tokenizer=tokenizer,
        video_processor=video_processor,
        chat_template=tokenizer.chat_template,
    )
    return config, processor

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
  PIL LLaVA image processor (resize the shortest edge, centre crop). An image is written ``<image>`` and
  expands to ``(image_size // patch_size) ** 2`` ``<image>`` tokens (the CLS feature is dropped).
- ``"gemma3"``: ``Gemma3ForConditionalGeneration`` = SigLIP vision tower + Gemma 3 text model,
  ``Gemma3Processor`` with the PIL Gemma 3 image processor (resize to a square). An image is written
  ``<start_of_image>`` and expands to ``"\\n\\n<start_of_image>" + (image_size // patch_size) ** 2 x
  "<image_soft_token>" + "<end_of_image>\\n\\n"``. Its processor also returns ``token_type_ids`` (1 on
  the soft image tokens), which the model uses for bidirectional attention inside an image.

Only processors that need neither torchvision nor a video processor can be built here: torchvision does
not import beside the CPU torch this project pins. Qwen2-VL / Qwen2.5-VL are therefore absent: their
processor's constructor type-checks a video processor, whose class only exists with torchvision, and
there is no documented way to build or load one without it.
"""

from __future__ import annotations

from collections.abc import Iterable

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
    "VISION_ARCHITECTURES",
    "build_tiny_vlm",
    "build_vision_tokenizer",
    "num_image_tokens",
    "vision_chat_template",
]

VISION_ARCHITECTURES: tuple[str, ...] = ("llava", "gemma3")

# The tokenizer's model-specific special tokens per architecture, as the processor reads them
# (``tokenizer.image_token``, ``tokenizer.boi_token`` ...). They get ids after the character tokenizer's.
IMAGE_SPECIAL_TOKENS: dict[str, dict[str, str]] = {
    "llava": {"image_token": "<image>"},
    "gemma3": {
        "boi_token": "<start_of_image>",
        "image_token": "<image_soft_token>",
        "eoi_token": "<end_of_image>",
    },
}

# What an image part of a chat message renders as: the string the processor expands to the image tokens.
IMAGE_PLACEHOLDERS: dict[str, str] = {"llava": "<image>", "gemma3": "<start_of_image>"}


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


def num_image_tokens(image_size: int = 32, patch_size: int = 8) -> int:
    """The image tokens one image expands to in ``build_tiny_vlm`` (either architecture): one per patch."""
    return (image_size // patch_size) ** 2


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
    if image_size % patch_size:
        raise ValueError(f"image_size ({image_size}) must be divisible by patch_size ({patch_size})")
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
    tokens_per_image = num_image_tokens(image_size, patch_size)
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
        image_processor = LlavaImageProcessorPil(
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
        image_processor = Gemma3ImageProcessorPil(size={"height": image_size, "width": image_size})
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

"""The tiny local VLMs: tokenizer ids and chat template, image expansion, forward, greedy generation and the
save/reload round trip through ``AutoProcessor`` / ``AutoModelForImageTextToText``, per architecture."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from jinja2.exceptions import TemplateError
from PIL import Image
from transformers import AutoModelForImageTextToText, AutoProcessor

from grpokit.models.tiny import build_char_tokenizer
from grpokit.models.tiny_vision import (
    IMAGE_PLACEHOLDERS,
    IMAGE_SPECIAL_TOKENS,
    QWEN_NEEDS,
    VISION_ARCHITECTURES,
    available_architectures,
    build_tiny_vlm,
    build_vision_tokenizer,
    num_image_tokens,
)
from tests.vision.architectures import ARCHITECTURES

TEXT_KEYS = {"input_ids", "attention_mask", "pixel_values"}
# Gemma 3's processor also marks the image tokens (1) for the model's bidirectional image attention; Qwen's
# gives each image's patch grid and marks image tokens in mm_token_type_ids (for its multimodal positions).
QWEN_KEYS = TEXT_KEYS | {"image_grid_thw", "mm_token_type_ids"}
EXPECTED_KEYS = {
    "llava": TEXT_KEYS,
    "gemma3": TEXT_KEYS | {"token_type_ids"},
    "qwen2_vl": QWEN_KEYS,
    "qwen2_5_vl": QWEN_KEYS,
}
# How many of the architecture's special tokens (in IMAGE_SPECIAL_TOKENS order) its image placeholder is.
PLACEHOLDER_TOKENS = {"llava": 1, "gemma3": 1, "qwen2_vl": 3, "qwen2_5_vl": 3}


def image(seed: int, size: tuple[int, int] = (40, 50)) -> Image.Image:
    """A deterministic RGB noise image (height x width), not square, so the processor has to resize it."""
    pixels = np.random.RandomState(seed).randint(0, 256, size=(*size, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def conversation(text: str = "What is 2+3?") -> list[dict]:
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]


def encode(processor, images: list[Image.Image], text: str = "What is 2+3?"):
    prompt = processor.apply_chat_template(conversation(text), add_generation_prompt=True, tokenize=False)
    return processor(text=[prompt], images=images, return_tensors="pt")


arch_param = pytest.mark.parametrize("arch", ARCHITECTURES)


@arch_param
def test_tokenizer_keeps_the_character_ids_and_adds_the_image_tokens(arch):
    char = build_char_tokenizer()
    tokenizer = build_vision_tokenizer(arch)
    text = "a b\nc <answer>23+45=68</answer>"
    assert tokenizer.encode(text) == char.encode(text)
    specials = IMAGE_SPECIAL_TOKENS[arch]
    ids = tokenizer.convert_tokens_to_ids(list(specials.values()))
    assert ids == list(range(len(char), len(char) + len(specials)))
    assert len(tokenizer) == len(char) + len(specials)
    for name, token in specials.items():
        assert getattr(tokenizer, name) == token
        assert getattr(tokenizer, f"{name}_id") == tokenizer.convert_tokens_to_ids(token)
    placeholder = IMAGE_PLACEHOLDERS[arch]
    placeholder_ids = ids[: PLACEHOLDER_TOKENS[arch]]
    assert tokenizer.encode(f"x{placeholder}y") == [*char.encode("x"), *placeholder_ids, *char.encode("y")]
    assert tokenizer.decode(tokenizer.encode(f"x{placeholder}y"), skip_special_tokens=True) == "xy"
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == (
        char.bos_token,
        char.eos_token,
        char.pad_token,
    )
    assert tokenizer.padding_side == "left"


@arch_param
def test_chat_template_renders_text_exactly_as_the_text_template(arch):
    char = build_char_tokenizer()
    tokenizer = build_vision_tokenizer(arch)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "23+45-17="},
        {"role": "assistant", "content": "51"},
        {"role": "user", "content": "1+1="},
    ]
    expected = char.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert expected == "Be brief.\n23+45-17=51<|endoftext|>1+1="
    assert tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == expected
    # The same conversation with list-of-parts content renders the same text.
    parted = [{**m, "content": [{"type": "text", "text": m["content"]}]} for m in messages]
    assert tokenizer.apply_chat_template(parted, add_generation_prompt=True, tokenize=False) == expected
    _, processor = build_tiny_vlm(arch)
    assert processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == expected
    user = [{"role": "user", "content": "23+45-17="}]
    assert tokenizer.apply_chat_template(user, tokenize=True, return_dict=False) == char.encode("23+45-17=")


@arch_param
def test_chat_template_renders_an_image_part_as_the_placeholder(arch):
    tokenizer = build_vision_tokenizer(arch)
    content = [{"type": "text", "text": "Look: "}, {"type": "image"}, {"type": "text", "text": "2+3="}]
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": content}], tokenize=False)
    assert rendered == f"Look: {IMAGE_PLACEHOLDERS[arch]}2+3="
    with pytest.raises(TemplateError, match="video"):
        tokenizer.apply_chat_template([{"role": "user", "content": [{"type": "video"}]}], tokenize=False)


@arch_param
def test_processor_expands_an_image_to_the_model_image_tokens(arch):
    model, processor = build_tiny_vlm(arch)
    tokenizer = processor.tokenizer
    inputs = encode(processor, [image(0)])
    assert set(inputs) == EXPECTED_KEYS[arch]
    ids = inputs["input_ids"][0]
    image_id = tokenizer.image_token_id
    assert image_id == model.config.image_token_id
    assert inputs["pixel_values"].dtype == torch.float32
    text_ids = tokenizer.encode("What is 2+3?")
    assert ids[-len(text_ids) :].tolist() == text_ids  # the text follows the image, untouched
    if arch in ("qwen2_vl", "qwen2_5_vl"):
        # Qwen keeps the aspect ratio: 40x50 pixels exceed 32*32, so both sides shrink by sqrt(40*50/1024)
        # and floor to multiples of 16 (2x2 merged 8-pixel patches): 16x32, a 1x2x4 grid of patches of
        # 2*8*8*3 = 384 values (an image repeats its frame), merged 2x2 into 2 tokens.
        assert inputs["image_grid_thw"].tolist() == [[1, 2, 4]]
        assert inputs["pixel_values"].shape == (8, 384)
        start, end = tokenizer.vision_bos_token_id, tokenizer.vision_eos_token_id
        assert ids[:4].tolist() == [start, *[image_id] * 2, end]
        square = encode(processor, [image(0, size=(32, 32))])
        assert int((square["input_ids"] == image_id).sum()) == num_image_tokens(arch=arch) == 4
        assert inputs["mm_token_type_ids"][0].tolist() == (ids == image_id).long().tolist()
        return
    assert int((ids == image_id).sum()) == num_image_tokens() == 16
    assert inputs["pixel_values"].shape == (1, 3, 32, 32)
    if arch == "llava":
        assert ids[:16].tolist() == [image_id] * 16
        assert model.config.image_seq_length == 16
    else:
        newline = tokenizer.convert_tokens_to_ids("\n")
        expected = [newline, newline, tokenizer.boi_token_id, *[image_id] * 16, tokenizer.eoi_token_id]
        assert ids[: len(expected) + 2].tolist() == [*expected, newline, newline]
        assert model.config.mm_tokens_per_image == 16
        assert inputs["token_type_ids"][0].tolist() == (ids == image_id).long().tolist()


@arch_param
def test_forward_gives_finite_logits_that_depend_on_the_image(arch):
    model, processor = build_tiny_vlm(arch)
    inputs = encode(processor, [image(0)])
    other = encode(processor, [image(1)])
    with torch.no_grad():
        logits = model(**inputs).logits
        other_logits = model(**other).logits
    assert logits.shape == (1, inputs["input_ids"].shape[1], len(processor.tokenizer))
    assert logits.dtype == torch.float32
    assert torch.isfinite(logits).all()
    assert not torch.allclose(logits[0, -1], other_logits[0, -1])


@arch_param
def test_build_is_seeded_and_restores_the_global_rng(arch):
    state = torch.random.get_rng_state()
    first, _ = build_tiny_vlm(arch, seed=0)
    assert torch.equal(torch.random.get_rng_state(), state)
    second, _ = build_tiny_vlm(arch, seed=0)
    third, _ = build_tiny_vlm(arch, seed=1)
    a, b, c = first.state_dict(), second.state_dict(), third.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)
    assert all(p.dtype == torch.float32 for p in first.parameters())
    for config in (first.config, first.config.text_config, first.generation_config):
        assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (1, 2, 0)


@arch_param
def test_greedy_generation_runs_and_is_deterministic(arch):
    model, processor = build_tiny_vlm(arch)
    prompts = [
        processor.apply_chat_template(conversation(text), add_generation_prompt=True, tokenize=False)
        for text in ("What is 2+3?", "Hi")
    ]
    inputs = processor(text=prompts, images=[[image(0)], [image(1)]], padding=True, return_tensors="pt")
    assert inputs["attention_mask"][1, 0] == 0  # padded on the left
    first = model.generate(**inputs, max_new_tokens=4, do_sample=False)
    second = model.generate(**inputs, max_new_tokens=4, do_sample=False)
    width = inputs["input_ids"].shape[1]
    assert width < first.shape[1] <= width + 4
    assert torch.equal(first[:, :width], inputs["input_ids"])
    assert torch.equal(first, second)


@arch_param
def test_save_and_reload_give_back_the_same_processor_and_model(arch, tmp_path):
    model, processor = build_tiny_vlm(arch)
    model.save_pretrained(tmp_path)
    processor.save_pretrained(tmp_path)
    loaded_processor = AutoProcessor.from_pretrained(tmp_path)
    loaded_model = AutoModelForImageTextToText.from_pretrained(tmp_path)
    assert type(loaded_processor) is type(processor)
    assert type(loaded_processor.image_processor) is type(processor.image_processor)
    assert type(loaded_model) is type(model)

    # The tokenizer comes back exactly as built (no architecture pre-tokenizer dropping spaces).
    text = "a b\nc <answer>7</answer>"
    assert loaded_processor.tokenizer.encode(text) == processor.tokenizer.encode(text)
    assert loaded_processor.tokenizer.padding_side == "left"
    assert loaded_processor.chat_template == processor.chat_template

    images = [image(0)]
    inputs = encode(processor, images)
    loaded_inputs = encode(loaded_processor, images)
    assert set(loaded_inputs) == set(inputs)
    for key in inputs:
        assert torch.equal(loaded_inputs[key], inputs[key]), key
    with torch.no_grad():
        assert torch.equal(loaded_model(**loaded_inputs).logits, model(**inputs).logits)
    gen = loaded_model.generation_config
    assert (gen.bos_token_id, gen.eos_token_id, gen.pad_token_id) == (1, 2, 0)


@arch_param
def test_apply_chat_template_can_tokenize_images_from_the_message(arch):
    _, processor = build_tiny_vlm(arch)
    picture = image(0)
    messages = [
        {"role": "user", "content": [{"type": "image", "image": picture}, {"type": "text", "text": "Hi"}]}
    ]
    inputs = processor.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
    )
    expected = encode(processor, [picture], text="Hi")
    assert set(inputs) == set(expected)
    for key in expected:
        assert torch.equal(inputs[key], expected[key]), key


def test_image_and_sizes_are_configurable():
    model, processor = build_tiny_vlm("gemma3", image_size=28, patch_size=14, hidden_size=32, num_heads=2)
    inputs = encode(processor, [image(0)])
    assert inputs["pixel_values"].shape == (1, 3, 28, 28)
    assert int((inputs["input_ids"] == model.config.image_token_id).sum()) == num_image_tokens(28, 14) == 4
    with torch.no_grad():
        assert torch.isfinite(model(**inputs).logits).all()


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="arch"):
        build_tiny_vlm("idefics3")
    with pytest.raises(ValueError, match="arch"):
        build_vision_tokenizer("idefics3")
    with pytest.raises(ValueError, match="divisible"):
        build_tiny_vlm("llava", image_size=30, patch_size=8)
    with pytest.raises(ValueError, match="image tokens"):
        build_tiny_vlm("gemma3", tokenizer=build_vision_tokenizer("llava"))


@pytest.mark.skipif(
    set(available_architectures()) == set(VISION_ARCHITECTURES), reason="torchvision imports here"
)
def test_qwen_without_torchvision_is_refused_naming_what_is_missing():
    with pytest.raises(ImportError, match="torchvision") as raised:
        build_tiny_vlm("qwen2_5_vl")
    assert QWEN_NEEDS in str(raised.value)

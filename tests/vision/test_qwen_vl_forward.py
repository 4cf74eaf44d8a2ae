"""Qwen2-VL and Qwen2.5-VL through grpokit's vision path, without their processors (which need torchvision,
absent beside the CPU build of PyTorch): the image tensors a processor would give (patches and
``image_grid_thw``) are made by hand. With left padding and multimodal rotary positions, the trainer's
log-probs equal the model's plain forward, the encoder runs once per prompt (where transformers takes
precomputed features), and the sampler's greedy draw
equals ``model.generate``."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForImageTextToText

from grpokit.models.vision import PromptImages, takes_encoder_outputs, vision_modules
from grpokit.rollout.base import SamplingParams
from grpokit.rollout.hf import TransformersBackend
from grpokit.train.forward import completion_logprobs

VOCAB, IMAGE, VIDEO, START, END = 120, 110, 111, 112, 113


def tiny_qwen_vl(model_type: str) -> torch.nn.Module:
    vision = dict(
        depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=14, spatial_merge_size=2,
        temporal_patch_size=2,
    )  # fmt: skip
    if model_type == "qwen2_5_vl":
        vision.update(out_hidden_size=64, fullatt_block_indexes=[1], window_size=56)
    else:
        vision.update(embed_dim=32, hidden_size=64, mlp_ratio=2)
    text = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]},
    )  # fmt: skip
    config = AutoConfig.for_model(
        model_type, text_config=text, vision_config=vision, image_token_id=IMAGE, video_token_id=VIDEO,
        vision_start_token_id=START, vision_end_token_id=END,
    )  # fmt: skip
    torch.manual_seed(0)
    return AutoModelForImageTextToText.from_config(config).eval()


def prompt(num_text: int, grid: tuple[int, int, int], seed: int) -> tuple[list[int], dict[str, torch.Tensor]]:
    """A prompt with one image of ``grid`` (t, h, w) patches: its ids (t*h*w/4 image tokens after the 2x2
    merge) and the tensors the processor gives (flattened patches, the grid)."""
    t, h, w = grid
    ids = [*range(5, 5 + num_text), START, *[IMAGE] * (t * h * w // 4), END, 7, 8]
    patches = torch.randn(t * h * w, 3 * 2 * 14 * 14, generator=torch.Generator().manual_seed(seed))
    return ids, {"pixel_values": patches, "image_grid_thw": torch.tensor([[t, h, w]])}


@pytest.fixture(params=["qwen2_vl", "qwen2_5_vl"])
def case(request):
    model = tiny_qwen_vl(request.param)
    (ids0, t0), (ids1, t1) = prompt(3, (1, 4, 4), 0), prompt(6, (1, 4, 6), 1)
    return model, [ids0, ids1], [t0, t1]


def left_padded(prompts: list[list[int]], group: int) -> tuple[torch.Tensor, torch.Tensor]:
    rows = [p for p in prompts for _ in range(group)]
    width = max(map(len, rows))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in rows])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in rows])
    return ids, mask


def test_logprobs_equal_the_plain_forward_and_the_encoder_runs_once_per_prompt(case):
    model, prompts, tensors = case
    group = 3
    images = PromptImages.of_prompts(tensors, [group, group], "mm_token_type_ids")
    p_ids, p_mask = left_padded(prompts, group)
    c_ids = torch.randint(10, 100, (len(p_ids), 5), generator=torch.Generator().manual_seed(2))
    c_mask = torch.ones_like(c_ids)
    c_mask[1, 3:] = 0
    patches = []  # the patches each encoder call received
    vision_modules(model)[0].register_forward_hook(
        lambda _m, args, kwargs, _o: patches.append((args[0] if args else kwargs["hidden_states"]).shape[0]),
        with_kwargs=True,
    )
    with torch.no_grad():
        logps, _ = completion_logprobs(model, p_ids, p_mask, c_ids, c_mask, images=images)
        if takes_encoder_outputs(model.model):  # one encoder pass over the 2 prompts' 16 + 24 patches
            assert patches == [16 + 24]
        ids = torch.cat([p_ids, c_ids], 1)
        full = model(input_ids=ids, attention_mask=torch.cat([p_mask, c_mask], 1),
                     mm_token_type_ids=(ids == IMAGE).long(), **images.row_inputs("cpu")).logits  # fmt: skip
    width = p_ids.shape[1]
    plain = full[:, width - 1 : -1].log_softmax(-1).gather(-1, c_ids[..., None])[..., 0] * c_mask
    torch.testing.assert_close(logps, plain, atol=2e-5, rtol=0)


def test_the_samplers_greedy_draw_equals_model_generate(case):
    model, prompts, tensors = case
    images = PromptImages.of_prompts(tensors, [1, 1], "mm_token_type_ids")
    params = SamplingParams(max_new_tokens=6, do_sample=False, eos_token_ids=(2,), pad_token_id=0,
                            suppress_token_ids=(IMAGE, VIDEO))  # fmt: skip
    out = TransformersBackend(model).generate(prompts, 1, params, images=images)
    for k, ids in enumerate(prompts):
        row = torch.tensor([ids])
        inputs = {"input_ids": row, "attention_mask": torch.ones_like(row),
                  "mm_token_type_ids": (row == IMAGE).long(), **tensors[k]}  # fmt: skip
        want = model.generate(**inputs, max_new_tokens=6, do_sample=False, eos_token_id=2, pad_token_id=0,
                              bad_words_ids=[[IMAGE], [VIDEO]])[0, len(ids) :].tolist()  # fmt: skip
        want = want[: want.index(2) + 1] if 2 in want else want
        assert out.completion_ids[k] == want

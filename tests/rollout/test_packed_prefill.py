"""The fast sampler's padding-free prefill: prompts of different lengths run packed (their real tokens only)
give the prompt cache and first logits that each prompt's own forward gives, laid out left-padded as the
padded prefill lays them out; chosen where padding is at least 10% of the prompt tokens; refused where it
cannot run."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from grpokit.models.parts import cache_argument, returned_cache
from grpokit.models.vision import PromptImages
from grpokit.rollout import FastSampler
from grpokit.rollout.base import SamplingParams

from .test_fast_sampler import EOS, PAD, PROMPTS, _build, _encode


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def built(request, tmp_path_factory):
    return _build(tmp_path_factory, request.param)


def _own_forward(model, prompt: list[int]):
    """Keys/values per layer [kv, n, d] and the last position's logits [V] of ``prompt`` run alone."""
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        out = model(input_ids=torch.tensor([prompt]), use_cache=True, **cache_argument(model, cache))
    layers = returned_cache(out, cache).layers
    return [layer.keys[0] for layer in layers], [layer.values[0] for layer in layers], out.logits[0, -1]


@pytest.mark.parametrize("batch", [16, 3])
def test_packed_prefill_equals_each_prompts_own_forward(built, batch):
    """Lengths 5, 2, 8, 1 (and 8 again): half the padded tokens are padding. With 3 prompts per backbone call
    the prompts run in two packed calls."""
    model, tok = built
    prompts = [_encode(tok, p) for p in [*PROMPTS, PROMPTS[2]]]
    sampler = FastSampler(model, padding_free=True, prefill_batch_size=batch)
    with torch.inference_mode():
        pre = sampler._prefill(prompts, torch.device("cpu"), keep_hf_cache=False)
    width = max(len(p) for p in prompts)
    assert pre.tokens == sum(len(p) for p in prompts)
    for k, prompt in enumerate(prompts):
        keys, values, logits = _own_forward(model, prompt)
        n = len(prompt)
        for layer, (k_own, v_own) in enumerate(zip(keys, values, strict=True)):
            torch.testing.assert_close(pre.keys[layer][k, :, width - n :], k_own, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(pre.values[layer][k, :, width - n :], v_own, atol=1e-5, rtol=1e-5)
            assert not pre.keys[layer][k, :, : width - n].any()  # left padding: zeros, masked by the bias
            assert not pre.values[layer][k, :, : width - n].any()
        torch.testing.assert_close(pre.last_logits[k], logits, atol=1e-5, rtol=1e-5)
        assert (pre.pad_bias[k, 0, 0, : width - n] == float("-inf")).all()
        assert (pre.pad_bias[k, 0, 0, width - n :] == 0).all()


def test_packed_and_padded_prefill_sample_the_same_greedy_tokens(built):
    """The whole sampler, greedy: the same completions whichever way the prompts are prefilled, and
    ``prefill_tokens`` counts what ran: the real prompt tokens packed, P x the longest padded."""
    model, tok = built
    prompts = [_encode(tok, p) for p in PROMPTS]
    params = SamplingParams(max_new_tokens=10, do_sample=False, eos_token_ids=(EOS,), pad_token_id=PAD)
    outputs, stats = {}, {}
    for padding_free in (True, False):
        sampler = FastSampler(model, padding_free=padding_free)
        outputs[padding_free] = sampler.generate(prompts, 2, params)
        stats[padding_free] = sampler.last_stats["prefill_tokens"]
    assert outputs[True].completion_ids == outputs[False].completion_ids
    for a, b in zip(outputs[True].logprobs, outputs[False].logprobs, strict=True):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-5, rtol=0)
    assert stats == {True: 16, False: 4 * 8}


@pytest.mark.parametrize(
    ("texts", "packed"),
    [
        (PROMPTS, True),  # 16 real of 32 padded tokens
        (["t5 t6 t7 t8 t9 t10 t11 t12 t13 t14", "t5 t6 t7 t8 t9 t10 t11 t12 t13"], False),  # 19 of 20
    ],
)
def test_by_default_packed_where_padding_is_at_least_a_tenth(built, texts, packed):
    model, tok = built
    prompts = [_encode(tok, p) for p in texts]
    sampler = FastSampler(model)
    assert sampler.padding_free is None
    sampler.generate(prompts, 2, SamplingParams(max_new_tokens=2, do_sample=False))
    real, padded = sum(len(p) for p in prompts), len(prompts) * max(len(p) for p in prompts)
    assert sampler.last_stats["prefill_tokens"] == (real if packed else padded)


def test_padding_free_refused_where_the_prefill_cannot_be_packed(built):
    model, _ = built
    with pytest.raises(ValueError, match=r"padding_free=True: the fast sampler cannot prefill .* packed"):
        FastSampler(model, impl="hf", padding_free=True)
    assert FastSampler(model, impl="hf").padding_free is False  # the generic decode pads: never packed
    sampler = FastSampler(model, padding_free=True)
    with pytest.raises(ValueError, match=r"padding_free=True: a prefill with images runs left-padded"):
        images = PromptImages(tensors=(None,), rows=torch.zeros(1, dtype=torch.long))
        sampler.generate([[3, 4]], 1, SamplingParams(max_new_tokens=1), images=images)


def test_packed_prefill_under_autocast_keeps_the_padded_prefills_dtypes(built):
    """Under bf16 autocast the keys come out of the rotary in one dtype and the values out of their
    projection in another: the packed prefill lays each out in its own, as the padded one has them."""
    model, tok = built
    prompts = [_encode(tok, p) for p in PROMPTS]
    made = {}
    for padding_free in (True, False):
        sampler = FastSampler(model, padding_free=padding_free)
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
            made[padding_free] = sampler._prefill(prompts, torch.device("cpu"), keep_hf_cache=False)
    for packed, padded in zip(made[True].keys + made[True].values, made[False].keys + made[False].values):
        assert packed.dtype == padded.dtype
        # equal up to bf16's rounding (products of other shapes round otherwise), through two layers
        torch.testing.assert_close(packed.float(), padded.float(), atol=0.1, rtol=0.05)
        assert (packed.float() - padded.float()).abs().mean() < 1e-2
    torch.testing.assert_close(made[True].last_logits, made[False].last_logits, atol=0.1, rtol=0.05)

"""The sampler's exactness under bf16 autocast, the precision ``bf16=true`` generates in: sampling equal in
distribution to transformers' ``generate`` under the same autocast, and every reported log-prob equal to a
full forward under it (fast sampler; multi-turn sessions cached and re-prefilled). bf16 rounds each matrix
product's output to 8 bits of mantissa, so log-probs agree to bf16's resolution (``ATOL``), not to fp32's
1e-5; each test also shows that the bf16 numbers really differ from fp32's (autocast was in effect)."""

from __future__ import annotations

import copy

import pytest
import torch

from grpokit.envs.turns import CachedTurnSession, ReprefillSession
from grpokit.models.tiny import build_char_tokenizer, build_tiny_model
from grpokit.rollout import FastSampler
from grpokit.rollout.base import SamplingParams

from .test_fast_sampler import EOS, PAD, PROMPTS, VOCAB, _build, _chi2_two_sample, _encode
from .test_turns import SIZES, episode_rows, full_forward_logprobs, params, prompt_ids, run

ATOL = 0.25
"""Log-prob agreement of two bf16 computations of one token (a fused decode step, a full forward): bf16's
rounding, compounded through the layers, moved single log-probs of these peaky test models by up to 0.14
(mean 0.02); a wrong token, position or weight moves them by a nat or more. fp32: 1e-5."""


def bf16():
    return torch.autocast("cpu", dtype=torch.bfloat16)


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    return _build(tmp_path_factory, "qwen2")


def forward_logprobs(model, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """log p(completion[t] | prompt + completion[:t]) from one full forward, in the ambient precision."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(completion)[:, None]).squeeze(1)


def test_bf16_sampling_equal_in_distribution_to_generate(qwen2):
    """First and second tokens of 3000 samples from generate and from FastSampler, both under bf16
    autocast: the two-sample chi-square test must not reject (fixed seeds)."""
    model, tok = qwen2
    prompt = _encode(tok, PROMPTS[2])
    n = 3000
    ids = torch.tensor([prompt] * n)
    with bf16():
        torch.manual_seed(123)
        mask = torch.ones_like(ids)
        hf = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, max_new_tokens=2,
                            min_new_tokens=2, pad_token_id=PAD, eos_token_id=None, top_k=0)  # fmt: skip
        hf = hf[:, len(prompt) :]
        torch.manual_seed(321)
        out = FastSampler(model).generate([prompt], n, SamplingParams(max_new_tokens=2, eos_token_ids=()))
    ours = torch.tensor(out.completion_ids)
    assert ours.shape == (n, 2)
    p_first = _chi2_two_sample(ours[:, 0], hf[:, 0], VOCAB)
    p_second = _chi2_two_sample(ours[:, 1], hf[:, 1], VOCAB)
    assert p_first > 1e-3 and p_second > 1e-3, (p_first, p_second)


@pytest.mark.parametrize("impl", ["native", "hf"])
def test_bf16_sampler_logprobs_equal_a_bf16_full_forward(qwen2, impl):
    model, tok = qwen2
    prompts = [_encode(tok, p) for p in PROMPTS[:3]]
    params_ = SamplingParams(max_new_tokens=6, eos_token_ids=(EOS,), pad_token_id=PAD)
    torch.manual_seed(0)
    with bf16():
        out = FastSampler(model, impl=impl).generate(prompts, 3, params_)
    widest, errors = 0.0, []
    for row, (completion, logprobs) in enumerate(zip(out.completion_ids, out.logprobs)):
        prompt, reported = prompts[row // 3], torch.tensor(logprobs)
        with bf16():
            expected = forward_logprobs(model, prompt, completion)
        torch.testing.assert_close(reported, expected, atol=ATOL, rtol=0)
        errors.append((reported - expected).abs())
        widest = max(widest, (reported - forward_logprobs(model, prompt, completion)).abs().max().item())
    # a few rounding steps on average, not a bias. (impl="hf" is transformers' forward on both sides, but a
    # cached decode step multiplies 1-row matrices and the full forward T-row ones: oneDNN picks other bf16
    # kernels for them on some processors, e.g. AMD EPYC with avx512_bf16, so they need not agree bit for bit)
    assert torch.cat(errors).mean() < 0.05
    assert widest > 1e-4  # against fp32's forward: bf16 really computed them


@pytest.fixture(scope="module")
def turn_model():
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(tokenizer, arch="llama", hidden_size=32, num_layers=2, num_heads=4, seed=3)
    return model.eval(), tokenizer


def test_bf16_turn_sessions_report_the_full_forward_logprobs(turn_model):
    """Multi-turn episodes under bf16 autocast: the cached session and the re-prefilling one each report,
    for every policy token, the log-prob a bf16 full forward over the episode gives."""
    model, tokenizer = turn_model
    ids = prompt_ids(tokenizer)
    greedy = params(tokenizer, greedy=True)
    with bf16():
        cached = run(CachedTurnSession(model, ids, SIZES), tokenizer, episode_rows(), greedy)
        again = run(ReprefillSession(FastSampler(model), ids, SIZES), tokenizer, episode_rows(), greedy)
    prompts = [p for p, size in zip(ids, SIZES) for _ in range(size)]
    widest = 0.0
    for prompt, *episodes in zip(prompts, cached, again):
        for episode in episodes:
            assert episode.done
            mask = torch.tensor(episode.policy_mask, dtype=torch.bool)
            with bf16():
                expected = full_forward_logprobs(model, prompt, episode.completion_ids)[mask]
            reported = torch.tensor(episode.logprobs)[mask]
            torch.testing.assert_close(reported, expected, atol=ATOL, rtol=0)
            fp32 = full_forward_logprobs(model, prompt, episode.completion_ids)[mask]
            widest = max(widest, (reported - fp32).abs().max().item())
    assert widest > 1e-4


def parameter_casts(model, run) -> int:
    """How many times ``run()`` casts one of ``model``'s parameters to another dtype (autocast's casts, and
    the decoder's own; either is a ``to`` of the parameter's storage that returns another dtype)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    storages = {p.untyped_storage().data_ptr() for p in model.parameters()}

    class Casts(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func in casts and args[0].dtype != out.dtype:
                Casts.count += args[0].untyped_storage().data_ptr() in storages
            return out

    casts = (torch.ops.aten.to.dtype, torch.ops.aten._to_copy.default)

    with Casts():
        run()
    return Casts.count


def decoder_cache_dtypes(model, prompts) -> tuple[set[torch.dtype], set[torch.dtype]]:
    """The dtypes of the native decoder's keys and of its values (prompt and generated) under bf16
    autocast."""
    from grpokit.rollout.native_decode import NativeDecoder

    with bf16(), torch.inference_mode():
        pre = FastSampler(model, impl="native")._prefill(prompts, torch.device("cpu"), keep_hf_cache=False)
        decoder = NativeDecoder(model, pre, group=2, max_new=4)
    keys = {t.dtype for t in decoder.prompt_keys + decoder.gen_k}
    return keys, {t.dtype for t in decoder.prompt_values + decoder.gen_v}


def test_the_native_decode_casts_each_weight_once_per_call_with_autocasts_numbers(qwen2, monkeypatch):
    """Under bf16 autocast the native decode casts its weights to bf16 once per call, not at every step
    (the sampler runs in inference mode, where autocast keeps no cast): the parameter casts of a call do not
    grow with its steps. It keeps its keys/values in bf16 too (each key cast once, where it is written).
    Its tokens and log-probs are those of autocast casting the float32 weights and the float32 keys at
    every product (the decode with its own casts turned off), bit for bit; qwen2's q/k/v biases included."""
    from grpokit.rollout import native_decode

    model, tok = qwen2
    prompts = [_encode(tok, p) for p in PROMPTS[:2]]
    monkeypatch.setattr(native_decode, "packs_weights", lambda device, dtype: False)  # the same kernels

    def sample(steps: int):
        params_ = SamplingParams(max_new_tokens=steps, eos_token_ids=(), pad_token_id=PAD)
        with bf16():
            return FastSampler(model, impl="native", generator=torch.Generator().manual_seed(5)).generate(
                prompts, 3, params_
            )

    once = sample(6)
    assert decoder_cache_dtypes(model, prompts) == ({torch.bfloat16}, {torch.bfloat16})
    casts = [parameter_casts(model, lambda n=n: sample(n)) for n in (2, 6)]
    assert casts[0] == casts[1]  # one cast per weight per call, whatever the number of steps
    monkeypatch.setattr(native_decode, "autocast_dtype", lambda device: None)  # autocast casts at each step
    every_step = sample(6)
    assert decoder_cache_dtypes(model, prompts)[0] == {torch.float32}  # the keys as the rotary leaves them
    assert once.completion_ids == every_step.completion_ids
    assert torch.equal(torch.tensor(once.logprobs), torch.tensor(every_step.logprobs))
    per_step = [parameter_casts(model, lambda n=n: sample(n)) for n in (2, 6)]
    assert per_step[1] - per_step[0] == 4 * (2 * 2 + 1)  # seen: 4 steps x (2 layers x (o, down) + head)
    fp32 = forward_logprobs(model, prompts[0], once.completion_ids[0])  # and the numbers are bf16's
    assert (torch.tensor(once.logprobs[0]) - fp32).abs().max() > 1e-4


def test_the_linear_by_columns_equals_f_linear_with_and_without_bias():
    from grpokit.rollout.native_decode import _linear_by_columns

    gen = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(37, 11, generator=gen), torch.randn(37, generator=gen)
    for rows in (1, 3):  # one row is computed as two equal ones
        x = torch.randn(rows, 11, generator=gen)
        for b in (None, bias):
            out = _linear_by_columns(weight, b, x)
            expected = x @ weight.T + (0 if b is None else b)  # [rows, 37]
            assert out.shape == (rows, 37) and out.is_contiguous()
            torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("group", [1, 3])
def test_a_bf16_model_with_a_float32_head_samples_its_forwards_logprobs(qwen2, group):
    """bf16 weights and an LM head made float32 by cast_lm_head_to_fp32, no autocast: the decode step's
    head gets float32 hidden states as the module's hook gives it (one row and several), and the reported
    log-probs are the full forward's."""
    from grpokit.models.policy import cast_lm_head_to_fp32

    model = copy.deepcopy(qwen2[0]).to(torch.bfloat16)
    cast_lm_head_to_fp32(model)
    assert model.get_output_embeddings().weight.dtype == torch.float32
    prompt = _encode(qwen2[1], PROMPTS[0])
    torch.manual_seed(0)
    out = FastSampler(model).generate([prompt], group, SamplingParams(max_new_tokens=6, eos_token_ids=()))
    for completion, logprobs in zip(out.completion_ids, out.logprobs, strict=True):
        expected = forward_logprobs(model, prompt, completion)
        torch.testing.assert_close(torch.tensor(logprobs), expected, atol=ATOL, rtol=0)

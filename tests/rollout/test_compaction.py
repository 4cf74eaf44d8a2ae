"""The fast sampler lets finished rows leave the decode batch (``FastSampler(compact=True)``, the default).

Against the same sampler decoding every row to the end (``compact=False``, the loop as it was): the same
tokens for the same seed (the uniforms are drawn for all N rows every step, so the random stream does not
change), log-probs equal to float rounding, and fewer rows fed to the decode calls. Against the model: greedy
rows equal ``generate`` token for token when whole groups (and their prompts) leave, and every reported
log-prob equals a full forward's.
"""

from __future__ import annotations

import pytest
import torch

from grpokit.rollout import FastSampler, SamplingParams, native_decode
from grpokit.rollout.logits import process_logits

from .test_fast_sampler import EOS, PAD, PROMPTS, _build, _encode, _hf_greedy

STOPS = (EOS, 5, 7, 11, 13, 17, 19, 23)  # common tokens: rows end at very different steps


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model_and_tok(request, tmp_path_factory):
    return _build(tmp_path_factory, request.param)


def _sample(model, prompts, params, *, impl, compact, seed=3, group=8):
    sampler = FastSampler(model, impl=impl, compact=compact, generator=torch.Generator().manual_seed(seed))
    return sampler.generate(prompts, group, params), sampler.last_stats


@pytest.mark.parametrize("impl", ["native", "hf"])
@pytest.mark.parametrize("penalty", [1.0, 1.3])
def test_same_tokens_as_decoding_every_row(model_and_tok, impl, penalty):
    model, tok = model_and_tok
    prompts = [_encode(tok, p) for p in PROMPTS]
    params = SamplingParams(max_new_tokens=24, eos_token_ids=STOPS, repetition_penalty=penalty, top_k=20)
    whole, whole_stats = _sample(model, prompts, params, impl=impl, compact=False)
    compact, stats = _sample(model, prompts, params, impl=impl, compact=True)
    assert compact.completion_ids == whole.completion_ids
    assert compact.truncated == whole.truncated
    for a, b in zip(compact.logprobs, whole.logprobs):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-5, rtol=0)
    lengths = sorted(len(c) for c in whole.completion_ids)
    assert lengths[0] < lengths[-1] // 2  # rows did finish early
    steps = whole_stats["decode_steps"]
    assert whole_stats["decoded_rows"] == whole_stats["rows"] * steps
    # compacted: every decode call feeds at least the rows still running, and fewer than all N
    running = sum(min(len(c), steps + 1) - 1 for c in whole.completion_ids)
    assert running <= stats["decoded_rows"] < whole_stats["decoded_rows"]


@pytest.mark.parametrize("packed_rows", [1, 3])
def test_logprobs_equal_a_full_forward(model_and_tok, monkeypatch, packed_rows):
    """On a CPU where the decode packs its weights (``packs_weights``), packed, however short the call; as the
    rows leave, their last 1-2 float32 rows run packed (``packed_rows`` 1, as on Zen 5) or by columns on the
    plain weights (3, elsewhere)."""
    monkeypatch.setattr(native_decode, "packing_pays", lambda dtype, rows, max_new: True)
    monkeypatch.setattr(native_decode, "packed_fp32_min_rows", lambda: packed_rows)
    packed_calls = []
    for name in ("packed_linear", "packed_linear_add"):
        real = getattr(native_decode, name)
        spy = lambda x, *args, real=real: packed_calls.append(x.shape[0]) or real(x, *args)  # noqa: E731
        monkeypatch.setattr(native_decode, name, spy)
    model, tok = model_and_tok
    prompts = [_encode(tok, p) for p in PROMPTS[:3]]
    params = SamplingParams(max_new_tokens=16, eos_token_ids=STOPS, temperature=0.8)
    out, stats = _sample(model, prompts, params, impl="native", compact=True, group=4)
    assert stats["decoded_rows"] < stats["rows"] * stats["decode_steps"]
    few = [rows for rows in packed_calls if rows <= 2]
    if PACKS[torch.float32]:
        assert packed_calls
        assert bool(few) == (packed_rows == 1)  # the last rows ran packed only where 1 row runs packed
    for row, (completion, logps) in enumerate(zip(out.completion_ids, out.logprobs)):
        prompt = prompts[row // 4]
        with torch.no_grad():
            logits = model(torch.tensor([prompt + completion])).logits[0].float()  # [L, V]
        scores = process_logits(logits[len(prompt) - 1 : -1], params)  # [C, V]
        expected = torch.log_softmax(scores, -1).gather(1, torch.tensor(completion)[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(logps), expected, atol=1e-4, rtol=0)


def test_whole_groups_leave_and_the_rest_decode_as_generate(model_and_tok):
    """Greedy rows of one prompt are equal, so a group finishes at once and its prompt leaves the cache; the
    other prompts' rows still equal ``generate``."""
    model, tok = model_and_tok
    prompts = [_encode(tok, p) for p in PROMPTS]
    greedy = [_hf_greedy(model, p, 12, eos_token_id=None) for p in prompts]
    stop = greedy[0][1]  # prompt 0 ends at its 2nd token
    params = SamplingParams(max_new_tokens=12, do_sample=False, eos_token_ids=(stop,), pad_token_id=PAD)
    sampler = FastSampler(model, compact=True)
    out = sampler.generate(prompts, 3, params)
    for row, completion in enumerate(out.completion_ids):
        expected = greedy[row // 3]
        end = expected.index(stop) + 1 if stop in expected else len(expected)
        assert completion == expected[:end], row
    assert len(out.completion_ids[0]) <= 2 and max(len(c) for c in out.completion_ids) > 2
    stats = sampler.last_stats
    assert stats["decoded_rows"] < stats["rows"] * stats["decode_steps"]


PACKS = {
    dtype: native_decode.packs_weights(torch.device("cpu"), dtype)
    for dtype in (torch.float32, torch.bfloat16)
}
NOT_PACKED = "the decode packs its weights on x86 CPUs: float32 with AVX2 or AVX-512, bf16 with AVX-512"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_products_equal_f_linear(dtype):
    """oneDNN's product on a packed weight equals ``F.linear`` on the weight as it is: float32 to float
    rounding, bfloat16 to bf16's; with and without a bias, at the row counts the decode meets, on [N, in]
    and on the decode's [N, 1, in]."""
    if not PACKS[dtype]:
        pytest.skip(NOT_PACKED)
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(96, 40, generator=gen).to(dtype)
    bias = torch.randn(96, generator=gen).to(dtype)
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 5e-2}
    for b in (None, bias):
        weights = native_decode._pack(native_decode.Weights(weight, b), rows=8)
        assert weights.packed is not None and weights.weight is weight  # the plain weight is kept
        for rows in (1, 3, 14):
            x = torch.randn(rows, 1, 40, generator=gen)  # float32, as the residual stream under autocast
            out = native_decode.packed_linear(x, weights.packed, b)
            plain_bias = None if b is None else b.double()
            expected = torch.nn.functional.linear(x.double(), weight.double(), plain_bias)
            assert out.shape == (rows, 1, 96) and out.dtype == dtype
            torch.testing.assert_close(out.double(), expected, **tol)


@pytest.mark.skipif(not PACKS[torch.float32], reason=NOT_PACKED)
def test_packed_product_adds_the_residual():
    """The decode adds each float32 residual inside the packed product (oneDNN's sum post-op):
    ``residual + F.linear(x, weight, bias)``, computed in float64 here, to float32 rounding, with and without
    a bias, on the decode's [N, 1, in]."""
    gen = torch.Generator().manual_seed(1)
    weight, bias = torch.randn(96, 40, generator=gen), torch.randn(96, generator=gen)
    for b in (None, bias):
        packed = native_decode.pack_weight(weight, rows=8)
        for rows in (3, 14):
            x, residual = torch.randn(rows, 1, 40, generator=gen), torch.randn(rows, 1, 96, generator=gen)
            out = native_decode.packed_linear_add(x, packed, b, residual)
            plain_bias = None if b is None else b.double()
            expected = residual.double() + torch.nn.functional.linear(x.double(), weight.double(), plain_bias)
            torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not PACKS[torch.float32], reason=NOT_PACKED)
def test_packed_decode_samples_as_the_unpacked_one(model_and_tok, monkeypatch):
    """The decode step on packed weights against the same step on the weights as they are (float32, the
    same seed): the same tokens here, and log-probs equal to float rounding. Only the products' kernels
    differ, so a token can differ only where a draw falls within rounding of the boundary between two
    tokens: the two samplers are equal in distribution. The packed step's log-probs also equal a full
    forward (``test_logprobs_equal_a_full_forward`` runs with it on such CPUs)."""
    model, tok = model_and_tok
    prompts = [_encode(tok, p) for p in PROMPTS]
    params = SamplingParams(max_new_tokens=24, eos_token_ids=STOPS, top_k=20)
    monkeypatch.setattr(native_decode, "packing_pays", lambda dtype, rows, max_new: True)  # a short call
    packed, _ = _sample(model, prompts, params, impl="native", compact=True)
    made = []
    real_pack = native_decode._pack
    monkeypatch.setattr(native_decode, "_pack", lambda w, rows: made.append(real_pack(w, rows)) or made[-1])
    _sample(model, prompts, params, impl="native", compact=True)
    assert made and all(w.packed is not None for w in made)  # every product of the step ran packed
    monkeypatch.setattr(native_decode, "packs_weights", lambda device, dtype: False)
    plain, _ = _sample(model, prompts, params, impl="native", compact=True)
    assert packed.completion_ids == plain.completion_ids
    for a, b in zip(packed.logprobs, plain.logprobs):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-5, rtol=0)

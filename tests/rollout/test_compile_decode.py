"""``compile_decode``: the fast sampler's decode step through torch.compile gives the eager step's tokens and
log-probs (greedy, and sampled from the same random numbers), and is refused where there is no native decode
step to compile."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounter

from grpokit import GRPOConfig
from grpokit.models.tiny import build_char_tokenizer, build_tiny_model
from grpokit.rollout import FastSampler
from grpokit.rollout.backends import make_backend
from grpokit.rollout.base import SamplingParams
from grpokit.rollout.fast import compiled_decode_step
from grpokit.rollout.native_decode import NativeDecoder


@pytest.fixture(scope="module")
def model():
    tokenizer = build_char_tokenizer()
    return build_tiny_model(tokenizer, hidden_size=16, num_layers=1, num_heads=2, seed=0).eval()


def _generate(model, compiled: bool, do_sample: bool, eos: tuple[int, ...] = ()):
    sampler = FastSampler(model, generator=torch.Generator().manual_seed(0), compile_decode=compiled)
    prompts = [[5, 6, 7, 8], [9, 10, 11]]  # ragged: the prompts are left-padded
    params = SamplingParams(max_new_tokens=8, temperature=1.0, do_sample=do_sample, eos_token_ids=eos)
    return sampler.generate(prompts, 3, params)


@pytest.mark.parametrize(
    ("do_sample", "eos"), [(False, ()), (True, ()), (True, tuple(range(3, 24)))]
)  # the last: rows finish early and leave the compiled step's batch
def test_compiled_decode_gives_the_eager_tokens_and_logprobs(model, do_sample, eos):
    eager, compiled = _generate(model, False, do_sample, eos), _generate(model, True, do_sample, eos)
    if eos:
        lengths = {len(c) for c in eager.completion_ids}
        assert min(lengths) < max(lengths)
    assert compiled.completion_ids == eager.completion_ids
    for a, b in zip(compiled.logprobs, eager.logprobs):
        assert a == pytest.approx(b, abs=1e-5)
    assert FastSampler(model, compile_decode=True).decode_step is compiled_decode_step()  # compiled once


def test_compile_decode_is_refused_without_a_native_decode(model):
    with pytest.raises(ValueError, match="compile_decode compiles the native decode step"):
        FastSampler(model, impl="hf", compile_decode=True)
    with pytest.raises(ValueError, match=r"the generation backend for this .* is model.generate"):
        make_backend("transformers", model, compile_decode=True)
    for settings, why in (
        ({"use_vllm": True}, "with use_vllm the vLLM engine generates"),
        ({"generation_backend": "transformers"}, "not model.generate"),
        ({"async_generation": True}, "not with async_generation"),
    ):
        with pytest.raises(ValueError, match=rf"GRPOConfig.compile_decode .*{why}"):
            GRPOConfig(compile_decode=True, **settings)


def test_the_step_is_compiled_once_for_every_decode_position(model):
    """torch.compile must not specialise the decode step on the decode position t (an integer index into the
    generated keys' buffers made it do so: a graph per position, and from the ninth dynamo's recompile limit
    ran the step uncompiled). A 16-token call makes two graphs, one for t = 0 (where the t + 1 generated
    keys broadcast) and one for every later t; a second call with more prompts, of other lengths, makes
    none, though the first call's prompts times kv heads equal the model's heads plus kv heads (another
    ``max_new_tokens``, the length of the key buffers, would). The counting backend runs the graphs as
    traced, no inductor."""
    torch._dynamo.reset()  # the tests above compiled the same step with inductor
    counter = CompileCounter()
    sampler = FastSampler(model, generator=torch.Generator().manual_seed(0))
    sampler.decode_step = torch.compile(NativeDecoder.__call__, dynamic=True, backend=counter)
    sampled = SamplingParams(max_new_tokens=16, temperature=1.0, do_sample=True, eos_token_ids=())
    # 2 prompts x 2 kv heads = 4 = heads + kv heads: the model's sizes are marked static, not taken as equal
    sampler.generate([[5, 6, 7], [8, 9, 10, 11, 12]], 3, sampled)
    assert counter.frame_count == 2
    sampler.generate([[5 + i + j for j in range(3 + i)] for i in range(5)], 3, sampled)  # 5 of 3-7 tokens
    assert counter.frame_count == 2
    torch._dynamo.reset()

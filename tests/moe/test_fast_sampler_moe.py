"""The fast sampler's native decode on mixture-of-experts decoders (Qwen3-MoE, Mixtral, Qwen2-MoE): greedy
output equal to ``generate``, sampling equal in distribution, each reported log-prob equal to a full
forward's, and ``generation_backend="auto"`` choosing it."""

import pytest
import torch

from grpokit.models.tiny import build_char_tokenizer, build_tiny_moe
from grpokit.rollout import FastSampler
from grpokit.rollout.backends import resolve_backend_name
from grpokit.rollout.base import SamplingParams
from grpokit.rollout.hf import TransformersBackend
from tests.rollout.test_fast_sampler import _chi2_two_sample

TOKENIZER = build_char_tokenizer()
PROMPTS = ["12+3=", "4+5+67=", "8=", "90+1+2+3="]


@pytest.fixture(scope="module", params=["qwen3_moe", "mixtral", "qwen2_moe"])
def moe(request):
    return build_tiny_moe(TOKENIZER, request.param, hidden_size=64, num_layers=2).eval()


def test_native_decode_and_auto_choose_it(moe):
    assert FastSampler(moe).impl == "native"
    assert resolve_backend_name("auto", moe) == "fast"


def test_greedy_equals_generate_token_for_token(moe):
    prompts = [TOKENIZER.encode(p) for p in PROMPTS]
    params = SamplingParams.for_tokenizer(TOKENIZER, max_new_tokens=24, greedy=True)
    ours = FastSampler(moe).generate(prompts, 1, params)
    theirs = TransformersBackend(moe).generate(prompts, 1, params)
    assert ours.completion_ids == theirs.completion_ids
    assert sum(len(c) for c in ours.completion_ids) >= 40  # most rows run well past their first tokens


def test_logprobs_equal_a_full_forward(moe):
    prompts = [TOKENIZER.encode(p) for p in PROMPTS[:3]]
    params = SamplingParams.for_tokenizer(TOKENIZER, max_new_tokens=10, temperature=0.8)
    torch.manual_seed(0)
    out = FastSampler(moe).generate(prompts, 3, params)
    for row, (tokens, logps) in enumerate(zip(out.completion_ids, out.logprobs)):
        prompt = prompts[row // 3]
        with torch.no_grad():
            logits = moe(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1].float() / 0.8
        expected = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(tokens)[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(logps), expected, rtol=0, atol=1e-5)


def test_sampling_equal_in_distribution_to_generate(moe):
    """First and second tokens of 2000 samples from each (chi-square, fixed seeds)."""
    prompt = TOKENIZER.encode(PROMPTS[1])
    n, vocab = 2000, len(TOKENIZER)
    torch.manual_seed(11)
    params = SamplingParams(max_new_tokens=2, eos_token_ids=())
    ours = torch.tensor(FastSampler(moe).generate([prompt], n, params).completion_ids)
    torch.manual_seed(12)
    theirs = torch.tensor(TransformersBackend(moe).generate([prompt], n, params).completion_ids)
    assert _chi2_two_sample(ours[:, 0], theirs[:, 0], vocab) > 1e-3
    assert _chi2_two_sample(ours[:, 1], theirs[:, 1], vocab) > 1e-3

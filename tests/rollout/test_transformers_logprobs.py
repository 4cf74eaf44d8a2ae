"""The transformers backend reports the sampling log-prob of every drawn token: the log-softmax, at that
token, of the scores ``generate`` processed (temperature, top-k, top-p, repetition penalty), checked against a
recomputation from one full forward, and against the fast sampler under greedy decoding."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpokit.rollout import FastSampler, SamplingParams, TransformersBackend, process_logits


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(tiny_model_dir)


def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _recomputed(model, prompt: list[int], completion: list[int], params: SamplingParams) -> torch.Tensor:
    """log_softmax(process_logits(logits))[token] at every completion position, from one forward [C]."""
    sequence = torch.tensor([prompt + completion])  # [1, L]
    with torch.no_grad():
        logits = model(sequence).logits[0].float()  # [L, V]
    rows = []
    for t, token in enumerate(completion):
        seen = torch.zeros(1, logits.shape[-1], dtype=torch.bool)
        seen[0, sequence[0, : len(prompt) + t]] = True
        scores = process_logits(logits[len(prompt) + t - 1][None], params, seen)  # [1, V]
        rows.append(torch.log_softmax(scores, dim=-1)[0, token])
    return torch.stack(rows)


def test_sampled_logprobs_equal_a_recomputation(policy):
    """Prompts of different lengths (left padding inside generate), three samples each, truncated sampling."""
    model, tok = policy
    prompts = [_encode(tok, "1+1="), _encode(tok, "12+34=")]
    params = SamplingParams(
        max_new_tokens=6, temperature=0.7, top_k=10, top_p=0.9, eos_token_ids=(tok.eos_token_id,),
        pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    out = TransformersBackend(model).generate(prompts, 3, params)
    assert out.logprobs is not None and len(out.logprobs) == 6
    for row, (completion, logprobs) in enumerate(zip(out.completion_ids, out.logprobs)):
        assert len(logprobs) == len(completion) >= 1
        expected = _recomputed(model, prompts[row // 3], completion, params)
        torch.testing.assert_close(torch.tensor(logprobs), expected, atol=1e-5, rtol=0)
        assert all(lp <= 0 for lp in logprobs)


def test_chunked_generation_reports_every_row(policy):
    model, tok = policy
    prompts = [_encode(tok, "1+1="), _encode(tok, "2+2="), _encode(tok, "3+3=")]
    params = SamplingParams(
        max_new_tokens=4, eos_token_ids=(tok.eos_token_id,), pad_token_id=tok.pad_token_id
    )
    torch.manual_seed(1)
    out = TransformersBackend(model, micro_batch_size=2).generate(prompts, 2, params)
    assert [len(lp) for lp in out.logprobs] == [len(ids) for ids in out.completion_ids]
    for row, (completion, logprobs) in enumerate(zip(out.completion_ids, out.logprobs)):
        expected = _recomputed(model, prompts[row // 2], completion, params)
        torch.testing.assert_close(torch.tensor(logprobs), expected, atol=1e-5, rtol=0)


def test_greedy_logprobs_match_the_fast_sampler_and_ignore_temperature(policy):
    """Greedy: the log-softmax of the scores after the repetition penalty only (no temperature): the model's
    own log-prob of the argmax token, the same tokens and log-probs as the fast sampler's greedy decode."""
    model, tok = policy
    prompt = _encode(tok, "7+8=")
    params = SamplingParams(
        max_new_tokens=5, do_sample=False, temperature=0.5, repetition_penalty=1.3,
        eos_token_ids=(tok.eos_token_id,), pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    hf = TransformersBackend(model).generate([prompt], 1, params)
    fast = FastSampler(model).generate([prompt], 1, params)
    assert hf.completion_ids == fast.completion_ids
    torch.testing.assert_close(torch.tensor(hf.logprobs), torch.tensor(fast.logprobs), atol=1e-5, rtol=0)
    expected = _recomputed(model, prompt, hf.completion_ids[0], params)  # process_logits: no temperature
    torch.testing.assert_close(torch.tensor(hf.logprobs[0]), expected, atol=1e-5, rtol=0)


def test_a_generate_returning_ids_alone_gets_the_same_logprobs_from_a_forward(policy):
    """A ``generate`` replaced by one that returns the sequences tensor alone (as TRL's tests patch it)
    records no scores: the backend recomputes them from a forward and gets the log-probs the real
    ``generate`` recorded for the same tokens (prompts of different lengths: left padding; a repetition
    penalty: ``seen`` covers the prompt's real tokens and the tokens drawn before)."""
    model, tok = policy
    prompts = [_encode(tok, "1+1="), _encode(tok, "12+34=")]
    params = SamplingParams(
        max_new_tokens=6, temperature=0.8, top_k=12, top_p=0.95, repetition_penalty=1.2,
        eos_token_ids=(tok.eos_token_id,), pad_token_id=tok.pad_token_id,
    )  # fmt: skip
    torch.manual_seed(3)
    recorded = TransformersBackend(model).generate(prompts, 2, params)
    real_generate = model.generate

    def ids_only(**kwargs):
        return real_generate(**kwargs).sequences  # [B, P + S]

    torch.manual_seed(3)
    model.generate = ids_only
    try:
        recomputed = TransformersBackend(model).generate(prompts, 2, params)
    finally:
        del model.generate  # the class's generate again
    assert recomputed.completion_ids == recorded.completion_ids
    assert recomputed.truncated == recorded.truncated
    for got, want in zip(recomputed.logprobs, recorded.logprobs):
        torch.testing.assert_close(torch.tensor(got), torch.tensor(want), atol=1e-5, rtol=0)

"""FastSampler against transformers' generate: greedy token for token, sampling equal in distribution,
processors equal to generate's own processed scores, log-probs equal a recomputation, early stop, groups.

The models are tiny random decoders saved to disk and loaded back with from_pretrained; initializer_range
0.3 makes the next-token distributions peaky (a top token of 15-50%), so top-k/top-p/min-p cut real mass.
"""

from __future__ import annotations

import math

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

from grpokit.rollout import FastSampler, process_logits
from grpokit.rollout.base import GenerationOutput, RolloutBackend, SamplingParams

VOCAB = 48
PAD, EOS = 0, 1


def _tokenizer(path) -> PreTrainedTokenizerFast:
    vocab = {"<pad>": PAD, "<eos>": EOS, "<unk>": 2}
    vocab.update({f"t{i}": i for i in range(3, VOCAB)})
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )
    tok.save_pretrained(path)
    return PreTrainedTokenizerFast.from_pretrained(path)


def _build(tmp_path_factory, model_type: str):
    path = tmp_path_factory.mktemp(f"tiny-{model_type}")
    tok = _tokenizer(path)
    config = AutoConfig.for_model(
        model_type,
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=128,
        initializer_range=0.3,
        tie_word_embeddings=False,
        pad_token_id=PAD,
        eos_token_id=EOS,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return model, tok


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    return _build(tmp_path_factory, "qwen2")


def _encode(tok, text: str) -> list[int]:
    return tok(text)["input_ids"]


PROMPTS = ["t5 t9 t3 t7 t11", "t4 t4", "t20 t21 t22 t23 t24 t25 t26 t27", "t30"]


def _hf_greedy(model, prompt: list[int], max_new: int, **kw) -> list[int]:
    ids = torch.tensor([prompt])
    kw = {"eos_token_id": EOS, **kw}
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        do_sample=False,
        max_new_tokens=max_new,
        pad_token_id=PAD,
        **kw,
    )
    return out[0, len(prompt) :].tolist()


# ---------------------------------------------------------------------------------------------- greedy
@pytest.mark.parametrize("model_type", ["qwen2", "llama", "qwen3"])
@pytest.mark.parametrize("impl", ["native", "hf"])
def test_greedy_equals_generate_token_for_token(tmp_path_factory, model_type, impl):
    model, tok = _build(tmp_path_factory, model_type)
    prompts = [_encode(tok, p) for p in PROMPTS]  # lengths 5, 2, 8, 1: left padding in one batch
    sampler = FastSampler(model, impl=impl)
    assert isinstance(sampler, RolloutBackend)
    assert sampler.impl == impl
    params = SamplingParams(max_new_tokens=12, do_sample=False, eos_token_ids=(EOS,), pad_token_id=PAD)
    out = sampler.generate(prompts, 2, params)
    assert len(out.completion_ids) == len(prompts) * 2
    for k, prompt in enumerate(prompts):
        expected = _hf_greedy(model, prompt, 12)
        expected = expected[: expected.index(EOS) + 1] if EOS in expected else expected
        for g in range(2):  # rows k*G .. k*G+G-1 belong to prompt k
            assert out.completion_ids[k * 2 + g] == expected
            assert out.truncated[k * 2 + g] == (EOS not in expected)


def test_greedy_with_repetition_penalty_equals_generate(qwen2):
    model, tok = qwen2
    prompt = _encode(tok, PROMPTS[0])
    params = SamplingParams(
        max_new_tokens=10, do_sample=False, repetition_penalty=1.8, eos_token_ids=(), pad_token_id=PAD
    )
    out = FastSampler(model).generate([prompt], 1, params)
    assert out.completion_ids[0] == _hf_greedy(model, prompt, 10, repetition_penalty=1.8, eos_token_id=None)


# ------------------------------------------------------------------------------------------ processors
PROCESSOR_SETTINGS = {
    "plain": {},
    "temperature": {"temperature": 0.6},
    "top_k": {"top_k": 4},
    "top_p": {"top_p": 0.7},
    "min_p": {"min_p": 0.15},
    "repetition_penalty": {"repetition_penalty": 1.7},
    "all": {"repetition_penalty": 1.3, "temperature": 0.8, "top_k": 10, "top_p": 0.9, "min_p": 0.05},
}


@pytest.mark.parametrize("setting", sorted(PROCESSOR_SETTINGS))
def test_process_logits_equals_generate_scores(qwen2, setting):
    """generate(output_scores) returns its processed scores next to the raw logits: ours must match them."""
    model, tok = qwen2
    kw = PROCESSOR_SETTINGS[setting]
    prompt = _encode(tok, PROMPTS[0])
    ids = torch.tensor([prompt] * 3)
    torch.manual_seed(1)
    out = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        do_sample=True,
        max_new_tokens=4,
        pad_token_id=PAD,
        eos_token_id=None,
        top_k=kw.get("top_k", 0),
        output_scores=True,
        output_logits=True,
        return_dict_in_generate=True,
        **{k: v for k, v in kw.items() if k != "top_k"},
    )
    params = SamplingParams(max_new_tokens=4, eos_token_ids=(), **kw)
    for t, (raw, scores) in enumerate(zip(out.logits, out.scores)):
        seen = torch.zeros(3, VOCAB, dtype=torch.bool)
        seen.scatter_(1, out.sequences[:, : len(prompt) + t], True)
        ours = process_logits(raw.float(), params, seen)
        assert torch.equal(torch.isinf(ours), torch.isinf(scores)), f"step {t}: different tokens filtered"
        finite = torch.isfinite(scores)
        torch.testing.assert_close(ours[finite], scores[finite].float(), rtol=1e-5, atol=1e-5)


def _chi2_two_sample(a: torch.Tensor, b: torch.Tensor, num_classes: int) -> float:
    """p-value of the chi-square test that two equal-size samples of class ids come from one distribution.

    Classes with fewer than 10 draws in both samples together are pooled into one bin."""
    ca = torch.bincount(a, minlength=num_classes).double()
    cb = torch.bincount(b, minlength=num_classes).double()
    assert ca.sum() == cb.sum()
    big = (ca + cb) >= 10
    ca_b = torch.cat([ca[big], ca[~big].sum()[None]])
    cb_b = torch.cat([cb[big], cb[~big].sum()[None]])
    keep = (ca_b + cb_b) > 0
    ca_b, cb_b = ca_b[keep], cb_b[keep]
    stat = float(((ca_b - cb_b) ** 2 / (ca_b + cb_b)).sum())
    dof = len(ca_b) - 1
    if dof == 0:
        return 1.0
    return float(
        torch.special.gammaincc(
            torch.tensor(dof / 2.0, dtype=torch.float64), torch.tensor(stat / 2.0, dtype=torch.float64)
        )
    )


@pytest.mark.parametrize("setting", sorted(PROCESSOR_SETTINGS))
def test_sampling_equal_in_distribution_to_generate(qwen2, setting):
    """First and second tokens of 3000 samples each from generate and from FastSampler (one prompt, G=3000):
    the two-sample chi-square test must not reject (fixed seeds, so the outcome is deterministic). Tokens
    ours samples must all be inside the support generate allows (filtered tokens never appear)."""
    model, tok = qwen2
    kw = PROCESSOR_SETTINGS[setting]
    prompt = _encode(tok, PROMPTS[2])
    n = 3000
    ids = torch.tensor([prompt] * n)
    torch.manual_seed(123)
    hf = model.generate(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        do_sample=True,
        max_new_tokens=2,
        min_new_tokens=2,
        pad_token_id=PAD,
        eos_token_id=None,
        top_k=kw.get("top_k", 0),
        **{k: v for k, v in kw.items() if k != "top_k"},
    )[:, len(prompt) :]
    torch.manual_seed(321)
    params = SamplingParams(max_new_tokens=2, eos_token_ids=(), **kw)
    ours = torch.tensor(FastSampler(model).generate([prompt], n, params).completion_ids)
    assert ours.shape == (n, 2)
    p_first = _chi2_two_sample(ours[:, 0], hf[:, 0], VOCAB)
    p_second = _chi2_two_sample(ours[:, 1], hf[:, 1], VOCAB)
    assert p_first > 1e-3 and p_second > 1e-3, (p_first, p_second)
    # Exact support of the first token: what generate's processors leave finite.
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[:, -1].float()
    seen = torch.zeros(1, VOCAB, dtype=torch.bool)
    seen[0, torch.tensor(prompt)] = True
    allowed = torch.isfinite(process_logits(logits, params, seen))[0]
    assert allowed[ours[:, 0]].all()
    if setting in ("top_k", "top_p", "min_p"):
        assert not allowed.all()  # the filter really removed tokens in this setting


def test_sampling_power_detects_a_wrong_temperature(qwen2):
    """The distribution test has teeth: temperature 0.6 vs 1.0 is rejected."""
    model, tok = qwen2
    prompt = _encode(tok, PROMPTS[2])
    torch.manual_seed(5)
    a = torch.tensor(
        FastSampler(model).generate([prompt], 3000, SamplingParams(max_new_tokens=1)).completion_ids
    )
    b = torch.tensor(
        FastSampler(model)
        .generate([prompt], 3000, SamplingParams(max_new_tokens=1, temperature=0.6))
        .completion_ids
    )
    assert _chi2_two_sample(a[:, 0], b[:, 0], VOCAB) < 1e-6


# ---------------------------------------------------------------------------------------------- log-probs
@pytest.mark.parametrize("impl", ["native", "hf"])
def test_logprobs_equal_recomputation(qwen2, impl):
    """Each reported log-prob = log_softmax(processed scores)[token], recomputed from one full forward."""
    model, tok = qwen2
    prompts = [_encode(tok, p) for p in PROMPTS[:3]]
    params = SamplingParams(
        max_new_tokens=6,
        temperature=0.7,
        top_k=12,
        top_p=0.95,
        repetition_penalty=1.2,
        eos_token_ids=(EOS,),
        pad_token_id=PAD,
    )
    torch.manual_seed(0)
    out = FastSampler(model, impl=impl).generate(prompts, 3, params)
    for row, (comp, lps) in enumerate(zip(out.completion_ids, out.logprobs)):
        prompt = prompts[row // 3]
        assert len(comp) == len(lps) >= 1
        seq = torch.tensor([prompt + comp])
        with torch.no_grad():
            logits = model(seq).logits[0].float()  # [L, V]
        for t, token in enumerate(comp):
            seen = torch.zeros(1, VOCAB, dtype=torch.bool)
            seen[0, seq[0, : len(prompt) + t]] = True
            scores = process_logits(logits[len(prompt) + t - 1][None], params, seen)
            expected = torch.log_softmax(scores, dim=-1)[0, token].item()
            assert math.isfinite(lps[t])
            assert abs(lps[t] - expected) < 1e-4, (row, t, lps[t], expected)


def test_greedy_logprobs_are_log_softmax_of_raw_logits(qwen2):
    model, tok = qwen2
    prompt = _encode(tok, PROMPTS[1])
    out = FastSampler(model).generate(
        [prompt], 1, SamplingParams(max_new_tokens=3, do_sample=False, temperature=0.5)
    )
    with torch.no_grad():
        logits = model(torch.tensor([prompt + out.completion_ids[0]])).logits[0]
    expected = torch.log_softmax(logits, -1)[len(prompt) - 1 : -1].gather(
        -1, torch.tensor(out.completion_ids[0])[:, None]
    )
    torch.testing.assert_close(torch.tensor(out.logprobs[0]), expected[:, 0], atol=1e-4, rtol=0)


# ---------------------------------------------------------------------------------------------- stopping
def test_stops_when_every_sequence_has_finished(qwen2):
    """EOS = the set of tokens that greedy decoding emits at its 3rd step for some prompt: every row ends
    there, with the EOS kept as its last token, and no decode step runs after the last row finished."""
    model, tok = qwen2
    prompts = [_encode(tok, p) for p in PROMPTS]
    greedy = [_hf_greedy(model, p, 3, eos_token_id=None) for p in prompts]
    stops = {g[2] for g in greedy}
    params = SamplingParams(max_new_tokens=40, do_sample=False, eos_token_ids=tuple(stops), pad_token_id=PAD)
    sampler = FastSampler(model)
    out = sampler.generate(prompts, 2, params)
    for row, comp in enumerate(out.completion_ids):
        g = greedy[row // 2]
        first_stop = next(t for t, tok_id in enumerate(g) if tok_id in stops)
        assert comp == g[: first_stop + 1]
        assert comp[-1] in stops and not any(x in stops for x in comp[:-1])
        assert out.truncated[row] is False
    assert sampler.last_stats["decode_steps"] == max(len(c) for c in out.completion_ids) - 1


def test_truncated_when_no_eos(qwen2):
    model, tok = qwen2
    out = FastSampler(model).generate([_encode(tok, PROMPTS[0])], 4, SamplingParams(max_new_tokens=7))
    assert all(len(c) == 7 for c in out.completion_ids)
    assert out.truncated == [True] * 4
    assert all(len(lp) == 7 for lp in out.logprobs)


def test_sampled_rows_stop_at_their_own_eos(qwen2):
    """Rows finish at different steps; each keeps its EOS as last token and nothing after it."""
    model, tok = qwen2
    common = (EOS, 5, 7, 11, 13, 17, 19, 23)
    params = SamplingParams(max_new_tokens=30, eos_token_ids=common)
    torch.manual_seed(3)
    out = FastSampler(model).generate([_encode(tok, p) for p in PROMPTS], 8, params)
    lengths = {len(c) for c in out.completion_ids}
    assert len(lengths) > 1
    for comp, trunc in zip(out.completion_ids, out.truncated):
        assert not any(x in common for x in comp[:-1])
        assert trunc == (comp[-1] not in common)


# ------------------------------------------------------------------------------------------ prompt sharing
def test_each_prompt_prefilled_once_and_shared_by_its_group(qwen2):
    model, tok = qwen2
    prompts = [_encode(tok, p) for p in PROMPTS]
    sampler = FastSampler(model)
    params = SamplingParams(max_new_tokens=5, do_sample=False, eos_token_ids=())
    out = sampler.generate(prompts, 6, params)
    assert sampler.last_stats["prefill_rows"] == len(prompts)  # not len(prompts) * 6
    for k, p in enumerate(prompts):
        expected = _hf_greedy(model, p, 5, eos_token_id=None)
        assert out.completion_ids[k * 6 : (k + 1) * 6] == [expected] * 6


def test_seeded_and_generator(qwen2):
    model, tok = qwen2
    prompts = [_encode(tok, p) for p in PROMPTS[:2]]
    params = SamplingParams(max_new_tokens=6, top_p=0.9)
    torch.manual_seed(7)
    a = FastSampler(model).generate(prompts, 4, params)
    torch.manual_seed(7)
    b = FastSampler(model).generate(prompts, 4, params)
    assert a.completion_ids == b.completion_ids and a.logprobs == b.logprobs
    c = FastSampler(model, generator=torch.Generator().manual_seed(7)).generate(prompts, 4, params)
    d = FastSampler(model, generator=torch.Generator().manual_seed(7)).generate(prompts, 4, params)
    assert c.completion_ids == d.completion_ids
    assert isinstance(a, GenerationOutput)


def test_restores_training_mode_and_validates(qwen2):
    model, tok = qwen2
    model.train()
    try:
        FastSampler(model).generate([_encode(tok, PROMPTS[0])], 2, SamplingParams(max_new_tokens=2))
        assert model.training
    finally:
        model.eval()
    with pytest.raises(ValueError):
        FastSampler(model).generate([[]], 2, SamplingParams(max_new_tokens=2))
    with pytest.raises(ValueError):
        FastSampler(model, impl="nope")


def test_prompts_per_call_bounds_the_batch_and_keeps_the_output(qwen2):
    """``prompts_per_call`` (``generation_micro_batch_size``) decodes a few prompts' groups at a time: the
    same greedy completions and log-probs, rows still grouped per prompt, the prefill counted in chunks."""
    model, tok = qwen2
    prompts = [_encode(tok, p) for p in PROMPTS[:3]]
    params = SamplingParams(max_new_tokens=5, do_sample=False, eos_token_ids=())
    whole = FastSampler(model).generate(prompts, 2, params)
    sampler = FastSampler(model, prompts_per_call=2)
    chunked = sampler.generate(prompts, 2, params)
    assert chunked.completion_ids == whole.completion_ids and chunked.truncated == whole.truncated
    torch.testing.assert_close(torch.tensor(chunked.logprobs), torch.tensor(whole.logprobs))
    assert sampler.last_stats["prefill_rows"] == 3 and sampler.last_stats["rows"] == 6
    with pytest.raises(ValueError, match="prompts_per_call"):
        FastSampler(model, prompts_per_call=0)

"""The lean training forward against the plain one.

Plain = ``model(input_ids, attention_mask, position_ids).logits`` over [prompt | completion], log_softmax,
gather: the textbook computation, written out in this file. The lean forward (completion positions only,
chunked LM head under checkpointing, shared prefix per group) must give the same log-probs, the same
entropy and the same gradient on every parameter, to float tolerance. A second reference is
``grpokit.core.logprobs_and_entropy`` on the full logits (the memory-lean log-softmax for loops that have
the logits), which the lean forward's fused head computes without them.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from grpokit.core import logprobs_and_entropy
from grpokit.train import lm_head
from grpokit.train.forward import completion_logprobs, no_grad_logprobs, shared_prefix_pays
from grpokit.train.lm_head import _FusedHeadLogprobs, head_chunk_rows

VOCAB = 61
G = 3


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-forward")
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        initializer_range=0.2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(path)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def _batch(prompt_lens=(5, 2, 4), completion_lens=(6, 4, 1, 5, 6, 3, 2, 6, 5), seed=0):
    """Groups of G rows sharing one left-padded prompt; completions right-padded to different lengths (a
    third of the padded tokens are padding: the automatic choice packs them, ``grpokit.models.packing``)."""
    gen = torch.Generator().manual_seed(seed)
    width, c_width = max(prompt_lens), max(completion_lens)
    rows = len(prompt_lens) * G
    p_ids = torch.zeros(rows, width, dtype=torch.long)
    p_mask = torch.zeros(rows, width, dtype=torch.long)
    for k, n in enumerate(prompt_lens):
        prompt = torch.randint(3, VOCAB, (n,), generator=gen)
        for g in range(G):
            p_ids[k * G + g, width - n :] = prompt
            p_mask[k * G + g, width - n :] = 1
    c_ids = torch.zeros(rows, c_width, dtype=torch.long)
    c_mask = torch.zeros(rows, c_width, dtype=torch.long)
    for r, n in enumerate(completion_lens[:rows]):
        c_ids[r, :n] = torch.randint(3, VOCAB, (n,), generator=gen)
        c_mask[r, :n] = 1
    return p_ids, p_mask, c_ids, c_mask


def _plain(model, p_ids, p_mask, c_ids, c_mask, temperature=1.0):
    """Textbook: full forward, logits at P-1 .. P+C-2, log_softmax, gather. Also the entropy."""
    input_ids = torch.cat([p_ids, c_ids], 1)
    attention_mask = torch.cat([p_mask, c_mask], 1)
    position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    width = p_ids.shape[1]
    logits = logits[:, width - 1 : -1].float() / temperature  # [B, C, V]
    logp_all = torch.log_softmax(logits, -1)
    logps = logp_all.gather(-1, c_ids[..., None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logps * c_mask, entropy * c_mask


def _grads(model, fn, weights):
    model.zero_grad(set_to_none=True)
    logps, entropy = fn()
    # A loss that uses every position: weighted log-probs plus a small entropy bonus.
    (logps * weights).sum().add(0.1 * entropy.sum()).backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return logps.detach(), entropy.detach(), grads


@pytest.mark.parametrize("padding_free", [False, True])
@pytest.mark.parametrize("shared_prefix", [False, True])
@pytest.mark.parametrize("chunk_size", [None, 4])
def test_lean_forward_equals_plain_logprobs_entropy_and_gradients(
    model, shared_prefix, chunk_size, padding_free
):
    p_ids, p_mask, c_ids, c_mask = _batch()
    weights = torch.randn(c_ids.shape, generator=torch.Generator().manual_seed(1))
    temperature = 0.7
    ref_lp, ref_ent, ref_g = _grads(
        model, lambda: _plain(model, p_ids, p_mask, c_ids, c_mask, temperature), weights
    )
    lp, ent, g = _grads(
        model,
        lambda: completion_logprobs(
            model,
            p_ids,
            p_mask,
            c_ids,
            c_mask,
            temperature=temperature,
            with_entropy=True,
            num_generations=G,
            shared_prefix=shared_prefix,
            chunk_size=chunk_size,
            padding_free=padding_free,
        ),
        weights,
    )
    assert lp.dtype == torch.float32 and lp.shape == c_ids.shape
    torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=1e-5)
    assert (lp[c_mask == 0] == 0).all() and (ent[c_mask == 0] == 0).all()
    assert set(g) == set(ref_g)
    for name in ref_g:
        scale = ref_g[name].abs().max().clamp(min=1e-6)
        torch.testing.assert_close(g[name] / scale, ref_g[name] / scale, atol=2e-5, rtol=0, msg=name)
    # The prompt's gradient reaches the embeddings of prompt tokens (shared path: summed over the G rows).
    prompt_tokens = p_ids[p_mask.bool()].unique()
    assert g["model.embed_tokens.weight"][prompt_tokens].abs().sum() > 0


def test_fused_head_equals_core_logprobs_on_the_full_logits(model):
    """The lean forward and core.logprobs_and_entropy over the full forward's logits: same log-probs, entropy
    and parameter gradients (two chunked custom-backward implementations of one quantity)."""
    p_ids, p_mask, c_ids, c_mask = _batch(seed=5)
    weights = torch.randn(c_ids.shape, generator=torch.Generator().manual_seed(2))

    def full_logits_path():
        input_ids, attention_mask = torch.cat([p_ids, c_ids], 1), torch.cat([p_mask, c_mask], 1)
        position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
        logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
        lp, ent = logprobs_and_entropy(
            logits[:, p_ids.shape[1] - 1 : -1], c_ids, temperature=0.9, with_entropy=True, chunk_size=5
        )
        return lp * c_mask, ent * c_mask

    ref_lp, ref_ent, ref_g = _grads(model, full_logits_path, weights)
    lp, ent, g = _grads(
        model,
        lambda: completion_logprobs(
            model, p_ids, p_mask, c_ids, c_mask, temperature=0.9, with_entropy=True, chunk_size=7
        ),
        weights,
    )
    torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=1e-5)
    for name in ref_g:
        scale = ref_g[name].abs().max().clamp(min=1e-6)
        torch.testing.assert_close(g[name] / scale, ref_g[name] / scale, atol=2e-5, rtol=0, msg=name)


def test_shared_prefix_equals_plain_path(model):
    p_ids, p_mask, c_ids, c_mask = _batch(prompt_lens=(7, 3), completion_lens=(5, 5, 2, 4, 5, 1), seed=3)
    with torch.no_grad():
        a, _ = completion_logprobs(model, p_ids, p_mask, c_ids, c_mask, num_generations=G, shared_prefix=True)
        b, _ = completion_logprobs(
            model, p_ids, p_mask, c_ids, c_mask, num_generations=G, shared_prefix=False
        )
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_single_token_completions(model):
    p_ids, p_mask, c_ids, c_mask = _batch(completion_lens=(1,) * 9)
    c_ids, c_mask = c_ids[:, :1], c_mask[:, :1]
    ref, _ = _plain(model, p_ids, p_mask, c_ids, c_mask)
    for shared in (False, True):
        lp, _ = completion_logprobs(
            model, p_ids, p_mask, c_ids, c_mask, num_generations=G, shared_prefix=shared
        )
        torch.testing.assert_close(lp.detach(), ref.detach(), atol=1e-5, rtol=1e-5)


def test_no_grad_logprobs_matches_and_is_a_normal_tensor(model):
    p_ids, p_mask, c_ids, c_mask = _batch()
    with torch.no_grad():
        ref, _ = _plain(model, p_ids, p_mask, c_ids, c_mask, temperature=1.3)
    model.train()
    out = no_grad_logprobs(
        model, p_ids, p_mask, c_ids, c_mask, temperature=1.3, num_generations=G, micro_batch_size=2 * G
    )
    assert model.training  # restored
    model.eval()
    assert not out.is_inference() and not out.requires_grad
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_shared_prefix_choice(model):
    p_ids, p_mask, c_ids, c_mask = _batch()
    # Long shared prompts and short completions pay; one generation per prompt never does.
    assert shared_prefix_pays(torch.ones(32, 512), 16, 64)
    assert not shared_prefix_pays(torch.ones(32, 512), 1, 64)
    assert not shared_prefix_pays(torch.ones(64, 4), 8, 128)
    # Rows of a "group" with different prompts: forced sharing is refused, automatic falls back to plain.
    mixed = p_ids.clone()
    mixed[1, -1] = (mixed[1, -1] + 1) % VOCAB
    with pytest.raises(ValueError, match="share one prompt"):
        completion_logprobs(model, mixed, p_mask, c_ids, c_mask, num_generations=G, shared_prefix=True)
    with torch.no_grad():
        auto, _ = completion_logprobs(model, mixed, p_mask, c_ids, c_mask, num_generations=G)
        plain, _ = _plain(model, mixed, p_mask, c_ids, c_mask)
    torch.testing.assert_close(auto, plain, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError):
        completion_logprobs(
            model, p_ids[:4], p_mask[:4], c_ids[:4], c_mask[:4], num_generations=G, shared_prefix=True
        )


def test_head_chunk_rows_keep_a_chunk_within_32_mib():
    # rows = 32 MiB / (4 bytes x V), between 32 and 512
    assert head_chunk_rows(8000) == 512  # 1,048 by size, capped
    assert head_chunk_rows(49152) == 170  # SmolLM2: 170 x 49,152 x 4 B = 33.4e6 B <= 32 MiB
    assert head_chunk_rows(152064) == 55  # Qwen2.5
    assert 170 * 49152 * 4 <= 32 * 2**20 < 171 * 49152 * 4
    assert head_chunk_rows(2_000_000) == 32  # the floor keeps the matmul efficient


@pytest.mark.parametrize("autocast, onednn", [(False, True), (False, False), (True, True)])
def test_fused_head_equals_a_float64_log_softmax_of_its_logits(autocast, onednn, monkeypatch):
    """The chunked head over chunks of 4, 4 and 3 rows (its buffers reused from chunk to chunk), with a bias
    and a temperature: log-probs, entropy and the gradients of h, W and b against a float64 log-softmax of
    the whole [M, V] logits and its exact gradient (dL/dz, then through z = h W^T + b). Under bf16 autocast
    the logits are the same bf16 product, and the backward runs after autocast is left, as a trainer calls
    it: the head recomputes each chunk's logits as its forward computed them, its entropy and dL/dz in
    float32; its gradient products take dL/dz, h and W rounded to bf16, as autocast's ``F.linear`` backward
    does, each product's result rounded to bf16 (to 2^-8 of each value, 2^-8 of the largest for W's, summed
    over three chunks). In float32 both ways the products run: oneDNN's where ``onednn_float32`` holds (the
    logits its own block, each chunk's dL/dW product added to the sum in blocks of 5 of W's 13 rows) and
    ``mm``/``addmm_`` into the buffers and the sum (``onednn`` False: as on a CPU without AVX-512, or a
    GPU)."""
    monkeypatch.setattr(lm_head, "WEIGHT_GRADIENT_ROWS", 5)
    if not onednn:
        monkeypatch.setattr(lm_head, "onednn_float32", lambda *tensors: False)
    gen = torch.Generator().manual_seed(7)
    h = torch.randn(11, 8, generator=gen).requires_grad_()
    weight = torch.randn(13, 8, generator=gen).requires_grad_()
    bias = torch.randn(13, generator=gen).requires_grad_()
    targets = torch.randint(0, 13, (11,), generator=gen)
    w_lp, w_ent = torch.randn(11, generator=gen), torch.randn(11, generator=gen)
    product = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else contextlib.nullcontext()

    with product:
        lp, ent = _FusedHeadLogprobs.apply(h, weight, bias, targets, 1 / 0.7, True, 4)
    (w_lp * lp + w_ent * ent).sum().backward()

    with product, torch.no_grad():
        logits = torch.nn.functional.linear(h, weight, bias)  # [M, V]
    z = logits.double().requires_grad_()
    log_p = torch.log_softmax(z / 0.7, dim=-1)
    ref_lp = log_p.gather(1, targets[:, None]).squeeze(1)
    ref_ent = -(log_p.exp() * log_p).sum(-1)
    (w_lp.double() * ref_lp + w_ent.double() * ref_ent).sum().backward()
    dz = z.grad  # [M, V]
    rounded = (lambda t: t.detach().bfloat16().double()) if autocast else (lambda t: t.detach().double())
    ref_grads = (rounded(dz) @ rounded(weight), rounded(dz).T @ rounded(h), dz.sum(0))
    torch.testing.assert_close(lp, ref_lp.float(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent, ref_ent.float(), atol=1e-5, rtol=1e-5)
    for name, tensor, ref in zip(("h", "W", "b"), (h, weight, bias), ref_grads):
        rtol = 2**-8 if autocast and name != "b" else 1e-5
        atol = rtol * ref.abs().max().item() if autocast and name == "W" else 1e-5
        torch.testing.assert_close(tensor.grad, ref.float(), atol=atol, rtol=rtol, msg=name)

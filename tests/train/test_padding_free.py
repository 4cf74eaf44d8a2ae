"""Padding-free passes (``grpokit.models.packing``, ``completion_logprobs(padding_free=...)``) against the
padded ones and the textbook forward.

The layout is checked against masks written out by hand; the packed forward, with and without the shared
prefix, against ``_plain`` (the full padded ``model(...)`` forward of ``test_forward``) on a Llama and a Qwen2
decoder: log-probs, entropy and every parameter's gradient, with gradient checkpointing too. Qwen2's case
without checkpointing is in ``test_forward`` (parametrised over ``padding_free``).
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from grpokit.models.packing import PackedLayout, packing_supported, refuse_unrunnable
from grpokit.models.policy import enable_gradient_checkpointing
from grpokit.models.tiny import build_char_tokenizer, build_tiny_moe
from grpokit.train.forward import _choose_packed, completion_logprobs, no_grad_logprobs

from .test_forward import VOCAB, G, _batch, _grads, _plain

ARCHITECTURES = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}


def _model(arch: str) -> torch.nn.Module:
    config_class, model_class = ARCHITECTURES[arch]
    config = config_class(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.2, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    return model_class(config).float()


def test_layout_on_prefix_is_the_hand_built_mask():
    # prefixes of 2 and 1 tokens; sequences of 2, 0 and 1 tokens continuing prefixes 0, 0 and 1
    layout = PackedLayout.on_prefix(torch.tensor([2, 1]), torch.tensor([0, 0, 1]), torch.tensor([2, 0, 1]))
    assert (layout.lengths, layout.prefix_lengths, layout.owners) == ((2, 0, 1), (2, 1), (0, 0, 1))
    assert layout.runs == ((1, 2, 0), (1, 1, 1))  # (count, length, prefix), the empty sequence left out
    inf = float("-inf")
    # the longest sequence has 2 queries: query j sees the prefix and own keys 0..j
    assert layout.prefix_mask(0, torch.float32).tolist() == [[0, 0, 0, inf], [0, 0, 0, 0]]
    assert layout.prefix_mask(1, torch.bfloat16).tolist() == [[0, 0, inf], [0, 0, 0]]
    assert layout.prefix_mask(0, torch.float32) is layout.prefix_mask(0, torch.float32)  # one per call
    index = layout.index
    # keys: prefix tokens 0 1 | 2, then the sequences' own: 3 4 | (none) | 5
    assert index.key_index.tolist() == [[0, 1, 3, 4], [0, 1, 0, 0], [2, 5, 0, 0]]
    assert index.query_index.tolist() == [[0, 1], [0, 0], [2, 0]]
    allowed = index.allowed[:, 0].int().tolist()
    assert allowed[0] == [[1, 1, 1, 0], [1, 1, 1, 1]]  # query j: the prefix, own keys 0..j
    assert allowed[1] == [[1, 0, 0, 0], [1, 0, 0, 0]]  # no queries: padding rows see one key
    assert allowed[2] == [[1, 1, 0, 0], [1, 0, 0, 0]]
    assert index.sequence_of.tolist() == [0, 0, 2] and index.slot_of.tolist() == [0, 1, 0]
    assert index.flat_keys.tolist() == [0, 1, 3, 4, 0, 1, 2, 5]
    assert index.cu_queries.tolist() == [0, 2, 2, 3] and index.cu_keys.tolist() == [0, 4, 6, 8]
    assert (index.max_queries, index.max_keys) == (2, 4)
    causal = PackedLayout.causal(torch.tensor([1, 3])).index
    assert causal.key_index.tolist() == [[0, 0, 0], [1, 2, 3]]
    assert causal.allowed[1, 0].int().tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]


@pytest.mark.parametrize("on_prefix", [False, True])
def test_attention_per_run_equals_the_padded_batch_and_each_row_alone(on_prefix):
    """The two non-flash kernels of ``packed_attention`` (one SDPA per run of equal rows on CPU, one padded
    batch on CUDA) against each sequence's attention written out: softmax over the keys it may see, 3 query
    heads per key head. Values and the gradients of the packed query, key and value."""
    from grpokit.models.packing import _padded_batch, _per_run

    lengths = torch.tensor([3, 0, 3, 2, 2, 1])
    if on_prefix:
        prefixes = torch.tensor([4, 2])
        layout = PackedLayout.on_prefix(prefixes, torch.tensor([0, 0, 0, 1, 1, 1]), lengths)
        assert layout.runs == ((2, 3, 0), (2, 2, 1), (1, 1, 1))  # equal neighbours batched, the empty dropped
    else:
        prefixes = torch.zeros(0, dtype=torch.long)
        layout = PackedLayout.causal(lengths)
        assert layout.runs == ((2, 3, None), (2, 2, None), (1, 1, None))
    total, keys = int(lengths.sum()), int(lengths.sum() + prefixes.sum())
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(1, 6, total, 8, generator=generator, requires_grad=True)
    k = torch.randn(1, 2, keys, 8, generator=generator, requires_grad=True)
    v = torch.randn(1, 2, keys, 8, generator=generator, requires_grad=True)
    weights = torch.randn(1, total, 6, 8, generator=generator)

    def by_hand() -> torch.Tensor:
        rows, start = [], 0
        starts = (prefixes.cumsum(0) - prefixes).tolist()
        for s, length in enumerate(lengths.tolist()):
            own = list(range(int(prefixes.sum()) + start, int(prefixes.sum()) + start + length))
            seen = []  # the prefix's keys, all visible
            if on_prefix:
                owner = layout.owners[s]
                seen = list(range(starts[owner], starts[owner] + layout.prefix_lengths[owner]))
            for j in range(length):
                visible = seen + own[: j + 1]
                kk = k[0, :, visible].repeat_interleave(3, dim=0)  # [6, n, 8]
                vv = v[0, :, visible].repeat_interleave(3, dim=0)
                scores = (q[0, :, start + j, None] * kk).sum(-1) / 8**0.5  # [6, n]
                rows.append((scores.softmax(-1)[..., None] * vv).sum(1))  # [6, 8]
            start += length
        return torch.stack(rows)[None]  # [1, T, 6, 8]

    results = []
    for attend in (by_hand, lambda: _per_run(q, k, v, layout, 0.0, None),
                   lambda: _padded_batch(q, k, v, layout.index, 0.0, None)):  # fmt: skip
        out = attend()
        grads = torch.autograd.grad((out * weights).sum(), (q, k, v))
        results.append((out, *grads))
    for result in results[1:]:
        for got, expected in zip(result, results[0], strict=True):
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
@pytest.mark.parametrize("shared_prefix", [False, True])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_packed_forward_equals_plain_and_padded(arch, shared_prefix, checkpointing):
    model = _model(arch)
    p_ids, p_mask, c_ids, c_mask = _batch(seed=4)
    weights = torch.randn(c_ids.shape, generator=torch.Generator().manual_seed(3))
    ref_lp, ref_ent, ref_g = _grads(model, lambda: _plain(model, p_ids, p_mask, c_ids, c_mask, 0.8), weights)
    if checkpointing:
        enable_gradient_checkpointing(model)
    model.train()
    options = dict(temperature=0.8, with_entropy=True, num_generations=G, shared_prefix=shared_prefix)

    def run(packed: bool):
        return completion_logprobs(model, p_ids, p_mask, c_ids, c_mask, padding_free=packed, **options)

    results = {packed: _grads(model, lambda packed=packed: run(packed), weights) for packed in (False, True)}
    for lp, ent, g in (results[True], results[False]):
        torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=1e-5)
        assert (lp[c_mask == 0] == 0).all()
        for name in ref_g:
            scale = ref_g[name].abs().max().clamp(min=1e-6)
            torch.testing.assert_close(g[name] / scale, ref_g[name] / scale, atol=2e-5, rtol=0, msg=name)


def test_context_tokens_are_attended_but_not_scored():
    """An episode's observation tokens (context 1, completion_mask 0): packed as the padded forward runs
    them."""
    model = _model("llama").eval()
    p_ids, p_mask, c_ids, context = _batch(seed=6)
    scored = context.clone()
    scored[:, 1::2] = 0  # every other completion token is an observation
    with torch.no_grad():
        padded, _ = completion_logprobs(
            model, p_ids, p_mask, c_ids, scored, context_mask=context, num_generations=G, padding_free=False
        )
        for shared in (False, True):
            packed, _ = completion_logprobs(
                model, p_ids, p_mask, c_ids, scored, context_mask=context, num_generations=G,
                shared_prefix=shared, padding_free=True,
            )  # fmt: skip
            torch.testing.assert_close(packed, padded, atol=1e-5, rtol=1e-5)


def test_no_grad_pass_packs_micro_batches_of_groups():
    model = _model("qwen2")
    p_ids, p_mask, c_ids, c_mask = _batch(seed=7)
    with torch.no_grad():
        ref, _ = _plain(model, p_ids, p_mask, c_ids, c_mask)
    out = no_grad_logprobs(
        model, p_ids, p_mask, c_ids, c_mask, num_generations=G, micro_batch_size=2 * G, padding_free=True
    )
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_calls_without_a_layout_run_the_models_own_attention():
    """Once packed, a model's attention goes through grpokit's dispatcher: its ordinary calls (the sampler's,
    a user's) give what the untouched model gives, and the saved config does not name the dispatcher."""
    model = _model("llama").eval()
    untouched = copy.deepcopy(model)
    p_ids, p_mask, c_ids, c_mask = _batch()
    completion_logprobs(model, p_ids, p_mask, c_ids, c_mask, padding_free=True)
    assert model.config._attn_implementation == "grpokit_packed_sdpa"
    ids, mask = torch.cat([p_ids, c_ids], 1), torch.cat([p_mask, c_mask], 1)
    with torch.no_grad():
        ours, theirs = (m(input_ids=ids, attention_mask=mask).logits for m in (model, untouched))
        torch.testing.assert_close(ours, theirs, atol=0, rtol=0)
    assert "grpokit" not in model.config.to_json_string()


def test_automatic_choice_and_refusals():
    model = _model("qwen2")
    p_ids, p_mask, c_ids, c_mask = _batch()
    assert _choose_packed(model, p_mask, c_mask, None, ())  # a third of the tokens are padding
    full = torch.ones_like(c_mask)
    assert not _choose_packed(model, torch.ones_like(p_mask), full, None, ())  # nothing to remove
    assert _choose_packed(model, torch.ones_like(p_mask), full, True, ())  # forced
    assert not _choose_packed(model, p_mask, c_mask, False, ())
    assert not _choose_packed(model, p_mask, c_mask, None, ["images"])  # laid out by padded rows
    holed = c_mask.clone()
    holed[0, 0] = 0  # a completion that is not right-padded
    assert not _choose_packed(model, p_mask, holed, None, ())
    with pytest.raises(ValueError, match="right-padded"):
        completion_logprobs(model, p_ids, p_mask, c_ids, holed, padding_free=True)
    moe = build_tiny_moe(build_char_tokenizer(), arch="qwen3_moe")
    assert not packing_supported(moe.config)
    with pytest.raises(ValueError, match="'qwen3_moe' is not one of"):
        _choose_packed(moe, p_mask, c_mask, True, ())
    with pytest.raises(
        ValueError, match=r"padding_free=True cannot run: model type 'qwen3_moe'.*routing replay"
    ):
        refuse_unrunnable(moe.config, images=False, routing_replay=True)
    refuse_unrunnable(model.config, images=False, routing_replay=False)  # runs

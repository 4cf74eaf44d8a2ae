"""Routing replay (``grpokit.models.routing_replay``) on every MoE architecture transformers ships that TRL's
tests name: the gate weights at given experts against hand-computed values, a pass's own routing replayed
reproducing it bit for bit, and the samplers' recorded routing aligned with the trainer's tokens."""

import math

import pytest
import torch

from grpokit.core import pad_left, pad_right
from grpokit.models.policy import enable_gradient_checkpointing
from grpokit.models.routing_replay import (
    GATES,
    RoutedExperts,
    RoutingUse,
    calls_of,
    install_routing,
    routing_for_run,
    routing_of,
)
from grpokit.models.tiny import MOE_ARCHITECTURES, build_char_tokenizer, build_tiny_model, build_tiny_moe
from grpokit.rollout.base import SamplingParams
from grpokit.rollout.fast import FastSampler
from grpokit.rollout.hf import TransformersBackend
from grpokit.train.forward import completion_logprobs

TOKENIZER = build_char_tokenizer()


@pytest.fixture(scope="module", params=sorted(MOE_ARCHITECTURES))
def moe(request):
    model = build_tiny_moe(TOKENIZER, request.param).eval()
    return model, install_routing(model)


# ---- the gate weights at given experts ---------------------------------------------------------------------
class _Router:
    def __init__(self, **attrs):
        self.__dict__.update(attrs)


E, ONE = math.e, 1.0
LOGITS = torch.tensor([[1.0, 2.0, 3.0, 0.0]])  # [1 token, 4 experts]
CHOSEN = torch.tensor([[0, 3]])  # not the router's own top-2 (experts 2 and 1)
SOFTMAX_ALL = torch.softmax(LOGITS, dim=-1)[0]  # e^l / (e + e^2 + e^3 + 1)


@pytest.mark.parametrize(
    ("router", "attrs", "expected"),
    [
        ("Qwen3MoeTopKRouter", {"norm_topk_prob": True}, [E / (E + ONE), ONE / (E + ONE)]),
        ("Qwen3MoeTopKRouter", {"norm_topk_prob": False}, [SOFTMAX_ALL[0], SOFTMAX_ALL[3]]),
        ("Qwen2MoeTopKRouter", {"norm_topk_prob": False}, [SOFTMAX_ALL[0], SOFTMAX_ALL[3]]),
        ("OlmoeTopKRouter", {"norm_topk_prob": False}, [SOFTMAX_ALL[0], SOFTMAX_ALL[3]]),
        ("MixtralTopKRouter", {}, [E / (E + ONE), ONE / (E + ONE)]),  # Mixtral always renormalises
        ("GptOssTopKRouter", {}, [E / (E + ONE), ONE / (E + ONE)]),  # softmax over the chosen logits 1, 0
        (  # sigmoid(1), sigmoid(0) = 0.5, renormalised, times the scaling factor 2.5
            "Glm4MoeTopkRouter", {"norm_topk_prob": True, "routed_scaling_factor": 2.5},
            [2.5 * (1 / (1 + 1 / E)) / (1 / (1 + 1 / E) + 0.5), 2.5 * 0.5 / (1 / (1 + 1 / E) + 0.5)],
        ),
        ("Glm4MoeTopkRouter", {"norm_topk_prob": False, "routed_scaling_factor": 1.0},
         [1 / (1 + 1 / E), 0.5]),
    ],
)  # fmt: skip
def test_gate_weights_at_given_experts_by_hand(router, attrs, expected):
    weights = GATES[router](_Router(**attrs), LOGITS, CHOSEN)
    expected = torch.tensor(expected, dtype=torch.float64)
    torch.testing.assert_close(weights[0].double(), expected, rtol=1e-6, atol=0)


# ---- replay on every architecture --------------------------------------------------------------------------
def test_replaying_a_pass_own_routing_reproduces_it_bit_for_bit(moe):
    """Record a forward's experts, replay them: the same logits, bit for bit (the gate weights recomputed at
    the replayed experts are the router's own); replaying other experts changes the output, and every
    replayed token counts as overridden."""
    model, routing = moe
    ids = torch.randint(5, 60, (3, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), routing.recording() as tape:
        natural = model(input_ids=ids).logits
    (used,) = calls_of(tape)  # one backbone call: [27 tokens, L, k]
    assert used.shape == (27, routing.num_layers, routing.top_k)
    experts = used.view(3, 9, routing.num_layers, routing.top_k)
    everywhere = torch.ones(3, 9, dtype=torch.bool)
    with torch.no_grad(), routing.replaying(experts, everywhere, replay=True, tag="same"):
        replayed = model(input_ids=ids).logits
    assert torch.equal(replayed, natural)
    shifted = (experts + 1) % routing.num_experts  # every token to other experts
    with torch.no_grad(), routing.replaying(shifted, everywhere, replay=True, tag="other"):
        other = model(input_ids=ids).logits
    assert (other - natural).abs().max() > 1e-4
    counts = routing.take_counts()
    assert counts["same"][:, 0].sum() == 0 and counts["same"][:, 1].sum() == 27 * routing.num_layers
    assert counts["other"][:, 0].sum() == 27 * routing.num_layers


def test_replay_keeps_the_router_learning(moe):
    """The gate weights at replayed experts carry the router's gradient (R3: recomputed from its logits)."""
    model, routing = moe
    ids = torch.randint(5, 60, (2, 6), generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), routing.recording() as tape:
        model(input_ids=ids)
    (used,) = calls_of(tape)
    experts = ((used + 1) % routing.num_experts).view(2, 6, routing.num_layers, routing.top_k)
    model.zero_grad()
    with routing.replaying(experts, torch.ones(2, 6, dtype=torch.bool), replay=True, tag="grad"):
        model(input_ids=ids).logits.square().sum().backward()
    routers = [m for m in model.modules() if type(m).__name__ in GATES]
    assert all(r.weight.grad is not None and r.weight.grad.abs().sum() > 0 for r in routers)
    model.zero_grad()
    routing.take_counts()


# ---- the samplers' routing, aligned with the trainer's tokens ----------------------------------------------
@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral", "olmoe", "gpt_oss"])
@pytest.mark.parametrize("sampler", ["fast", "generate"])
def test_the_samplers_routing_is_the_trainers_at_the_same_precision(arch, sampler):
    """An fp32 sampler and the fp32 training forward route every fed token alike (prompts of different
    lengths, completions ending at different EOS): the recorded rows land on the batch's tokens, and a
    trainer pass that compares them counts 0 differences over exactly the tokens the sampler fed; replaying
    them gives the trainer's own log-probs. (The fast sampler decodes OLMoE and GPT-OSS through the model's
    own forward with a cache, its "hf" path; Qwen3-MoE and Mixtral natively.)"""
    model = build_tiny_moe(TOKENIZER, arch).eval()
    routing = install_routing(model)
    prompts = [TOKENIZER.encode("12+3="), TOKENIZER.encode("4+5+67=")]
    params = SamplingParams.for_tokenizer(TOKENIZER, max_new_tokens=8)
    backend = FastSampler(model, generator=torch.Generator().manual_seed(0)) if sampler == "fast" else (
        TransformersBackend(model))  # fmt: skip
    torch.manual_seed(0)
    out = backend.generate(prompts, 3, params)
    lengths = [len(c) for c in out.completion_ids]
    rows = [p for p in prompts for _ in range(3)]
    assert [r.shape[0] for r in out.routed_experts] == [len(p) + c - 1 for p, c in zip(rows, lengths)]
    p_ids, p_mask = pad_left(rows, TOKENIZER.pad_token_id, "cpu")
    c_ids, c_mask = pad_right(out.completion_ids, TOKENIZER.pad_token_id, "cpu")
    sampled = RoutedExperts.from_rows(out.routed_experts, [len(p) for p in rows], p_ids.shape[1],
                                      c_ids.shape[1], routing.num_experts)  # fmt: skip
    assert sampled.experts.dtype == torch.uint8
    assert int(sampled.recorded.sum()) == sum(len(p) + c - 1 for p, c in zip(rows, lengths))
    with torch.no_grad():
        own, _ = completion_logprobs(model, p_ids, p_mask, c_ids, c_mask, shared_prefix=False)
        compared, _ = completion_logprobs(model, p_ids, p_mask, c_ids, c_mask, shared_prefix=False,
                                          routing=RoutingUse(sampled, replay=False, tag="cmp"))  # fmt: skip
        replayed, _ = completion_logprobs(model, p_ids, p_mask, c_ids, c_mask, num_generations=3,
                                          routing=RoutingUse(sampled, replay=True, tag="rep"))  # fmt: skip
    counts = routing.take_counts()
    assert counts["cmp"][:, 0].sum() == 0
    assert counts["cmp"][0, 1] == sampled.recorded.sum()  # every fed token compared, in every layer
    assert torch.equal(compared, own)
    torch.testing.assert_close(replayed, own, rtol=0, atol=1e-5)  # shared prefix: the same to float rounding


def test_a_pass_records_the_routing_it_used_in_the_batch_layout():
    """A recording pass leaves [B, P+C, L, k] experts, recorded on the attended tokens but the last; replayed,
    they give the pass's log-probs again, with the shared prefix and without."""
    model = build_tiny_moe(TOKENIZER, "qwen3_moe").eval()
    routing = install_routing(model)
    p_ids, p_mask = pad_left([TOKENIZER.encode("1+2=")] * 2 + [TOKENIZER.encode("30+4=")] * 2, 0, "cpu")
    c_ids, c_mask = pad_right([TOKENIZER.encode(s) for s in ("3", "12", "34", "7")], 0, "cpu")
    for shared in (True, False):
        with torch.no_grad():
            own, _ = completion_logprobs(model, p_ids, p_mask, c_ids, c_mask, num_generations=2,
                                         shared_prefix=shared, routing=RoutingUse(record=True))  # fmt: skip
        used = routing.take_recorded()
        assert used.experts.shape == (4, p_ids.shape[1] + c_ids.shape[1], routing.num_layers, routing.top_k)
        attended = torch.cat([p_mask, c_mask], 1).bool()
        attended[:, -1] = False
        assert torch.equal(used.recorded, attended)
        with torch.no_grad():
            replay = RoutingUse(used, replay=True)
            again, _ = completion_logprobs(model, p_ids, p_mask, c_ids, c_mask, num_generations=2,
                                           shared_prefix=shared, routing=replay)  # fmt: skip
        assert torch.equal(again, own)
        assert routing.take_counts()["pass"][:, 0].sum() == 0


# ---- which runs get it -------------------------------------------------------------------------------------
def test_routing_for_run_refuses_what_it_cannot_replay():
    dense = build_tiny_model(TOKENIZER, hidden_size=16, num_layers=1, num_heads=2)
    assert routing_for_run(dense, "off", {}) is None
    with pytest.raises(ValueError, match=r"'R3', but LlamaForCausalLM has no mixture-of-experts routers"):
        routing_for_run(dense, "R3", {})
    moe = build_tiny_moe(TOKENIZER, "mixtral")
    with pytest.raises(ValueError, match="routing_replay='R3' is refused with use_vllm"):
        routing_for_run(moe, "R3", {"with use_vllm": True})
    assert routing_for_run(moe, "R2", {"with use_vllm": False}) is routing_of(moe)


def test_an_unknown_router_is_refused_by_name_and_only_unmeasured_when_off(caplog):
    class DeepseekV9TopkRouter(torch.nn.Module):
        pass

    model = torch.nn.Sequential(DeepseekV9TopkRouter())
    with pytest.raises(ValueError, match="DeepseekV9TopkRouter is not one of them"):
        routing_for_run(model, "R2", {})
    assert routing_for_run(model, "off", {}) is None
    assert "no routing/* metrics" in caplog.text


def test_copies_of_the_policy_share_its_routing():
    """The sampler's dtype copy and the reference are deep copies: their routers report to the policy's."""
    import copy

    model = build_tiny_moe(TOKENIZER, "qwen3_moe")
    routing = install_routing(model)
    assert install_routing(model) is routing  # idempotent
    assert routing_of(copy.deepcopy(model)) is routing


def test_a_checkpointed_backward_recomputes_with_the_replayed_experts():
    """Gradient checkpointing recomputes each layer in the backward, after the forward's replay context
    closed: within ``in_backward`` the routers route as the forward replayed, so the gradients equal the
    un-checkpointed replay's (without it they would follow the router's own experts)."""
    model = build_tiny_moe(TOKENIZER, "qwen3_moe").train()
    routing = install_routing(model)
    p_ids, p_mask = pad_left([TOKENIZER.encode("1+2=")] * 2, 0, "cpu")
    c_ids, c_mask = pad_right([TOKENIZER.encode(s) for s in ("345", "67")], 0, "cpu")
    with torch.no_grad():
        completion_logprobs(model, p_ids, p_mask, c_ids, c_mask, routing=RoutingUse(record=True))
    own = routing.take_recorded()
    shifted = RoutedExperts((own.experts + 1) % routing.num_experts, own.recorded)  # other experts
    grads = []
    for checkpointing in (False, True):
        if checkpointing:
            enable_gradient_checkpointing(model)  # non-reentrant
        model.zero_grad()
        logps, _ = completion_logprobs(model, p_ids, p_mask, c_ids, c_mask,
                                       routing=RoutingUse(shifted, replay=True, tag="gc"))  # fmt: skip
        with routing.in_backward():
            logps.sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    routing.take_counts()
    assert grads[0].keys() == grads[1].keys()
    for name, grad in grads[1].items():
        torch.testing.assert_close(grad, grads[0][name], rtol=1e-5, atol=1e-7, msg=name)

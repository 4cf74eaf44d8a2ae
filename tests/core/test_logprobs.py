"""Chunked log-probs and entropy against torch.log_softmax (values and gradients), and their memory use."""

import math

import pytest
import torch

from grpokit.core import entropy_from_logits, logprobs_and_entropy, selective_log_softmax

CHUNKS = [None, 1, 2, 4, 7, 100]


def reference(logits: torch.Tensor, index: torch.Tensor, temperature: float = 1.0):
    logp_all = torch.log_softmax(logits.float() / temperature, dim=-1)  # [B, T, V]
    logp = logp_all.gather(-1, index.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def make(b: int = 3, t: int = 5, v: int = 11, seed: int = 0, dtype: torch.dtype = torch.float32):
    g = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(b, t, v, generator=g)).to(dtype)
    index = torch.randint(0, v, (b, t), generator=g)
    upstream = torch.randn(b, t, generator=g), torch.randn(b, t, generator=g)
    return logits, index, upstream


def test_two_token_vocabulary_by_hand():
    # logits [0, ln 3] -> p = [1/4, 3/4]: log p = [ln 0.25, ln 0.75] = [-1.386294, -0.287682];
    # entropy = -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.346574 + 0.215762 = 0.562335.
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, math.log(3.0)]]])
    logp, ent = logprobs_and_entropy(logits, torch.tensor([[0, 1]]), with_entropy=True)
    torch.testing.assert_close(logp, torch.tensor([[math.log(0.25), math.log(0.75)]]))
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    torch.testing.assert_close(ent, torch.tensor([[h, h]]))
    # Temperature 2: logits [0, ln 3 / 2] -> p = [1, sqrt 3] / (1 + sqrt 3).
    logp, _ = logprobs_and_entropy(logits, torch.tensor([[0, 1]]), temperature=2.0)
    z = 1 + math.sqrt(3)
    torch.testing.assert_close(logp, torch.tensor([[math.log(1 / z), math.log(math.sqrt(3) / z)]]))


@pytest.mark.parametrize("chunk_size", CHUNKS)
def test_selective_log_softmax_matches_log_softmax_gather(chunk_size):
    logits, index, (up, _) = make()
    ours_in = logits.clone().requires_grad_(True)
    ref_in = logits.clone().requires_grad_(True)
    ours = selective_log_softmax(ours_in, index, chunk_size=chunk_size)
    ref, _ = reference(ref_in, index)
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, ref)
    (ours * up).sum().backward()
    (ref * up).sum().backward()
    torch.testing.assert_close(ours_in.grad, ref_in.grad)


@pytest.mark.parametrize("chunk_size", CHUNKS)
def test_logprobs_and_entropy_with_temperature(chunk_size):
    logits, index, (up_lp, up_h) = make(seed=1)
    ours_in = logits.clone().requires_grad_(True)
    ref_in = logits.clone().requires_grad_(True)
    logp, ent = logprobs_and_entropy(
        ours_in, index, temperature=0.7, with_entropy=True, chunk_size=chunk_size
    )
    ref_logp, ref_ent = reference(ref_in, index, temperature=0.7)
    torch.testing.assert_close(logp, ref_logp)
    torch.testing.assert_close(ent, ref_ent)
    (logp * up_lp + ent * up_h).sum().backward()
    (ref_logp * up_lp + ref_ent * up_h).sum().backward()
    torch.testing.assert_close(ours_in.grad, ref_in.grad)


def test_without_entropy_returns_none():
    logits, index, _ = make()
    logp, ent = logprobs_and_entropy(logits, index)
    assert ent is None and logp.shape == (3, 5)


@pytest.mark.parametrize("chunk_size", [None, 3])
def test_entropy_from_logits_matches_reference(chunk_size):
    logits, index, (_, up) = make(seed=2)
    ours_in = logits.clone().requires_grad_(True)
    ref_in = logits.clone().requires_grad_(True)
    ent = entropy_from_logits(ours_in, chunk_size=chunk_size)
    _, ref_ent = reference(ref_in, index)
    torch.testing.assert_close(ent, ref_ent)
    (ent * up).sum().backward()
    (ref_ent * up).sum().backward()
    torch.testing.assert_close(ours_in.grad, ref_in.grad)


def test_bf16_logits():
    logits, index, (up, _) = make(b=2, t=6, v=50, seed=3, dtype=torch.bfloat16)
    ours_in = logits.clone().requires_grad_(True)
    ref_in = logits.clone().requires_grad_(True)
    ours = selective_log_softmax(ours_in, index, chunk_size=4)
    ref, _ = reference(ref_in, index)  # float32 math on the same bf16 values
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, ref)
    (ours * up).sum().backward()
    (ref * up).sum().backward()
    assert ours_in.grad.dtype == torch.bfloat16
    # Both gradients end as bf16 casts of the same float32 numbers, up to bf16 rounding.
    torch.testing.assert_close(ours_in.grad.float(), ref_in.grad.float(), rtol=1e-2, atol=1e-2)


def test_gradcheck_float64():
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(2, 3, 5, generator=g, dtype=torch.float64, requires_grad=True)
    index = torch.randint(0, 5, (2, 3), generator=g)

    def both(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logp, ent = logprobs_and_entropy(x, index, temperature=1.3, with_entropy=True, chunk_size=2)
        return logp, ent

    assert torch.autograd.gradcheck(both, (logits,))


def test_non_contiguous_logits_and_masked_vocabulary():
    logits, index, _ = make(b=2, t=6, v=9, seed=5)
    logits[..., 0] = float("-inf")  # a token ruled out (e.g. by top-k)
    index = index.clamp(min=1)
    view = logits[:, :-1, :]  # as sliced by the training forward: not contiguous
    x = view.clone().requires_grad_(True)
    logp, ent = logprobs_and_entropy(view, index[:, :-1], with_entropy=True, chunk_size=3)
    ref_logp, _ = reference(view, index[:, :-1])
    torch.testing.assert_close(logp, ref_logp)
    assert torch.isfinite(ent).all()
    logp2, ent2 = logprobs_and_entropy(x, index[:, :-1], with_entropy=True, chunk_size=3)
    (3 * logp2.sum() + 3 * ent2.sum()).backward()  # upstream > 1 must not overflow
    assert torch.isfinite(x.grad).all()
    assert torch.equal(x.grad[..., 0], torch.zeros(2, 5))


def test_no_float32_copy_of_the_logits_is_kept_for_backward():
    # The autograd graph keeps the bf16 logits (already alive), the ids and [B, T] float32 statistics,
    # never a float32 [B, T, V] tensor.
    b, t, v = 2, 64, 1000
    logits = torch.randn(b, t, v).to(torch.bfloat16).requires_grad_(True)
    index = torch.randint(0, v, (b, t))
    saved: list[torch.Tensor] = []

    def pack(x: torch.Tensor) -> torch.Tensor:
        saved.append(x)
        return x

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        logp, ent = logprobs_and_entropy(logits, index, with_entropy=True, chunk_size=8)
    float_bytes = sum(
        x.numel() * x.element_size() for x in saved if x.is_floating_point() and x.dtype != torch.bfloat16
    )
    assert float_bytes <= 2 * b * t * 4  # the [B, T] logsumexp and entropy
    assert max(x.numel() for x in saved) == b * t * v  # only the logits themselves are [B, T, V]
    (logp.sum() + ent.sum()).backward()
    assert logits.grad.shape == (b, t, v)


def test_validation():
    logits, index, _ = make()
    with pytest.raises(ValueError, match="logits"):
        selective_log_softmax(logits[0], index[0])
    with pytest.raises(ValueError, match="index"):
        selective_log_softmax(logits, index[:, :2])
    with pytest.raises(ValueError, match="temperature"):
        logprobs_and_entropy(logits, index, temperature=0.0)
    with pytest.raises(ValueError, match="chunk_size"):
        selective_log_softmax(logits, index, chunk_size=0)

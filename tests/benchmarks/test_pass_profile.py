"""``benchmarks/pass_profile.py --breakdown``'s operator clock: the FLOPs it counts for the products and the
attention it times, against hand-computed counts (2 m k n per product; 4 x d x heads per query and key seen
for an attention forward, twice that for its backward), with and without gradients, under autocast too."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from pass_profile import OperatorClock


def test_products_count_two_m_k_n_with_and_without_gradients():
    x = torch.randn(3, 5, 7, requires_grad=True)  # 15 rows of 7
    w = torch.randn(11, 7, requires_grad=True)
    with OperatorClock() as clock:
        F.linear(x, w).sum().backward()  # forward, input gradient, weight gradient: three products
    assert clock.flops["products"] == 3 * 2 * 15 * 7 * 11
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16), OperatorClock() as clock:
        F.linear(x, w)  # (without gradients under autocast ``linear`` itself reaches the clock)
    assert clock.flops["products"] == 2 * 15 * 7 * 11
    assert clock.seconds["products"] > 0 and clock.flops["attention"] == 0


def test_attention_counts_the_keys_each_query_sees():
    n, heads, kv_heads, queries, keys, d = 2, 4, 2, 6, 10, 8
    q = torch.randn(n, heads, queries, d, requires_grad=True)
    k = torch.randn(n, kv_heads, keys, d, requires_grad=True)
    v = torch.randn(n, kv_heads, keys, d, requires_grad=True)
    mask = torch.zeros(queries, keys)
    mask[:, 7:] = float("-inf")  # each query sees 7 keys
    with OperatorClock() as clock:
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True).sum().backward()
    assert clock.flops["attention"] == (4 + 8) * d * heads * n * queries * 7
    causal = torch.randn(n, heads, queries, d, requires_grad=True)
    same = causal.detach()
    with OperatorClock() as clock:
        F.scaled_dot_product_attention(causal, same, same, is_causal=True).sum().backward()
    assert clock.flops["attention"] == (4 + 8) * d * heads * n * (1 + 2 + 3 + 4 + 5 + 6)
    with torch.no_grad(), OperatorClock() as clock:
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask.isfinite(), enable_gqa=True)
    assert clock.flops["attention"] == 4 * d * heads * n * queries * 7
    assert clock.flops["products"] == 0

"""A tiny Qwen3-MoE policy directory whose routers nearly tie: every expert's router row is one shared row
plus 0.3% of its own, so the router logits of a token are close and bf16 rounding flips its experts."""

import pytest
import torch

from grpokit.models.routing_replay import routers_of
from grpokit.models.tiny import build_char_tokenizer, build_tiny_moe


def close_routers(model: torch.nn.Module, spread: float = 0.003) -> torch.nn.Module:
    """Router rows w_e <- w_0 + spread * w_e: logits close, their order still the model's own."""
    with torch.no_grad():
        for router in routers_of(model):
            router.weight.copy_(router.weight[:1] + spread * router.weight)
    return model


@pytest.fixture(scope="session")
def close_moe_dirs(tmp_path_factory):
    """{arch: directory} of tiny Qwen3-MoE and Mixtral policies with close router logits."""
    tokenizer = build_char_tokenizer()
    dirs = {}
    for arch in ("qwen3_moe", "mixtral"):
        path = tmp_path_factory.mktemp(f"close-{arch}")
        close_routers(build_tiny_moe(tokenizer, arch)).save_pretrained(path)
        tokenizer.save_pretrained(path)
        dirs[arch] = path
    return dirs

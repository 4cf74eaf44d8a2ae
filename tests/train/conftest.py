"""A tiny Qwen2 policy saved to disk (the real from_pretrained path) and a few arithmetic rows."""

import pytest
import torch

from grpokit.models.tiny import build_char_tokenizer, build_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-policy")
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(
        tokenizer, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=0
    )
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def rows():
    return [
        {"prompt": "1+1=", "solution": "2"},
        {"prompt": "2+3=", "solution": "5"},
        {"prompt": "4+4=", "solution": "8"},
        {"prompt": "7-2=", "solution": "5"},
    ]


def digit_reward(prompts, completions, completion_ids, solution, **kwargs):
    """The solution's presence (1.0) plus a small token-id term, so that a random policy's groups differ."""
    return [
        (1.0 if s in c else 0.0) + 0.1 * (sum(ids) % 5)
        for c, s, ids in zip(completions, solution, completion_ids)
    ]


@pytest.fixture(autouse=True)
def _few_threads():
    torch.set_num_threads(1)

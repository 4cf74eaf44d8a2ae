"""A few arithmetic rows and a reward for the trainer tests (the tiny policy is in tests/conftest.py)."""

import pytest


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

"""Ragged groups through any backend (``generate_groups``): each prompt gets exactly its group size, groups
in prompt order, in at most two generate calls."""

from __future__ import annotations

import pytest

from grpokit.rollout import GenerationOutput, SamplingParams, generate_groups


class Recorder:
    """A backend answering with (prompt id, sample index) encoded as tokens; records each call."""

    def __init__(self):
        self.calls = []

    def generate(self, prompt_ids, num_generations, params):
        self.calls.append(([p[0] for p in prompt_ids], num_generations))
        ids = [[p[0], i] for p in prompt_ids for i in range(num_generations)]
        return GenerationOutput(ids, [[-0.5, -float(i)] for _, i in ids], [False] * len(ids))


PARAMS = SamplingParams(max_new_tokens=2, temperature=1.0, eos_token_ids=(0,), pad_token_id=0)


def test_equal_sizes_are_one_call():
    backend = Recorder()
    out = generate_groups(backend, [[10], [11]], [3, 3], PARAMS)
    assert backend.calls == [([10, 11], 3)] and len(out.completion_ids) == 6


def test_ragged_sizes_take_two_calls_and_keep_each_groups_first_samples():
    backend = Recorder()
    sizes = [2, 6, 3, 2, 5]  # threshold 3 generates 3*3 + 2*6 = 21 rows (2: 2*2 + 3*6 = 22; 5: 4*5 + 6 = 26)
    out = generate_groups(backend, [[10], [11], [12], [13], [14]], sizes, PARAMS)
    assert backend.calls == [([10, 12, 13], 3), ([11, 14], 6)]
    expected = [[p, i] for p, size in zip([10, 11, 12, 13, 14], sizes) for i in range(size)]
    assert out.completion_ids == expected  # prompt order, each group its first `size` samples
    assert out.logprobs == [[-0.5, -float(i)] for _, i in expected]
    assert out.truncated == [False] * sum(sizes)


def test_sizes_must_match_the_prompts():
    with pytest.raises(ValueError, match="2 prompts but 1 group sizes"):
        generate_groups(Recorder(), [[1], [2]], [2], PARAMS)

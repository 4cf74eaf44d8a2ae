"""score_process, combining outcome and process advantages, and the neural ProcessRewardModel."""

from __future__ import annotations

import pytest
import torch

from grpokit.core import combine_outcome_and_process, process_advantages
from grpokit.rewards import RewardFunctionError
from grpokit.rewards.process_rewards import ProcessRewardModel, resolve_process_reward_funcs, score_process
from grpokit.rm import build_tiny_reward_model, save_reward_model
from grpokit.tasks.chain import chain_step_reward

ROW = {"start": 2, "operations": ["+3", "*2"], "solution": "10"}


def encode(tok, texts, eos=True):
    return [
        tok(t, add_special_tokens=False)["input_ids"] + ([tok.eos_token_id] if eos else []) for t in texts
    ]


def test_score_process_with_the_chain_verifier(char_tok):
    completions = [
        "2+3=5\n5*2=10\n<answer>10</answer>",  # all right
        "2+3=6\n6*2=12\n<answer>12</answer>",  # slip in step 1
    ]
    ids = encode(char_tok, completions)
    columns = {"start": [2, 2], "operations": [ROW["operations"]] * 2, "solution": ["10", "10"]}
    scores = score_process([chain_step_reward], ["2 +3 *2\n"] * 2, completions, ids, char_tok, columns)
    rewards, ends = scores.step_rewards, scores.step_ends
    assert rewards == [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]
    # "2+3=5\n" tokens 0..5, "5*2=10\n" 6..12, "<answer>" 13 "1" 14 "0" 15 "</answer>" 16, EOS 17
    assert ends == [[5, 12, 16], [5, 12, 16]]
    # the result feeds core.process_advantages directly. Pooled R = [1,1,1,0,0,0]: mean 0.5,
    # unbiased std sqrt(6 * 0.25 / 5) = sqrt(0.3); each step of row 0 gets +0.5/sqrt(0.3), each of
    # row 1 gets -0.5/sqrt(0.3)
    adv = process_advantages(rewards, ends, group_size=2, num_tokens=18, eps=0.0)
    r = 0.5 / 0.3**0.5
    assert adv.shape == (2, 18)
    assert adv[0, 0].item() == pytest.approx(3 * r)  # tokens up to step 1's end see all three steps
    assert adv[0, 6].item() == pytest.approx(2 * r)
    assert adv[0, 16].item() == pytest.approx(r)
    assert adv[0, 17].item() == 0.0  # EOS after the last step
    assert adv[1, 0].item() == pytest.approx(-3 * r)


def test_weights_none_rows_and_metrics(char_tok):
    completions = ["a\nb", "c", ""]
    ids = encode(char_tok, completions)

    def ones(prompts, completions, steps, **columns):
        return [[1.0] * len(s) for s in steps]

    def skip_second(prompts, completions, steps, **columns):
        assert columns["step_spans"] == [[(0, 1), (2, 3)], [(0, 1)], []]
        return [[0.5] * len(s) if i != 1 else None for i, s in enumerate(steps)]

    scores = score_process([ones, skip_second], ["p"] * 3, completions, ids, char_tok, weights=[1.0, 2.0])
    # row 0: 1 + 2 * 0.5 = 2 per step; row 1: only `ones` applies; row 2: no steps
    assert scores.step_rewards == [[2.0, 2.0], [1.0], []]
    assert scores.step_ends == [[1, 2], [0], []]
    m = scores.metrics()
    assert m["process_rewards/ones/mean"] == 1.0 and m["process_rewards/skip_second/mean"] == 0.5
    assert m["process_rewards/num_steps/mean"] == 1.0


def test_wrong_number_of_step_rewards_is_an_error(char_tok):
    def bad(prompts, completions, steps, **columns):
        return [[1.0] for _ in steps]

    with pytest.raises(RewardFunctionError, match=r"'bad' at row 0: 1 step rewards for 2 steps"):
        score_process([bad], ["p"], ["a\nb"], encode(char_tok, ["a\nb"]), char_tok)


def test_process_rewards_follow_the_failure_policy(char_tok):
    """reward_failure for step rewards, as for outcome rewards: raise naming the function and the row, or
    count the failure and let the function apply to none of those completions."""
    completions = ["a\nb", "c", "d\ne"]
    ids = encode(char_tok, completions)

    def ones(prompts, completions, steps, **columns):
        return [[1.0] * len(s) for s in steps]

    def flaky(prompts, completions, steps, **columns):  # row 1: NaN, row 2: one value for two steps
        return [[2.0, 2.0], [float("nan")], [2.0]]

    def broken(prompts, completions, steps, **columns):
        raise KeyError("no column 'start'")

    with pytest.raises(RewardFunctionError, match=r"'flaky' at row 1: non-finite step reward"):
        score_process([ones, flaky], ["p"] * 3, completions, ids, char_tok)
    with pytest.raises(RewardFunctionError, match=r"'broken': raised KeyError") as caught:
        score_process([broken], ["p"] * 3, completions, ids, char_tok)
    assert isinstance(caught.value.__cause__, KeyError)

    scores = score_process([ones, flaky, broken], ["p"] * 3, completions, ids, char_tok, on_error="none")
    # row 0: 1 + 2 per step; rows 1 and 2: only `ones` (flaky failed there, broken everywhere)
    assert scores.step_rewards == [[3.0, 3.0], [1.0], [1.0, 1.0]]
    assert scores.failures == {"ones": 0, "flaky": 2, "broken": 3}
    assert scores.per_function["flaky"] == [[2.0, 2.0], None, None]
    metrics = scores.metrics()
    assert (
        metrics["process_rewards/flaky/failures"] == 2.0 and metrics["process_rewards/broken/failures"] == 3.0
    )
    assert metrics["process_rewards/flaky/mean"] == 2.0  # over the steps it did score


def test_resolve_builtin_names():
    (fn,) = resolve_process_reward_funcs(["chain_steps"])
    assert fn is chain_step_reward
    with pytest.raises(TypeError):
        resolve_process_reward_funcs([3])


def test_combine_outcome_and_process_by_hand():
    outcome = torch.tensor([1.0, -1.0])
    process = torch.tensor([[0.5, 0.25, 0.0], [2.0, 1.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    out = combine_outcome_and_process(outcome, process, mask, outcome_weight=0.5, process_weight=2.0)
    # row 0: 0.5*1 + 2*[0.5, 0.25] = [1.5, 1.0], masked third; row 1: -0.5 + 2*[2, 1, 0] = [3.5, 1.5, -0.5]
    assert out.tolist() == [[1.5, 1.0, 0.0], [3.5, 1.5, -0.5]]


# --- ProcessRewardModel ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_prm(char_tok):
    return build_tiny_reward_model(char_tok, "process", hidden_size=32, num_layers=1, seed=0)


def test_prm_scores_one_probability_per_step(char_tok, tiny_prm):
    prm = ProcessRewardModel(tiny_prm, char_tok, batch_size=2)
    completions = ["2+3=5\n5*2=10\n<answer>10</answer>", "2+3=5", "", "\n\n1\n"]
    scores = prm(["2 +3 *2\n"] * 4, completions, None)
    assert [len(s) for s in scores] == [3, 1, 0, 1]
    assert all(0.0 < v < 1.0 for row in scores for v in row)
    assert not any(p.requires_grad for p in tiny_prm.parameters())
    # batching and padding do not change a score
    alone = ProcessRewardModel(tiny_prm, char_tok, batch_size=1)(["2 +3 *2\n"] * 4, completions)
    for a, b in zip(scores, alone):
        assert a == pytest.approx(b, abs=1e-5)
    # causal backbone: a step's score does not depend on later steps
    prefix = prm(["2 +3 *2\n"], ["2+3=5\n"])[0][0]
    assert prefix == pytest.approx(scores[0][0], abs=1e-5)


def test_prm_through_score_process_and_from_a_checkpoint(char_tok, tiny_prm, tmp_path):
    save_reward_model(tiny_prm, char_tok, tmp_path / "prm", kind="process", delimiter="\n")
    (prm,) = resolve_process_reward_funcs([str(tmp_path / "prm")], batch_size=4)
    assert isinstance(prm, ProcessRewardModel) and prm.delimiter == "\n"
    completions = ["2+3=5\n5*2=10\n", "2+3=6"]
    scores = score_process([prm], ["2 +3 *2\n"] * 2, completions, encode(char_tok, completions), char_tok)
    rewards, ends = scores.step_rewards, scores.step_ends
    assert [len(r) for r in rewards] == [2, 1] and ends == [[5, 12], [4]]
    direct = ProcessRewardModel(tiny_prm, char_tok)(["2 +3 *2\n"] * 2, completions)
    for a, b in zip(rewards, direct):
        assert a == pytest.approx(b, abs=1e-5)


def test_prm_refuses_a_different_delimiter(char_tok, tiny_prm):
    prm = ProcessRewardModel(tiny_prm, char_tok, delimiter="<step>")
    with pytest.raises(RewardFunctionError, match="same step delimiter") as caught:
        score_process([prm], ["p"], ["a\nb"], encode(char_tok, ["a\nb"]), char_tok, delimiter="\n")
    assert isinstance(caught.value.__cause__, ValueError)

"""The chained-arithmetic task: rows, worked solutions, the step verifiers and the outcome reward."""

from __future__ import annotations

import random

import pytest

from grpokit.rewards.process_rewards import step_texts
from grpokit.tasks.chain import (
    chain_outcome_reward,
    chain_step_reward,
    chain_step_reward_local,
    corrupt_solution,
    label_chain_samples,
    make_chain_policy_rm_samples,
    make_chain_rm_samples,
    make_chain_splits,
    worked_solution,
)

ROW = {"prompt": "17 +8 *2 -5\n", "solution": "45", "start": 17, "operations": ["+8", "*2", "-5"]}


def verify(fn, completions, row=ROW):
    steps = [step_texts(c) for c in completions]
    n = len(completions)
    return fn(
        [row["prompt"]] * n, completions, steps, start=[row["start"]] * n, operations=[row["operations"]] * n
    )


def test_worked_solution_by_hand():
    # 17+8=25, 25*2=50, 50-5=45
    assert worked_solution(ROW) == "17+8=25\n25*2=50\n50-5=45\n<answer>45</answer>"


def test_splits_are_seeded_disjoint_and_consistent():
    train, test = make_chain_splits(3, 50, 20, num_ops=3)
    again, _ = make_chain_splits(3, 50, 20, num_ops=3)
    assert train == again
    assert len(train) == 50 and len(test) == 20
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in test}
    for row in train + test:
        assert set(row) == {"prompt", "solution", "start", "operations"} and len(row["operations"]) == 3
        answer = worked_solution(row).split("\n")[-1]
        assert answer == f"<answer>{row['solution']}</answer>"
        assert int(row["solution"]) >= 0
    assert make_chain_splits(4, 50, 20)[0] != train


def test_character_tokenizer_covers_the_task(char_tok):
    train, _ = make_chain_splits(0, 30, 0)
    for row in train:
        ids = char_tok(row["prompt"] + worked_solution(row), add_special_tokens=False)["input_ids"]
        assert char_tok.unk_token_id not in ids


@pytest.mark.parametrize(
    ("completion", "prefix", "local"),
    [
        # all right
        ("17+8=25\n25*2=50\n50-5=45\n<answer>45</answer>", [1, 1, 1, 1], [1, 1, 1, 1]),
        # slip in step 2 (25*2=51), carried on correctly: prefix condemns the rest, local only step 2
        ("17+8=25\n25*2=51\n51-5=46\n<answer>46</answer>", [1, 0, 0, 0], [1, 0, 1, 1]),
        # right lines, wrong answer
        ("17+8=25\n25*2=50\n50-5=45\n<answer>44</answer>", [1, 1, 1, 0], [1, 1, 1, 0]),
        # wrong operation in step 1 (+9 instead of +8)
        ("17+9=26\n26*2=52\n52-5=47\n<answer>47</answer>", [0, 0, 0, 0], [0, 1, 1, 1]),
        # a line that does not parse; local: line 3 starts from 50, not the last written result 25 (wrong),
        # and the answer repeats line 3's written 45 (right)
        ("17+8=25\n25 times 2\n50-5=45\n<answer>45</answer>", [1, 0, 0, 0], [1, 0, 0, 1]),
        # answer straight away: it stands where the first operation should be
        ("<answer>45</answer>", [0], [0]),
        # truncated mid-step: the partial line is wrong
        ("17+8=25\n25*2=5", [1, 0], [1, 0]),
        # an extra line after the answer is wrong
        ("17+8=25\n25*2=50\n50-5=45\n<answer>45</answer>\n1+1=2", [1, 1, 1, 1, 0], [1, 1, 1, 1, 0]),
        # empty lines are not steps; surrounding spaces are tolerated
        ("17+8=25\n\n 25*2=50 \n50-5=45\n<answer> 45 </answer>", [1, 1, 1, 1], [1, 1, 1, 1]),
    ],
)
def test_step_verifiers_on_hand_made_chains(completion, prefix, local):
    assert verify(chain_step_reward, [completion]) == [prefix]
    assert verify(chain_step_reward_local, [completion]) == [local]


def test_outcome_reward():
    completions = [
        "17+8=25\n25*2=50\n50-5=45\n<answer>45</answer>",
        "<answer>045</answer>",
        "17+8=25\n<answer>44</answer>",
        "no answer",
        "<answer>44</answer>\n<answer>45</answer>",  # the last tag counts
        "<answer>45</answer>\n<answer>44</answer>",
        "<answer>50-5</answer>",  # equal in value, but not an integer answer
    ]
    expected = [1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    assert chain_outcome_reward([""] * 7, completions, None, solution=["45"] * 7) == expected


def test_rm_samples_labels_match_the_rewards():
    train, _ = make_chain_splits(0, 200, 0)
    samples = make_chain_rm_samples(train, kind="process", seed=0)
    outcomes = make_chain_rm_samples(train, kind="outcome", seed=0)
    wrong = 0
    for row, sample, outcome in zip(train, samples, outcomes):
        assert sample["completion"] == outcome["completion"]  # same seed, same completions
        assert len(sample["step_labels"]) == len(step_texts(sample["completion"]))
        assert outcome["label"] == float(
            all(v == 1.0 for v in sample["step_labels"])
            and len(sample["step_labels"]) == len(row["operations"]) + 1
        )
        wrong += outcome["label"] == 0.0
    assert 60 < wrong < 140  # about half are corrupted


def test_corruptions_are_wrong():
    train, _ = make_chain_splits(1, 100, 0)
    rng = random.Random(0)
    for row in train:
        bad = corrupt_solution(row, rng)
        assert chain_outcome_reward([""], [bad], None, solution=[row["solution"]]) == [0.0]


def test_label_chain_samples_by_hand():
    row = {"prompt": "17 +8 *2 -5\n", "solution": "45", "start": 17, "operations": ["+8", "*2", "-5"]}
    right = "17+8=25\n25*2=50\n50-5=45\n<answer>45</answer>"
    slip = "17+8=25\n25*2=51\n51-5=46\n<answer>46</answer>"  # step 2 wrong, carried on
    lucky = "17+8=25\n25*2=50\n50-5=44\n<answer>45</answer>"  # step 3 wrong, answer right
    outcome = label_chain_samples([row] * 3, [right, slip, lucky], kind="outcome")
    assert [s["label"] for s in outcome] == [1.0, 0.0, 1.0]
    process = label_chain_samples([row] * 3, [right, slip, lucky], kind="process")
    assert [s["step_labels"] for s in process] == [[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0]]
    with pytest.raises(ValueError, match="kind"):
        label_chain_samples([row], [right], kind="pairwise")
    with pytest.raises(ValueError, match="1 rows but 2 completions"):
        label_chain_samples([row], [right, slip], kind="outcome")


def test_policy_rm_samples_are_the_policys_groups_labelled_by_rule(char_tok):
    from grpokit.models.tiny import build_tiny_model

    model = build_tiny_model(char_tok, hidden_size=16, num_layers=1, num_heads=2, seed=0)
    rows, _ = make_chain_splits(0, 3, 1)
    samples = make_chain_policy_rm_samples(model, char_tok, rows, kind="process", num_generations=4,
                                           max_new_tokens=8, seed=0)  # fmt: skip
    assert [s["prompt"] for s in samples] == [row["prompt"] for row in rows for _ in range(4)]
    again = make_chain_policy_rm_samples(model, char_tok, rows, kind="process", num_generations=4,
                                         max_new_tokens=8, seed=0)  # fmt: skip
    assert again == samples  # seeded
    relabelled = label_chain_samples([row for row in rows for _ in range(4)],
                                     [s["completion"] for s in samples], kind="process")  # fmt: skip
    assert relabelled == samples
    with pytest.raises(ValueError, match="num_generations"):
        make_chain_policy_rm_samples(model, char_tok, rows, num_generations=0)

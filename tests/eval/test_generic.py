"""evaluate_model on a model, data and rewards grpokit does not ship: every number equals an independent plain
``transformers`` computation; maj@k / pass@k on fixed completions; bad input refused before generation."""

from __future__ import annotations

from math import comb

import pytest
import torch

from grpokit.cli.eval_command import load_eval_model
from grpokit.eval import EvalCompletions, evaluate_model, gold_answer, grade_completions, resolve_extractor
from grpokit.rewards.extract import extract_boxed
from tests.eval.user_eval import (
    MAX_NEW_TOKENS,
    ROWS,
    WEIGHTS,
    build_user_model,
    expected_metrics,
    greedy_by_hand,
    write_reward_module,
)


@pytest.fixture(scope="module")
def user_model(tmp_path_factory):
    return build_user_model(tmp_path_factory.mktemp("user-qwen2"))


@pytest.fixture
def user_rewards(tmp_path, monkeypatch):
    module = write_reward_module(tmp_path, monkeypatch)
    return [f"{module}.digit_reward", "tag_count"]


@pytest.mark.parametrize("template_kwargs", [{}, {"terse": True}])
@pytest.mark.parametrize("backend", ["fast", "transformers"])
def test_greedy_metrics_equal_plain_transformers_by_hand(user_model, user_rewards, backend, template_kwargs):
    model, tokenizer = load_eval_model(str(user_model), device="cpu", dtype="float32")
    result = evaluate_model(
        model,
        tokenizer,
        ROWS,
        reward_funcs=user_rewards,
        reward_weights=list(WEIGHTS),
        max_new_tokens=MAX_NEW_TOKENS,
        chat_template_kwargs=template_kwargs or None,
        generation_backend=backend,
        batch_size=3,  # several backend calls, prompts of different lengths padded together
        per_example=True,
    )
    reference = greedy_by_hand(user_model, ROWS, MAX_NEW_TOKENS, **template_kwargs)
    expected = expected_metrics(ROWS, reference, threshold=1.0)
    records = result["records"]
    assert [r["completions"] for r in records] == [[ref["text"]] for ref in reference]
    assert [r["completion_tokens"] for r in records] == [[len(ref["ids"])] for ref in reference]
    assert [r["truncated"] for r in records] == [[ref["truncated"]] for ref in reference]
    assert [r["rewards"] for r in records] == [[value] for value in expected["combined"]]
    assert [r["correct"] for r in records] == [[ok] for ok in expected["correct"]]
    assert records[5]["rewards_by_function"]["digit_reward"] == [None]  # the user reward returned None
    assert result["accuracy"] == expected["accuracy"]
    assert result["mean_reward"] == expected["mean_reward"]
    assert result["rewards/digit_reward/mean"] == expected["digit_mean"]
    assert result["rewards/tag_count_reward/mean"] == expected["tag_mean"]
    assert result["mean_completion_tokens"] == expected["mean_completion_tokens"]
    assert result["truncated_rate"] == expected["truncated_rate"]
    assert (result["num_examples"], result["num_samples"], result["generation_backend"]) == (8, 1, backend)
    assert result["reward_funcs"] == ["digit_reward", "tag_count_reward"]
    assert "pass@1" not in result and "maj@1" not in result
    # the data exercise what they should: EOS stops and truncations, right and wrong, a None reward
    assert 0 < expected["truncated_rate"] < 1 and 0 < expected["accuracy"] < 1


def test_the_template_variables_reach_the_chat_template(user_model, user_rewards):
    model, tokenizer = load_eval_model(str(user_model), device="cpu", dtype="float32")
    chat_rows = ROWS[6:]
    texts = {}
    for terse in (False, True):
        out = evaluate_model(
            model,
            tokenizer,
            chat_rows,
            reward_funcs=user_rewards,
            max_new_tokens=MAX_NEW_TOKENS,
            chat_template_kwargs={"terse": terse},
            per_example=True,
        )
        texts[terse] = [r["completions"][0] for r in out["records"]]
    plain = evaluate_model(
        model,
        tokenizer,
        [{**row, "prompt": row["prompt"][0]["content"]} for row in chat_rows],
        reward_funcs=user_rewards,
        max_new_tokens=MAX_NEW_TOKENS,
        per_example=True,
    )
    assert texts[True] == [r["completions"][0] for r in plain["records"]]  # terse: the bare content
    assert texts[False] != texts[True]


def test_sampling_is_seeded_and_its_metrics_agree_with_the_records(user_model, user_rewards):
    model, tokenizer = load_eval_model(str(user_model), device="cpu", dtype="float32")
    rows = [row for row in ROWS if row["solution"] is not None]
    options = dict(
        reward_funcs=user_rewards,
        answer_extractor=f"{user_rewards[0].split('.')[0]}.first_word",
        num_samples=4,
        temperature=1.5,
        top_k=20,
        max_new_tokens=MAX_NEW_TOKENS,
        correct_threshold=0.5,
        pass_k=[2],
        seed=3,
        per_example=True,
    )
    state = torch.random.get_rng_state()
    result = evaluate_model(model, tokenizer, rows, **options)
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's RNG is left alone
    assert evaluate_model(model, tokenizer, rows, **options) == result
    records = result["records"]
    correct = [r["correct"] for r in records]
    fractions = [sum(c) / 4 for c in correct]
    assert result["mean@4"] == result["accuracy"] == pytest.approx(sum(fractions) / len(rows))
    assert result["pass@4"] == sum(any(c) for c in correct) / len(rows)
    assert result["pass@2"] == pytest.approx(
        sum(1 - comb(4 - sum(c), 2) / comb(4, 2) for c in correct) / len(rows)
    )
    majority_right = 0
    for record in records:
        votes = [a for a in record["extracted"] if a is not None]
        best = max(votes, key=lambda a: (votes.count(a), -votes.index(a))) if votes else None
        majority_right += best == record["solution"]
    assert result["maj@4"] == majority_right / len(rows)
    for record in records:
        assert record["extracted"] == [c.split()[0] if c.split() else None for c in record["completions"]]
    assert len({c for r in records for c in r["completions"]}) > len(rows)  # it did sample


def boxed_rows_and_completions() -> tuple[list[dict], EvalCompletions]:
    rows = [
        {"prompt": "a", "solution": "4"},
        {"prompt": [{"role": "user", "content": "b"}], "solution": "10"},
        {"prompt": "c", "solution": "7"},
    ]
    texts = [
        ["so \\boxed{4}", "\\boxed{5}", "\\boxed{ 4 }", "no box"],  # 2 right; majority 4: right
        ["\\boxed{12}", "\\boxed{10}", "\\boxed{12}", "\\boxed{10"],  # 1 right (last box unclosed); 12 wins
        ["\\boxed{3}"] * 4,  # none right
    ]
    ids = [[list(range(len(t))) for t in group] for group in texts]
    truncated = [[False, False, False, True], [False, False, False, True], [False] * 4]
    return rows, EvalCompletions(texts, ids, truncated)


def test_boxed_answers_give_maj_pass_and_mean_at_k():
    rows, completions = boxed_rows_and_completions()
    result = grade_completions(
        rows, completions, answer_extractor=resolve_extractor("boxed"), pass_k=[1, 2], per_example=True
    )
    assert result["mean@4"] == result["accuracy"] == (2 / 4 + 1 / 4 + 0) / 3
    assert result["mean_reward"] == 3 / 12 and result["rewards/answer_match/mean"] == 3 / 12
    assert result["pass@4"] == 2 / 3
    # Chen et al. 2021: 1 - C(n-c, k) / C(n, k) per prompt, n = 4, c = 2, 1, 0
    per_prompt = [1 - comb(4 - c, 2) / comb(4, 2) for c in (2, 1, 0)]
    assert result["pass@2"] == pytest.approx(sum(per_prompt) / 3)
    assert result["pass@1"] == pytest.approx(result["mean@4"])
    assert result["maj@4"] == 1 / 3
    assert result["format_rate"] == 10 / 12
    assert result["truncated_rate"] == 2 / 12
    assert result["mean_completion_tokens"] == sum(len(t) for group in completions.texts for t in group) / 12
    assert result["records"][1]["extracted"] == ["12", "10", "12", None]
    assert result["records"][0]["correct"] == [True, False, True, False]


def test_a_worked_solution_is_graded_by_its_extracted_answer():
    rows = [{"prompt": "How many clips?", "solution": "48 / 2 = 24 in May, 48 + 24 = 72.\n#### 72"}]
    completions = EvalCompletions([["48 + 24 = 72\n#### 72", "#### 70", "so #### 72."]], [[[1], [1], [1]]])
    result = grade_completions(
        rows, completions, answer_extractor=resolve_extractor("hash"), per_example=True
    )
    assert result["records"][0]["correct"] == [True, False, True]
    assert result["maj@3"] == 1.0 and result["accuracy"] == 2 / 3 and result["truncated_rate"] == 0.0
    assert gold_answer("7", extract_boxed) == "7" and gold_answer("so \\boxed{7}", extract_boxed) == "7"


def test_reward_functions_decide_correctness_and_the_extractor_still_votes():
    rows, completions = boxed_rows_and_completions()

    def says_four(prompts, completions, **kwargs):  # a conversational prompt gets an assistant message
        texts = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
        return [2.0 * ("4" in t) for t in texts]

    result = grade_completions(
        rows, completions, reward_funcs=[says_four], answer_extractor=extract_boxed, correct_threshold=2.0
    )
    assert result["rewards/says_four/mean"] == result["mean_reward"] == 2.0 * 2 / 12
    assert result["accuracy"] == (2 / 4) / 3 and result["pass@4"] == 1 / 3
    assert result["maj@4"] == 1 / 3  # the vote compares with the solution column, whatever the reward


def test_a_users_extractor_by_import_path(tmp_path, monkeypatch):
    module = write_reward_module(tmp_path, monkeypatch)
    first_word = resolve_extractor(f"{module}.first_word")
    assert first_word("12 apples") == "12" and resolve_extractor(f"{module}:first_word") is first_word
    assert resolve_extractor("boxed") is extract_boxed and resolve_extractor(None) is None


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"answer_extractor": "boxd", "reward_funcs": ["tag_count"]},
            r"answer_extractor: unknown extractor 'boxd'",
        ),
        ({"answer_extractor": "no_such_module.fn"}, r"answer_extractor 'no_such_module.fn': cannot import"),
        ({"reward_funcs": ["no_such_reward"]}, r"reward_funcs: unknown reward 'no_such_reward'"),
        (
            {"reward_funcs": ["tag_count"], "num_samples": 4, "temperature": 0.0},
            r"num_samples=4 needs temperature > 0",
        ),
        ({}, r"nothing to grade with: give reward_funcs .* or an answer_extractor"),
        ({"answer_extractor": "boxed"}, r"answer_extractor without reward_funcs.*'solution' column.*row 1"),
        (
            {
                "answer_extractor": "boxed",
                "reward_funcs": ["tag_count"],
                "num_samples": 2,
                "temperature": 1.0,
            },
            r"maj@2 .*'solution' column",
        ),
        ({"reward_funcs": ["tag_count"], "reward_weights": [1.0, 2.0]}, r"reward_weights has 2 values"),
        ({"reward_funcs": ["tag_count"], "num_samples": 2, "temperature": 1.0, "pass_k": [3]}, r"pass_k"),
    ],
)
def test_bad_input_is_refused_naming_the_option_before_generating(options, message):
    rows = [{"prompt": "1+1=", "solution": "2"}, {"prompt": "2+2="}]
    with pytest.raises(ValueError, match=message):
        evaluate_model(None, None, rows, **options)  # no model needed: nothing is generated

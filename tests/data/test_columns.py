"""``column_mapping`` and ``prompt_column`` shape the rows the reward functions see; every unusable row or
column is refused with a message naming the field, the row and the columns there are."""

from __future__ import annotations

import json

import datasets
import pytest

from grpokit.data.loading import DataSettings, load_dataset_rows, reward_columns

GSM_LIKE = [
    {"question": "1+1=", "answer": "2", "id": 0},
    {"question": "2+3=", "answer": "5", "id": 1},
]


def test_column_mapping_renames_for_the_reward_functions():
    args = DataSettings(column_mapping={"question": "prompt", "answer": "solution"})
    rows = load_dataset_rows(datasets.Dataset.from_list(GSM_LIKE), args)
    assert rows == [
        {"prompt": "1+1=", "solution": "2", "id": 0},
        {"prompt": "2+3=", "solution": "5", "id": 1},
    ]
    # The reward functions receive every column but the prompt, under the new names.
    assert reward_columns(rows) == {"id": [0, 1], "solution": ["2", "5"]}
    assert GSM_LIKE[0] == {"question": "1+1=", "answer": "2", "id": 0}  # the caller's rows are untouched


def test_prompt_column_becomes_the_prompt(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in GSM_LIKE))
    rows = load_dataset_rows(str(path), DataSettings(prompt_column="question"))
    assert rows == [{"prompt": "1+1=", "answer": "2", "id": 0}, {"prompt": "2+3=", "answer": "5", "id": 1}]
    assert reward_columns(rows) == {"answer": ["2", "5"], "id": [0, 1]}


def test_prompt_column_names_a_column_after_the_mapping_and_swaps_are_allowed():
    args = DataSettings(
        column_mapping={"question": "query", "answer": "id", "id": "answer"}, prompt_column="query"
    )
    rows = load_dataset_rows(GSM_LIKE, args)
    assert rows[1] == {"prompt": "2+3=", "id": "5", "answer": 1}


def test_conversational_prompts_in_a_renamed_column():
    messages = [{"role": "system", "content": "Add."}, {"role": "user", "content": "1+1="}]
    rows = load_dataset_rows([{"messages": messages, "answer": "2"}], DataSettings(prompt_column="messages"))
    assert rows == [{"prompt": messages, "answer": "2"}]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"column_mapping": {"questions": "prompt"}},
            r"column_mapping: train_dataset has no column 'questions' to rename "
            r"\(columns: \['question', 'answer', 'id'\]\)",
        ),
        (
            {"column_mapping": {"question": "prompt", "answer": "prompt"}},
            r"column_mapping renames both 'question' and 'answer' to 'prompt'",
        ),
        (
            {"column_mapping": {"question": "id"}},
            r"column_mapping renames 'question' to 'id', but train_dataset already has a 'id' column",
        ),
        (
            {"prompt_column": "query"},
            r"prompt_column='query': train_dataset has no such column "
            r"\(columns: \['question', 'answer', 'id'\]\)",
        ),
        (
            {"prompt_column": "query", "column_mapping": {"answer": "solution"}},
            r"prompt_column='query': .*columns after column_mapping: \['question', 'solution', 'id'\]",
        ),
        (
            {"prompt_column": "answer", "column_mapping": {"question": "prompt"}},
            r"prompt_column='answer', but train_dataset also has a 'prompt' column; rename that one",
        ),
    ],
)
def test_bad_column_settings(settings, message):
    with pytest.raises(ValueError, match=message):
        load_dataset_rows(GSM_LIKE, DataSettings(**settings))


def test_a_row_without_the_prompt_column():
    rows = [{"question": "1+1="}, {"query": "2+2="}]
    with pytest.raises(
        ValueError,
        match=r"eval_dataset row 1: missing the prompt column 'question' "
        r"\(prompt_column; columns: \['query'\]\)",
    ):
        load_dataset_rows(rows, DataSettings(prompt_column="question"), name="eval_dataset")
    with pytest.raises(
        ValueError, match=r"train_dataset row 1: missing the 'prompt' field \(columns: \['query'\]\)"
    ):
        load_dataset_rows([{"prompt": "1+1="}, {"query": "2+2="}], DataSettings())


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ("", r"empty string"),
        ("  \n\t", r"whitespace-only string"),
        (None, r"empty \(None\)"),
        (7, r"expected a string or a list of \{'role', 'content'\} messages, got int"),
        ([], r"empty list of messages"),
        ([{"role": "user"}], r"message 0 must be a dict with 'role' and 'content'"),
        (
            [{"role": "system", "content": "Add."}, {"role": "user", "content": []}],
            r"message 1 has an empty content list",
        ),
        ([{"role": "user", "content": 3}], r"message 0 content must be a string or a list of parts, got int"),
        (
            [{"role": "system", "content": " "}, {"role": "user", "content": [{"type": "text", "text": ""}]}],
            r"every message's content is empty",
        ),
    ],
)
def test_empty_or_malformed_prompts_name_the_row_and_field(prompt, message):
    rows = [{"prompt": "1+1="}, {"prompt": "2+2="}, {"prompt": prompt}]
    with pytest.raises(ValueError, match=r"^train_dataset row 2 field 'prompt': " + message):
        load_dataset_rows(rows, DataSettings())


def test_multimodal_parts_with_text_and_non_dict_rows_pass_or_fail_clearly():
    prompt = [{"role": "user", "content": [{"type": "text", "text": "1+1="}]}]
    assert load_dataset_rows([{"prompt": prompt}], DataSettings())[0]["prompt"] == prompt
    with pytest.raises(ValueError, match=r"train_dataset row 1: expected a dict, got str"):
        load_dataset_rows([{"prompt": "1+1="}, "2+2="], DataSettings(prompt_column="prompt"))

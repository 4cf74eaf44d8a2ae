"""grpokit.data.records: JSON lines with NaN as null, and readable errors for malformed lines."""

import math

import pytest

from grpokit.data.records import append_jsonl, json_number, read_jsonl, write_jsonl


def test_numbers_and_round_trip(tmp_path):
    assert json_number(math.nan) is None and json_number(-math.inf) is None
    assert json_number(0.1234567, 3) == 0.123 and json_number(2) == 2.0
    path = tmp_path / "sub" / "log.jsonl"
    write_jsonl(path, [{"a": 1}])
    append_jsonl(path, [{"a": json_number(math.nan)}, {"b": [1, 2]}])
    assert read_jsonl(path) == [{"a": 1}, {"a": None}, {"b": [1, 2]}]


def test_a_malformed_line_is_named(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"a": 1}\n\n{"a": \n')
    with pytest.raises(ValueError, match=r"train_dataset: .*bad.jsonl line 3 is not valid JSON"):
        read_jsonl(path, "train_dataset")

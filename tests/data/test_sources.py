"""Every form a data set can take reaches the trainer as the same list of row dicts: local files, folders
of data files with splits (read by ``datasets.load_dataset`` as a hub repository would be), in-memory
``Dataset`` / ``DatasetDict`` objects and plain lists; bad sources are refused with the reason."""

from __future__ import annotations

import json

import datasets
import pytest

from grpokit.data.loading import DataSettings, load_dataset_rows, load_rows

ROWS = [
    {"prompt": "1+1=", "solution": "2"},
    {"prompt": "2+3=", "solution": "5"},
    {"prompt": "4+4=", "solution": "8"},
]
CHAT_ROWS = [
    {"prompt": [{"role": "system", "content": "Add."}, {"role": "user", "content": "1+1="}], "solution": "2"},
    {"prompt": [{"role": "user", "content": "2+3="}], "solution": "5"},
]


def write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".csv", ".parquet"])
def test_local_files(tmp_path, suffix):
    path = tmp_path / f"train{suffix}"
    if suffix == ".jsonl":
        write_jsonl(path, ROWS)
    elif suffix == ".json":
        path.write_text(json.dumps(ROWS))
    elif suffix == ".csv":
        path.write_text("prompt,solution\n1+1=,2\n2+3=,5\n4+4=,8\n")
    else:
        datasets.Dataset.from_list(ROWS).to_parquet(str(path))
    rows = load_dataset_rows(str(path), DataSettings())
    # csv has no types: "2" is read back as the integer 2.
    expected = [{**row, "solution": int(row["solution"])} for row in ROWS] if suffix == ".csv" else ROWS
    assert rows == expected


def test_a_pathlib_path_and_load_rows_defaults(tmp_path):
    path = write_jsonl(tmp_path / "train.jsonl", ROWS)
    assert load_rows(path) == ROWS
    assert load_dataset_rows(path, None, name="eval_dataset") == ROWS  # a single file has no splits


def test_folder_with_train_and_test_jsonl_splits(tmp_path):
    folder = tmp_path / "arith"
    write_jsonl(folder / "train.jsonl", ROWS)
    write_jsonl(folder / "test.jsonl", ROWS[:1])
    args = DataSettings()
    assert load_dataset_rows(str(folder), args, name="train_dataset") == ROWS
    assert load_dataset_rows(str(folder), args, name="eval_dataset") == ROWS[:1]


def test_folder_of_parquet_shards_with_conversational_prompts_and_chosen_splits(tmp_path):
    folder = tmp_path / "chat"
    (folder / "data").mkdir(parents=True)
    datasets.Dataset.from_list(CHAT_ROWS).to_parquet(str(folder / "data" / "train-00000-of-00001.parquet"))
    datasets.Dataset.from_list(CHAT_ROWS[1:]).to_parquet(str(folder / "data" / "dev-00000-of-00001.parquet"))
    args = DataSettings(dataset_train_split="dev", dataset_test_split="train")
    assert load_dataset_rows(str(folder), args, name="train_dataset") == CHAT_ROWS[1:]
    assert load_dataset_rows(str(folder), args, name="eval_dataset") == CHAT_ROWS


def test_folder_without_the_configured_split_lists_its_splits(tmp_path):
    folder = tmp_path / "only-train"
    write_jsonl(folder / "train.jsonl", ROWS)
    with pytest.raises(
        ValueError,
        match=r"eval_dataset: '.*only-train' has no split 'test' \(splits: \['train'\]\); "
        r"set dataset_test_split",
    ):
        load_dataset_rows(str(folder), DataSettings(), name="eval_dataset")


def test_folder_with_an_unknown_dataset_config(tmp_path):
    folder = tmp_path / "arith"
    write_jsonl(folder / "train.jsonl", ROWS)
    with pytest.raises(ValueError, match=r"could not read the folder: .*'main' not found"):
        load_dataset_rows(str(folder), DataSettings(dataset_config="main"))


def test_in_memory_dataset_and_dataset_dict():
    train, test = datasets.Dataset.from_list(ROWS), datasets.Dataset.from_list(ROWS[2:])
    assert load_dataset_rows(train, DataSettings()) == ROWS
    splits = datasets.DatasetDict({"train": train, "validation": test})
    args = DataSettings(dataset_test_split="validation")
    assert load_dataset_rows(splits, args, name="train_dataset") == ROWS
    assert load_dataset_rows(splits, args, name="eval_dataset") == ROWS[2:]
    with pytest.raises(
        ValueError,
        match=r"train_dataset: the DatasetDict has no split 'train' \(splits: \['validation'\]\); "
        r"set dataset_train_split",
    ):
        load_dataset_rows(datasets.DatasetDict({"validation": test}), args)


def test_iterable_dataset_and_list_of_dicts():
    assert load_dataset_rows(datasets.Dataset.from_list(ROWS).to_iterable_dataset(), DataSettings()) == ROWS
    rows = load_dataset_rows(CHAT_ROWS, DataSettings())
    assert rows == CHAT_ROWS and rows[0] is not CHAT_ROWS[0]  # copied: renames never touch the caller's data


def test_a_name_that_is_neither_local_nor_on_the_hub():
    # The data tests run offline (conftest.py): the hub lookup fails as it does on a machine without network.
    with pytest.raises(
        ValueError,
        match=r"train_dataset='someone/no-such-set' is not a local file or folder and could not be loaded "
        r"from the hub with datasets.load_dataset\('someone/no-such-set', 'main'\): ConnectionError: ",
    ):
        load_dataset_rows("someone/no-such-set", DataSettings(dataset_config="main"))
    with pytest.raises(
        ValueError, match=r"eval_dataset='bad name!' is not a local file or folder and could not"
    ):
        load_dataset_rows("bad name!", DataSettings(), name="eval_dataset")


def test_missing_local_paths_unsupported_files_and_other_objects(tmp_path):
    for missing in (str(tmp_path / "nothing.jsonl"), "./no-such-folder", "data/train.parquet"):
        with pytest.raises(FileNotFoundError, match=r"train_dataset: no such file or folder"):
            load_dataset_rows(missing, DataSettings())
    text = tmp_path / "train.txt"
    text.write_text("1+1=\n")
    with pytest.raises(ValueError, match=r"train_dataset: unsupported file type '.txt'"):
        load_dataset_rows(str(text), DataSettings())
    with pytest.raises(TypeError, match=r"eval_dataset: expected a datasets.Dataset.*got int"):
        load_dataset_rows(3, DataSettings(), name="eval_dataset")
    with pytest.raises(ValueError, match=r"`train_dataset` is required"):
        load_dataset_rows(None, DataSettings())


def test_malformed_jsonl_line_and_empty_sources(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"prompt": "1+1="}\n{"prompt": \n')
    with pytest.raises(ValueError, match=r"train_dataset: .*train.jsonl line 2 is not valid JSON"):
        load_dataset_rows(str(path), DataSettings())
    for empty in ([], datasets.Dataset.from_dict({"prompt": []})):
        with pytest.raises(ValueError, match=r"eval_dataset is empty"):
            load_dataset_rows(empty, DataSettings(), name="eval_dataset")

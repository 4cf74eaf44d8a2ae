"""GRPOTrainer takes a data set the way TRL users load one: a folder resolved by ``datasets.load_dataset``
(like a hub repository of data files), its splits, renamed columns, and a refusal of over-long prompts."""

from __future__ import annotations

import json

import pytest

from grpokit import GRPOTrainer
from grpokit.data.chat import encode_prompt

from ..conftest import small_config


def seen_solutions(prompts, completions, completion_ids, answer, **kwargs):
    """A reward that needs the renamed column ``answer`` (from ``gold``)."""
    return [float(a in c) for c, a in zip(completions, answer)]


def write_split(folder, split, pairs):
    folder.mkdir(exist_ok=True)
    lines = [json.dumps({"question": q, "gold": g}) for q, g in pairs]
    (folder / f"{split}.jsonl").write_text("\n".join(lines))


def test_a_folder_with_splits_and_renamed_columns_trains_and_evaluates(tiny_model_dir, tmp_path):
    data = tmp_path / "my-dataset"
    write_split(data, "train", [("1+1=", "2"), ("2+3=", "5")])
    write_split(data, "test", [("4+4=", "8")])  # (grpokit train's dataset_test_split chooses another)
    config = small_config(tmp_path, beta=0.0, prompt_column="question", column_mapping={"gold": "answer"})
    trainer = GRPOTrainer(
        str(tiny_model_dir), [seen_solutions], config, train_dataset=str(data), eval_dataset=str(data)
    )
    assert trainer.train_rows == [{"prompt": "1+1=", "answer": "2"}, {"prompt": "2+3=", "answer": "5"}]
    assert trainer.eval_rows == [{"prompt": "4+4=", "answer": "8"}]
    trainer.train()
    assert set(trainer.evaluate()) == {"eval/reward", "eval/rewards/seen_solutions/mean", "eval_loss"}


def test_prompts_longer_than_max_prompt_length_are_refused_when_asked(tiny_model_dir, tmp_path):
    rows = [{"prompt": "1+1=", "answer": "2"}, {"prompt": "12345+67890=", "answer": "80235"}]
    config = small_config(tmp_path, max_prompt_length=8, prompt_truncation="error")
    with pytest.raises(ValueError, match=r"train_dataset row 1.*12 tokens.*max_prompt_length.*8"):
        GRPOTrainer(str(tiny_model_dir), [seen_solutions], config, train_dataset=rows)
    left = GRPOTrainer(str(tiny_model_dir), [seen_solutions], small_config(tmp_path, max_prompt_length=8),
                       train_dataset=rows)  # fmt: skip
    whole = encode_prompt(rows[1]["prompt"], left.tokenizer, None, None)
    assert len(whole) == 12 and left.encode_prompt(rows[1]["prompt"]) == whole[-8:]  # cut from the left

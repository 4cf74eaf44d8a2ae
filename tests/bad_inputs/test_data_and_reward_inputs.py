"""Data files that are not UTF-8 are refused naming the file and the line; a reward function that hangs is
bounded by ``reward_timeout`` and handled by ``reward_failure`` (stop naming the function and the limit, or
count it as a failure); a hung call never keeps the process from exiting."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import pytest

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.cli import main
from grpokit.data.loading import load_dataset_rows
from grpokit.rewards import RewardFunctionError
from grpokit.rewards.scoring import score_completions

from ..conftest import small_config

ROWS = [{"prompt": "1+1=", "solution": "2"}, {"prompt": "2+3=", "solution": "5"}]
LATIN1 = "café".encode("latin-1")  # b"caf\xe9": not UTF-8


def write_non_utf8(path):
    """Line 3 (the second row after a header line, or the second of three JSON lines) holds byte 0xe9."""
    if path.suffix == ".jsonl":
        lines = [b'{"prompt": "1+1=", "solution": "2"}', b'{"prompt": "2+2=", "solution": "4"}']
        lines.append(b'{"prompt": "' + LATIN1 + b'", "solution": "5"}')
    elif path.suffix == ".json":
        lines = [b'[{"prompt": "1+1=", "solution": "2"},', b'{"prompt": "2+2=", "solution": "4"},']
        lines.append(b'{"prompt": "' + LATIN1 + b'", "solution": "5"}]')
    else:
        lines = [b"prompt,solution", b"1+1=,2", LATIN1 + b",5"]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".csv"])
def test_a_data_file_that_is_not_utf8_is_named_with_its_line(tmp_path, suffix):
    """Before: a bare UnicodeDecodeError (jsonl) or the reader's error, naming neither file nor row."""
    path = write_non_utf8(tmp_path / f"train{suffix}")
    message = (
        rf"train_dataset: {path} line 3 is not UTF-8 text \(byte 0xe9 at column \d+\); save the file as UTF-8"
    )
    with pytest.raises(ValueError, match=message):
        load_dataset_rows(str(path), GRPOConfig().data_settings(), name="train_dataset")


def test_the_command_line_names_a_non_utf8_data_file_without_a_traceback(tiny_model_dir, tmp_path):
    path = write_non_utf8(tmp_path / "train.csv")
    argv = ["train", f"model={tiny_model_dir}", "task=null", f"dataset={path}", "reward_funcs=[think_format]",
            f"output_dir={tmp_path / 'run'}", "max_steps=1", "disable_tqdm=true"]  # fmt: skip
    with pytest.raises(SystemExit, match=rf"^grpokit: dataset: {path} line 3 is not UTF-8 text"):
        main(argv)


def test_a_malformed_json_file_names_the_file(tmp_path):
    path = tmp_path / "train.json"
    path.write_text('[{"prompt": "1+1=", "solution": "2"},\n{"prompt": "2+')
    with pytest.raises(ValueError, match=rf"^eval_dataset: {path} could not be read as json: "):
        load_dataset_rows(str(path), None, name="eval_dataset")


# -- reward_timeout --
def sleepy_reward(completions, **kwargs):
    time.sleep(600)
    return [1.0] * len(completions)


def length_reward(completions, **kwargs):
    return [float(len(c)) for c in completions]


def test_a_reward_that_hangs_stops_the_run_naming_the_function_and_the_limit(tiny_model_dir, tmp_path):
    """Before: the run waited for the function forever."""
    config = small_config(tmp_path, reward_timeout=0.5)
    trainer = GRPOTrainer(str(tiny_model_dir), [length_reward, sleepy_reward], config, train_dataset=ROWS)
    start = time.monotonic()
    with pytest.raises(RewardFunctionError, match=r"^reward function 'sleepy_reward': no answer within "
                       r"reward_timeout=0.5 s$"):  # fmt: skip
        trainer.train()
    assert time.monotonic() - start < 120  # the 0.5 s limit, not the 600 s call


def test_with_reward_failure_none_a_hung_call_is_counted_and_the_run_goes_on(tiny_model_dir, tmp_path):
    config = small_config(tmp_path, reward_timeout=0.5, reward_failure="none")
    trainer = GRPOTrainer(str(tiny_model_dir), [length_reward, sleepy_reward], config, train_dataset=ROWS)
    (metrics,) = trainer.train()
    assert metrics["rewards/sleepy_reward/failures"] == 8.0  # every value of the call: None, counted
    assert metrics["rewards/length_reward/failures"] == 0.0
    assert metrics["reward"] == metrics["rewards/length_reward/mean"]  # the hung one left out of the sum


def test_an_async_reward_that_blocks_the_event_loop_is_bounded_too():
    async def blocking(completions, **kwargs):
        time.sleep(300)  # blocks instead of awaiting
        return [1.0] * len(completions)

    async def waiting(completions, **kwargs):
        await asyncio.sleep(300)
        return [1.0] * len(completions)

    start = time.monotonic()
    for reward in (blocking, waiting):
        rewards, failures = score_completions(
            [reward, length_reward], ["p", "q"], ["a", "bc"], on_error="none", timeout=0.3
        )
        assert failures == {reward.__name__: 2, "length_reward": 0}
        assert rewards[:, 1].tolist() == [1.0, 2.0] and rewards[:, 0].isnan().all()
    assert time.monotonic() - start < 120  # the 0.3 s limits, not the 300 s calls


def test_a_hung_reward_does_not_keep_the_process_from_exiting():
    code = (
        "import time\n"
        "from grpokit.rewards.scoring import score_completions\n"
        "def hang(completions, **kwargs):\n"
        "    time.sleep(3600)\n"
        "_, failures = score_completions([hang], ['p'], ['a'], on_error='none', timeout=0.2)\n"
        "print(failures['hang'])\n"
    )
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.strip() == "1", done.stderr
    assert time.monotonic() - start < 300  # the interpreter's start-up, not the hour


def test_a_reward_timeout_that_is_not_positive_is_refused():
    with pytest.raises(
        ValueError, match=r"GRPOConfig.reward_timeout must be > 0 seconds \(or None: unbounded\)"
    ):
        GRPOConfig(reward_timeout=0)
    assert GRPOConfig().reward_timeout is None  # unbounded by default: rewards run in the trainer's thread


def test_a_reward_under_a_limit_keeps_the_callers_grad_mode():
    import torch

    seen = []

    def grad_mode(completions, **kwargs):
        seen.append(torch.is_grad_enabled())
        return [0.0] * len(completions)

    with torch.no_grad():
        score_completions([grad_mode], ["p"], ["a"], timeout=5.0)
    score_completions([grad_mode], ["p"], ["a"], timeout=5.0)
    assert seen == [False, True]


def test_the_scores_written_to_the_log_are_those_of_the_reward_that_answered(tiny_model_dir, tmp_path):
    config = small_config(tmp_path, reward_timeout=0.5, reward_failure="none", log_completions=True)
    GRPOTrainer(str(tiny_model_dir), [length_reward, sleepy_reward], config, train_dataset=ROWS).train()
    records = [json.loads(line) for line in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    assert records and all(r["rewards"]["sleepy_reward"] is None for r in records)


def test_training_rows_without_a_column_a_reward_reads_are_refused_when_the_trainer_is_built(
    tiny_model_dir, tmp_path
):
    """Before: with reward_failure="none" every call failed and was counted, step after step, while the run
    trained on the other rewards; with "raise" it stopped at the first step."""

    def graded(completions, answer, **kwargs):
        return [float(a in c) for c, a in zip(completions, answer)]

    config = small_config(tmp_path, reward_failure="none")
    message = (
        r"^train_dataset has no column 'answer', which the reward graded reads \(its columns: prompt, "
        r"solution\); add it, or rename one with column_mapping=\{<its name>: answer\}$"
    )
    with pytest.raises(ValueError, match=message):
        GRPOTrainer(str(tiny_model_dir), [length_reward, graded], config, train_dataset=ROWS)
    renamed = small_config(tmp_path, column_mapping={"solution": "answer"})
    GRPOTrainer(str(tiny_model_dir), [graded], renamed, train_dataset=ROWS)  # the rename is honoured

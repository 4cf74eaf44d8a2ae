"""``grpokit train``'s before/after evaluation measures the run's own data with the run's own rewards (or says
why it measured nothing), never silently the recipe's built-in task; held-out rows without a column their
grader reads are refused before the cold start; ``grpokit eval`` refuses the same before its model loads."""

from __future__ import annotations

import json
import shutil
import textwrap

import pytest

from grpokit.cli import main
from grpokit.eval import evaluate_model
from grpokit.models import load_tokenizer

REWARDS = """
def has_answer(completions, answer, **kwargs):
    return [float(str(a) in c) for c, a in zip(completions, answer)]


def length_bonus(completions, **kwargs):
    return [min(len(c), 4) / 4 for c in completions]
"""
TRAIN = [{"prompt": "one plus one is ", "answer": "2"}, {"prompt": "two plus three is ", "answer": "5"}]
HELD_OUT = [{"prompt": f"{a} plus {b} is ", "answer": str(a + b)} for a, b in ((1, 2), (2, 2), (3, 1))]


@pytest.fixture
def user_files(tmp_path, monkeypatch):
    """The user's reward module (on sys.path), training rows and held-out rows (column ``answer``, not the
    arithmetic task's ``solution``)."""
    (tmp_path / "my_rewards.py").write_text(textwrap.dedent(REWARDS))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(__import__("sys").modules, "my_rewards", raising=False)
    train, held_out = tmp_path / "my.jsonl", tmp_path / "my_eval.jsonl"
    train.write_text("".join(json.dumps(row) + "\n" for row in TRAIN))
    held_out.write_text("".join(json.dumps(row) + "\n" for row in HELD_OUT))
    return train, held_out


def train_argv(model, out, *extra: str) -> list[str]:
    """Over the default recipe (``task: arithmetic``), as a user who brings data would type it."""
    return ["train", f"model={model}", f"output_dir={out}", "max_steps=1", "num_generations=4",
            "per_device_train_batch_size=8", "max_completion_length=4", "num_eval_examples=20",
            "disable_tqdm=true", *extra]  # fmt: skip


def test_a_users_dataset_is_not_evaluated_as_the_recipes_task(tiny_model_dir, tmp_path, user_files, capsys):
    """Before: the before/after accuracy, eval_summary.json and the card reported the arithmetic task."""
    train, _ = user_files
    out = tmp_path / "run"
    assert (
        main(train_argv(tiny_model_dir, out, f"dataset={train}", "reward_funcs=[my_rewards.has_answer]")) == 0
    )
    summary = json.loads((out / "eval_summary.json").read_text())
    assert "before" not in summary and "after" not in summary
    reason = (
        f"dataset={train} replaces the task's data and no eval_dataset holds out rows of it; give "
        "eval_dataset="
    )
    assert summary["held_out"]["skipped"].startswith(reason)
    assert (summary["task"], summary["train_dataset"]) == (None, str(train))
    assert f"grpokit: no before/after evaluation: {reason}" in capsys.readouterr().out
    card = (out / "README.md").read_text()
    assert (
        f"## Held-out evaluation\n\nNot measured: {reason}" in card and "arithmetic` task grades" not in card
    )


def test_a_users_held_out_rows_are_graded_by_the_runs_rewards(tiny_model_dir, tmp_path, user_files):
    """Before: graded by the arithmetic task's exact-answer reward, which stopped on a bare KeyError."""
    train, held_out = user_files
    out = tmp_path / "run"
    rewards = ["reward_funcs=[my_rewards.has_answer, my_rewards.length_bonus]", "reward_weights=[1.0, 0.5]"]
    assert (
        main(train_argv(tiny_model_dir, out, f"dataset={train}", f"eval_dataset={held_out}", *rewards)) == 0
    )
    summary = json.loads((out / "eval_summary.json").read_text())
    graded_by = (
        "the run's reward functions (`has_answer`, `length_bonus`, weighted as in training; "
        "correct when >= 1)"
    )
    assert summary["held_out"] == {
        "dataset": f"eval_dataset {held_out}", "num_examples": 3, "graded_by": graded_by,
    }  # fmt: skip
    for when in ("before", "after"):
        assert summary[when]["reward_funcs"] == ["has_answer", "length_bonus"]
        assert summary[when]["num_examples"] == 3
    import my_rewards  # the numbers are the trained model's on these rows under these rewards
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out)
    by_hand = evaluate_model(
        model, load_tokenizer(out), HELD_OUT, reward_funcs=[my_rewards.has_answer, my_rewards.length_bonus],
        reward_weights=[1.0, 0.5], max_new_tokens=4, max_prompt_length=512,
    )  # fmt: skip
    assert summary["after"]["mean_reward"] == by_hand["mean_reward"]
    assert summary["after"]["accuracy"] == by_hand["accuracy"]
    card = (out / "README.md").read_text()
    assert f"On eval_dataset {held_out} of 3 examples with greedy decoding, graded by {graded_by}" in card


def test_held_out_rows_without_the_graders_column_are_refused_before_the_cold_start(
    tmp_path, user_files, monkeypatch
):
    """Before: a bare ``KeyError: 'solution'`` from the first evaluation, after the cold start."""
    _, held_out = user_files

    def no_cold_start(*args, **kwargs):
        raise AssertionError("the cold start ran")

    monkeypatch.setattr("grpokit.cli.train_command.resolve_model", no_cold_start)
    message = (
        rf"^grpokit: eval_dataset {held_out} has no column 'solution', which exact_answer \(the `arithmetic` "
        r"task's grader\) reads to grade the held-out evaluation \(its columns: answer, prompt\); add the "
        r"column, or rename one with column_mapping=\{<its name>: solution\}$"
    )
    with pytest.raises(SystemExit, match=message):
        main(train_argv("tiny:arithmetic", tmp_path / "run", f"eval_dataset={held_out}"))


def test_a_users_reward_reading_a_missing_column_is_refused_before_training(
    tiny_model_dir, tmp_path, user_files
):
    train, _ = user_files
    no_answer = tmp_path / "no_answer.jsonl"
    no_answer.write_text(json.dumps({"prompt": "1 plus 1 is ", "solution": "2"}) + "\n")
    argv = train_argv(tiny_model_dir, tmp_path / "run", f"dataset={train}", f"eval_dataset={no_answer}",
                      "reward_funcs=[my_rewards.has_answer]")  # fmt: skip
    with pytest.raises(
        SystemExit, match=rf"eval_dataset {no_answer} has no column 'answer', which has_answer"
    ):
        main(argv)
    assert not (tmp_path / "run").exists()  # refused before anything was written


# -- grpokit eval --
def eval_argv(model, *extra: str) -> list[str]:
    return ["eval", f"model={model}", "max_new_tokens=4", "progress=false", *extra]


def no_model(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the model loaded")

    monkeypatch.setattr("grpokit.cli.eval_command.load_eval_model", refuse)


def test_grpokit_eval_refuses_rows_without_the_graders_column_before_the_model_loads(
    tmp_path, user_files, monkeypatch
):
    """Before: ``KeyError: 'solution'`` from the grader, after every completion was generated."""
    _, held_out = user_files
    no_model(monkeypatch)
    message = (
        rf"^grpokit eval: eval_dataset {held_out} has no column 'solution', which the reward "
        r"arithmetic_exact_answer_reward reads \(its columns: answer, prompt\)"
    )
    with pytest.raises(SystemExit, match=message):
        main(eval_argv("tiny:arithmetic", f"eval_dataset={held_out}", "task=arithmetic"))
    with pytest.raises(SystemExit, match=r"has no column 'solution', which the reward accuracy_reward reads"):
        main(eval_argv("tiny:arithmetic", f"eval_dataset={held_out}", "reward_funcs=[accuracy]"))


def test_grpokit_eval_names_a_data_file_that_is_not_utf8(tmp_path, monkeypatch):
    no_model(monkeypatch)
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"prompt": "1+1=", "solution": "2"}\n{"prompt": "caf\xe9", "solution": "3"}\n')
    with pytest.raises(SystemExit, match=rf"^grpokit eval: eval_dataset: {path} line 2 is not UTF-8 text"):
        main(eval_argv("tiny:arithmetic", f"eval_dataset={path}", "reward_funcs=[accuracy]"))


def test_grpokit_eval_names_a_corrupt_model_config(tiny_model_dir, tmp_path):
    """Before: transformers' OSError, as a traceback."""
    model = shutil.copytree(tiny_model_dir, tmp_path / "model")
    (model / "config.json").write_text('{"model_type": "llama", "hidden_')
    with pytest.raises(
        SystemExit, match=rf"^grpokit: model: {model / 'config.json'} is corrupt or truncated"
    ):
        main(eval_argv(model, "task=arithmetic", "num_eval_examples=2"))

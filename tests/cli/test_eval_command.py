"""``grpokit eval`` end to end through ``grpokit.cli.main``: a user's model, data file and reward module
(numbers equal to plain ``transformers`` by hand), sampling metrics, the built-in task path as before, and
bad input stopped with a message naming the option, before any model loads."""

from __future__ import annotations

import json

import pytest
from transformers import AutoModelForCausalLM

from grpokit.cli import main
from grpokit.cli.eval_command import parse_eval_args
from grpokit.cli.train_command import task_splits
from grpokit.eval import evaluate_accuracy
from grpokit.models import load_tokenizer
from grpokit.tasks.evaluation import task_graders
from tests.eval.user_eval import (
    MAX_NEW_TOKENS,
    ROWS,
    build_user_model,
    expected_metrics,
    greedy_by_hand,
    write_reward_module,
)


@pytest.fixture(scope="module")
def user_model(tmp_path_factory):
    return build_user_model(tmp_path_factory.mktemp("user-qwen2"))


@pytest.fixture
def question_file(tmp_path):
    """The user's rows as jsonl, the prompt under ``question``."""
    path = tmp_path / "questions.jsonl"
    lines = [json.dumps({"question": row["prompt"], "solution": row["solution"]}) for row in ROWS]
    path.write_text("\n".join(lines) + "\n")
    return path


def run(capsys, *argv: str) -> dict:
    assert main(["eval", *argv, "progress=false"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_users_model_data_and_reward_module_end_to_end(
    user_model, question_file, tmp_path, monkeypatch, capsys
):
    module = write_reward_module(tmp_path, monkeypatch)
    output = tmp_path / "out" / "eval.json"
    printed = run(
        capsys,
        f"model={user_model}",
        f"eval_dataset={question_file}",
        "prompt_column=question",
        f"reward_funcs=[{module}.digit_reward, tag_count]",
        "reward_weights=[1.0, 0.5]",
        f"max_new_tokens={MAX_NEW_TOKENS}",
        "chat_template_kwargs={terse: false}",  # YAML false, not the (truthy) string "false"
        "device=cpu",
        "dtype=float32",
        "per_example=true",
        f"output={output}",
    )
    written = json.loads(output.read_text())
    assert printed == {k: v for k, v in written.items() if k != "records"}  # records go to the file
    reference = greedy_by_hand(user_model, ROWS, MAX_NEW_TOKENS, terse=False)
    expected = expected_metrics(ROWS, reference, threshold=1.0)
    assert [r["completions"] for r in written["records"]] == [[ref["text"]] for ref in reference]
    assert [r["prompt"] for r in written["records"]] == [row["prompt"] for row in ROWS]
    assert [r["rewards"] for r in written["records"]] == [[value] for value in expected["combined"]]
    assert written["accuracy"] == expected["accuracy"]
    assert written["mean_reward"] == expected["mean_reward"]
    assert written["rewards/digit_reward/mean"] == expected["digit_mean"]
    assert written["rewards/tag_count_reward/mean"] == expected["tag_mean"]
    assert written["mean_completion_tokens"] == expected["mean_completion_tokens"]
    assert written["truncated_rate"] == expected["truncated_rate"]
    assert (written["num_examples"], written["num_samples"], written["temperature"]) == (8, 1, 0.0)
    assert (written["task"], written["generation_backend"]) == (None, "fast")  # qwen2: the fast sampler


def test_sampling_with_a_users_extractor_reports_pass_mean_and_maj(
    user_model, question_file, tmp_path, monkeypatch, capsys
):
    module = write_reward_module(tmp_path, monkeypatch)
    result = run(
        capsys,
        f"model={user_model}",
        f"eval_dataset={question_file}",
        "prompt_column=question",
        "num_eval_examples=5",
        f"reward_funcs=[{module}.digit_reward]",
        f"answer_extractor={module}.first_word",
        "num_samples=3",
        "pass_k=[1, 2]",
        "top_p=0.9",
        "seed=1",
        f"max_new_tokens={MAX_NEW_TOKENS}",
        "generation_backend=transformers",
    )
    assert result["num_examples"] == 5 and result["num_samples"] == 3 and result["temperature"] == 1.0
    assert result["generation_backend"] == "transformers"
    for key in ("pass@1", "pass@2", "pass@3", "mean@3", "maj@3", "format_rate", "accuracy"):
        assert 0.0 <= result[key] <= 1.0, key
    assert result["pass@1"] == pytest.approx(result["mean@3"]) and result["accuracy"] == result["mean@3"]
    assert result["pass@1"] <= result["pass@2"] <= result["pass@3"]


def test_a_built_in_task_evaluates_as_before(tiny_model_dir, tmp_path, capsys):
    output = tmp_path / "eval.json"
    result = run(
        capsys, f"model={tiny_model_dir}", "num_eval_examples=6", "max_new_tokens=6", f"output={output}"
    )
    assert result["task"] == "arithmetic"  # the default without an eval_dataset
    assert json.loads(output.read_text()) == result
    # what `grpokit eval` computed before it became generic: evaluate_accuracy with the task's graders
    args = parse_eval_args([f"model={tiny_model_dir}", "num_eval_examples=6"])
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    before = evaluate_accuracy(
        model,
        load_tokenizer(str(tiny_model_dir)),
        task_splits("arithmetic", args)[1],
        max_new_tokens=6,
        **task_graders("arithmetic"),
    )
    for key in ("accuracy", "num_examples", "num_samples", "mean_completion_tokens", "truncated_rate"):
        assert result[key] == before[key], key
    assert result["format_rate"] == before["format_rate"]
    assert result["reward_funcs"] == ["arithmetic_exact_answer_reward"]
    # the task's reward names work in reward_funcs
    named = run(
        capsys,
        f"model={tiny_model_dir}",
        "task=arithmetic",
        "reward_funcs=[exact_answer, format]",
        "num_eval_examples=2",
        "max_new_tokens=4",
    )
    assert named["reward_funcs"] == ["arithmetic_exact_answer_reward", "arithmetic_format_reward"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["answer_extractor=boxd", "reward_funcs=[tag_count]"], "answer_extractor: unknown extractor 'boxd'"),
        (["reward_funcs=[no_such_reward]"], "reward_funcs: unknown reward 'no_such_reward'"),
        (
            ["reward_funcs=[tag_count]", "num_samples=4", "temperature=0"],
            "num_samples=4 needs temperature > 0",
        ),
        ([], "nothing to grade with: give reward_funcs"),
        (["answer_extractor=boxed", "column_mapping={solution: gold}"], "'solution' column"),
        (["reward_funcs=[tag_count]", "reward_weights=[1, 2]"], "reward_weights has 2 values"),
        (["reward_funcs=[tag_count]", "device=gpu:x"], "device: 'gpu:x'"),
    ],
)
def test_bad_input_stops_naming_the_option_before_the_model_loads(argv, message, question_file):
    data = [f"eval_dataset={question_file}", "prompt_column=question"]
    with pytest.raises(SystemExit, match=f"grpokit eval: .*{message}"):
        main(["eval", "model=no/such-model", *data, *argv])  # the model would fail to load: never reached


def test_unknown_task_column_or_file_and_bad_dtype(question_file, tmp_path, capsys):
    with pytest.raises(SystemExit, match="task: unknown built-in task 'algebra'"):
        main(["eval", "model=no/such-model", "task=algebra"])
    with pytest.raises(SystemExit, match="prompt_column='query'"):
        main(["eval", "model=no/such-model", f"eval_dataset={question_file}", "prompt_column=query"])
    with pytest.raises(SystemExit, match=r"grpokit eval: .*missing\.jsonl"):
        main(["eval", "model=no/such-model", f"eval_dataset={tmp_path / 'missing.jsonl'}"])
    with pytest.raises(SystemExit) as error:  # tyro: not one of the choices
        main(["eval", "model=no/such-model", "dtype=float8"])
    assert error.value.code == 2 and "float8" in capsys.readouterr().err


def test_the_console_script_finds_a_reward_module_in_the_working_directory(tiny_model_dir, tmp_path):
    """`grpokit eval reward_funcs=[my_rewards.fn]` from the folder holding my_rewards.py, as README shows
    (a console script, unlike `python -m`, does not put the working directory on sys.path by itself)."""
    import shutil
    import subprocess

    script = shutil.which("grpokit")
    assert script is not None, "grpokit is installed with pip install -e, which creates the script"
    (tmp_path / "my_rewards.py").write_text(
        "def nonempty(prompts, completions, completion_ids, **kwargs):\n"
        "    return [1.0 if ids else 0.0 for ids in completion_ids]\n"
    )
    (tmp_path / "rows.jsonl").write_text('{"question": "1+1="}\n{"question": "2+2="}\n')
    done = subprocess.run(
        [script, "eval", f"model={tiny_model_dir}", "eval_dataset=rows.jsonl", "prompt_column=question",
         "reward_funcs=[my_rewards.nonempty]", "max_new_tokens=3", "output=out.json", "progress=false"],
        cwd=tmp_path, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "out.json").read_text())
    assert result["reward_funcs"] == ["nonempty"] and result["num_examples"] == 2
    assert result["mean_reward"] == 1.0  # every completion has at least one token (3 new, or EOS)


def test_a_game_task_plays_the_scripted_players(tiny_model_dir, capsys):
    """``grpokit eval task=tictactoe``: the policy against the random and the minimax player, one sampled
    game per seat and deal; the minimax player never loses, so the policy never wins against it; an illegal
    move loses, so the outcomes are the legal-move rate's complement at most."""
    result = run(capsys, f"model={tiny_model_dir}", "task=tictactoe", "num_eval_examples=4")
    assert result["game"] == "TicTacToe" and result["num_examples"] == 4
    assert result["game/expert/win"] == 0.0
    for opponent in ("random", "expert"):
        shares = [result[f"game/{opponent}/{k}"] for k in ("win", "draw", "loss")]
        assert sum(shares) == pytest.approx(1.0)
    assert result["accuracy"] == pytest.approx(1 - result["game/expert/loss"])
    assert 0.0 <= result["game/legal_rate"] <= 1.0

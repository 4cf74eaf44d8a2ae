"""The command line for process supervision and iterative GRPO: the chain recipes, task step-verifier names,
and a reward-model directory as ``iterative_rm``."""

from __future__ import annotations

import json

import pytest
import yaml

from grpokit.cli import find_recipe, load_recipe, main
from grpokit.cli.train_args import TrainArgs
from grpokit.cli.train_command import process_supervision
from grpokit.models.tiny import build_char_tokenizer
from grpokit.rm import build_tiny_reward_model, save_reward_model
from grpokit.tasks import get_task
from grpokit.tasks.chain import chain_outcome_reward, chain_step_reward


@pytest.mark.parametrize(
    ("name", "process", "iterative"),
    [
        ("chain-outcome", None, None),
        ("chain-process-rule", ["chain_steps"], None),
        ("chain-process-prm", ["train-rm:process"], None),
        ("chain-iterative-prm", None, "train-rm:process"),
    ],
)
def test_chain_recipes_load(name, process, iterative):
    args = load_recipe(find_recipe(name))
    base = load_recipe(find_recipe("chain-outcome"))
    assert (args.model, args.task, args.process_reward_funcs, args.iterative_rm) == (
        "tiny:chain",
        "chain",
        process,
        iterative,
    )
    # the same policy, data and budget in every row
    for key in (
        "max_steps",
        "num_generations",
        "per_device_train_batch_size",
        "learning_rate",
        "beta",
        "seed",
    ):
        assert getattr(args.config, key) == getattr(base.config, key), key
    assert args.config.iteration_steps == (10 if iterative else 0)
    # the process rows watch the exact answer (proxy_gold/*, the process rewards as the proxy)
    assert args.config.gold_reward == (None if name == "chain-outcome" else "chain_outcome_reward")


def test_chain_task_is_registered():
    task = get_task("chain")
    assert task.reward_funcs["exact_answer"] is chain_outcome_reward
    assert task.process_reward_funcs["chain_steps"] is chain_step_reward
    train, test = task.make_splits(seed=0, num_train=20, num_test=5)
    assert task.extract_answer(task.worked_solution(test[0])) == test[0]["solution"]
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in test}


def test_process_supervision_resolves_task_names(tmp_path):
    args = TrainArgs(task="chain", process_reward_funcs=["chain_steps", "some/prm/dir"])
    assert process_supervision(args) == {"process_reward_funcs": [chain_step_reward, "some/prm/dir"]}
    tokenizer = build_char_tokenizer()
    for kind, expected in (("process", chain_step_reward), ("outcome", chain_outcome_reward)):
        path = tmp_path / kind
        model = build_tiny_reward_model(tokenizer, kind, hidden_size=16, num_layers=1)
        save_reward_model(model, tokenizer, path, kind=kind)
        kwargs = process_supervision(TrainArgs(task="chain", iterative_rm=str(path)))
        assert kwargs == {"iterative_reward_model": str(path), "rm_label_func": expected}


def write_recipe(tmp_path, tiny_model_dir, **extra):
    path = tmp_path / "recipe.yaml"
    values = {
        "model": str(tiny_model_dir),
        "task": "chain",
        "num_train_examples": 8,
        "num_eval_examples": 2,
        "output_dir": str(tmp_path / "run"),
        "max_steps": 2,
        "num_generations": 4,
        "per_device_train_batch_size": 8,
        "max_completion_length": 8,
        "disable_tqdm": True,
        **extra,
    }
    path.write_text(yaml.safe_dump(values))
    return path


def test_cli_trains_with_process_rewards(tmp_path, tiny_model_dir):
    recipe = write_recipe(
        tmp_path, tiny_model_dir, process_reward_funcs=["chain_steps"], outcome_advantage_weight=0.0
    )
    assert main(["train", str(recipe)]) == 0
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert "process_rewards/chain_steps/mean" in lines[-1]
    assert "rewards/chain_outcome_reward/mean" in lines[-1]  # still logged, weight 0 in the advantage


def test_cli_iterative_reward_model(tmp_path, tiny_model_dir):
    tokenizer = build_char_tokenizer()
    rm_dir = tmp_path / "prm"
    save_reward_model(
        build_tiny_reward_model(tokenizer, "process", hidden_size=16, num_layers=1),
        tokenizer,
        rm_dir,
        kind="process",
    )
    recipe = write_recipe(tmp_path, tiny_model_dir, iterative_rm=str(rm_dir), iteration_steps=1, beta=0.04)
    assert main(["train", str(recipe)]) == 0
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all("rm/accuracy_after" in line and "process_rewards/prm/mean" in line for line in lines)
    summary = json.loads((tmp_path / "run" / "eval_summary.json").read_text())
    assert summary["reward_model"]["rm/updates"] == 2
    assert (tmp_path / "run" / "reward_model" / "replay_buffer.jsonl").exists()

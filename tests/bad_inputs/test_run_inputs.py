"""Bad inputs to a run (models, tokenizers, data, rewards, output directories, environments) are refused with
a message naming the argument or row and what to do: one test each. Configuration inputs are in
``test_config_inputs.py``; others live beside the code they guard (reward failures in
tests/rewards/test_scoring.py, data rows in tests/train/test_trainer.py)."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.rewards import RewardFunctionError

from ..conftest import small_config

ROWS = [{"prompt": "1+1=", "solution": "2"}, {"prompt": "2+3=", "solution": "5"}]


def config(tmp_path, **overrides) -> GRPOConfig:
    return small_config(tmp_path, seed=42, **overrides)


def length_reward(completions, **kwargs):
    return [float(len(c)) for c in completions]


def test_an_output_dir_with_another_runs_checkpoints(tiny_model_dir, tmp_path):
    GRPOTrainer(
        str(tiny_model_dir), [length_reward], config(tmp_path, save_steps=1), train_dataset=ROWS
    ).train()
    again = GRPOTrainer(str(tiny_model_dir), [length_reward], config(tmp_path), train_dataset=ROWS)
    with pytest.raises(ValueError, match=r"holds the results of a finished train run .*checkpoint-1.*resume"):
        again.train()  # (built: train(resume_from_checkpoint=...) could have continued it)
    over = config(tmp_path, overwrite_output_dir=True, save_steps=1)
    GRPOTrainer(str(tiny_model_dir), [length_reward], over, train_dataset=ROWS).train()  # allowed
    resumed = config(tmp_path, max_steps=2, resume_from_checkpoint="latest")
    assert len(GRPOTrainer(str(tiny_model_dir), [length_reward], resumed, train_dataset=ROWS).train()) == 1


def test_a_model_path_that_does_not_exist(tmp_path):
    for model in (str(tmp_path / "no-such-model"), "./models/missing"):
        with pytest.raises(ValueError, match=r"model: .* does not exist; give a model directory"):
            GRPOTrainer(model, [length_reward], config(tmp_path), train_dataset=ROWS)


def test_a_tokenizer_without_pad_or_eos(tiny_model_dir, tmp_path):
    bare = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, "[UNK]"))
    )
    with pytest.raises(
        ValueError, match="processing_class: the tokenizer has neither a pad nor an EOS token"
    ):
        GRPOTrainer(
            str(tiny_model_dir), [length_reward], config(tmp_path), train_dataset=ROWS, processing_class=bare
        )


def test_an_empty_data_set(tiny_model_dir, tmp_path):
    with pytest.raises(ValueError, match="train_dataset is empty"):
        GRPOTrainer(str(tiny_model_dir), [length_reward], config(tmp_path), train_dataset=[])


def test_a_reward_function_returning_the_wrong_number_of_values(tiny_model_dir, tmp_path):
    def short(completions, **kwargs):
        return [1.0]

    trainer = GRPOTrainer(str(tiny_model_dir), [short], config(tmp_path), train_dataset=ROWS)
    with pytest.raises(RewardFunctionError, match=r"short.*returned 1 values? for 8 completions"):
        trainer.train()


def test_a_model_directory_with_custom_code_is_not_run_without_trust_remote_code(tmp_path):
    """Loading never passes trust_remote_code: a directory whose config maps to its own Python code is
    refused by transformers, and the code is never imported (a user opts in with
    ``model_init_kwargs={trust_remote_code: true}``)."""
    import json

    model = tmp_path / "custom"
    model.mkdir()
    marker = tmp_path / "code-ran"
    (model / "modeling_custom.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    (model / "configuration_custom.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    settings = {
        "model_type": "custom-unknown",
        "auto_map": {
            "AutoConfig": "configuration_custom.CustomConfig",
            "AutoModelForCausalLM": "modeling_custom.CustomModel",
        },
    }
    (model / "config.json").write_text(json.dumps(settings))
    from grpokit.models import build_char_tokenizer

    with pytest.raises(ValueError, match="trust_remote_code"):
        GRPOTrainer(
            str(model),
            [length_reward],
            config(tmp_path),
            train_dataset=ROWS,
            processing_class=build_char_tokenizer(),
        )
    assert not marker.exists()


def test_an_environment_that_is_not_one(tiny_model_dir, tmp_path):
    from grpokit.envs import make_environment_factory

    with pytest.raises(
        ValueError, match=r"environment 'nowhere_env.Grid': cannot import Grid from nowhere_env"
    ):
        make_environment_factory("nowhere_env.Grid")
    known = r"\(calculator, kuhn_poker, maze, nim, tictactoe\)"
    with pytest.raises(ValueError, match=rf"environment 'labyrinth': not a built-in {known}"):
        make_environment_factory("labyrinth")

    class NoStep:
        def reset(self, row):
            pass

    with pytest.raises(TypeError, match=r"environment NoStep needs reset\(row\) and step\(action\) methods"):
        make_environment_factory(NoStep)
    with pytest.raises(TypeError, match=r"environment_kwargs \['size'\] given to a step function"):
        make_environment_factory(lambda row, actions: None, {"size": 3})
    with pytest.raises(
        TypeError, match=r"an environment step must return a Turn or \(observation, reward, done\)"
    ):
        make_environment_factory(lambda row, actions: 1.0)().step("x")

"""Every field of TRL 1.16's GRPOConfig is accepted with TRL's meaning, accepted as having no effect, or
refused with a reason: never a TypeError, never silently dropped."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from grpokit import GRPOConfig
from grpokit.config.trl_fields import NO_EFFECT, REFUSED, TYPES, refuse_trainer_arguments
from tests.trl_1_16_fields import TRL_1_16_DEFAULTS

OWN = {f.name for f in dataclasses.fields(GRPOConfig)}


def test_every_trl_field_is_a_field_with_one_treatment():
    """Every TRL 1.16 field is a GRPOConfig field (so TRL's flags and YAML keys parse); those grpokit does not
    use have TRL's default and exactly one treatment, no effect or refused."""
    assert [n for n in TRL_1_16_DEFAULTS if n not in OWN] == []
    assert set(TYPES) == set(NO_EFFECT) | set(REFUSED) and not set(NO_EFFECT) & set(REFUSED)
    defaults = {f.name: f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
                for f in dataclasses.fields(GRPOConfig)}  # fmt: skip
    for name in TYPES:
        expected = TRL_1_16_DEFAULTS[name]
        assert defaults[name] == (list(expected) if isinstance(expected, tuple) else expected), name


def test_a_trl_config_with_every_default_constructs():
    config = GRPOConfig(**TRL_1_16_DEFAULTS)
    # TRL's defaults keep TRL's meaning where grpokit has the field
    assert config.loss_type == "dapo" and config.beta == 0.0 and config.num_train_epochs == 3.0
    assert config.report_to == [] and config.save_strategy == "steps" and config.save_steps == 500
    assert config.eval_strategy == "no" and config.optim == "adamw_torch_fused"
    # TRL's None for "unset" becomes grpokit's default
    assert config.output_dir == "runs/grpo" and config.min_p == 0.0 and config.fsdp == "" and not config.bf16


def _value_of_its_type(name: str, avoid: tuple) -> object:
    """A value of the field's declared type (as TRL types it) that is none of ``avoid``."""
    kind = str(TYPES[name][0])
    candidates = {"bool": [True, False], "int": [3, 7], "float": [1.5, 0.5], "list": [["x"]],
                  "dict": [{"a": 1}], "str": ["something-else"]}  # fmt: skip
    for word in ("bool", "list", "int", "float", "dict", "str"):
        if word in kind:
            for value in candidates[word]:
                if not any(value == a and type(value) is type(a) for a in avoid):
                    return value
    raise AssertionError(name)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_fields_accept_their_off_value_and_refuse_the_rest_with_a_reason(name):
    allowed, why = REFUSED[name]
    for value in allowed:
        GRPOConfig(**{name: value})
    turned_on = _value_of_its_type(name, allowed)
    with pytest.raises(ValueError, match=rf"GRPOConfig\.{name}=.* is not supported: ") as err:
        GRPOConfig(**{name: turned_on})
    assert why in str(err.value)


@pytest.mark.parametrize("name", sorted(NO_EFFECT))
def test_no_effect_fields_are_accepted_and_logged(name, caplog):
    value = _value_of_its_type(name, (TYPES[name][1],))
    with caplog.at_level(logging.INFO, logger="grpokit"):
        config = GRPOConfig(**{name: value})
    assert getattr(config, name) == value
    assert f"GRPOConfig.{name}={value!r} has no effect in grpokit: {NO_EFFECT[name]}" in caplog.text


def test_trl_only_fields_go_through_yaml_and_dicts_too():
    assert GRPOConfig.from_dict({"torch_compile": False, "do_train": True}).to_dict()["beta"] == 0.04
    with pytest.raises(ValueError, match=r"torch_compile=True is not supported: torch\.compile is not"):
        GRPOConfig.from_dict({"torch_compile": True})
    with pytest.raises(ValueError, match="unknown GRPOConfig field"):
        GRPOConfig.from_dict({"not_a_field": 1})
    assert "torch_compile: false" not in GRPOConfig(torch_compile=False).to_yaml()  # at its default: unsaid
    assert "do_train: true" in GRPOConfig(do_train=True).to_yaml()


def test_a_name_trl_does_not_have_is_still_a_type_error_from_the_dataclass():
    with pytest.raises(TypeError, match="not_a_field"):
        GRPOConfig(not_a_field=1)


@pytest.mark.parametrize(
    ("given", "expected"),
    [("none", []), ("wandb", ["wandb"]), (["tensorboard", "wandb"], ["tensorboard", "wandb"]),
     ("all", ["all"]), (["none"], []), (None, [])],
)  # fmt: skip
def test_report_to_takes_trl_forms(given, expected):
    assert GRPOConfig(report_to=given).report_to == expected


def test_report_to_names_an_unknown_sink():
    with pytest.raises(ValueError, match="report_to names an unknown sink 'comet'"):
        GRPOConfig(report_to="comet")


def test_generation_kwargs_take_precedence_over_the_sampling_fields():
    config = GRPOConfig(temperature=1.0, generation_kwargs={"temperature": 0.7, "max_new_tokens": 33})
    assert (config.temperature, config.max_completion_length) == (1.0, 256)  # as set
    resolved = config.resolved()  # as a run uses it
    assert resolved.temperature == 0.7 and resolved.max_completion_length == 33
    with pytest.raises(ValueError, match=r"generation_kwargs key 'num_beams' is not supported"):
        GRPOConfig(generation_kwargs={"num_beams": 4})
    with pytest.raises(ValueError, match="temperature must be > 0"):  # still validated
        GRPOConfig(generation_kwargs={"temperature": 0.0})


@pytest.mark.parametrize(
    ("fields", "strategy", "steps"),
    [({}, "no", None), ({"eval_strategy": None, "eval_steps": 5}, "steps", 5),
     ({"eval_strategy": "steps", "logging_steps": 3}, "steps", 3),
     ({"eval_strategy": "epoch"}, "epoch", None)],
)  # fmt: skip
def test_eval_strategy_resolves_like_trl(fields, strategy, steps):
    config = GRPOConfig(**fields).resolved()
    assert (config.eval_strategy, config.eval_steps) == (strategy, steps)


def test_eval_steps_alone_is_refused_as_trl_would_ignore_it():
    """TRL's default eval_strategy is "no", under which eval_steps does nothing: said, not ignored."""
    with pytest.raises(ValueError, match=r"eval_steps=5 has no effect with eval_strategy='no'"):
        GRPOConfig(eval_steps=5)


def test_save_strategy_resolves_like_trl():
    assert GRPOConfig().resolved().save_strategy == "no"
    assert GRPOConfig(save_steps=10).resolved().save_strategy == "steps"
    # save_steps=0 means no periodic checkpoint under "steps" too, as in transformers
    assert GRPOConfig(save_strategy="steps", save_steps=0).resolved().save_strategy == "no"


def test_unsupported_trainer_arguments_are_refused_with_the_reason():
    refuse_trainer_arguments(rollout_func=None, quantization_config=None)
    with pytest.raises(ValueError, match=r"rollout_func=...\) is not supported: pass a rollout_backend"):
        refuse_trainer_arguments(rollout_func=print)
    with pytest.raises(ValueError, match=r"quantization_config=...\) is not supported: quantised"):
        refuse_trainer_arguments(quantization_config={"load_in_4bit": True})


def test_command_line_dict_values_are_typed_like_yaml():
    """tyro gives the values of a dict field as strings; "false" would be true in a Jinja template."""
    config = GRPOConfig(
        chat_template_kwargs={"enable_thinking": "false", "budget": "3", "name": "x"},
        lr_scheduler_type="cosine",
        lr_scheduler_kwargs={"num_cycles": "0.5"},
    )
    assert config.chat_template_kwargs == {"enable_thinking": False, "budget": 3, "name": "x"}
    assert config.lr_scheduler_kwargs == {"num_cycles": 0.5}


def test_the_migration_guide_lists_every_refused_and_no_effect_field_with_its_reason():
    from pathlib import Path

    guide = (Path(__file__).resolve().parents[1] / "docs" / "migrating-from-trl.md").read_text()
    for name, (_, why) in REFUSED.items():
        assert f"| `{name}` |" in guide and why in guide, name
    for name, why in NO_EFFECT.items():
        assert f"`{name}`" in guide and why in guide, name


def test_transformers_newer_checkpointing_names_set_gradient_checkpointing():
    """TRL's config inherits transformers 5.x's ``TrainingArguments``, where ``activation_checkpointing`` is
    the name and ``gradient_checkpointing`` its deprecated alias: either works here, from the command line
    too."""
    from transformers import HfArgumentParser

    config = GRPOConfig(
        activation_checkpointing=True, activation_checkpointing_kwargs={"use_reentrant": False}
    )
    assert config.gradient_checkpointing and config.gradient_checkpointing_kwargs == {"use_reentrant": False}
    assert not GRPOConfig(activation_checkpointing=False).gradient_checkpointing
    assert GRPOConfig(activation_checkpointing=True, gradient_checkpointing=True).gradient_checkpointing
    (parsed,) = HfArgumentParser(GRPOConfig).parse_args_into_dataclasses(
        ["--output_dir", "out", "--activation_checkpointing", "true"]
    )
    assert parsed.gradient_checkpointing is True
    disagree = r"activation_checkpointing=False and gradient_checkpointing=True disagree"
    with pytest.raises(ValueError, match=disagree):
        GRPOConfig(activation_checkpointing=False, gradient_checkpointing=True)


def test_scale_rewards_takes_trls_legacy_booleans():
    """TRL still reads scale_rewards=True as "group" and False as "none" (its __post_init__)."""
    assert GRPOConfig(scale_rewards=True).scale_rewards == "group"
    assert GRPOConfig(scale_rewards=False).scale_rewards == "none"
    assert GRPOConfig.from_dict({"scale_rewards": False}).scale_rewards == "none"
    with pytest.raises(ValueError, match=r"GRPOConfig.scale_rewards must be one of"):
        GRPOConfig(scale_rewards="sometimes")


def test_generation_kwargs_do_sample_true_is_what_grpo_does_and_false_is_refused():
    """TRL passes generation_kwargs to its sampler; do_sample=True is GRPO's sampling (accepted, the other
    keys still apply); do_sample=False (greedy groups of G identical completions) is refused with why."""
    config = GRPOConfig(generation_kwargs={"do_sample": True, "top_k": 5}).resolved()
    assert config.top_k == 5
    with pytest.raises(ValueError, match=r"do_sample=False: GRPO samples its G completions"):
        GRPOConfig(generation_kwargs={"do_sample": False})

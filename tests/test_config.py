"""GRPOConfig: paper defaults, batch plan arithmetic, validation messages, YAML round trip."""

import pytest

from grpokit import GRPOConfig


def test_defaults_follow_the_paper():
    config = GRPOConfig()
    assert (config.loss_type, config.beta, config.epsilon, config.scale_rewards) == (
        "grpo",
        0.04,
        0.2,
        "group",
    )
    assert (config.num_iterations, config.learning_rate, config.num_generations) == (1, 1e-6, 8)
    assert config.policy_loss().clip_high == 0.2  # epsilon_high unset -> symmetric clipping


def test_batch_plan_counts_one_step():
    # 4 completions per micro-batch x 2 accumulation x 3 optimizer steps = 24 completions = 3 prompts x G=8
    config = GRPOConfig(
        per_device_train_batch_size=4, gradient_accumulation_steps=2, steps_per_generation=3, num_iterations=2
    )
    plan = config.batch_plan()
    assert (plan.prompts, plan.completions) == (3, 24)
    assert plan.optimizer_steps == 6  # mu=2 epochs x 3 optimizer steps
    assert plan.micro_batches_per_optimizer_step == 2
    assert "3 prompts" in plan.describe()


def test_generation_batch_size_derives_steps_per_generation():
    # R1-Zero shape in miniature: 64 completions split into 4 optimizer steps of 16
    plan = GRPOConfig(
        num_generations=16, per_device_train_batch_size=16, generation_batch_size=64
    ).batch_plan()
    assert (plan.prompts, plan.optimizer_steps) == (4, 4)
    # two processes halve the optimizer steps for the same generation batch
    assert (
        GRPOConfig(num_generations=16, per_device_train_batch_size=16, generation_batch_size=64)
        .batch_plan(num_processes=2)
        .optimizer_steps
        == 2
    )


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"num_generations": 1}, "num_generations"),
        ({"epsilon": 0.3, "epsilon_high": 0.2}, "epsilon_high"),
        ({"per_device_train_batch_size": 6}, "per_device_train_batch_size"),  # 6 is not a multiple of G=8
        ({"generation_batch_size": 12, "num_generations": 8}, "generation_batch_size"),
        ({"generation_batch_size": 16, "steps_per_generation": 3}, "steps_per_generation"),
        ({"beta": -0.1}, "beta"),
        ({"top_entropy_quantile": 0.0}, "top_entropy_quantile"),
        ({"delta": 1.1}, "delta"),
        ({"sync_ref_model": True, "beta": 0.0}, "sync_ref_model"),
        ({"temperature": 0.0}, "temperature"),
        ({"max_steps": 0}, "max_steps"),
        ({"bf16": True, "fp16": True}, "bf16"),
        ({"bf16": True, "mixed_precision": "fp16"}, "bf16"),
        ({"fp16": True, "mixed_precision": "bf16"}, "fp16"),
        ({"warmup_steps": -1}, "warmup_steps"),
        ({"num_completions_to_print": -1}, "num_completions_to_print"),
    ],
)
def test_invalid_combinations_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"GRPOConfig\.{field}"):
        GRPOConfig(**kwargs)


def test_yaml_round_trip(tmp_path):
    config = GRPOConfig(
        loss_type="dapo", epsilon_high=0.28, beta=0.0, scale_rewards="none", reward_weights=[1, 0.5]
    )
    path = tmp_path / "config.yaml"
    config.to_yaml(path)
    assert GRPOConfig.from_yaml(path) == config


def test_unknown_yaml_field_is_named(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("beta: 0.1\nbetta: 0.2\n")
    with pytest.raises(ValueError, match="betta"):
        GRPOConfig.from_yaml(path)


def test_trl_precision_and_warmup_names():
    assert GRPOConfig(bf16=True).resolved().mixed_precision == "bf16"
    assert GRPOConfig(fp16=True).resolved().mixed_precision == "fp16"
    assert GRPOConfig(bf16=True, mixed_precision="bf16").resolved().mixed_precision == "bf16"
    assert GRPOConfig(bf16=True).mixed_precision == "no"  # as set: derived only when resolved
    assert GRPOConfig().num_warmup_steps(100) == 0
    assert GRPOConfig(warmup_ratio=0.1).num_warmup_steps(95) == 10  # ceil(9.5)
    assert GRPOConfig(warmup_steps=3).num_warmup_steps(95) == 3
    with pytest.raises(ValueError, match=r"warmup_steps \(3\) and warmup_ratio \(0.1\) are both set"):
        GRPOConfig(warmup_ratio=0.1, warmup_steps=3)  # transformers lets steps win silently


def test_yaml_round_trip_keeps_model_init_kwargs_and_precision(tmp_path):
    config = GRPOConfig(bf16=True, model_init_kwargs={"dtype": "bfloat16", "trust_remote_code": True})
    path = tmp_path / "config.yaml"
    config.to_yaml(path)
    assert GRPOConfig.from_yaml(path) == config


def test_each_enumerated_field_is_made_from_its_one_source_list():
    """One list per concept, in the code that acts on the names; the field types are made from it."""
    import typing

    from grpokit.config import choices
    from grpokit.config.values import field_types
    from grpokit.core.choices import (
        IMPORTANCE_SAMPLING_LEVELS,
        IS_MODES,
        LOSS_PRESETS,
        MULTI_REWARD_AGGREGATIONS,
        SCALES,
    )
    from grpokit.envs.selfplay import OPPONENTS
    from grpokit.rewards.scoring import ON_ERROR
    from grpokit.rollout.choices import GENERATION_BACKENDS, VLLM_MODEL_IMPLS, VLLM_MODES

    sources = {
        "loss_type": tuple(LOSS_PRESETS), "scale_rewards": SCALES,
        "importance_sampling_level": IMPORTANCE_SAMPLING_LEVELS,
        "multi_objective_aggregation": MULTI_REWARD_AGGREGATIONS, "vllm_importance_sampling_mode": IS_MODES,
        "generation_backend": GENERATION_BACKENDS, "vllm_mode": VLLM_MODES,
        "vllm_model_impl": VLLM_MODEL_IMPLS,
        "eval_strategy": choices.STRATEGIES, "save_strategy": choices.STRATEGIES,
        "mixed_precision": choices.MIXED_PRECISIONS, "generation_dtype": choices.DTYPES,
        "ref_model_dtype": choices.DTYPES, "lr_scheduler_type": choices.LR_SCHEDULER_TYPES,
        "optim": choices.OPTIMIZERS, "hub_strategy": choices.HUB_STRATEGIES,
        "max_steps_unit": choices.MAX_STEPS_UNITS, "prompt_truncation": choices.PROMPT_TRUNCATIONS,
        "reward_failure": ON_ERROR,  # rewards' list, mirrored by choices.REWARD_FAILURES
        "routing_replay": choices.ROUTING_REPLAYS,
        "game_opponent": OPPONENTS,  # self-play's list (config.choices.GAME_OPPONENTS)
        "role_advantage": choices.ROLE_ADVANTAGES,
    }  # fmt: skip

    def choices_of(annotation):
        literals = [a for a in typing.get_args(annotation) if typing.get_origin(a) is typing.Literal]
        return typing.get_args(literals[0] if literals else annotation)

    types = field_types(GRPOConfig)
    enumerated = {name for name, annotation in types.items() if "Literal" in str(annotation)}
    assert enumerated == set(sources) == set(choices.LITERALS)
    for name, source in sources.items():
        assert choices_of(types[name]) == tuple(source), name
    assert choices.REWARD_FAILURES == ON_ERROR


def test_the_constructor_keeps_the_dataclass_signature_and_takes_trl_fields():
    """``GRPOConfig``'s metaclass drops TRL's other fields before the dataclass's ``__init__``: the signature
    ``help()`` shows is every field's, a positional ``output_dir`` works (TRL's first argument), a TRL-only
    no-effect field is accepted, a TRL feature turned on is refused, and an unknown name is a TypeError."""
    import dataclasses
    import inspect

    names = list(inspect.signature(GRPOConfig).parameters)
    assert names == [spec.name for spec in dataclasses.fields(GRPOConfig)]
    assert GRPOConfig("runs/positional").output_dir == "runs/positional"
    assert GRPOConfig(dataloader_num_workers=4, beta=0.0).beta == 0.0
    with pytest.raises(ValueError, match=r"GRPOConfig.use_liger_kernel=True is not supported"):
        GRPOConfig(use_liger_kernel=True)
    with pytest.raises(TypeError, match="not_a_field"):
        GRPOConfig(not_a_field=1)

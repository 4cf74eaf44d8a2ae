"""What the colocated vLLM engine is built with, and what is refused before one starts: the engine's context
(``vllm_max_model_length``: by default what the run needs, a shorter one refused naming both numbers), the
CPU engine's arguments and its lack of sleep mode. No vLLM needed; the engine itself is tests/vllm."""

from __future__ import annotations

import pytest

from grpokit import GRPOConfig
from grpokit.rollout.vllm_backend import colocate_engine_kwargs, refuse_cpu_sleep_mode


def config(tmp_path, **fields) -> GRPOConfig:
    return GRPOConfig(output_dir=str(tmp_path), use_vllm=True, **fields)


def context(args: GRPOConfig, model_context: int | None = 100_000) -> int | None:
    """The engine's max_model_len for ``args`` on a model whose context is ``model_context``."""
    return colocate_engine_kwargs(args.vllm_settings(), "/cfg", rank=0, model_context=model_context)[
        "max_model_len"
    ]


def test_the_engine_context_defaults_to_prompt_plus_completion(tmp_path):
    assert context(config(tmp_path, max_prompt_length=512, max_completion_length=4096)) == 512 + 4096
    # generation_kwargs' max_new_tokens is the completion budget the run uses (TRL's precedence)
    assert context(config(tmp_path, max_prompt_length=100, generation_kwargs={"max_new_tokens": 300})) == 400
    # prompts kept whole: no bound is known, the engine takes the model config's context
    assert context(config(tmp_path, max_prompt_length=None)) is None
    assert context(config(tmp_path, vllm_max_model_length=5000)) == 5000


def test_a_run_bound_beyond_the_models_context_takes_the_models_with_a_warning(tmp_path, caplog):
    """The tiny recipes allow 512-token prompts on a 256-position model: the engine cannot take 552, so it
    takes the model's context and says which completions it would cut (the policy could not score them
    either)."""
    args = config(tmp_path, max_prompt_length=512, max_completion_length=40)
    with caplog.at_level("WARNING", logger="grpokit.rollout.vllm_backend"):
        assert context(args, model_context=256) is None
    assert (
        "max_prompt_length + max_completion_length (552) is more than the model's context (256)"
        in caplog.text
    )
    assert context(args, model_context=552) == 552


@pytest.mark.parametrize(
    ("fields", "numbers"),
    [
        # the R1-Zero example the docs used to give: a 4096-token completion budget in a 2048 context
        ({"max_prompt_length": 512, "max_completion_length": 4096, "vllm_max_model_length": 2048},
         "(2048) is shorter than max_prompt_length + max_completion_length (512 + 4096 = 4608)"),
        ({"max_prompt_length": 64, "generation_kwargs": {"max_new_tokens": 64}, "vllm_max_model_length": 127},
         "(127) is shorter than max_prompt_length + max_completion_length (64 + 64 = 128)"),
    ],
)  # fmt: skip
def test_a_context_shorter_than_the_run_needs_is_refused_naming_both_numbers(tmp_path, fields, numbers):
    with pytest.raises(ValueError, match="vllm_max_model_length") as err:
        config(tmp_path, **fields)
    assert numbers in str(err.value) and "set vllm_max_model_length >= " in str(err.value)


def test_a_context_that_fits_is_taken(tmp_path):
    args = config(tmp_path, max_prompt_length=64, max_completion_length=64, vllm_max_model_length=128)
    assert context(args) == 128


def test_the_cpu_engine_runs_eagerly_without_sleep_mode(tmp_path):
    settings = config(tmp_path, vllm_enable_sleep_mode=True, max_prompt_length=8, max_completion_length=8)
    gpu = colocate_engine_kwargs(settings.vllm_settings(), "/cfg", rank=0, platform="cuda")
    cpu = colocate_engine_kwargs(settings.vllm_settings(), "/cfg", rank=0, platform="cpu")
    assert (gpu["enforce_eager"], gpu["enable_sleep_mode"]) == (False, True)
    assert (cpu["enforce_eager"], cpu["enable_sleep_mode"]) == (True, False)
    assert cpu["max_model_len"] == 16 and cpu["load_format"] == "dummy"
    with pytest.raises(ValueError, match="vllm_enable_sleep_mode=True is not supported by vLLM's CPU engine"):
        refuse_cpu_sleep_mode(settings.vllm_settings(), "cpu")
    refuse_cpu_sleep_mode(settings.vllm_settings(), "cuda")  # GPUs sleep

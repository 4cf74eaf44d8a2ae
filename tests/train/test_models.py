"""Loading the policy: TRL's model_init_kwargs reach from_pretrained, with dtype names resolved."""

from __future__ import annotations

import pytest
import torch

from grpokit import GRPOConfig
from grpokit.cli import parse_train_args
from grpokit.train.models import load_policy, model_init_kwargs


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (None, {"dtype": torch.float32}),
        ({"dtype": "bfloat16"}, {"dtype": torch.bfloat16}),
        ({"torch_dtype": "torch.float16"}, {"dtype": torch.float16}),  # TRL's older key, torch. prefix
        ({"dtype": "auto", "low_cpu_mem_usage": "true"}, {"dtype": "auto", "low_cpu_mem_usage": True}),
        (
            {"attn_implementation": "eager", "trust_remote_code": "False"},
            {"attn_implementation": "eager", "trust_remote_code": False, "dtype": torch.float32},
        ),
    ],
)
def test_model_init_kwargs_are_resolved(given, expected):
    assert model_init_kwargs(GRPOConfig(model_init_kwargs=given)) == expected


def test_bad_dtype_is_named():
    with pytest.raises(ValueError, match="model_init_kwargs: dtype 'bfloat17'"):
        model_init_kwargs(GRPOConfig(model_init_kwargs={"dtype": "bfloat17"}))


def test_policy_loads_in_the_requested_dtype(tiny_model_dir):
    policy = load_policy(str(tiny_model_dir), GRPOConfig(model_init_kwargs={"dtype": "bfloat16"}))
    assert {p.dtype for p in policy.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in load_policy(str(tiny_model_dir), GRPOConfig()).parameters()} == {torch.float32}


def test_command_line_mapping_and_precision_alias():
    args = parse_train_args(["model_init_kwargs={dtype: bfloat16, attn_implementation: sdpa}", "bf16=true"])
    assert args.config.model_init_kwargs == {"dtype": "bfloat16", "attn_implementation": "sdpa"}
    assert args.config.mixed_precision == "bf16"


def test_recipe_mapping_survives_the_command_line(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "base: arithmetic-tiny\nmodel_init_kwargs: {dtype: bfloat16, trust_remote_code: true}\n"
    )
    args = parse_train_args([str(recipe), "beta=0.1"])
    assert args.config.model_init_kwargs == {"dtype": "bfloat16", "trust_remote_code": True}
    assert args.config.beta == 0.1

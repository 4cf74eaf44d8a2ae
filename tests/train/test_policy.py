"""Loading the policy: TRL's model_init_kwargs reach from_pretrained, with dtype names resolved."""

from __future__ import annotations

import pytest
import torch

from grpokit import GRPOConfig
from grpokit.cli import parse_train_args
from grpokit.models.policy import load_policy, model_init_kwargs


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
    assert args.config.resolved().mixed_precision == "bf16"


def test_recipe_mapping_survives_the_command_line(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "base: arithmetic-tiny\nmodel_init_kwargs: {dtype: bfloat16, trust_remote_code: true}\n"
    )
    args = parse_train_args([str(recipe), "beta=0.1"])
    assert args.config.model_init_kwargs == {"dtype": "bfloat16", "trust_remote_code": True}
    assert args.config.beta == 0.1


def test_disable_dropout_zeroes_modules_attributes_and_config():
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    from grpokit.models.policy import disable_dropout

    llama = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=32,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            attention_dropout=0.3,
        )
    )
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=32, n_embd=16, n_layer=1, n_head=2, resid_pdrop=0.2))
    for model in (llama, gpt2):
        disable_dropout(model)
        rates = [m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)]
        rates += [
            v for m in model.modules() for k, v in vars(m).items() if "dropout" in k and isinstance(v, float)
        ]
        rates += [v for k, v in vars(model.config).items() if "dropout" in k and isinstance(v, float)]
        assert rates and all(r == 0.0 for r in rates)


def test_load_policy_disables_dropout_only_when_asked(tiny_model_dir):
    loaded = load_policy(str(tiny_model_dir), GRPOConfig(model_init_kwargs={"attention_dropout": 0.25}))
    assert loaded.config.attention_dropout == 0.25
    loaded = load_policy(
        str(tiny_model_dir), GRPOConfig(disable_dropout=True, model_init_kwargs={"attention_dropout": 0.25})
    )
    assert loaded.config.attention_dropout == 0.0
    assert all(m.attention_dropout == 0.0 for m in loaded.modules() if hasattr(m, "attention_dropout"))


def test_chat_template_kwargs_reach_the_template(tiny_model_dir, rows, tmp_path):
    from grpokit import GRPOTrainer
    from grpokit.data.chat import render_prompt

    from .conftest import digit_reward

    template = (
        "{%- for m in messages -%}{{ m['content'] }}{%- endfor -%}"
        "{%- if add_generation_prompt and enable_thinking is defined and not enable_thinking -%}"
        "<answer>{%- endif -%}"
    )
    messages = [{"role": "user", "content": "1+1="}]
    config = GRPOConfig(
        output_dir=str(tmp_path),
        num_generations=2,
        per_device_train_batch_size=2,
        max_completion_length=8,
        chat_template_kwargs={"enable_thinking": False},
    )
    trainer = GRPOTrainer(str(tiny_model_dir), [digit_reward], config, train_dataset=rows)
    trainer.tokenizer.chat_template = template
    assert render_prompt(messages, trainer.tokenizer) == "1+1="
    assert render_prompt(messages, trainer.tokenizer, {"enable_thinking": False}) == "1+1=<answer>"
    assert trainer.tokenizer.decode(trainer.encode_prompt(messages)) == "1+1=<answer>"

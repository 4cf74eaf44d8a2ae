"""The locally built policy: character tokenizer, tiny Qwen2/Llama model, cached supervised cold start."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import grpokit.tasks.cold_start as cold_start
from grpokit.models import build_char_tokenizer, build_tiny_model
from grpokit.tasks import cold_start_policy
from grpokit.tasks.arithmetic import make_arithmetic_splits, worked_solution

# A cold start small enough to run in a second or two.
TINY_SFT = {
    "hidden_size": 32,
    "num_layers": 1,
    "num_heads": 2,
    "num_sft_examples": 64,
    "batch_size": 8,
    "max_steps": 4,
    "warmup_steps": 1,
    "probe_every": 2,
    "probe_size": 4,
    "max_new_tokens": 8,
    "task_kwargs": {"num_digits": 2},
}


def test_tokenizer_round_trip_and_special_tokens(tmp_path):
    tok = build_char_tokenizer()
    train, _ = make_arithmetic_splits(seed=0, num_train=20, num_test=1)
    texts = [r["prompt"] + worked_solution(r) for r in train] + ["Hello, world!\n  (x) = {y}; ~`|"]
    for text in texts:
        ids = tok(text)["input_ids"]
        assert tok.decode(ids) == text
    # one token per character; the tags are single tokens
    assert len(tok("347+285=")["input_ids"]) == 8
    assert len(tok("<answer>12</answer>")["input_ids"]) == 4
    # no BOS/EOS added on encode, so add_special_tokens does not change prompt ids
    assert tok("12+34=")["input_ids"] == tok("12+34=", add_special_tokens=False)["input_ids"]
    # skipping special tokens drops EOS/pad but keeps the answer tags
    ids = tok("<answer>5</answer>")["input_ids"] + [tok.eos_token_id, tok.pad_token_id]
    assert tok.decode(ids, skip_special_tokens=True) == "<answer>5</answer>"
    assert len({tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id}) == 4
    # unknown characters map to unk
    assert tok("é")["input_ids"] == [tok.unk_token_id]
    # a conversational prompt renders to exactly the plain prompt
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "12+34="}], tokenize=False, add_generation_prompt=True
    )
    assert chat == "12+34="
    full = tok.apply_chat_template(
        [{"role": "user", "content": "1+2="}, {"role": "assistant", "content": "<answer>3</answer>"}],
        tokenize=False,
    )
    assert full == "1+2=<answer>3</answer>" + tok.eos_token
    # save / load through the standard path
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert loaded("7+5=12<answer>12</answer>")["input_ids"] == tok("7+5=12<answer>12</answer>")["input_ids"]
    assert (loaded.eos_token_id, loaded.pad_token_id, loaded.padding_side) == (tok.eos_token_id, 0, "left")
    assert loaded.apply_chat_template([{"role": "user", "content": "1+2="}], tokenize=False) == "1+2="


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_tiny_model_is_seeded_and_reloads(tmp_path, arch):
    tok = build_char_tokenizer()
    model = build_tiny_model(tok, arch=arch, hidden_size=32, num_layers=1, num_heads=2, seed=1)
    same = build_tiny_model(tok, arch=arch, hidden_size=32, num_layers=1, num_heads=2, seed=1)
    other = build_tiny_model(tok, arch=arch, hidden_size=32, num_layers=1, num_heads=2, seed=2)
    assert model.config.model_type == arch and model.config.vocab_size == len(tok)
    assert model.generation_config.eos_token_id == tok.eos_token_id
    assert model.generation_config.pad_token_id == tok.pad_token_id
    w = model.get_input_embeddings().weight
    assert torch.equal(w, same.get_input_embeddings().weight)
    assert not torch.equal(w, other.get_input_embeddings().weight)

    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    ids = torch.tensor([tok("12+34=")["input_ids"]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, model.eval()(ids).logits)


def test_build_tiny_model_refuses_bad_settings():
    tok = build_char_tokenizer()
    with pytest.raises(ValueError, match="arch"):
        build_tiny_model(tok, arch="gpt2")
    with pytest.raises(ValueError, match="divisible"):
        build_tiny_model(tok, hidden_size=30, num_heads=4)


def test_cold_start_trains_once_then_reuses_the_cache(tmp_path, monkeypatch):
    path = cold_start_policy("arithmetic", cache_dir=tmp_path, seed=0, progress=False, **TINY_SFT)
    assert path.parent == tmp_path and path.name.startswith("arithmetic-")
    record = json.loads((path / "cold_start.json").read_text())
    assert record["settings"]["max_steps"] == 4 and 1 <= record["record"]["steps"] <= 4
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp directory left behind
    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    assert model.config.hidden_size == 32 and tok.eos_token_id == model.generation_config.eos_token_id
    # the standard AutoTokenizer path gives back the character tokenizer exactly (whitespace included)
    text = "Add: 12 + 34\n7+5=12<answer>12</answer>"
    assert tok(text)["input_ids"] == build_char_tokenizer()(text)["input_ids"]
    assert tok.decode(tok(text)["input_ids"]) == text

    def no_training(*args, **kwargs):
        raise AssertionError("a cached cold start must not train again")

    monkeypatch.setattr(cold_start, "_run_cold_start", no_training)
    assert cold_start_policy("arithmetic", cache_dir=tmp_path, seed=0, progress=False, **TINY_SFT) == path
    # other settings, other directory (and here: training would be needed)
    with pytest.raises(AssertionError, match="must not train"):
        cold_start_policy("arithmetic", cache_dir=tmp_path, seed=1, progress=False, **TINY_SFT)
    with pytest.raises(TypeError, match="unknown cold-start settings"):
        cold_start_policy("arithmetic", cache_dir=tmp_path, no_such_setting=1)


def test_cold_start_default_cache_follows_env(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPOKIT_CACHE", str(tmp_path))
    path = cold_start_policy(
        "arithmetic", seed=0, progress=False, **{**TINY_SFT, "max_steps": 1, "arch": "llama"}
    )
    assert path.parent == tmp_path / "models"
    assert (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file()
    assert AutoModelForCausalLM.from_pretrained(path).config.model_type == "llama"

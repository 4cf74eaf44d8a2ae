"""``grpokit.models.parts``: the cache argument a forward takes, for a plain and a PEFT model."""

from __future__ import annotations

import inspect
import warnings

import torch
from peft import LoraConfig, get_peft_model
from transformers import DynamicCache

from grpokit.models.parts import cache_argument, returned_cache
from grpokit.models.tiny import build_char_tokenizer, build_tiny_model


def test_a_peft_model_gets_the_cache_under_its_base_models_name():
    """A PEFT model's own forward names no cache; it passes keyword arguments on to the base model, whose
    signature decides (``cache`` in transformers >= 5.2x, where ``past_key_values`` warns and is removed in
    5.40). The cached continuation equals the whole sequence's forward."""
    model = build_tiny_model(build_char_tokenizer(), hidden_size=32, num_layers=2, num_heads=2, seed=0)
    lora = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj"], init_lora_weights=False)).eval()
    base_name = "cache" if "cache" in inspect.signature(type(model).forward).parameters else "past_key_values"
    assert cache_argument(model, None).keys() == cache_argument(lora, None).keys() == {base_name}
    ids = torch.tensor([[5, 9, 12, 7, 3, 11]])
    cache = DynamicCache(config=model.config)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        first = lora(input_ids=ids[:, :4], use_cache=True, **cache_argument(lora, cache))
        cache = returned_cache(first, cache)
        rest = lora(input_ids=ids[:, 4:], use_cache=True, **cache_argument(lora, cache))
        whole = lora(input_ids=ids).logits
    torch.testing.assert_close(rest.logits, whole[:, 4:], rtol=0, atol=1e-5)

"""Models: loading the policy and its tokenizer, tiny local models, and the parts of a model the step reads.

A character tokenizer and tiny Qwen2/Llama policies (``tiny``), loading a saved tokenizer exactly as saved
(``loading``); the policy to train with its options, PEFT adapters and gradient checkpointing (``policy``),
a decoder's sizes from its config alone (``shape``), a model's backbone and the weight a (LoRA) linear
applies (``parts``) and the replay-safe prompt caches of the training forward (``prefix_cache``) are
imported from their modules. Importing this package registers grpokit's policy verifier reward model
(``verifier``) with transformers' ``Auto`` classes, so its checkpoints load like any other."""

from grpokit.models.loading import load_tokenizer, pad_token_id
from grpokit.models.tiny import CHAT_TEMPLATE, build_char_tokenizer, build_tiny_model
from grpokit.models.verifier import PolicyVerifierConfig

__all__ = [
    "CHAT_TEMPLATE",
    "PolicyVerifierConfig",
    "build_char_tokenizer",
    "build_tiny_model",
    "load_tokenizer",
    "pad_token_id",
]

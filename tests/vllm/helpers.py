"""What tests/vllm compares vLLM's engine with: ``transformers``' own greedy decoding and forward pass of the
same policy, and the sampling distribution computed here by hand from its logits (temperature, then top-k,
then top-p: vLLM's order)."""

from __future__ import annotations

import torch

from grpokit.models.tiny import build_char_tokenizer, build_tiny_model

PROMPT_LEN, COMPLETION_LEN = 12, 10
"""max_prompt_length and max_completion_length of the engine tests: the engine's context is their sum."""


def tiny_policy(seed: int = 0, *, tie: bool = True, sharpen: float = 8.0) -> tuple[torch.nn.Module, object]:
    """grpokit's tiny Llama (head_dim 32, a size vLLM's CPU attention supports) with its final norm scaled
    x``sharpen``: x8 gives peaked next-token distributions, so that greedy decoding does not hinge on the last
    bit of two kernels' sums and fp32 engine and ``transformers`` pick the same tokens; x2 leaves sampling
    many tokens with distinct log-probs."""
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(
        tokenizer, hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128, seed=seed,
        tie_word_embeddings=tie, max_position_embeddings=128,
    )  # fmt: skip
    with torch.no_grad():
        model.model.norm.weight.mul_(sharpen)
    return model.eval(), tokenizer


def digits(prompts, completions, completion_ids, **kwargs) -> list[float]:
    """A reward: the share of the completion's characters that are digits (a random tiny policy: ~0.1)."""
    return [sum(ch.isdigit() for ch in text) / max(len(text), 1) for text in completions]


def encode(tokenizer, texts: list[str]) -> list[list[int]]:
    return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]


@torch.no_grad()
def hf_greedy(model: torch.nn.Module, prompts: list[list[int]], max_new: int, eos: int) -> list[list[int]]:
    """``transformers``' greedy completion of each prompt (one at a time: no padding), EOS kept."""
    completions = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new, do_sample=False,
            eos_token_id=eos, pad_token_id=eos, top_p=None, top_k=None, temperature=None,
        )  # fmt: skip
        completions.append(out[0, len(prompt) :].tolist())
    return completions


@torch.no_grad()
def next_token_logits(model: torch.nn.Module, prompt: list[int], completion: list[int]) -> torch.Tensor:
    """[len(completion), V] float32 logits that predicted each completion token (``transformers`` forward)."""
    ids = torch.tensor([prompt + completion])
    logits = model(input_ids=ids).logits[0].float()  # [T, V]
    return logits[len(prompt) - 1 : len(prompt) - 1 + len(completion)]


def processed_logprobs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """[T, V] log-probs of the distribution sampled from: logits / temperature, the top_k largest kept
    (ties kept), then the smallest set of tokens, most likely first, whose mass reaches top_p (a token is
    kept while the mass before it is < top_p), renormalised."""
    scaled = logits / temperature  # [T, V]
    if top_k > 0:
        kth = scaled.topk(top_k, dim=-1).values[:, -1:]  # [T, 1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = scaled.softmax(-1)
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(-1) - sorted_probs  # [T, V]
    drop_sorted = mass_before >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return scaled.masked_fill(drop, float("-inf")).log_softmax(-1)


def chosen(logps: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    """[T] the log-prob of each token under the [T, V] ``logps``."""
    return logps[torch.arange(len(tokens)), torch.tensor(tokens)]

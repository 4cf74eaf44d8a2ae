"""vLLM in server mode: a ``RolloutBackend`` that generates over HTTP from a vLLM server on other GPUs and
pushes the trainer's weights to it over NCCL.

The protocol is TRL 1.16's (``trl/generation/vllm_client.py``): since TRL 1.1x, ``trl vllm-serve`` only runs
vLLM's own OpenAI-compatible server with ``VLLM_SERVER_DEV_MODE=1`` (which exposes the weight-transfer
endpoints), ``--weight-transfer-config '{"backend": "nccl"}'``, ``--logprobs-mode processed_logprobs`` and
``--max-logprobs -1``. Both ``trl vllm-serve --model M`` (TRL 1.16) and that ``vllm serve`` command line
(vLLM >= 0.22) serve this client. The older ``trl vllm-serve`` of TRL <= 1.9 (its own FastAPI app with
``/generate/`` and ``/update_named_param/``) is not supported.

Endpoints (vLLM 0.22-0.32, ``vllm/entrypoints/serve`` and ``vllm/entrypoints/rl``):

- ``GET /health`` (200 when up), ``GET /v1/models`` (the served model's id), ``GET /get_world_size``;
- ``GET /server_info?config_format=json`` (dev mode): the server's ``VllmConfig``, read once at connection
  (``check_server``) to refuse a server whose log-probs are not ``processed_logprobs`` (vLLM's default
  ``raw_logprobs`` are taken before the temperature and the top-k/top-p filters: the off-policy ratios would
  be wrong) or which has no NCCL weight-transfer engine, naming the flag to add;
- ``POST /v1/completions`` with token-id prompts, ``n``, the sampling fields, ``logprobs=0``,
  ``return_token_ids`` (each choice then carries ``token_ids``), ``return_tokens_as_token_ids``; the choices
  come prompt-major (``index = prompt * n + sample``) with ``finish_reason`` and ``logprobs.token_logprobs``;
- weight transfer: ``POST /init_weight_transfer_engine {"init_info": {master_address, master_port,
  rank_offset: 1, world_size}}`` while the trainer joins the NCCL group as rank 0 (vLLM's
  ``StatelessProcessGroup`` + ``PyNcclCommunicator``); then per push ``POST /start_weight_update {}``,
  ``POST /update_weights {"update_info": {names, dtype_names, shapes}}`` while the trainer broadcasts each
  tensor from rank 0 in that order (the unpacked transfer, the workers' default in vLLM 0.22-0.32),
  ``POST /finish_weight_update``; ``POST /reset_prefix_cache`` (``{"success": false}`` while blocks are
  held: retried).

The weights reach a server on CUDA over NCCL, as above (**CUDA only**, untested here). A server on CPU cannot
receive them that way: every weight-transfer backend of vLLM 0.32 moves CUDA tensors (``nccl``,
``sparse_nccl``, ``nccl_m2n``: NCCL; ``ipc``: CUDA IPC handles; ``sharded_rdt``: CUDA streams and IPC;
``modelexpress``: an external GPU package), and on vLLM's CPU build ``/init_weight_transfer_engine`` answers
HTTP 500 (the worker's ``torch.accelerator.current_device_index()``: "Cannot access accelerator device when
none is available"). For a CPU server on this machine grpokit pushes through a directory instead
(``DirectoryWeightSender``): the weights written as safetensors, then ``POST /collective_rpc {"method":
"reload_weights", "kwargs": {"weights_path": dir}}`` (dev mode, vLLM >= 0.32), which loads them through the
model's own ``load_weights`` as at startup. ``check_server`` reads the server's device and picks the route.

Tested against a real ``vllm serve`` of vLLM 0.32.0's CPU build (``tests/vllm/test_server.py``): the
connection check, generation, log-probs, the prefix-cache reset and the directory push.

HTTP uses the standard library (``urllib``): no dependency beyond grpokit's.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
import shutil
import socket
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
import weakref
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from grpokit.models.parts import hf_model
from grpokit.rollout.base import GenerationOutput, SamplingParams
from grpokit.rollout.vllm_common import (
    ALTERNATIVE,
    VLLMSettings,
    VLLMUnavailableError,
    is_truncated,
    process_layout,
    vllm_sampling_kwargs,
)
from grpokit.rollout.weight_names import policy_weights

__all__ = [
    "DirectoryWeightSender",
    "NcclWeightSender",
    "ServerSettings",
    "VLLMServerBackend",
    "VLLMServerClient",
    "VLLMServerConfigError",
    "make_server_backend",
    "parse_completions",
    "refuse_tied_head_on_cpu_server",
    "server_problems",
    "server_settings",
    "weight_metadata",
]

logger = logging.getLogger(__name__)

LOGPROBS_FLAG = "--logprobs-mode processed_logprobs"
NCCL_FLAG = """--weight-transfer-config '{"backend": "nccl"}'"""
LAUNCH = (
    "start one with `trl vllm-serve --model <model>` (TRL 1.16) or `VLLM_SERVER_DEV_MODE=1 vllm serve "
    f"<model> {NCCL_FLAG} {LOGPROBS_FLAG}`"
)
LOGPROBS_MODES = {
    "raw_logprobs": "vLLM's default: log-probs taken before the temperature and the top-k/top-p filters",
    "raw_logits": "logits before the temperature and the filters, not log-probs",
    "processed_logits": "logits, not log-probs",
}
"""What a server's other ``--logprobs-mode`` returns instead of the sampled token's log-prob."""
LOOPBACK = ("0.0.0.0", "localhost", "127.0.0.1", "::1", "")
"""Hosts that mean this machine (``0.0.0.0``: grpokit's default, a server on every interface here)."""
CUDA_ONLY_BACKENDS = "nccl, sparse_nccl, nccl_m2n: NCCL; ipc: CUDA IPC; sharded_rdt: CUDA streams and IPC"


def parse_completions(
    body: dict[str, Any], num_prompts: int, n: int, eos_ids: Sequence[int]
) -> GenerationOutput:
    """A ``/v1/completions`` response (``return_token_ids``, ``logprobs=0``) as a ``GenerationOutput``: the n
    completions of each prompt contiguous, in prompt order; a null log-prob becomes NaN (unknown)."""
    choices = sorted(body["choices"], key=lambda choice: choice["index"])
    if len(choices) != num_prompts * n:
        raise RuntimeError(f"the vLLM server returned {len(choices)} completions for {num_prompts} x {n}")
    if any(choice.get("token_ids") is None for choice in choices):
        raise RuntimeError("the vLLM server returned no token_ids: it needs return_token_ids (vLLM >= 0.22)")
    ids = [list(choice["token_ids"]) for choice in choices]
    truncated = [is_truncated(t, c.get("finish_reason"), eos_ids) for t, c in zip(ids, choices)]
    if any(choice.get("logprobs") is None for choice in choices):
        return GenerationOutput(ids, None, truncated)
    logprobs = [
        [math.nan if value is None else float(value) for value in choice["logprobs"]["token_logprobs"]]
        for choice in choices
    ]
    return GenerationOutput(ids, logprobs, truncated)


def repeat_each(out: GenerationOutput, times: int) -> GenerationOutput:
    """Each completion of ``out`` ``times`` times in a row (its copies stay in its prompt's group)."""
    if times == 1:
        return out
    ids = [list(row) for row in out.completion_ids for _ in range(times)]
    logprobs = None if out.logprobs is None else [list(row) for row in out.logprobs for _ in range(times)]
    return GenerationOutput(ids, logprobs, [flag for flag in out.truncated for _ in range(times)])


class VLLMServerConfigError(RuntimeError):
    """A vLLM server whose settings would give wrong log-probs or could not receive the weights."""


@dataclass(frozen=True)
class ServerSettings:
    """What grpokit checks of a running server: parts of its ``VllmConfig`` (``/server_info``)."""

    logprobs_mode: str | None
    """``processed_logprobs`` (after penalties, temperature and filters) is the only right one."""
    weight_transfer_backend: str | None
    """``--weight-transfer-config``'s backend; None: the server has no weight-transfer engine."""
    device_type: str | None
    """``cuda``, ``cpu``, ...: where the server's workers hold the weights."""
    prefix_caching: bool | None
    """Whether the server caches prompt prefixes (then a weight push must reset the cache)."""


def device_type(device_config: dict[str, Any]) -> str | None:
    """``cpu``, ``cuda``, ... from a dumped ``DeviceConfig``: its ``device_type`` if there, else its
    ``device`` (``"cpu"``; null on CUDA, where vLLM leaves the device to each worker: unknown)."""
    value = device_config.get("device_type") or device_config.get("device")
    return str(value).split(":")[0] if value else None


def server_settings(info: dict[str, Any]) -> ServerSettings:
    """The ``ServerSettings`` in a ``GET /server_info?config_format=json`` answer (a missing part: None)."""
    config = info.get("vllm_config")
    if not isinstance(config, dict):
        raise VLLMServerConfigError(
            "the vLLM server's /server_info returned its config as text, not JSON (a vLLM without "
            "?config_format=json): grpokit cannot check its log-prob mode; use vLLM >= 0.22"
        )
    model = config.get("model_config") or {}
    transfer = config.get("weight_transfer_config") or {}
    device = config.get("device_config") or {}
    cache = config.get("cache_config") or {}
    return ServerSettings(
        logprobs_mode=model.get("logprobs_mode"),
        weight_transfer_backend=transfer.get("backend") if isinstance(transfer, dict) else None,
        device_type=device_type(device),
        prefix_caching=cache.get("enable_prefix_caching"),
    )


def weight_route(settings: ServerSettings) -> str:
    """How the weights reach the server: ``nccl`` (vLLM's weight-transfer engine; a CUDA server), or
    ``directory`` for a server on CPU, where no weight-transfer backend of vLLM runs: grpokit writes the
    weights to a directory the server then reloads from (``DirectoryWeightSender``)."""
    return "directory" if settings.device_type == "cpu" else "nccl"


def server_problems(settings: ServerSettings, *, push_weights: bool, local: bool = True) -> list[str]:
    """What is wrong with a server for grpokit, each naming the fix; empty when it serves grpokit. ``local``:
    the server runs on this machine (sees this machine's files)."""
    problems = []
    if settings.logprobs_mode != "processed_logprobs":
        what = LOGPROBS_MODES.get(settings.logprobs_mode or "", "not the sampling distribution's log-probs")
        problems.append(
            f"its --logprobs-mode is {settings.logprobs_mode!r} ({what}), so the off-policy correction's "
            f"ratios would be wrong: add {LOGPROBS_FLAG}"
        )
    if not push_weights:
        return problems
    if weight_route(settings) == "directory":
        if not local:
            problems.append(
                f"it runs on {settings.device_type!r}, where vLLM's weight-transfer backends do not ("
                f"{CUDA_ONLY_BACKENDS}), and grpokit's fallback, a weight directory the server reloads "
                "from, needs the server on this machine: serve it here (vllm_server_host=127.0.0.1) or on a "
                "CUDA GPU"
            )
        return problems
    if settings.weight_transfer_backend is None:
        problems.append(
            f"it has no weight-transfer engine, so it cannot receive the policy's weights: add {NCCL_FLAG}"
        )
    elif settings.weight_transfer_backend != "nccl":
        problems.append(
            f"its weight-transfer backend is {settings.weight_transfer_backend!r}; grpokit pushes over NCCL: "
            f"start it with {NCCL_FLAG}"
        )
    return problems


class VLLMServerClient:
    """The HTTP side of a vLLM server (no vLLM, no GPU needed): health, generation, weight-update calls."""

    def __init__(self, base_url: str, *, request_timeout: float | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.request_timeout = request_timeout
        self._model_id: str | None = None

    def request(self, method: str, path: str, payload: Any = None, *, timeout: float | None = None) -> Any:
        """One JSON request; the decoded JSON answer (None for an empty body). HTTP errors raise
        RuntimeError with the server's answer; a 404 on a weight-transfer endpoint names the dev mode."""
        data = None if payload is None else json.dumps(payload).encode()
        request = urllib.request.Request(f"{self.base_url}{path}", data=data, method=method)
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=timeout or self.request_timeout) as answer:
                text = answer.read().decode()
        except urllib.error.HTTPError as err:
            detail = err.read().decode(errors="replace")[:500]
            hint = " (started without VLLM_SERVER_DEV_MODE=1?)" if err.code == 404 else ""
            raise RuntimeError(f"vLLM server {method} {path}: HTTP {err.code}{hint}: {detail}") from None
        return json.loads(text) if text.strip() else None

    def wait_until_healthy(self, timeout: float, interval: float = 2.0) -> None:
        """Poll ``GET /health`` until it answers 200; ConnectionError naming the URL after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.request("GET", "/health", timeout=max(1.0, min(5.0, timeout)))
                return
            except (OSError, RuntimeError) as err:  # refused, unreachable, not ready (503)
                last = err
            if time.monotonic() + interval > deadline:
                raise ConnectionError(
                    f"no vLLM server answered at {self.base_url}/health within "
                    f"vllm_server_timeout={timeout} s (last error: {last}); {LAUNCH}. {ALTERNATIVE}."
                )
            time.sleep(interval)

    def model_id(self) -> str:
        """The served model's id (``/v1/models``), sent with each completion request."""
        if self._model_id is None:
            self._model_id = self.request("GET", "/v1/models")["data"][0]["id"]
        return self._model_id

    def completion_payload(
        self, prompt_ids: Sequence[Sequence[int]], n: int, params: SamplingParams
    ) -> dict[str, Any]:
        """The ``/v1/completions`` request body: token-id prompts and ``vllm_sampling_kwargs``."""
        return {
            "model": self.model_id(),
            "prompt": [list(ids) for ids in prompt_ids],
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            **vllm_sampling_kwargs(params, n),
        }

    def generate(
        self, prompt_ids: Sequence[Sequence[int]], n: int, params: SamplingParams
    ) -> GenerationOutput:
        """``n`` completions per prompt from the server's current weights. Greedy asks for one and repeats
        it: vLLM refuses ``n > 1`` at temperature 0 (HTTP 400 "n must be 1 when using greedy sampling",
        vLLM 0.32), and the n greedy completions would be the same."""
        asked = n if params.do_sample else 1
        body = self.request("POST", "/v1/completions", self.completion_payload(prompt_ids, asked, params))
        return repeat_each(parse_completions(body, len(prompt_ids), asked, params.eos_token_ids), n // asked)

    def world_size(self) -> int:
        """The server's workers (tensor x pipeline x data parallel): the NCCL group less the trainer."""
        return int(self.request("GET", "/get_world_size")["world_size"])

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        """Ask the workers to join the NCCL weight-transfer group (blocks until the trainer joins too)."""
        self.request("POST", "/init_weight_transfer_engine", {"init_info": init_info})

    def start_weight_update(self) -> None:
        self.request("POST", "/start_weight_update", {})

    def update_weights(self, metadata: Sequence[tuple[str, str, list[int]]]) -> None:
        """Announce the tensors about to be broadcast, in order (blocks until they are received)."""
        names, dtypes, shapes = (list(column) for column in zip(*metadata))
        self.request("POST", "/update_weights", {"update_info": {"names": names, "dtype_names": dtypes,
                                                                 "shapes": shapes}})  # fmt: skip

    def finish_weight_update(self) -> None:
        self.request("POST", "/finish_weight_update", {})

    def server_settings(self) -> ServerSettings:
        """The server's log-prob mode, weight-transfer backend and device (``/server_info``, dev mode)."""
        return server_settings(self.request("GET", "/server_info?config_format=json"))

    def is_local(self) -> bool:
        """Whether the server runs on this machine (a loopback address: it sees this machine's files)."""
        host = urllib.parse.urlparse(self.base_url).hostname or ""
        return host in LOOPBACK or host.startswith("127.")

    def check_server(self, *, push_weights: bool) -> ServerSettings:
        """Refuse a server that would give wrong log-probs or (``push_weights``) could not receive the
        weights: VLLMServerConfigError naming every flag to add. Returns its settings."""
        settings = self.server_settings()
        problems = server_problems(settings, push_weights=push_weights, local=self.is_local())
        if problems:
            reasons = "; ".join(problems)
            raise VLLMServerConfigError(
                f"the vLLM server at {self.base_url} cannot serve grpokit: {reasons} ({LAUNCH})."
            )
        return settings

    def reload_weights(self, directory: str) -> None:
        """Have every worker reload its weights from the safetensors in ``directory`` (vLLM >= 0.32's
        ``Worker.reload_weights(weights_path=...)`` through the dev-mode ``POST /collective_rpc``)."""
        payload = {"method": "reload_weights", "kwargs": {"weights_path": directory}}
        self.request("POST", "/collective_rpc", payload)

    def reset_prefix_cache(self, attempts: int = 10, interval: float = 0.5) -> None:
        """Drop the server's prefix cache (its KV was computed with the previous weights). vLLM answers
        ``{"success": false}`` while cache blocks are held by running requests: retried ``attempts`` times,
        then RuntimeError (an older vLLM answers nothing: taken as done)."""
        for _ in range(attempts):
            answer = self.request("POST", "/reset_prefix_cache")
            if not isinstance(answer, dict) or answer.get("success", True):
                return
            time.sleep(interval)
        raise RuntimeError(
            f"the vLLM server at {self.base_url} kept its prefix cache after {attempts} resets (blocks still "
            "in use): its cached prompts would reuse KV computed with the previous weights"
        )


def weight_metadata(model: nn.Module) -> list[tuple[str, str, list[int]]]:
    """``(name, vLLM dtype name, shape)`` of each weight ``policy_weights`` yields, in order (a full pass:
    under FSDP every process must call it)."""
    return [(name, str(t.dtype).removeprefix("torch."), list(t.shape)) for name, t in policy_weights(model)]


def local_address_towards(host: str) -> str:
    """This machine's address on the route to ``host`` (what the server's workers connect back to)."""
    if host in LOOPBACK:
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host, 9))  # no packet is sent: this only picks the route
        return probe.getsockname()[0]


def join_nccl_group(host: str, port: int, world_size: int, device: torch.device) -> Any:
    """Rank 0 of the weight-transfer NCCL group (a ``PyNcclCommunicator``), as the server's workers join it:
    vLLM >= 0.32's ``nccl_common.stateless_init_process_group`` (which lifts the NCCL settings vLLM pins for
    its own communicators, as the workers do), else ``StatelessProcessGroup`` + ``PyNcclCommunicator``."""
    try:
        from vllm.distributed.weight_transfer.nccl_common import stateless_init_process_group
    except ImportError:
        from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
        from vllm.distributed.utils import StatelessProcessGroup

        group = StatelessProcessGroup.create(host=host, port=port, rank=0, world_size=world_size)
        return PyNcclCommunicator(group, device=device)
    return stateless_init_process_group(host, port, 0, world_size, device)


class NcclWeightSender:
    """The trainer's end (rank 0) of the NCCL group with the server's workers (ranks 1..W). CUDA only."""

    def __init__(self, client: VLLMServerClient, host: str, port: int, device: torch.device) -> None:
        self.client, self.device = client, device
        world_size = client.world_size() + 1
        info = {"master_address": host, "master_port": port, "rank_offset": 1, "world_size": world_size}
        with ThreadPoolExecutor(max_workers=1) as pool:  # the server blocks in the rendezvous until we join
            joined = pool.submit(client.init_weight_transfer_engine, info)
            self.communicator = join_nccl_group(host, port, world_size, device)
            joined.result()

    def send(
        self, metadata: Sequence[tuple[str, str, list[int]]], weights: Iterable[tuple[str, torch.Tensor]]
    ) -> None:
        """One weight update: announce ``metadata``, broadcast each tensor of ``weights`` (same order)."""
        self.client.start_weight_update()
        with ThreadPoolExecutor(max_workers=1) as pool:  # the workers receive while we broadcast
            received = pool.submit(self.client.update_weights, metadata)
            for (name, tensor), (expected, _, _) in zip(weights, metadata, strict=True):
                if name != expected:
                    raise RuntimeError(f"weight order changed: {name!r} where {expected!r} was announced")
                tensor = tensor.to(self.device).contiguous()
                self.communicator.broadcast(tensor, src=0, stream=torch.cuda.current_stream(self.device))
            received.result()
        self.client.finish_weight_update()


class DirectoryWeightSender:
    """Pushes the weights to a server on this machine through a directory: each push writes them as one
    safetensors file, then the server's workers reload from it (``VLLMServerClient.reload_weights``: vLLM's
    ``reload_weights`` over the dev-mode ``/collective_rpc``, which maps the checkpoint names onto its fused
    layers as at startup). For a server on CPU, where none of vLLM's weight-transfer backends runs; it costs
    a write and a read of the weights per push. ``directory`` None: a temporary one, removed with the
    sender."""

    def __init__(self, client: VLLMServerClient, directory: str | None = None) -> None:
        self.client = client
        self.directory = Path(directory or tempfile.mkdtemp(prefix="grpokit-vllm-weights-"))
        if directory is None:
            self._cleanup = weakref.finalize(self, shutil.rmtree, self.directory, True)

    def send(
        self, metadata: Sequence[tuple[str, str, list[int]]], weights: Iterable[tuple[str, torch.Tensor]]
    ) -> None:
        """One weight update: ``weights`` (in ``metadata``'s order) written, then reloaded by the server."""
        from safetensors.torch import save_file

        tensors = {}
        for (name, tensor), (expected, _, _) in zip(weights, metadata, strict=True):
            if name != expected:
                raise RuntimeError(f"weight order changed: {name!r} where {expected!r} was announced")
            tensors[name] = tensor.detach().to("cpu").contiguous()
        staging = self.directory / "model.safetensors.partial"
        save_file(tensors, str(staging))
        os.replace(staging, self.directory / "model.safetensors")
        self.client.reload_weights(str(self.directory))


class VLLMServerBackend:
    """A ``RolloutBackend`` generating on a vLLM server from the live policy ``model``.

    The main process (``is_main``) pushes the weights (``sync_weights``): at the start of every ``generate``
    (``sync_every_generate``, the default), else before the first generation and whenever the trainer calls
    ``sync_weights()`` at a step boundary. Every process iterates the weights (FSDP gathers are collectives)
    and, with several processes, waits at a barrier for the push. ``sender`` None: no weight updates (the
    server's own weights; for evaluation or tests)."""

    def __init__(
        self,
        client: VLLMServerClient,
        model: nn.Module | None,
        sender: NcclWeightSender | DirectoryWeightSender | None,
        *,
        is_main: bool = True,
        world_size: int = 1,
        sync_every_generate: bool = True,
    ) -> None:
        self.client, self.model, self.sender = client, model, sender
        self.is_main, self.world_size, self.sync_every_generate = is_main, world_size, sync_every_generate
        self._metadata: list[tuple[str, str, list[int]]] | None = None
        self._stale = True

    def mark_weights_changed(self) -> None:
        """The policy's weights changed: push them at the next ``generate`` (with several processes, call
        ``sync_weights()`` at a step boundary instead: a push is a collective)."""
        self._stale = True

    @torch.no_grad()
    def sync_weights(self) -> None:
        """Push the policy's current weights to the server (every process calls it, in step)."""
        self._stale = False
        if self.is_main and self.sender is None:  # nothing to push to
            return
        if self._metadata is None:
            self._metadata = weight_metadata(self.model)
        weights = policy_weights(self.model)
        if self.sender is not None:
            self.sender.send(self._metadata, weights)
            self.client.reset_prefix_cache()
        else:
            for _ in weights:  # the other processes take part in the gathers
                pass
        if self.world_size > 1:  # nobody generates before the push is complete
            torch.distributed.barrier()

    def generate(
        self, prompt_ids: Sequence[Sequence[int]], num_generations: int, params: SamplingParams
    ) -> GenerationOutput:
        """``num_generations`` completions per prompt (grouped contiguously), with sampling log-probs."""
        if self.sync_every_generate or self._stale:
            self.sync_weights()
        return self.client.generate(prompt_ids, num_generations, params)


def require_nccl(url: str) -> None:
    """VLLMUnavailableError unless this process can join an NCCL group (the ``vllm`` package, a CUDA GPU):
    what a push to a server on CUDA needs on the trainer's side."""
    missing = [what for what, here in (("the vllm package", importlib.util.find_spec("vllm") is not None),
                                       ("a CUDA GPU", torch.cuda.is_available())) if not here]  # fmt: skip
    if missing:
        raise VLLMUnavailableError(
            f"the vLLM server at {url} runs on CUDA and receives the policy's weights over NCCL, which needs "
            f"{' and '.join(missing)} in the training process too. {ALTERNATIVE}."
        )


def refuse_tied_head_on_cpu_server(model: nn.Module, url: str) -> None:
    """A CPU server cannot take the weights of a policy whose LM head is tied to its input embedding: vLLM's
    in-place reload processes the layers whose weights it loads, a tied head loads none, and on the CPU
    engine its packed copy (oneDNN's) keeps the weights the server started with; no endpoint can redo that
    processing (colocate mode does it in process: ``vllm_backend.refresh_tied_heads``). Measured: after a
    push the server's greedy completions were neither the old nor the new weights'."""
    inner = hf_model(model)
    config = getattr(inner, "config", None)
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    if getattr(text, "tie_word_embeddings", False):
        raise VLLMServerConfigError(
            f"the vLLM server at {url} runs on its CPU build, where a pushed policy with an LM head tied to "
            "its embeddings (tie_word_embeddings=True) keeps the head's old weights (vLLM's reload does not "
            "re-process a tied head); use vllm_mode='colocate', which does, or a GPU server"
        )


def make_server_backend(
    settings: VLLMSettings, model: nn.Module, *, step_sync: bool = False
) -> VLLMServerBackend:
    """The server-mode backend of ``settings`` (``GRPOConfig.vllm_settings()``): waits for the server's
    health (``server_timeout``), refuses a server with the wrong settings (``check_server``: log-prob mode,
    weight-transfer backend, device), then opens the weight-transfer group from the main process. Several
    training processes need ``step_sync``: a push at every ``generate`` would need every process to
    generate the same number of times (evaluation shares, ragged groups and episodes do not)."""
    rank, _, world_size = process_layout()
    if world_size > 1 and not step_sync:
        raise ValueError(
            f"GRPOConfig.vllm_mode='server' with {world_size} training processes is not supported yet: the "
            "trainer does not push the weights at step boundaries; use one training process per server, or "
            "vllm_mode='colocate'"
        )
    client = VLLMServerClient(settings.server_url)
    client.wait_until_healthy(settings.server_timeout)
    server = client.check_server(push_weights=rank == 0)
    sender = None
    if rank == 0 and weight_route(server) == "directory":
        refuse_tied_head_on_cpu_server(model, client.base_url)
        sender = DirectoryWeightSender(client)
    elif rank == 0:
        require_nccl(client.base_url)
        host = local_address_towards(urllib.parse.urlparse(client.base_url).hostname or "")
        device = next(model.parameters()).device
        device = device if device.type == "cuda" else torch.device("cuda", torch.cuda.current_device())
        sender = NcclWeightSender(client, host, settings.group_port, device)
    return VLLMServerBackend(
        client, model, sender, is_main=rank == 0, world_size=world_size, sync_every_generate=not step_sync
    )

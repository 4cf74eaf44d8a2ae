"""Routing replay for mixture-of-experts policies: the experts a token was routed to, recorded in one pass and
imposed in another.

An MoE layer's router scores the experts of each token and keeps the top k. Two passes over the same tokens
can choose different experts: the sampler (another dtype, another kernel) and the trainer, or the old policy
and the policy being updated. The importance ratio of such a token compares two different sub-networks, and
in large MoE runs those ratios explode. Replaying the routing removes the difference:

- **R3** (rollout routing replay, arXiv 2510.11370): the sampler records the experts it chose for every token;
  the trainer's old-policy, reference and update passes use those experts;
- **R2** (GSPO paper, "routing replay"): the old-policy pass records its experts; the update uses them.

Replaying fixes the *choice* of experts only. Their gate weights are recomputed from the router's current
logits at the replayed experts, with the architecture's own normalisation (R3's choice: the router still
learns, through the weights of the experts the token uses). Per router class (``GATES``):

- softmax over all experts, then top-k (Qwen2-MoE, Qwen3-MoE, OLMoE; Mixtral): ``softmax(logits)[experts]``,
  renormalised over the k where the model renormalises (``norm_topk_prob``; Mixtral always);
- top-k of the logits, then softmax over the k (GPT-OSS): ``softmax(logits[experts])``;
- sigmoid scores with group-limited selection (GLM-4-MoE): ``sigmoid(logits)[experts]``, renormalised where
  ``norm_topk_prob``, times ``routed_scaling_factor`` (the selection bias only ever chose experts).

Replaying a pass's own routing reproduces that pass bit for bit (tests/moe/test_routing_replay.py).

Mechanics: :func:`install_routing` puts a forward hook on every router of a model (the routers return
``(logits, weights, experts)``), all sharing one :class:`ExpertRouting`; copies of the model (the sampler's
dtype copy, the reference) share it too. Outside a ``recording`` or ``replaying`` context (or, for a
gradient-checkpointing recomputation, ``in_backward``) the hooks do nothing. Routing travels as
:class:`RoutedExperts`: expert ids ``[n, T, L, k]`` (one byte each up to 256 experts) aligned with the
batch's ``[left-padded prompt | right-padded completion]`` tokens.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

logger = logging.getLogger("grpokit")

__all__ = [
    "GATES",
    "TAGS",
    "ExpertRouting",
    "RoutedExperts",
    "RoutingUse",
    "install_routing",
    "replayed_tags",
    "routing_for_run",
    "routing_of",
    "sampled_rows",
]

TAGS = ("sampler", "reference", "update")
"""Where a run's passes count routing differences: the old-policy pass against the sampler's experts, the
reference pass (R3), the update against the old pass's (or the sampler's)."""


def replayed_tags(mode: str) -> dict[str, bool]:
    """Which tags' passes replay the experts they are given under ``routing_replay`` ``mode``."""
    return {"sampler": mode == "R3", "reference": mode == "R3", "update": mode in ("R2", "R3")}


# ---------------------------------------------------------------------- gate weights at given experts
def _softmax_then_topk(module: Any, logits: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """Qwen2/3-MoE, OLMoE: softmax in float32, renormalised if ``norm_topk_prob``, in the logits' dtype."""
    weights = torch.softmax(logits, dim=-1, dtype=torch.float).gather(-1, experts)  # [tokens, k]
    if getattr(module, "norm_topk_prob", False):
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights.to(logits.dtype)


def _mixtral(module: Any, logits: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """Mixtral: softmax in float32, always renormalised over the k, kept in float32."""
    weights = torch.softmax(logits.float(), dim=-1).gather(-1, experts)  # [tokens, k]
    return weights / weights.sum(dim=-1, keepdim=True)


def _topk_then_softmax(module: Any, logits: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """GPT-OSS: softmax over the chosen experts' logits only."""
    chosen = logits.gather(-1, experts)  # [tokens, k]
    return torch.softmax(chosen, dim=1, dtype=chosen.dtype)


def _sigmoid_grouped(module: Any, logits: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """GLM-4-MoE (DeepSeek-V3 style): sigmoid scores, renormalised if ``norm_topk_prob``, scaled."""
    weights = logits.sigmoid().gather(1, experts)  # [tokens, k]
    if module.norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * module.routed_scaling_factor


GATES: dict[str, Callable[[Any, torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "Qwen2MoeTopKRouter": _softmax_then_topk,
    "Qwen3MoeTopKRouter": _softmax_then_topk,
    "OlmoeTopKRouter": _softmax_then_topk,
    "MixtralTopKRouter": _mixtral,
    "GptOssTopKRouter": _topk_then_softmax,
    "Glm4MoeTopkRouter": _sigmoid_grouped,
}
"""Router class (transformers 5) -> its gate weights at given experts, computed as the router computes them
at the experts it chooses itself."""


# ---------------------------------------------------------------------- the routing a batch carries
@dataclass(frozen=True)
class RoutedExperts:
    """The experts each token was routed to, aligned with a batch's ``[prompt | completion]`` tokens.

    ``experts`` [n, T, L, k] (uint8 for up to 256 experts, else int16): for row i, token t, MoE layer l, the k
    experts in the router's order. ``recorded`` [n, T] bool: the tokens whose experts were recorded (a
    pass's real tokens); elsewhere (padding, the last completion token, which no pass feeds) ``experts``
    holds ``0 .. k-1``, harmless where it is replayed: those positions are never attended to."""

    experts: torch.Tensor
    recorded: torch.Tensor

    def __getitem__(self, index: Any) -> RoutedExperts:
        return RoutedExperts(self.experts[index], self.recorded[index])

    def __len__(self) -> int:
        return self.experts.shape[0]

    @classmethod
    def cat(cls, parts: Sequence[RoutedExperts]) -> RoutedExperts:
        return cls(torch.cat([p.experts for p in parts]), torch.cat([p.recorded for p in parts]))

    @classmethod
    def from_rows(
        cls,
        rows: Sequence[torch.Tensor],
        prompt_lengths: Sequence[int],
        prompt_width: int,
        completion_width: int,
        num_experts: int,
        device: torch.device | str | None = None,
    ) -> RoutedExperts:
        """Rows of a sampler (``GenerationOutput.routed_experts``: row i's [p_i + c_i - 1, L, k] over its real
        prompt tokens and every completion token but the last) placed in a batch's layout: prompts
        left-padded to ``prompt_width``, completions right-padded to ``completion_width``."""
        layers, k = rows[0].shape[1:]
        width = prompt_width + completion_width
        experts = (
            torch.arange(k, dtype=storage_dtype(num_experts)).expand(len(rows), width, layers, k).clone()
        )
        recorded = torch.zeros(len(rows), width, dtype=torch.bool)
        for i, (row, p) in enumerate(zip(rows, prompt_lengths)):
            start = prompt_width - p
            experts[i, start : start + row.shape[0]] = row.to(experts.dtype).cpu()
            recorded[i, start : start + row.shape[0]] = True
        return cls(experts.to(device), recorded.to(device))


def storage_dtype(num_experts: int) -> torch.dtype:
    """One byte per expert id up to 256 experts, two up to 32768."""
    return torch.uint8 if num_experts <= 256 else torch.int16


@dataclass(frozen=True)
class RoutingUse:
    """How a training pass routes: ``experts`` (None: its own routing) replayed (``replay``) or only compared
    with (the mismatch counted under ``tag``); ``record``: keep the experts the pass used
    (``ExpertRouting.take_recorded``)."""

    experts: RoutedExperts | None = None
    replay: bool = False
    tag: str = "pass"
    record: bool = False

    def rows(self, index: Any) -> RoutingUse:
        """The same use over rows ``index`` of the batch."""
        return dataclasses.replace(self, experts=None if self.experts is None else self.experts[index])

    @classmethod
    def for_pass(
        cls, mode: str, name: str, sampled: RoutedExperts | None, old: RoutedExperts | None = None
    ) -> RoutingUse:
        """How pass ``name`` ("old", "reference", "update") routes under ``routing_replay`` ``mode`` ("off",
        "R2", "R3"), given the sampler's experts (``sampled``) and the old-policy pass's (``old``):

        - old: R3 replays the sampler's; otherwise compares with them (tag "sampler") and records its own;
        - reference: R3 replays the sampler's (tag "reference"); otherwise routes by its own router;
        - update: R3 replays the sampler's, R2 the old pass's; off compares with the old pass's (or, where
          it did not run, the sampler's). Tag "update"."""
        if name == "old":
            return cls(sampled, replay=mode == "R3", tag="sampler", record=mode != "R3")
        if name == "reference":
            return cls(sampled if mode == "R3" else None, replay=True, tag="reference")
        if name != "update":
            raise ValueError(f"unknown pass {name!r}")
        if mode == "R3":
            return cls(sampled, replay=True, tag="update")
        if mode == "R2":
            return cls(old, replay=True, tag="update")
        return cls(old if old is not None else sampled, replay=False, tag="update")


# ---------------------------------------------------------------------- the hooks
class _RouterHook:
    """Forward hook of MoE layer ``layer``'s router. Copies of the model share it (and its routing)."""

    def __init__(self, routing: ExpertRouting, layer: int) -> None:
        self.routing, self.layer = routing, layer

    def __deepcopy__(self, memo: dict[int, Any]) -> _RouterHook:
        return self

    def __call__(self, module: Any, args: Any, output: Any) -> Any:
        return self.routing._routed(module, self.layer, output)


@dataclass
class _Replay:
    experts: torch.Tensor  # [tokens, L, k] long
    counted: torch.Tensor  # [tokens] bool: the tokens whose mismatch counts
    replay: bool
    tag: str


class ExpertRouting:
    """The routers of one MoE model (and its copies): records what they choose, replays what they are given,
    counts where the two differ. State is per thread (a sampler drawing ahead in the background records its
    own)."""

    def __init__(self, num_layers: int, top_k: int, num_experts: int) -> None:
        self.num_layers, self.top_k, self.num_experts = num_layers, top_k, num_experts
        self._state = threading.local()
        self._counts: dict[str, torch.Tensor] = {}  # tag -> [L, 2]: tokens that differ, tokens counted
        self._recorded: list[RoutedExperts] = []
        self._lock = threading.Lock()
        self._backward: _Replay | None = None  # replayed in a backward's recomputation (``in_backward``)

    # ---- contexts
    @contextmanager
    def recording(self) -> Iterator[list[list[torch.Tensor]]]:
        """Within: every router call appends its experts ([tokens, k]) to ``tape[layer]``."""
        tape: list[list[torch.Tensor]] = [[] for _ in range(self.num_layers)]
        previous, self._state.tape = getattr(self._state, "tape", None), tape
        try:
            yield tape
        finally:
            self._state.tape = previous

    @contextmanager
    def replaying(
        self, experts: torch.Tensor, counted: torch.Tensor, *, replay: bool, tag: str
    ) -> Iterator[None]:
        """Within: router calls over ``experts.shape[0] * experts.shape[1]`` tokens (``experts`` [B, S, L, k],
        the tokens of a backbone call in order) compare their own choice with ``experts`` at the ``counted``
        [B, S] tokens, and with ``replay`` route to ``experts`` instead. The context stays readable by a
        gradient-checkpointing replay of the same call within ``in_backward`` (the last such context of
        this thread)."""
        flat = _Replay(experts.reshape(-1, *experts.shape[2:]).long(), counted.reshape(-1), replay, tag)
        previous, self._state.replay = getattr(self._state, "replay", None), flat
        try:
            yield
        finally:
            self._state.replay = previous
            self._state.last = flat

    def forget_last(self) -> None:
        """A new pass starts: no earlier ``replaying`` call is for its backward."""
        self._state.last = None

    @contextmanager
    def in_backward(self) -> Iterator[None]:
        """Around a backward: gradient checkpointing recomputes a layer's forward there (on a GPU in
        autograd's own thread), and its routers route as the last ``replaying`` call of this thread did (a
        forward over whole rows: one backbone call), uncounted. Only passes with gradients see it: a
        sampler drawing meanwhile (inference mode) routes by its own."""
        last = getattr(self._state, "last", None)
        self._backward = None if last is None else dataclasses.replace(last, tag="")
        try:
            yield
        finally:
            self._backward = None
            self._state.last = None

    # ---- what the passes leave
    def take_counts(self) -> dict[str, torch.Tensor]:
        """Per tag, [L, 2] (tokens whose experts differed, tokens compared) since the last call."""
        with self._lock:
            counts, self._counts = self._counts, {}
        return {tag: c.cpu() for tag, c in counts.items()}

    def metrics(self, counts: dict[str, torch.Tensor], replayed: dict[str, bool]) -> dict[str, float]:
        """``routing/<tag>_mismatch`` (and ``/layer_<l>``): the fraction of compared tokens whose experts
        differed between the pass and the routing it was given, where it used its own; 0 where it replayed
        them. ``routing/<tag>_overridden`` (and per layer) where it replayed: the fraction whose router would
        have chosen other experts. ``counts``: ``take_counts()``, summed over processes."""
        out: dict[str, float] = {}
        for tag, c in counts.items():
            differ, total = c[:, 0].double(), c[:, 1].double()
            if float(total.sum()) == 0:
                continue
            name = "overridden" if replayed.get(tag, False) else "mismatch"
            out[f"routing/{tag}_{name}"] = float(differ.sum() / total.sum())
            for layer in range(c.shape[0]):
                out[f"routing/{tag}_{name}/layer_{layer}"] = float(differ[layer] / total[layer].clamp(min=1))
            if name == "overridden":
                out[f"routing/{tag}_mismatch"] = 0.0  # the pass used the given experts
        return out

    def push_recorded(self, experts: RoutedExperts) -> None:
        self._recorded.append(experts)

    def take_recorded(self) -> RoutedExperts | None:
        """The experts the recording passes used since the last call, their rows in pass order."""
        parts, self._recorded = self._recorded, []
        return RoutedExperts.cat(parts) if parts else None

    # ---- the hook's work
    def _routed(self, module: Any, layer: int, output: Any) -> Any:
        tape = getattr(self._state, "tape", None)
        plan: _Replay | None = getattr(self._state, "replay", None)
        if plan is None and self._backward is not None and torch.is_grad_enabled():  # a recomputation
            plan = self._backward
        if tape is None and plan is None:
            return None
        logits, weights, experts = output
        if plan is not None:
            given = plan.experts[:, layer].to(experts.device)  # [tokens, k]
            if given.shape[0] != experts.shape[0]:
                raise RuntimeError(
                    f"routing replay: the router of MoE layer {layer} routes {experts.shape[0]} tokens but "
                    f"{given.shape[0]} were given (the pass's token layout differs from the recorded one)"
                )
            differ = (given.sort(dim=-1).values != experts.sort(dim=-1).values).any(dim=-1)  # [tokens]
            counted = plan.counted.to(experts.device)
            if plan.tag:  # (a recomputation is not counted again)
                self._count(plan.tag, layer, (differ & counted).sum(), counted.sum())
            if plan.replay:
                weights = GATES[router_class(module)](module, logits, given)
                experts = given.to(experts.dtype)
                output = (logits, weights, experts)
        if tape is not None:
            tape[layer].append(experts.detach())
        return output if plan is not None and plan.replay else None

    def _count(self, tag: str, layer: int, differ: torch.Tensor, total: torch.Tensor) -> None:
        with self._lock:
            counts = self._counts.get(tag)
            if counts is None:
                counts = self._counts[tag] = torch.zeros(
                    self.num_layers, 2, dtype=torch.long, device=differ.device
                )
            counts[layer, 0] += differ
            counts[layer, 1] += total


def calls_of(tape: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    """A recording's backbone calls: [tokens, L, k] each (every MoE layer runs once per call)."""
    counts = {len(calls) for calls in tape}
    if len(counts) != 1:
        raise RuntimeError(f"routing replay: MoE layers recorded unequal numbers of calls ({sorted(counts)})")
    return [torch.stack([tape[layer][j] for layer in range(len(tape))], dim=1) for j in range(counts.pop())]


def sampled_rows(
    tape: list[list[torch.Tensor]],
    prompt_lengths: Sequence[int],
    prompt_width: int,
    group: int,
    completion_lengths: Sequence[int],
    num_experts: int,
    fed: Sequence[torch.Tensor] | None = None,
) -> list[torch.Tensor]:
    """A sampler's routing per row, from its recording: first the prefill of the P left-padded prompts
    (``prompt_width`` tokens each, ``prompt_lengths`` real; one call or several of whole prompts), then one
    call per decode step over the N = P * ``group`` rows in prompt order (step j fed completion token j), or
    over the rows ``fed[j]`` in that order (a sampler whose finished rows leave the decode batch).
    Row i: [p + c_i - 1, L, k] on the CPU, one byte per expert id (its real prompt tokens, then its
    completion tokens but the last, which no pass feeds)."""
    calls = calls_of(tape)
    layers, k = calls[0].shape[1:]
    prefill_tokens, seen = len(prompt_lengths) * prompt_width, 0
    prefill = []
    while seen < prefill_tokens:
        prefill.append(calls.pop(0))
        seen += prefill[-1].shape[0]
    prompts = torch.cat(prefill).reshape(len(prompt_lengths), prompt_width, layers, k)  # [P, W, L, k]
    rows_count = len(completion_lengths)
    if fed is not None:  # each call's rows in place among all N (rows that had left: never read)
        calls = [c.new_zeros(rows_count, layers, k).index_copy(0, rows, c) for c, rows in zip(calls, fed)]
    steps = torch.stack([c.reshape(rows_count, layers, k) for c in calls], dim=1) if calls else None
    dtype, rows = storage_dtype(num_experts), []
    for i, c in enumerate(completion_lengths):
        p = prompt_lengths[i // group]
        row = prompts[i // group, prompt_width - p :]  # [p, L, k]
        if c > 1 and steps is not None:
            row = torch.cat([row, steps[i, : c - 1]])  # [p + c - 1, L, k]
        rows.append(row.to("cpu", dtype))
    return rows


# ---------------------------------------------------------------------- installing
_INSTALLED: weakref.WeakKeyDictionary[torch.nn.Module, ExpertRouting] = weakref.WeakKeyDictionary()
_WITHOUT: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()  # looked at, no routing hooks found


def routers_of(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's MoE routers in layer order (modules whose class name says top-k router)."""
    return [m for m in model.modules() if router_class(m).lower().endswith("topkrouter")]


def router_class(module: torch.nn.Module) -> str:
    """The name of ``module``'s own class. A parametrized module (peft >= 0.22 puts LoRA on an MoE router's
    weight through ``torch.nn.utils.parametrize``) is an instance of a ``Parametrized<Class>`` subclass."""
    cls = type(module)
    if torch.nn.utils.parametrize.is_parametrized(module):
        cls = cls.__bases__[0]
    return cls.__name__


def install_routing(model: torch.nn.Module) -> ExpertRouting | None:
    """Hooks on every router of ``model`` (idempotent), or None for a model without routers. A router class
    without a known gate formula (``GATES``) is refused, naming it."""
    existing = routing_of(model)
    if existing is not None:
        return existing
    routers = routers_of(model)
    if not routers:
        return None
    unknown = sorted({router_class(r) for r in routers} - set(GATES))
    if unknown:
        raise ValueError(
            f"routing replay knows the routers of {', '.join(sorted(GATES))}; {', '.join(unknown)} is "
            "not one of them (its gate weights at given experts are not implemented): routing_replay='off'"
        )
    top_k = {int(r.top_k) for r in routers}
    experts = {int(r.num_experts) for r in routers}
    if len(top_k) != 1 or len(experts) != 1:
        raise ValueError(f"routing replay needs one top_k and one expert count, got {top_k} and {experts}")
    routing = ExpertRouting(len(routers), top_k.pop(), experts.pop())
    for layer, router in enumerate(routers):
        router.register_forward_hook(_RouterHook(routing, layer))
    _INSTALLED[model] = routing
    _WITHOUT.discard(model)
    return routing


def routing_of(model: torch.nn.Module) -> ExpertRouting | None:
    """The ``ExpertRouting`` whose hooks sit on ``model``'s routers (on a copy of a model, the original's),
    or None. Both answers are remembered per model (every generation call asks: a dense model's modules are
    walked once)."""
    if model in _INSTALLED:
        return _INSTALLED[model]
    if model in _WITHOUT:
        return None
    found = None
    for module in model.modules():
        for hook in module._forward_hooks.values():
            if isinstance(hook, _RouterHook):
                found = hook.routing
                break
        if found is not None:
            break
    if found is not None:
        _INSTALLED[model] = found
    else:
        _WITHOUT.add(model)
    return found


def routing_for_run(model: torch.nn.Module, mode: str, refusals: dict[str, bool]) -> ExpertRouting | None:
    """The ``ExpertRouting`` of a run's policy, installed on it: every mixture-of-experts policy whose routers
    grpokit knows (``GATES``) records the sampler's routing and logs where passes differ, whatever ``mode``
    (``GRPOConfig.routing_replay``). None for a dense policy. ``mode`` R2/R3 on a dense policy, on unknown
    routers, or where a ``refusals`` entry holds (its key: why, completing "routing_replay=... is refused
    ...") is a ValueError."""
    name = type(model).__name__
    routers = routers_of(model)
    if not routers:
        if mode != "off":
            raise ValueError(
                f"GRPOConfig.routing_replay={mode!r}, but {name} has no mixture-of-experts routers to "
                "replay; leave it 'off'"
            )
        return None
    unknown = sorted({router_class(r) for r in routers} - set(GATES))
    if unknown:
        if mode != "off":
            install_routing(model)  # raises, naming the router
        logger.warning(
            "grpokit: %s's routers (%s) are not ones routing replay knows: no routing/* metrics",
            name, ", ".join(unknown),
        )  # fmt: skip
        return None
    for reason, applies in refusals.items():
        if mode != "off" and applies:
            raise ValueError(f"GRPOConfig.routing_replay={mode!r} is refused {reason}")
    return install_routing(model)

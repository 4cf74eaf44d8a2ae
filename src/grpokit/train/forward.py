"""The training forward: per-token log-probs (and entropy) of completion tokens under a causal LM.

Input layout (one row per completion): ``input_ids = [left-padded prompt | right-padded completion]``.
Only the last ``C = completion_ids.shape[1]`` positions are scored.

Lean on three counts (all exact up to float rounding; tests/train/test_forward.py checks log-probs and
parameter gradients against the plain ``model(...).logits`` + log-softmax forward):

1. **Only completion positions reach the LM head**, and only the real ones (``completion_mask == 1``): the
   backbone's hidden states are gathered at those positions first.
2. **The LM head and the log-softmax run in chunks of rows** inside one autograd function
   (``grpokit.train.lm_head``): the [rows, V] logits of one chunk are the only ones alive at a time, in the
   forward and in the backward (which recomputes them: one extra matmul instead of keeping [M, V]). A float32
   [B, T, V] tensor never exists. Same quantities as ``grpokit.core.logprobs.logprobs_and_entropy`` on the
   full logits, computed in fewer passes over memory (that function takes logits, so it cannot avoid them).
3. **Shared prefix**: with ``num_generations = G`` the G rows of a group carry the same prompt. The prompt is
   then run once per group, its keys/values are repeated to the G rows (``repeat_interleave``, whose backward
   sums the G gradients back into the one prompt computation), and only the completions run per row. This
   turns ``B * (P + C)`` backbone tokens into ``B/G * P + B * C``. It is chosen automatically when it removes
   enough work (see ``shared_prefix_pays``), or forced with ``shared_prefix=True/False``. Its caches are
   safe to replay (``grpokit.models.prefix_cache``), so it stays exact under gradient checkpointing.

Passes that need no gradient (reference, old-policy log-probs) should run under ``torch.inference_mode()``;
``no_grad_logprobs`` does that.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch

from grpokit.models.moe import is_mixture_of_experts
from grpokit.models.packing import (
    PackedLayout,
    packed_call,
    packed_prompts,
    packing_obstacles,
    padding_free_pays,
    use_packed_attention,
)
from grpokit.models.parts import cache_argument, decoder_of
from grpokit.models.policy import is_checkpointing
from grpokit.models.prefix_cache import (
    PrefixCache,
    RecordingCache,
    full_attention_only,
    replay_safe_layers,
)
from grpokit.models.routing_replay import (
    ExpertRouting,
    RoutedExperts,
    RoutingUse,
    calls_of,
    routing_of,
    storage_dtype,
)
from grpokit.models.vision import (
    PromptImages,
    image_features,
    multimodal_backbone,
    takes_encoder_outputs,
    token_types,
)
from grpokit.train.lm_head import head_logprobs

__all__ = [
    "PolicyLogprobs",
    "completion_logprobs",
    "micro_batch_rows",
    "no_grad_logprobs",
    "shared_prefix_pays",
]

MICRO_BATCH_TOKENS = 4608
"""Default backbone-token budget of one gradient micro-batch (see ``micro_batch_rows``)."""

SHARED_PREFIX_MIN_SAVING = 0.15
"""Shared-prefix forward is used when it removes at least this fraction of the backbone's tokens."""


def completion_logprobs(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    num_generations: int | None = None,
    shared_prefix: bool | None = None,
    chunk_size: int | None = None,
    context_mask: torch.Tensor | None = None,
    router_logits: list[Any] | None = None,
    images: PromptImages | None = None,
    routing: RoutingUse | None = None,
    padding_free: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of each completion token under ``model``.

    Shapes: prompt_ids/prompt_mask [B, P] (left-padded), completion_ids/completion_mask [B, C]
    (right-padded). Returns (logps [B, C] float32, entropy [B, C] float32 or None).
    logps[b, t] = log softmax(logits[b, P + t - 1] / temperature)[completion_ids[b, t]]; positions with
    ``completion_mask == 0`` are not computed and hold 0 (so does their entropy).
    ``num_generations``: rows k*G .. k*G+G-1 share one prompt (enables the shared-prefix forward).
    ``shared_prefix``: None picks by ``shared_prefix_pays`` (never for a mixture of experts: see
    ``_choose_shared``); True/False forces (True needs groups whose
    prompts are identical, else ValueError). ``chunk_size``: LM-head rows per chunk (default
    ``head_chunk_rows(V)``). ``context_mask`` [B, C]: the completion tokens that exist (attended to and
    counted in positions) when that differs from the scored ones: an episode's observation tokens are
    context (``context_mask`` 1) but not scored (``completion_mask`` 0). None: ``completion_mask``.
    ``router_logits``: a list to receive ``(router logits, attention mask)`` of a mixture-of-experts
    backbone (``grpokit.models.moe``), each token's as the model's own forward routes it (with the shared
    prefix, a prompt's router logits repeated to its G rows).
    ``images``: the rows' image inputs (a vision-language policy, ``grpokit.models.vision``): the model's
    own multimodal backbone runs over each whole row, its vision encoder once per distinct prompt.
    ``routing``: a mixture-of-experts policy's routing (``grpokit.models.routing_replay``): the experts
    ([B, P+C] tokens) to replay or to compare with, and whether to record the experts the pass used. Under
    gradient checkpointing with gradients on, replayed rows run whole (no shared prefix), so that a
    checkpointed layer's recomputation routes as its forward did.
    ``padding_free``: run the backbone over the rows' real tokens packed into one sequence
    (``grpokit.models.packing``), combined with the shared prefix when that applies. None picks it where the
    model supports it and padding is at least ``models.packing.PADDING_FREE_MIN_SAVING`` of the backbone's
    tokens (``_choose_packed``); True forces it (ValueError where it cannot run); False never.
    """
    context = completion_mask if context_mask is None else context_mask
    batch, num_completion = completion_ids.shape
    if num_completion == 0:
        empty = completion_ids.new_zeros((batch, 0), dtype=torch.float32)
        return empty, (empty.clone() if with_entropy else None)
    shapes = (prompt_ids, prompt_mask, num_generations, num_completion)
    routes = _Routes.of(model, routing)
    if routes is not None and images is not None:
        raise ValueError(
            "routing replay with images (a mixture-of-experts vision-language model) is not built"
        )
    if routes is not None and torch.is_grad_enabled() and is_checkpointing(model):
        shared_prefix = False  # a checkpointed layer replays within its call's routing context only
    padded_inputs = [
        name
        for name, given in (("images", images), ("routing replay", routes), ("router logits", router_logits))
        if given is not None
    ]
    if images is not None:
        hidden = _vision_hidden(model, prompt_ids, prompt_mask, completion_ids, context, images)
    elif _choose_packed(model, prompt_mask, context, padding_free, padded_inputs):
        shared = _choose_shared(model, *shapes, shared_prefix, real_completion=context)
        ids_and_masks = (prompt_ids, prompt_mask, completion_ids, context)
        hidden = _packed_hidden(model, *ids_and_masks, num_generations, shared)
    elif _choose_shared(model, *shapes, shared_prefix):
        hidden = _shared_prefix_hidden(
            model, prompt_ids, prompt_mask, completion_ids, context, num_generations, routes, router_logits
        )
    else:
        hidden = _full_hidden(model, prompt_ids, prompt_mask, completion_ids, context, router_logits, routes)
    return head_logprobs(
        model,
        hidden,
        completion_ids,
        completion_mask,
        temperature=temperature,
        with_entropy=with_entropy,
        chunk_size=chunk_size,
    )


class PolicyLogprobs(torch.nn.Module):
    """The policy with :func:`completion_logprobs` as its ``forward``: what the trainer hands to
    ``accelerator.prepare``.

    The lean forward reaches into the model (backbone, LM head) instead of calling ``model(...)``. Under
    ``DistributedDataParallel`` gradients are only averaged across processes for computations that run
    inside the wrapped module's ``forward``, so the wrapped module must be this one, not the bare model.
    ``self(prompt_ids, prompt_mask, completion_ids, completion_mask, **options)`` returns what
    ``completion_logprobs(model, ...)`` returns.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        prompt_ids: torch.Tensor,
        prompt_mask: torch.Tensor,
        completion_ids: torch.Tensor,
        completion_mask: torch.Tensor,
        **options: object,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        ids_and_masks = (prompt_ids, prompt_mask, completion_ids, completion_mask)
        return completion_logprobs(self.model, *ids_and_masks, **options)


def no_grad_logprobs(
    model: torch.nn.Module,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    num_generations: int | None = None,
    micro_batch_size: int | None = None,
    context_mask: torch.Tensor | None = None,
    images: PromptImages | None = None,
    routing: RoutingUse | None = None,
    padding_free: bool | None = None,
) -> torch.Tensor:
    """Log-probs [B, C] for a pass that needs no gradient (reference model, old policy), under
    ``torch.inference_mode`` and in eval mode, ``micro_batch_size`` rows at a time (a multiple of
    ``num_generations`` keeps groups whole so the shared prefix still applies). ``model``: a causal LM, or
    a ``PolicyLogprobs`` module (possibly sharded). ``context_mask``, ``images``, ``routing``,
    ``padding_free``: as for ``completion_logprobs`` (a recorded routing is left in the model's
    ``ExpertRouting`` in row order)."""
    batch = completion_ids.shape[0]
    step = micro_batch_size or batch
    # Called as a module (PolicyLogprobs): a sharded (FSDP) root gathers its weights in its forward hooks.
    run = model if isinstance(model, PolicyLogprobs) else PolicyLogprobs(model)
    was_training = model.training
    run.eval()
    # Weights that DeepSpeed ZeRO-3 gathers during the pass (and may keep) must not become inference
    # tensors, which autograd refuses later: plain no_grad there.
    partitioned = hasattr(next(run.parameters()), "ds_id")
    try:
        with torch.no_grad() if partitioned else torch.inference_mode():
            parts = []
            for s in range(0, batch, step):
                sl = slice(s, s + step)
                rows = completion_ids[sl].shape[0]
                group = num_generations if (num_generations and rows % num_generations == 0) else None
                logps, _ = run(
                    prompt_ids[sl],
                    prompt_mask[sl],
                    completion_ids[sl],
                    completion_mask[sl],
                    temperature=temperature,
                    num_generations=group,
                    padding_free=padding_free,
                    context_mask=None if context_mask is None else context_mask[sl],
                    **({} if images is None else {"images": images[sl]}),
                    **({} if routing is None else {"routing": routing.rows(sl)}),
                )
                parts.append(logps)
            out = torch.cat(parts)
    finally:
        run.train(was_training)
    return out.clone()  # a normal tensor (inference tensors cannot be saved for backward later)


def shared_prefix_pays(prompt_mask: torch.Tensor, num_generations: int, num_completion: int) -> bool:
    """True when running each group's prompt once saves at least ``SHARED_PREFIX_MIN_SAVING`` of the backbone
    tokens: plain = B * (P + C), shared = B/G * P + B * C (P = padded prompt width)."""
    batch, width = prompt_mask.shape
    if num_generations <= 1 or batch % num_generations or width == 0:
        return False
    plain = batch * (width + num_completion)
    shared = batch // num_generations * width + batch * num_completion
    return (plain - shared) >= SHARED_PREFIX_MIN_SAVING * plain


def micro_batch_rows(
    num_rows: int,
    prompt_width: int,
    completion_len: int,
    num_generations: int | None = None,
    token_budget: int = MICRO_BATCH_TOKENS,
) -> int:
    """Rows per gradient micro-batch so that one forward keeps at most ``token_budget`` backbone tokens.

    The activations kept for the backward grow with the backbone tokens of the micro-batch; splitting an
    optimizer step's rows into equal micro-batches (losses divided by their count, as gradient accumulation
    does) gives the same gradient with a fraction of the peak memory, and costs no time as long as each
    micro-batch still has a few thousand tokens. Returns a divisor of ``num_rows``; a multiple of
    ``num_generations`` when that divides ``num_rows`` (whole groups keep the shared-prefix forward).
    """
    group = num_generations if num_generations and num_rows % num_generations == 0 else 1

    def tokens(rows: int) -> int:
        if group > 1 and shared_prefix_pays(torch.ones(rows, prompt_width), group, completion_len):
            return rows // group * prompt_width + rows * completion_len
        return rows * (prompt_width + completion_len)

    candidates = [r for r in range(group, num_rows + 1, group) if num_rows % r == 0]
    fitting = [r for r in candidates if tokens(r) <= token_budget]
    return max(fitting) if fitting else candidates[0]


# ---------------------------------------------------------------------- backbone passes
def _choose_shared(
    model, prompt_ids, prompt_mask, num_generations, num_completion, shared_prefix, real_completion=None
) -> bool:
    """Whether to run each group's prompt once (see ``completion_logprobs``). ``real_completion`` [B, C]: the
    completion tokens a packed call runs; the saving is then counted over real tokens, not padded widths."""
    if shared_prefix is False or not num_generations or num_generations <= 1:
        if shared_prefix:
            raise ValueError("shared_prefix=True needs num_generations > 1")
        return False
    if shared_prefix is None and is_mixture_of_experts(model.config):
        # An expert's matmul rounds differently with the number of tokens it gets, which the prompt call
        # changes with the groups a micro-batch holds: chosen automatically, two passes over the same weights
        # would differ by float rounding (ratio 1 at lr 0 broken, near-tied experts flipped between them;
        # under ZeRO-3 the two calls also break its gradient reduction). Whole rows, unless forced.
        return False
    batch = prompt_ids.shape[0]
    if batch % num_generations:
        if shared_prefix:
            raise ValueError(f"batch {batch} is not a multiple of num_generations {num_generations}")
        return False
    if shared_prefix is None:
        if real_completion is None:
            pays = shared_prefix_pays(prompt_mask, num_generations, num_completion)
        else:  # packed: B * (p + c) real tokens, or B/G * p + B * c
            prompt_tokens, completion_tokens = float(prompt_mask.sum()), float(real_completion.sum())
            saved = prompt_tokens * (1 - 1 / num_generations)
            pays = saved >= SHARED_PREFIX_MIN_SAVING * (prompt_tokens + completion_tokens)
        if not pays:
            return False
    if not full_attention_only(model.config):
        if shared_prefix:
            raise ValueError("shared_prefix=True needs a model whose every layer is full attention")
        return False
    ids = prompt_ids.view(batch // num_generations, num_generations, -1)
    mask = prompt_mask.view(batch // num_generations, num_generations, -1)
    same = bool(((ids == ids[:, :1]) | (mask == 0)).all()) and bool((mask == mask[:, :1]).all())
    if not same and shared_prefix:
        raise ValueError("shared_prefix=True but the rows of a group do not share one prompt")
    return same


def _choose_packed(model, prompt_mask, context, padding_free, padded_inputs=()) -> bool:
    """Whether the backbone runs over packed real tokens: rows laid out as the padded forward takes them
    (prompts left-padded, completions right-padded), a model ``packing_supported`` and no input laid out by
    padded rows (``padded_inputs``: images, routing replay, router logits); chosen automatically when
    padding is at least ``models.packing.PADDING_FREE_MIN_SAVING`` of the padded tokens."""
    if padding_free is False:
        return False
    reasons = packing_obstacles(model.config, padded_inputs)
    if not _padded_as_expected(prompt_mask, context):
        reasons.append("prompts must be left-padded and completions right-padded")
    if reasons:
        if padding_free:
            raise ValueError("padding_free=True cannot run here: " + "; ".join(reasons))
        return False
    if padding_free:
        return True
    padded = prompt_mask.numel() + context.numel()
    return padding_free_pays(padded, float(prompt_mask.sum()) + float(context.sum()))


def _padded_as_expected(prompt_mask: torch.Tensor, context: torch.Tensor) -> bool:
    """Prompts left-padded ([0 .. 0 1 .. 1], at least one token) and completions right-padded."""
    width, num_completion = prompt_mask.shape[1], context.shape[1]
    prompt_lengths, lengths = prompt_mask.sum(dim=1), context.sum(dim=1)  # [B]
    prompt_cols = torch.arange(width, device=prompt_mask.device)
    cols = torch.arange(num_completion, device=context.device)
    left = (prompt_mask.bool() == (prompt_cols[None, :] >= width - prompt_lengths[:, None])).all()
    right = (context.bool() == (cols[None, :] < lengths[:, None])).all()
    return bool(left) and bool(right) and bool((prompt_lengths > 0).all())


def _packed_hidden(model, prompt_ids, prompt_mask, completion_ids, context, group, shared) -> torch.Tensor:
    """The backbone over each row's real tokens packed into one sequence -> [B, C, H] (the padded forward's
    hidden states at the completion positions; padded positions hold some row's state, never scored).

    A row's sequence is its real prompt tokens and its completion tokens but the last (which predicts past
    the completion), positions counting from 0. ``shared``: the prompts of each group of ``group`` rows run
    once, packed, in a first call whose keys/values the completions read (``PackedLayout.on_prefix``).
    """
    decoder = decoder_of(model)
    use_packed_attention(decoder.config)
    width, num_completion = prompt_ids.shape[1], completion_ids.shape[1]
    fed = context[:, 1:].bool()  # [B, C-1] completion token t runs when token t+1 exists
    if not shared:
        keep = torch.cat([prompt_mask.bool(), fed], dim=1)  # [B, P+C-1]
        ids = torch.cat([prompt_ids, completion_ids[:, :-1]], dim=1)  # [B, P+C-1]
        place = keep.long().cumsum(dim=1) - 1  # [B, P+C-1] a kept token's position in its row
        lengths = keep.sum(dim=1)  # [B]
        packed = {"input_ids": ids[keep][None], "position_ids": place[keep][None]}  # [1, T]
        out = decoder(**packed, use_cache=False, **packed_call(lengths))
        hidden = out.last_hidden_state[0]  # [T, H]
        at = (lengths.cumsum(0) - lengths)[:, None] + place  # [B, P+C-1] packed index of each kept token
        return hidden[at[:, width - 1 : width - 1 + num_completion].clamp(min=0)]  # [B, C, H]
    # the prompts, once per group
    p_lengths = prompt_mask[::group].sum(dim=1)  # [B/G]
    with replay_safe_layers(decoder):
        recording, last = packed_prompts(decoder, prompt_ids[::group], prompt_mask[::group])  # last [B/G, H]
        first = last.repeat_interleave(group, dim=0)[:, None]  # [B, 1, H]
        lengths = fed.sum(dim=1)  # [B]
        if num_completion == 1 or int(lengths.sum()) == 0:
            return torch.cat([first, first.new_zeros(first.shape[0], num_completion - 1, first.shape[2])], 1)
        # the completions, on top of their group's prompt (keys read from the packed prompt call, not copied)
        prefix = PrefixCache([(layer.keys, layer.values) for layer in recording.layers])  # [1, kv, T_p, d]
        place = fed.long().cumsum(dim=1) - 1  # [B, C-1]
        owners = torch.arange(len(lengths), device=lengths.device) // group  # [B]
        layout = PackedLayout.on_prefix(p_lengths, owners, lengths)
        out = decoder(
            input_ids=completion_ids[:, :-1][fed][None],
            position_ids=(p_lengths[owners][:, None] + place)[fed][None],
            use_cache=True, **cache_argument(decoder, prefix), **packed_call(lengths, layout),
        )  # fmt: skip
    hidden = out.last_hidden_state[0]  # [T_c, H]
    at = (lengths.cumsum(0) - lengths)[:, None] + place  # [B, C-1]
    return torch.cat([first, hidden[at.clamp(min=0)]], dim=1)  # [B, C, H]


def _full_hidden(
    model, prompt_ids, prompt_mask, completion_ids, completion_mask, router_logits=None, routes=None
) -> torch.Tensor:
    """Backbone over [prompt | completion]; hidden states at positions P-1 .. P+C-2 -> [B, C, H]. With a
    ``router_logits`` list, the backbone's router logits and the attention mask they were routed under are
    appended to it."""
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)  # [B, P+C]
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)  # [B, P+C]
    # Positions count real tokens only, so left padding does not shift a prompt (same as generate()).
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)  # [B, P+C]
    width, num_completion = prompt_ids.shape[1], completion_ids.shape[1]
    # The last completion position predicts past the completion: it never needs to be run.
    routed = {"output_router_logits": True} if router_logits is not None else {}
    with _Routes.call(routes, slice(None), slice(0, -1)) as tape:
        out = decoder_of(model)(
            input_ids=input_ids[:, :-1],
            attention_mask=attention_mask[:, :-1],
            position_ids=position_ids[:, :-1],
            use_cache=False,
            **routed,
        )
    if tape is not None:  # the experts this pass used: [B, P+C-1] tokens, the last position unfed
        (used,) = calls_of(tape)
        routes.keep([used.view(*input_ids[:, :-1].shape, *used.shape[1:])], attention_mask)
    if router_logits is not None:
        router_logits.append((out.router_logits, attention_mask[:, :-1]))
    return out.last_hidden_state[:, width - 1 : width - 1 + num_completion]  # [B, C, H]


def _vision_hidden(model, prompt_ids, prompt_mask, completion_ids, completion_mask, images) -> torch.Tensor:
    """A vision-language model's backbone over [prompt | completion] with the rows' images -> [B, C, H].

    Positions are the model's own (no ``position_ids``: multimodal rotary positions such as Qwen-VL's are
    computed from the ids, the image grid and the attention mask), so the result equals the model's plain
    forward. The vision encoder runs once per distinct prompt (``grpokit.models.vision.image_features``)
    where transformers takes precomputed features; an older release gets every row's pixel values and runs
    its encoder per row (the same numbers, G times the encoder's work).
    """
    backbone = multimodal_backbone(model)
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)[:, :-1]  # [B, P+C-1]
    attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)[:, :-1]  # [B, P+C-1]
    if takes_encoder_outputs(backbone):  # image_grid_thw, image_sizes, ... and the features, once per prompt
        extra = images.row_inputs(input_ids.device, pixels=False)
        extra["mm_encoder_outputs"] = {"image": image_features(backbone, images, input_ids.device)}
    else:  # pixel values of every row: the model's own encoder call
        extra = images.row_inputs(input_ids.device)
    if images.token_type_key is not None:  # per-token modality ids: 1 on image tokens
        extra[images.token_type_key] = token_types(input_ids, model.config)
    out = backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **extra)
    width, num_completion = prompt_ids.shape[1], completion_ids.shape[1]
    return out.last_hidden_state[:, width - 1 : width - 1 + num_completion]  # [B, C, H]


def _shared_prefix_hidden(
    model, prompt_ids, prompt_mask, completion_ids, completion_mask, group, routes=None, router_logits=None
) -> torch.Tensor:
    """Prompt once per group, its keys/values repeated to the G rows, completions on top -> [B, C, H].

    The caches are replay-safe (``grpokit.models.prefix_cache``), so this is exact under gradient
    checkpointing too: a checkpointed layer keeps them instead of dropping the prompt. With a
    ``router_logits`` list (an MoE's load-balancing loss), each layer's router logits of the [B, P+C-1] tokens
    the plain forward routes are appended as it would return them: the prompt's repeated to its G rows
    (``repeat_interleave``: their gradients sum into the one prompt computation), then the completions'.
    """
    decoder = decoder_of(model)
    num_completion = completion_ids.shape[1]
    p_ids, p_mask = prompt_ids[::group], prompt_mask[::group]  # [B/G, P]
    p_pos = (p_mask.cumsum(dim=1) - 1).clamp(min=0)
    width = prompt_ids.shape[1]
    recording = RecordingCache(model.config.get_text_config(decoder=True).num_hidden_layers)
    routed = {"output_router_logits": True} if router_logits is not None else {}
    with replay_safe_layers(decoder):
        # (a group's prompt routes as its first row's did)
        with _Routes.call(routes, slice(None, None, group), slice(0, width)) as prompt_tape:
            out = decoder(
                input_ids=p_ids, attention_mask=p_mask, position_ids=p_pos, use_cache=True,
                **cache_argument(decoder, recording), **routed,
            )  # fmt: skip
        logits = None if router_logits is None else [  # per layer [B, P, E]: each prompt's, to its G rows
            layer.view(*p_ids.shape, -1).repeat_interleave(group, dim=0) for layer in out.router_logits
        ]  # fmt: skip
        first = out.last_hidden_state[:, -1:].repeat_interleave(group, dim=0)  # [B, 1, H] predicts token 0
        used = []
        if prompt_tape is not None:  # [B/G, P] tokens, each group's for its G rows
            (prompt_used,) = calls_of(prompt_tape)
            prompt_used = prompt_used.view(*p_ids.shape, *prompt_used.shape[1:])  # [B/G, P, L, k]
            used.append(prompt_used.repeat_interleave(group, dim=0))
        if num_completion == 1:
            if used:
                routes.keep(used, torch.cat([prompt_mask, completion_mask], dim=1))
            if logits is not None:  # the plain forward routes the prompt only
                router_logits.append((tuple(x.flatten(0, 1) for x in logits), prompt_mask))
            return first
        # Each prompt's keys/values repeated to its G rows; the backward of the repeat sums the G gradients.
        prefix = recording.repeated(group)
        lengths = prompt_mask.sum(dim=1, keepdim=True)  # [B, 1] real prompt tokens
        c_ids, c_mask = completion_ids[:, :-1], completion_mask[:, :-1]  # [B, C-1]
        c_pos = lengths + c_mask.cumsum(dim=1) - 1  # [B, C-1] (only real tokens matter)
        c_pos = torch.maximum(c_pos, lengths)  # keep padded positions in range
        attention_mask = torch.cat([prompt_mask, c_mask], dim=1)  # [B, P+C-1]
        with _Routes.call(routes, slice(None), slice(width, width + num_completion - 1)) as completion_tape:
            out = decoder(
                input_ids=c_ids, attention_mask=attention_mask, position_ids=c_pos, use_cache=True,
                **cache_argument(decoder, prefix), **routed,
            )  # fmt: skip
        if logits is not None:  # per layer [B, P+C-1, E] -> [B * (P+C-1), E], as the plain forward's
            pairs = zip(logits, out.router_logits)
            joined = [torch.cat([p, c.view(*c_ids.shape, -1)], dim=1).flatten(0, 1) for p, c in pairs]
            router_logits.append((tuple(joined), attention_mask))
        if completion_tape is not None:
            (completion_used,) = calls_of(completion_tape)
            used.append(completion_used.view(*c_ids.shape, *completion_used.shape[1:]))
            routes.keep(used, torch.cat([prompt_mask, completion_mask], dim=1))
    return torch.cat([first, out.last_hidden_state], dim=1)  # [B, C, H]


class _Routes:
    """A pass's ``RoutingUse`` on the model's ``ExpertRouting``: per backbone call, the given experts of
    that call's tokens (replayed or compared) and a recording of the experts used."""

    def __init__(self, routing: ExpertRouting, use: RoutingUse) -> None:
        self.routing, self.use = routing, use

    @classmethod
    def of(cls, model: torch.nn.Module, use: RoutingUse | None) -> _Routes | None:
        if use is None:
            return None
        routing = routing_of(model)
        if routing is None:
            raise ValueError(f"routing replay: {type(model).__name__} has no mixture-of-experts routers")
        routing.forget_last()  # this pass's backward recomputes with this pass's routing, or its own
        return cls(routing, use) if use.experts is not None or use.record else None

    @staticmethod
    @contextmanager
    def call(routes: _Routes | None, rows: slice, tokens: slice) -> Iterator[list[list[torch.Tensor]] | None]:
        """Around one backbone call over ``rows`` x ``tokens`` of the batch's [B, P+C] layout; yields the
        recording (or None)."""
        if routes is None:
            yield None
            return
        with ExitStack() as stack:
            given = routes.use.experts
            if given is not None:
                stack.enter_context(routes.routing.replaying(
                    given.experts[rows, tokens], given.recorded[rows, tokens],
                    replay=routes.use.replay, tag=routes.use.tag,
                ))  # fmt: skip
            yield stack.enter_context(routes.routing.recording()) if routes.use.record else None

    def keep(self, used: list[torch.Tensor], attention_mask: torch.Tensor) -> None:
        """The experts the pass used ([B, P+C-1, L, k] in pieces along the tokens) as ``RoutedExperts`` of the
        [B, P+C] layout (the last token unfed), recorded on the attended tokens."""
        experts = torch.cat(used, dim=1)  # [B, P+C-1, L, k]
        batch, _, layers, k = experts.shape
        last = torch.arange(k, device=experts.device, dtype=experts.dtype).expand(batch, 1, layers, k)
        experts = torch.cat([experts, last], dim=1).to(
            storage_dtype(self.routing.num_experts)
        )  # [B, P+C, L, k]
        recorded = attention_mask.bool().clone()
        recorded[:, -1] = False
        self.routing.push_recorded(RoutedExperts(experts, recorded))

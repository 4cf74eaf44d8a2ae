"""The fast sampler: an own sampling loop over a ``transformers`` causal LM, built for GRPO's G-per-prompt
shape.

What makes it fast, compared with ``model.generate`` on the prompts repeated G times:

- each distinct prompt is prefilled **once**; its keys/values are kept once per prompt, and every decode step
  attends over them with one batched matmul for all G samples of the group (no G-fold copy of the prompt
  cache, no G-fold prompt prefill);
- the keys/values of the generated tokens live in **pre-allocated** buffers ([N, kv_heads, max_new, d]),
  written in place (no ``torch.cat`` of the whole cache every step, which dominates ``DynamicCache`` decode);
- the decode step runs the model's own modules (projections, norms, MLP, rotary embedding) without the
  per-call bookkeeping of the ``transformers`` forward (mask building, output capture);
- the logits processors run on float32 ``[N, V]`` rows only, and decoding stops as soon as every row has
  finished.

The shared-prefix decode path ("native") covers the Llama family of decoders (``llama``, ``qwen2``, ``qwen3``,
``mistral`` without a sliding window). Any other causal LM is decoded through its own ``forward`` with a
``transformers`` cache expanded to the G rows ("hf" path): slower, equally exact.

A vision-language model whose language model the native decode supports (LLaVA over a Llama-family
decoder) samples with images: each prompt's prefill runs the model's own multimodal backbone with that
prompt's image inputs (so the vision encoder runs once per prompt, not once per completion as in
``generate``), and the decode, text only, is the native one. Architectures with multimodal rotary positions
(Qwen2-VL, Qwen2.5-VL) or without a native decode (Gemma 3) sample with ``model.generate``.

Sampling is the same in distribution as ``transformers`` ``generate``: the same processors in the same order
(repetition penalty; then, when sampling, temperature, top-k, top-p, min-p) and ``torch.multinomial`` on the
softmax of the processed scores. The reported log-probability of a token is the log-softmax of those processed
scores at that token (with top-k/top-p/min-p it is the log-prob under the truncated distribution actually
sampled from). One deliberate difference: ``generate`` counts the left-padding tokens of a batched
prompt as "already seen" for the repetition penalty (so a row's distribution depends on which other
prompts share its batch); here only real prompt tokens and generated tokens count.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import nn

from grpokit.core import pad_left
from grpokit.models.packing import packed_prompts, packing_obstacles, padding_free_pays
from grpokit.models.parts import cache_argument, decoder_of, model_device, returned_cache
from grpokit.models.routing_replay import routing_of, sampled_rows
from grpokit.models.vision import PromptImages, multimodal_backbone, token_types
from grpokit.rollout.base import GenerationOutput, SamplingParams
from grpokit.rollout.logits import process_logits, sample_token
from grpokit.rollout.native_decode import NativeDecoder, native_supported

__all__ = ["FastSampler"]

STAT_NAMES = ("prefill_rows", "prefill_tokens", "decode_steps", "rows", "decoded_rows")
"""``FastSampler.last_stats``' counters."""


@dataclass
class _Prefill:
    """Result of prefilling the P distinct prompts once."""

    keys: list[torch.Tensor]  # per layer [P, kv, L, d] (after rotary)
    values: list[torch.Tensor]  # per layer [P, kv, L, d]
    pad_bias: torch.Tensor  # [P, 1, 1, L] additive: 0 for real prompt tokens, -inf for left padding
    lengths: torch.Tensor  # [P] real prompt lengths
    last_logits: torch.Tensor  # [P, V] float32
    cache: object  # the transformers cache (hf path only)
    tokens: int  # prompt tokens run through the backbone: P*L padded, the real ones where packed


class FastSampler:
    """Rollout backend (``RolloutBackend``) over a ``transformers`` causal LM.

    Args:
        model: a ``PreTrainedModel`` with a causal LM head; its live weights are used (no copy).
        generator: optional ``torch.Generator`` (on the model's device) for sampling; default: torch's
            global RNG.
        impl: ``"auto"`` (native shared-prefix decode where the architecture is supported, else ``"hf"``),
            ``"native"`` (raise if unsupported) or ``"hf"``.
        prefill_batch_size: prompts prefilled per forward call (bounds prefill activation memory).
        prompts_per_call: prompts whose G samples are decoded together (None: all); the KV cache holds
            that many prompts' samples at a time.
        compile_decode: run the native decode step through ``torch.compile`` (inductor, dynamic shapes;
            compiled once per process on first use, then per new shape set). Native decode only.
        compact: let finished rows leave the decode batch (see ``compact``).
        padding_free: prefill the prompts packed, their real tokens only (see ``padding_free``); None: where
            it can run and padding is at least ``PADDING_FREE_MIN_SAVING`` of the padded prompt tokens.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        generator: torch.Generator | None = None,
        impl: str = "auto",
        prefill_batch_size: int = 16,
        prompts_per_call: int | None = None,
        compile_decode: bool = False,
        compact: bool = True,
        padding_free: bool | None = None,
    ) -> None:
        if impl not in ("auto", "native", "hf"):
            raise ValueError(f"impl must be 'auto', 'native' or 'hf', got {impl!r}")
        self.model = model
        self.generator = generator
        self.prefill_batch_size = prefill_batch_size
        if prompts_per_call is not None and prompts_per_call < 1:
            raise ValueError(f"prompts_per_call must be >= 1, got {prompts_per_call}")
        self.prompts_per_call = prompts_per_call
        supported = native_supported(model)
        if impl == "native" and not supported:
            raise ValueError(f"native decode does not support {type(model).__name__}; use impl='hf'")
        self.impl = "native" if (impl == "auto" and supported) else ("hf" if impl == "auto" else impl)
        if compile_decode and self.impl != "native":
            raise ValueError(
                f"compile_decode compiles the native decode step, which does not support "
                f"{type(model).__name__} (llama, qwen2, qwen3, mistral without a sliding window, qwen2_moe, "
                "qwen3_moe, mixtral)"
            )
        self.compact = compact
        """Whether finished rows leave the decode batch (``_compaction_pays``); False decodes every row until
        the last one finishes (the same tokens, up to float rounding)."""
        obstacles = packing_obstacles(model.config) if self.impl == "native" else ["no native decode"]
        if padding_free and obstacles:
            raise ValueError(
                f"padding_free=True: the fast sampler cannot prefill {type(model).__name__} packed: "
                + "; ".join(obstacles)
            )
        self.padding_free = False if obstacles else padding_free
        """Whether the prefill runs each chunk's prompts packed into one sequence of their real tokens (each
        attending only to itself, positions from 0; ``grpokit.models.packing``) instead of left-padded to the
        longest: True always (not with images), False never, None where padding is at least
        ``PADDING_FREE_MIN_SAVING`` of the padded prompt tokens. Native decode of a model that
        ``packing_supported`` (Llama, Qwen2, Qwen3, Mistral without a sliding window) only; the prompt cache
        is the same up to float rounding, laid out left-padded for the decode."""
        self.accepts_images = self.impl == "native"
        """Whether ``generate`` takes ``images`` (a vision-language model, native decode only)."""
        self.decode_step = compiled_decode_step() if compile_decode else None
        """The compiled ``NativeDecoder.__call__`` (``compile_decode``); None: the decoder is called as is."""
        self.last_stats: dict[str, int] = {}
        """Counters of the last ``generate`` call, summed over its chunks of prompts: prefill_rows (distinct
        prompts run), prefill_tokens (prompt tokens run through the backbone: padded to the longest, or the
        real ones where the prefill is packed), decode_steps (forward calls after the prefill), rows."""

    # ------------------------------------------------------------------ public API
    def generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        num_generations: int,
        params: SamplingParams,
        images: PromptImages | None = None,
    ) -> GenerationOutput:
        """Sample ``num_generations`` completions per prompt; rows k*G .. k*G+G-1 belong to prompt k.
        ``images``: the prompts' image inputs, one row per prompt (``accepts_images``)."""
        if images is not None and not self.accepts_images:
            raise ValueError(
                f"the fast sampler takes images only with its native decode, which does not support "
                f"{type(self.model).__name__}; sample with model.generate (generation_backend='transformers')"
            )
        if images is not None and self.padding_free:
            raise ValueError(
                "padding_free=True: a prefill with images runs left-padded (image inputs are laid out by "
                "padded rows); sample with padding_free=None or False"
            )
        if num_generations < 1:
            raise ValueError("num_generations must be >= 1")
        if params.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("every prompt needs at least one token")
        was_training = self.model.training
        self.model.eval()  # no dropout while sampling
        step = self.prompts_per_call or len(prompt_ids)
        parts, stats = [], dict.fromkeys(STAT_NAMES, 0)
        try:
            with torch.inference_mode():
                for start in range(0, len(prompt_ids), step):
                    chunk = slice(start, start + step)
                    chunk_images = None if images is None else images[chunk]
                    parts.append(self._generate(prompt_ids[chunk], num_generations, params, chunk_images))
                    stats = {name: stats[name] + self.last_stats[name] for name in stats}
        finally:
            self.model.train(was_training)
        self.last_stats = stats
        return _joined(parts)

    # ------------------------------------------------------------------ the loop
    def _generate(
        self,
        prompt_ids: Sequence[Sequence[int]],
        num_generations: int,
        params: SamplingParams,
        images: PromptImages | None = None,
    ) -> GenerationOutput:
        device = model_device(self.model)
        group = num_generations
        vocab = self.model.get_output_embeddings().weight.shape[0]
        routing = routing_of(self.model)  # a mixture-of-experts model: its routers' choices, recorded
        with routing.recording() if routing is not None else nullcontext() as tape:
            out, fed = self._sample(prompt_ids, group, params, images, device, vocab)
        if tape is not None:  # the prefill, then one call per decode step over the rows ``fed``
            lengths = [len(p) for p in prompt_ids]
            completion_lengths = [len(ids) for ids in out.completion_ids]
            out.routed_experts = sampled_rows(
                tape, lengths, max(lengths), group, completion_lengths, routing.num_experts, fed
            )
        return out

    def _sample(
        self,
        prompt_ids: Sequence[Sequence[int]],
        group: int,
        params: SamplingParams,
        images: PromptImages | None,
        device: torch.device,
        vocab: int,
    ) -> tuple[GenerationOutput, list[torch.Tensor]]:
        """The sampling loop: the output, and the rows each decode call ran (in its order)."""
        num_prompts, rows, max_new = len(prompt_ids), len(prompt_ids) * group, params.max_new_tokens
        pre = self._prefill(prompt_ids, device, keep_hf_cache=self.impl == "hf", images=images)
        if self.impl == "native":
            decoder = NativeDecoder(self.model, pre, group, max_new, compiled=self.decode_step is not None)
            step = decoder
            if self.decode_step is not None:  # compile_decode
                step = functools.partial(self.decode_step, decoder)
        else:
            decoder = step = _HFDecoder(self.model, pre, group, max_new)

        seen = None
        if params.repetition_penalty != 1.0:
            seen = torch.zeros(num_prompts, vocab, dtype=torch.bool, device=device)
            for k, p in enumerate(prompt_ids):
                seen[k, torch.as_tensor(list(p), device=device).clamp(max=vocab - 1)] = True
            seen = seen.repeat_interleave(group, dim=0)  # [N, V]

        eos = torch.as_tensor(list(params.eos_token_ids) or [-1], device=device)  # [E]
        tokens = torch.zeros(rows, max_new, dtype=torch.long, device=device)  # [N, max_new]
        logps = torch.zeros(rows, max_new, dtype=torch.float32, device=device)
        lengths = torch.full((rows,), max_new, dtype=torch.long, device=device)
        finished = torch.zeros(rows, dtype=torch.bool, device=device)
        live = torch.arange(rows, device=device)  # [n] the rows in the decode batch (all N at first)
        running = torch.ones(rows, dtype=torch.bool, device=device)  # [n] not finished yet
        logits = pre.last_logits.repeat_interleave(group, dim=0)  # [n, V]
        steps, fed = 0, []  # fed: the rows of each decode call, in the call's order
        for t in range(max_new):
            scores = process_logits(logits.float(), params, seen)  # [n, V]
            if params.do_sample:  # one uniform per row of all N, as if none had left: the same stream
                uniforms = torch.rand(rows, 1, device=device, generator=self.generator)[live]
                next_tok, lse = sample_token(scores, uniforms=uniforms)
            else:
                next_tok, lse = scores.argmax(dim=-1), torch.logsumexp(scores, dim=-1)
            tokens[live, t] = next_tok
            logps[live, t] = scores.gather(1, next_tok[:, None]).squeeze(1) - lse  # log-softmax at the token
            steps = t + 1
            if seen is not None:
                seen.scatter_(1, next_tok[:, None], True)
            hit = torch.isin(next_tok, eos) & running  # [n]
            lengths[live[hit]] = t + 1
            finished[live[hit]] = True
            running = running & ~hit
            still = int(running.sum())  # (the one host sync of a step)
            if t + 1 == max_new or still == 0:
                break
            if self.compact and _compaction_pays(len(running) - still, len(running)):  # finished rows leave
                order = decoder.keep(running, t)  # [n'] old places of the rows that stay
                live, running, next_tok = live[order], running[order], next_tok[order]
                seen = None if seen is None else seen[order]
            logits = step(next_tok, t)  # [n, V]
            fed.append(live)

        self.last_stats = {
            "prefill_rows": num_prompts,
            "prefill_tokens": pre.tokens,
            "decode_steps": steps - 1,
            "rows": rows,
            "decoded_rows": sum(len(f) for f in fed),
        }
        tokens_l = tokens[:, :steps].tolist()
        logps_l = logps[:, :steps].tolist()
        lengths_l = lengths.clamp(max=steps).tolist()
        finished_l = finished.tolist()
        out = GenerationOutput(
            completion_ids=[tokens_l[i][: lengths_l[i]] for i in range(rows)],
            logprobs=[logps_l[i][: lengths_l[i]] for i in range(rows)],
            truncated=[not f for f in finished_l],
        )
        return out, fed

    # ------------------------------------------------------------------ prefill
    def _prefill(
        self,
        prompt_ids: Sequence[Sequence[int]],
        device: torch.device,
        keep_hf_cache: bool,
        images: PromptImages | None = None,
    ) -> _Prefill:
        """Run each distinct prompt once (left-padded, positions counting real tokens only); with ``images``
        (native path) through the model's multimodal backbone with each prompt's image inputs."""
        from transformers import DynamicCache

        lengths = torch.tensor([len(p) for p in prompt_ids], device=device)
        ids, mask = pad_left(prompt_ids, 0, device)  # [P, L] each (padding is masked, its id unused)
        position_ids = (mask.cumsum(dim=1) - 1).clamp(min=0)  # [P, L]
        base = decoder_of(self.model) if images is None else multimodal_backbone(self.model)
        head = self.model.get_output_embeddings()
        if keep_hf_cache:
            # hf path: one forward over all prompts, the cache is expanded to the G rows afterwards.
            cache = DynamicCache(config=self.model.config)
            out = self.model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=position_ids,
                **cache_argument(self.model, cache),
                use_cache=True,
                logits_to_keep=1,
            )
            logits, cache = out.logits[:, -1].float(), returned_cache(out, cache)
            return _Prefill([], [], _pad_bias(mask), lengths, logits, cache, mask.numel())
        if images is None and self._prefills_packed(mask):
            return self._packed_prefill(ids, mask, lengths)
        keys: list[list[torch.Tensor]] = []
        values: list[list[torch.Tensor]] = []
        last = []
        for s in range(0, len(prompt_ids), self.prefill_batch_size):
            sl = slice(s, s + self.prefill_batch_size)
            cache = DynamicCache(config=self.model.config)
            out = base(
                input_ids=ids[sl],
                attention_mask=mask[sl],
                position_ids=position_ids[sl],
                **cache_argument(base, cache),
                use_cache=True,
                **_image_inputs(images, sl, ids[sl], self.model.config, device),
            )
            cache = returned_cache(out, cache)
            last.append(head(out.last_hidden_state[:, -1]).float())  # [p, V]
            layers = cache.layers
            keys.append([layer.keys for layer in layers])
            values.append([layer.values for layer in layers])
        n_layers = len(keys[0])
        pad = (mask == 0)[:, None, :, None]  # [P, 1, L, 1]
        # Zero the keys/values of left-padding positions: they are masked out, but a non-finite value there
        # would still poison the attention matmul (0 * nan).
        k_all = [torch.cat([chunk[i] for chunk in keys]).masked_fill(pad, 0.0) for i in range(n_layers)]
        v_all = [torch.cat([chunk[i] for chunk in values]).masked_fill(pad, 0.0) for i in range(n_layers)]
        return _Prefill(k_all, v_all, _pad_bias(mask), lengths, torch.cat(last), None, mask.numel())

    def _prefills_packed(self, mask: torch.Tensor) -> bool:
        """Whether prompts of ``mask`` [P, L] (left-padded) are prefilled packed (``padding_free``)."""
        if self.padding_free is None:
            return padding_free_pays(mask.numel(), float(mask.sum()))
        return self.padding_free

    def _packed_prefill(self, ids: torch.Tensor, mask: torch.Tensor, lengths: torch.Tensor) -> _Prefill:
        """The prefill over the prompts' real tokens only (``ids``, ``mask`` [P, L] as the padded prefill has
        them, ``lengths`` [P]): ``prefill_batch_size`` prompts per backbone call, packed into one sequence,
        each attending only to itself (``packed_prompts``). Their keys/values are laid out as the padded
        prefill's ([P, kv, L, d] per layer, left-padded, zeros at the padding), so that the decode reads them
        the same way."""
        base = decoder_of(self.model)
        head = self.model.get_output_embeddings()
        real = mask.bool()  # [P, L]
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        last = []
        for s in range(0, len(ids), self.prefill_batch_size):
            sl = slice(s, s + self.prefill_batch_size)
            recording, hidden = packed_prompts(base, ids[sl], mask[sl])
            last.append(head(hidden).float())  # [p, V]
            for i, layer in enumerate(recording.layers):  # keys/values [1, kv, T, d]
                if len(keys) == i:  # [P, kv, L, d], each in its own dtype (under autocast the keys, past
                    _, kv_heads, _, head_dim = layer.keys.shape  # the rotary, may be float32, the values not)
                    shape = (len(ids), kv_heads, ids.shape[1], head_dim)
                    keys.append(layer.keys.new_zeros(shape))
                    values.append(layer.values.new_zeros(shape))
                keys[i][sl].transpose(1, 2)[real[sl]] = layer.keys[0].transpose(0, 1)  # [T, kv, d]
                values[i][sl].transpose(1, 2)[real[sl]] = layer.values[0].transpose(0, 1)
        return _Prefill(keys, values, _pad_bias(mask), lengths, torch.cat(last), None, int(lengths.sum()))


# ---------------------------------------------------------------------- decoders
class _HFDecoder:
    """Generic decode step: the model's own forward with its cache expanded to the G rows of each prompt."""

    def __init__(self, model: nn.Module, pre: _Prefill, group: int, max_new: int) -> None:
        self.model = model
        self.cache = pre.cache
        self.cache.batch_repeat_interleave(group)
        self.positions = pre.lengths.repeat_interleave(group)[:, None]  # [N, 1]
        real = (pre.pad_bias[:, 0, 0] == 0).long()  # [P, L]
        self.mask = torch.cat(
            [
                real.repeat_interleave(group, dim=0),
                torch.ones(real.shape[0] * group, max_new, dtype=torch.long, device=real.device),
            ],
            dim=1,
        )  # [N, L + max_new]
        self.prompt_width = real.shape[1]

    def keep(self, running: torch.Tensor, t: int) -> torch.Tensor:
        """Only the ``running`` [n] rows stay in the decode batch (see ``NativeDecoder.keep``); returns their
        old places, in order."""
        order = running.nonzero().squeeze(1)  # [n']
        self.cache.batch_select_indices(order)
        self.positions, self.mask = self.positions[order], self.mask[order]
        return order

    def __call__(self, tokens: torch.Tensor, t: int) -> torch.Tensor:
        out = self.model(
            input_ids=tokens[:, None],
            attention_mask=self.mask[:, : self.prompt_width + t + 1],
            position_ids=self.positions + t,
            **cache_argument(self.model, self.cache),
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1].float()


# ---------------------------------------------------------------------- helpers
def _image_inputs(
    images: PromptImages | None, prompts: slice, ids: torch.Tensor, config: object, device: torch.device
) -> dict[str, torch.Tensor]:
    """The multimodal backbone's image inputs for ``prompts`` (one row each), ids [p, L]: their image tensors
    and, where the architecture reads one, the per-token modality ids."""
    if images is None:
        return {}
    chunk = images[prompts]
    inputs = chunk.row_inputs(device)
    if chunk.token_type_key is not None:
        inputs[chunk.token_type_key] = token_types(ids, config)
    return inputs


@functools.cache
def compiled_decode_step() -> Callable[[NativeDecoder, torch.Tensor, int], torch.Tensor]:
    """``NativeDecoder.__call__`` through ``torch.compile`` (inductor, dynamic shapes), made once per
    process: every sampler shares its compiled graphs, so a new sampler (a new step's) does not compile
    again. Two graphs for a call: the first decode position and every later one
    (``tests/rollout/test_compile_decode.py``); rows leaving the batch add one, a new ``max_new_tokens``
    (the key buffers' length) compiles again."""
    return torch.compile(NativeDecoder.__call__, dynamic=True)


def _joined(parts: list[GenerationOutput]) -> GenerationOutput:
    """One output from the outputs of consecutive prompt chunks (rows stay grouped per prompt)."""
    if len(parts) == 1:
        return parts[0]
    return GenerationOutput(
        completion_ids=[row for part in parts for row in part.completion_ids],
        logprobs=[row for part in parts for row in part.logprobs or []],
        truncated=[flag for part in parts for flag in part.truncated],
        routed_experts=None
        if any(p.routed_experts is None for p in parts)
        else [row for part in parts for row in part.routed_experts],
    )


COMPACT_FRACTION = 16
"""Finished rows leave the decode batch once they are at least 1/16 of it (and at least one): each
compaction copies the generated keys/values of as many rows as left, so it waits for a few."""


def _compaction_pays(finished: int, rows: int) -> bool:
    """Whether enough of the decode batch's ``rows`` have ``finished`` to compact it now."""
    return finished >= max(1, rows // COMPACT_FRACTION)


def _pad_bias(mask: torch.Tensor) -> torch.Tensor:
    """[P, L] 0/1 mask -> [P, 1, 1, L] additive float32 bias (0 keep, -inf drop)."""
    bias = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    return bias.masked_fill(mask == 0, float("-inf"))[:, None, None, :]

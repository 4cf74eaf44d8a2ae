"""Turn sessions: the generation side of multi-turn episodes (``grpokit.envs.episodes`` drives them).

A session holds one growing context per episode (prompt, then the policy's turns and the environment's
observations) and offers two operations:

- ``act(rows, params, limits)``: every listed episode generates its next policy turn (until EOS or its limit
  of new tokens); returns the tokens, their sampling log-probs and whether EOS ended the turn;
- ``observe(tokens)``: append tokens (an observation) to episodes' contexts.

Two implementations:

- :class:`CachedTurnSession` (the fast sampler's model): every distinct prompt is prefilled once and its
  key/value cache repeated to its episodes; each decode step and each observation is appended to that cache
  in place, so no context is ever run twice. Episodes advance in lock step: a row whose turn has ended
  leaves a masked slot while the others decode, and observations of different lengths are left-padded
  into one forward, with masked slots. Positions count real tokens only, so the values equal one forward
  over the episode's tokens (``tests/rollout/test_turns.py``).
- :class:`ReprefillSession` (any ``RolloutBackend``: ``transformers`` ``generate``, a user's backend): each
  turn generates from the whole context again, one completion per episode. Exact, and the reference the
  cached session is checked against; it pays a prefill of the whole context every turn.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Protocol

import torch

from grpokit.core import pad_left
from grpokit.models.parts import cache_argument, model_device, returned_cache
from grpokit.rollout.base import RolloutBackend, SamplingParams
from grpokit.rollout.logits import process_logits, sample_token

__all__ = ["CachedTurnSession", "ReprefillSession", "TurnOutput", "TurnSession", "open_session"]

TurnOutput = tuple[list[int], list[float], bool]
"""One episode's turn: (tokens, their sampling log-probs, True when EOS ended it)."""


class TurnSession(Protocol):
    """Growing contexts of episodes 0..N-1 (see the module docstring)."""

    def act(
        self, rows: Sequence[int], params: SamplingParams, limits: Sequence[int], waiting: Sequence[int] = ()
    ) -> list[TurnOutput]:
        """Episodes ``rows`` each generate one policy turn of at most ``limits[i]`` tokens; ``waiting``
        episodes go on without acting (a game's other seats); every other episode has ended."""
        ...

    def observe(self, tokens: Mapping[int, Sequence[int]], waiting: Sequence[int] = ()) -> None:
        """Append ``tokens[row]`` to each listed episode's context (after its last turn); ``waiting``
        episodes go on unchanged, every other episode has ended."""
        ...


def open_session(
    backend: RolloutBackend, prompt_ids: Sequence[Sequence[int]], group_sizes: Sequence[int]
) -> TurnSession:
    """The cached session on a fast sampler's model, the re-prefilling one on any other backend.
    Episodes are numbered in group order: ``group_sizes[k]`` episodes start from ``prompt_ids[k]``."""
    from grpokit.rollout.fast import FastSampler

    if isinstance(backend, FastSampler):
        return CachedTurnSession(backend.model, prompt_ids, group_sizes, generator=backend.generator)
    return ReprefillSession(backend, prompt_ids, group_sizes)


class ReprefillSession:
    """Every turn is one ``backend.generate`` call over the episodes' whole contexts (one sample each)."""

    def __init__(
        self, backend: RolloutBackend, prompt_ids: Sequence[Sequence[int]], group_sizes: Sequence[int]
    ) -> None:
        self.backend = backend
        self.contexts = [list(p) for p, size in zip(prompt_ids, group_sizes) for _ in range(size)]

    def act(
        self, rows: Sequence[int], params: SamplingParams, limits: Sequence[int], waiting: Sequence[int] = ()
    ) -> list[TurnOutput]:
        call = dataclasses.replace(params, max_new_tokens=max(limits))
        out = self.backend.generate([self.contexts[r] for r in rows], 1, call)
        eos = set(params.eos_token_ids)
        turns = []
        for i, (row, limit) in enumerate(zip(rows, limits)):
            # a prefix of a longer sample is a sample of the shorter limit: tokens are drawn one by one
            tokens = out.completion_ids[i][:limit]
            logprobs = (out.logprobs[i] if out.logprobs is not None else [0.0] * len(tokens))[:limit]
            self.contexts[row] += tokens
            turns.append((tokens, list(logprobs), bool(tokens) and tokens[-1] in eos))
        return turns

    def observe(self, tokens: Mapping[int, Sequence[int]], waiting: Sequence[int] = ()) -> None:
        for row, ids in tokens.items():
            self.contexts[row] += list(ids)


class CachedTurnSession:
    """Episodes on one ``transformers`` key/value cache, never re-prefilled (module docstring).

    Cache rows are the live episodes; ``act`` on fewer episodes drops the others' rows first (an episode
    that is not asked to act again has ended). The sampled token that ends a turn is fed with the next
    observation (a turn's last token needs no forward unless something follows it).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        prompt_ids: Sequence[Sequence[int]],
        group_sizes: Sequence[int],
        *,
        generator: torch.Generator | None = None,
    ) -> None:
        from transformers import DynamicCache

        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("every prompt needs at least one token")
        self.model, self.generator = model, generator
        self.device = model_device(model)
        self.vocab = model.get_output_embeddings().weight.shape[0]
        ids, mask = pad_left(prompt_ids, 0, self.device)  # [P, L]
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        self.cache = DynamicCache(config=model.config)
        with torch.inference_mode(), _eval_mode(model):
            out = model(
                input_ids=ids, attention_mask=mask, position_ids=positions,
                use_cache=True, logits_to_keep=1, **cache_argument(model, self.cache),
            )  # fmt: skip
        self.cache = returned_cache(out, self.cache)
        repeat = torch.repeat_interleave(
            torch.arange(len(prompt_ids), device=self.device),
            torch.as_tensor(list(group_sizes), device=self.device),
        )  # [N] the prompt of each episode
        self.cache.batch_select_indices(repeat)
        self.rows = list(range(int(repeat.numel())))  # episode of each cache row
        self.mask = mask[repeat]  # [N, T] 1 on real tokens, 0 on padding and masked slots
        self.positions = mask.sum(dim=1)[repeat]  # [N] next position: real tokens so far
        self.logits = out.logits[:, -1].float()[repeat]  # [N, V] next-token logits
        self.pending: list[int | None] = [None] * len(self.rows)  # a turn's last token, not yet fed
        self.seen = torch.zeros(len(self.rows), self.vocab, dtype=torch.bool, device=self.device)
        for row, k in enumerate(repeat.tolist()):
            self.seen[
                row, torch.as_tensor(list(prompt_ids[k]), device=self.device).clamp(max=self.vocab - 1)
            ] = True

    # ------------------------------------------------------------------ act
    def act(
        self, rows: Sequence[int], params: SamplingParams, limits: Sequence[int], waiting: Sequence[int] = ()
    ) -> list[TurnOutput]:
        self._keep([*rows, *waiting])
        acting = set(rows)
        if any(p is not None for p, row in zip(self.pending, self.rows) if row in acting):
            raise RuntimeError("observe() must follow a turn before the next act()")
        n = len(self.rows)
        by_row = dict(zip(rows, limits))
        limit = torch.as_tensor([by_row.get(r, 0) for r in self.rows], device=self.device)  # [n] (0: waits)
        eos = torch.as_tensor(list(params.eos_token_ids) or [-1], device=self.device)
        tokens: list[torch.Tensor] = []
        logps: list[torch.Tensor] = []
        active = limit > 0  # [n] a waiting row takes masked slots and keeps its next-token logits
        lengths = torch.zeros(n, dtype=torch.long, device=self.device)
        ended = torch.zeros(n, dtype=torch.bool, device=self.device)
        with torch.inference_mode(), _eval_mode(self.model):
            for _ in range(int(limit.max())):
                scores = process_logits(self.logits, params, self.seen)  # [n, V]
                if params.do_sample:
                    token, lse = sample_token(scores, self.generator)
                else:
                    token, lse = scores.argmax(dim=-1), torch.logsumexp(scores, dim=-1)
                tokens.append(token)
                logps.append(scores.gather(1, token[:, None]).squeeze(1) - lse)
                lengths += active.long()
                live = active.nonzero().squeeze(1)
                self.seen[live, token[live]] = True
                hit = torch.isin(token, eos) & active
                ended |= hit
                active &= ~hit & (lengths < limit)
                if not bool(active.any()):
                    break
                logits = self._feed(token[:, None], active[:, None])
                # a waiting row keeps its logits (a row whose turn ended gets new ones with its observation)
                self.logits = torch.where(active[:, None], logits, self.logits) if waiting else logits
        steps_tokens = torch.stack(tokens, dim=1).tolist()  # [n, steps]
        steps_logps = torch.stack(logps, dim=1).tolist()
        out: dict[int, TurnOutput] = {}
        for i, row in enumerate(self.rows):
            if row not in acting:
                continue
            size = int(lengths[i])
            self.pending[i] = steps_tokens[i][size - 1]
            out[row] = (steps_tokens[i][:size], steps_logps[i][:size], bool(ended[i]))
        return [out[row] for row in rows]

    # ------------------------------------------------------------------ observe
    def observe(self, tokens: Mapping[int, Sequence[int]], waiting: Sequence[int] = ()) -> None:
        """The episodes in ``tokens`` and ``waiting`` go on (the others have ended and are dropped): feed
        each listed one's pending turn token and its observation ``tokens[row]`` (may be empty) in one
        forward, left-padded so that every row's last real token is the block's last slot; a waiting
        episode keeps its pending token (it is fed with that episode's next observation)."""
        self._keep([*tokens, *waiting])
        feeds = []
        for i, row in enumerate(self.rows):
            pending = [] if self.pending[i] is None or row not in tokens else [self.pending[i]]
            feeds.append(pending + list(tokens.get(row, [])))
        if not any(feeds):
            return
        if any(not f for f, row in zip(feeds, self.rows) if row in tokens):
            raise RuntimeError("observe(): an episode with nothing to feed has no next-token logits")
        width = max(len(f) for f in feeds)
        ids = torch.zeros(len(feeds), width, dtype=torch.long, device=self.device)
        real = torch.zeros(len(feeds), width, dtype=torch.bool, device=self.device)
        for i, feed in enumerate(feeds):
            ids[i, width - len(feed) :] = torch.as_tensor(feed, device=self.device)
            real[i, width - len(feed) :] = True
            self.seen[i, ids[i, width - len(feed) :].clamp(max=self.vocab - 1)] = True
        with torch.inference_mode(), _eval_mode(self.model):
            logits = self._feed(ids, real)
        if waiting:  # a waiting row's logits are kept
            fed = torch.as_tensor([row in tokens for row in self.rows], device=self.device)  # [n]
            logits = torch.where(fed[:, None], logits, self.logits)
        self.logits = logits
        for i, row in enumerate(self.rows):
            if row in tokens:
                self.pending[i] = None

    # ------------------------------------------------------------------ helpers
    def _feed(self, ids: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        """Append ids [n, w] to the cache; ``real`` [n, w] marks the slots attended to from now on (each row's
        real slots are a suffix of the block). Returns the logits at the block's last slot [n, V]."""
        offsets = (real.long().cumsum(dim=1) - 1).clamp(min=0)  # [n, w] index among the row's real slots
        positions = self.positions[:, None] + offsets
        self.mask = torch.cat([self.mask, real.long()], dim=1)
        out = self.model(
            input_ids=ids, attention_mask=self.mask, position_ids=positions,
            use_cache=True, logits_to_keep=1, **cache_argument(self.model, self.cache),
        )  # fmt: skip
        self.cache = returned_cache(out, self.cache)
        self.positions = self.positions + real.long().sum(dim=1)
        return out.logits[:, -1].float()

    def _keep(self, rows: Sequence[int]) -> None:
        """Drop the cache rows of episodes not in ``rows`` (they have ended)."""
        keep = [i for i, row in enumerate(self.rows) if row in set(rows)]
        missing = set(rows) - set(self.rows)
        if missing:
            raise ValueError(f"episodes {sorted(missing)} have ended or do not exist")
        if len(keep) == len(self.rows):
            return
        index = torch.as_tensor(keep, dtype=torch.long, device=self.device)
        self.cache.batch_select_indices(index)
        self.mask, self.positions = self.mask[index], self.positions[index]
        self.logits, self.seen = self.logits[index], self.seen[index]
        self.rows = [self.rows[i] for i in keep]
        self.pending = [self.pending[i] for i in keep]


class _eval_mode:
    """No dropout while sampling; the model's mode restored afterwards."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def __enter__(self) -> None:
        self.was_training = self.model.training
        self.model.eval()

    def __exit__(self, *exc: object) -> None:
        self.model.train(self.was_training)

"""Evaluate any causal LM on any prompt rows, graded by any reward functions and/or an answer extractor:
what ``grpokit eval`` runs.

Two steps, usable apart:

* :func:`generate_completions`: ``k`` completions per prompt through a rollout backend
  (:mod:`grpokit.rollout`: the fast sampler where it supports the model, else ``model.generate``), the
  prompts encoded exactly as training encodes them (``grpokit.data.chat.encode_prompt``: chat template
  with ``chat_template_kwargs`` for message lists, cut from the left to ``max_prompt_length``);
* :func:`grade_completions`: rewards (:func:`grpokit.rewards.score_completions`, the weighted sum of
  :func:`grpokit.core.combine_rewards` with :func:`grpokit.rewards.reward_weights`), correctness against a
  threshold, and the sampling metrics of :mod:`grpokit.eval.metrics`.

:func:`evaluate_model` does both. Definitions of every key it returns: :func:`grade_completions` and
docs/evaluation.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
from tqdm.auto import tqdm

from grpokit.data.integrity import InputError
from grpokit.envs.base import environment_reward
from grpokit.envs.episodes import EpisodeRunner
from grpokit.eval.evaluate import stop_token_ids
from grpokit.eval.grading import EvalCompletions, grade_completions, resolve_extractor, validate_grading
from grpokit.models.loading import pad_token_id
from grpokit.rewards.extract import Extractor
from grpokit.rewards.registry import resolve_rewards
from grpokit.rollout import RolloutBackend, SamplingParams, make_backend, resolve_backend_name
from grpokit.rollout.base import GenerationOutput

__all__ = ["evaluate_model", "generate_completions"]


@torch.no_grad()
def generate_completions(
    model: Any,
    tokenizer: Any,
    rows: Sequence[Mapping[str, Any]],
    *,
    num_samples: int = 1,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    max_new_tokens: int = 256,
    max_prompt_length: int | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
    generation_backend: str | RolloutBackend = "auto",
    batch_size: int = 64,
    seed: int = 0,
    progress: bool = False,
    episodes: EpisodeRunner | None = None,
) -> EvalCompletions:
    """``num_samples`` completions for each row's ``prompt``.

    Prompts are encoded as in training (``grpokit.data.chat.encode_prompt``). Decoding: ``temperature
    == 0`` is greedy (``SamplingParams(do_sample=False)``: argmax, no temperature/top-p/top-k); otherwise
    sampling with ``temperature``, ``top_p`` and ``top_k`` (0 = off), reproducible from ``seed`` (torch's
    RNG is forked, so the caller's random state is untouched). A completion stops at the tokenizer's EOS or
    any EOS id of the model's generation config. ``generation_backend``: ``auto`` (the fast sampler where
    :func:`grpokit.rollout.resolve_backend_name` says it supports the model, else ``transformers``),
    ``fast``, ``transformers``, or a :class:`~grpokit.rollout.RolloutBackend` instance. ``batch_size``
    prompts (each with all its samples) go to the backend per call; ``progress`` shows a bar over prompts.
    ``episodes``: multi-turn episodes in an environment instead of single completions (each completion is
    an episode's transcript; its columns, such as ``env_reward``, are kept for grading).
    ``tokenizer`` may be a vision-language model's processor: the rows' images then go with their prompts
    (``grpokit.models.vision.encode_rows``, as training encodes them), and image placeholders are never
    drawn.
    """
    # The one encoding of prompts; imported here so that importing grpokit.eval loads no trainer.
    from grpokit.data.chat import encode_prompt
    from grpokit.models.vision import encode_rows, is_processor, placeholder_token_ids

    processor = tokenizer if is_processor(tokenizer) else None
    if processor is not None:
        if episodes is not None:
            raise InputError("episodes with a vision-language model's images are not supported")
        tokenizer = processor.tokenizer

    if isinstance(generation_backend, str):
        name = resolve_backend_name(generation_backend, model)
        backend = make_backend(name, model)
    else:
        name, backend = type(generation_backend).__name__, generation_backend
    if processor is not None and not getattr(backend, "accepts_images", False):
        raise InputError(
            f"generation_backend={name!r} takes no images for {type(model).__name__}; a vision-language "
            "model generates with generation_backend='transformers' (or 'auto'; 'fast' for LLaVA-style "
            "models)"
        )
    params = SamplingParams(
        max_new_tokens=max_new_tokens,
        temperature=temperature if temperature > 0 else 1.0,
        top_p=top_p,
        top_k=top_k,
        do_sample=temperature > 0,
        eos_token_ids=tuple(stop_token_ids(model, tokenizer)),
        pad_token_id=pad_token_id(tokenizer),
        suppress_token_ids=placeholder_token_ids(model.config) if processor is not None else (),
    )
    if episodes is not None:  # the environment's tools reach the chat template
        chat_template_kwargs = {**episodes.template_kwargs, **(chat_template_kwargs or {})}
    device = next(model.parameters()).device
    result = EvalCompletions([], [], [], backend=name, columns=[] if episodes is not None else None)
    bar = tqdm(total=len(rows), desc="eval", unit="prompt", disable=not progress)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), bar:
        torch.manual_seed(seed)
        for start in range(0, len(rows), max(1, batch_size)):
            chunk = rows[start : start + max(1, batch_size)]
            images = None  # the prompts' image inputs (a vision-language model), one row per prompt
            if processor is not None:
                prompt_ids, images = encode_rows(
                    processor, chunk, [1] * len(chunk), "eval", first=start,
                    max_prompt_length=max_prompt_length, chat_template_kwargs=chat_template_kwargs,
                )  # fmt: skip
            else:
                prompt_ids = [
                    encode_prompt(row["prompt"], tokenizer, max_prompt_length, chat_template_kwargs)
                    for row in chunk
                ]
            columns = None
            if images is not None:
                out = backend.generate(prompt_ids, num_samples, params, images=images)
            elif episodes is None:
                out = backend.generate(prompt_ids, num_samples, params)
            else:
                out, columns = run_episodes(episodes, backend, chunk, prompt_ids, num_samples, params)
            texts = tokenizer.batch_decode(out.completion_ids, skip_special_tokens=True)
            flags = out.truncated or [False] * len(texts)
            for i in range(len(chunk)):
                group = slice(i * num_samples, (i + 1) * num_samples)
                if columns is not None:
                    result.columns.append(columns[group])
                result.texts.append(texts[group])
                result.token_ids.append([list(ids) for ids in out.completion_ids[group]])
                result.truncated.append(list(flags[group]))
            bar.update(len(chunk))
    return result


def run_episodes(
    runner: EpisodeRunner,
    backend: RolloutBackend,
    rows: Sequence[Mapping[str, Any]],
    prompt_ids: list[list[int]],
    num_samples: int,
    params: SamplingParams,
) -> tuple[GenerationOutput, list[dict[str, Any]]]:
    """``num_samples`` episodes per row: their completions and, per episode, its columns."""
    from grpokit.envs.episodes import as_generation_output, episode_columns
    from grpokit.envs.turns import open_session

    session = open_session(backend, prompt_ids, [num_samples] * len(prompt_ids))
    done = runner.run(session, [dict(row) for row in rows for _ in range(num_samples)], params)
    return as_generation_output(done), episode_columns(done)


def evaluate_model(
    model: Any,
    tokenizer: Any,
    rows: Iterable[Mapping[str, Any]],
    *,
    reward_funcs: Sequence[Any] = (),
    reward_weights: Sequence[float] | None = None,
    answer_extractor: str | Extractor | None = None,
    correct_threshold: float = 1.0,
    pass_k: Sequence[int] = (),
    num_samples: int = 1,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    max_new_tokens: int = 256,
    max_prompt_length: int | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
    generation_backend: str | RolloutBackend = "auto",
    batch_size: int = 64,
    seed: int = 0,
    per_example: bool = False,
    progress: bool = False,
    episodes: EpisodeRunner | None = None,
) -> dict[str, Any]:
    """Generate for every row and grade: :func:`generate_completions` then :func:`grade_completions` (whose
    docstring defines every returned key).

    ``rows``: dicts with a ``prompt`` (a string, or chat messages rendered with the tokenizer's chat
    template and ``chat_template_kwargs``) and any other columns the reward functions read (``solution``
    for answer grading and ``maj@k``). ``reward_funcs``: reward specifications as training takes them
    (callables, built-in names such as ``accuracy``, ``module.function`` paths, reward-model directories;
    :func:`grpokit.rewards.resolve_rewards`, reward models moved to the model's device).
    ``answer_extractor``: see :func:`resolve_extractor`. Everything is validated before generation
    (:func:`validate_grading`). ``episodes``: grade multi-turn episodes (``grpokit.envs.episodes``);
    without reward functions the environment's own reward grades them (a solve rate)."""
    rows = [dict(row) for row in rows]
    if episodes is not None and not reward_funcs:
        reward_funcs = [environment_reward]
    try:
        funcs = resolve_rewards(list(reward_funcs), allow_empty=True)
    except ValueError as error:
        raise ValueError(f"reward_funcs: {error}") from error
    extractor = resolve_extractor(answer_extractor)
    validate_grading(
        rows,
        num_reward_funcs=len(funcs),
        extractor=extractor,
        num_samples=num_samples,
        temperature=temperature,
        reward_weights=reward_weights,
        pass_k=pass_k,
    )
    funcs = resolve_rewards(funcs, device=next(model.parameters()).device, allow_empty=True)  # RMs to device
    completions = generate_completions(
        model,
        tokenizer,
        rows,
        num_samples=num_samples,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        max_new_tokens=max_new_tokens,
        max_prompt_length=max_prompt_length,
        chat_template_kwargs=chat_template_kwargs,
        generation_backend=generation_backend,
        batch_size=batch_size,
        seed=seed,
        progress=progress,
        episodes=episodes,
    )
    result = grade_completions(
        rows,
        completions,
        reward_funcs=funcs,
        reward_weights=reward_weights,
        answer_extractor=extractor,
        correct_threshold=correct_threshold,
        pass_k=pass_k,
        per_example=per_example,
    )
    if completions.columns is not None:
        result.update(episode_summary([c for per_row in completions.columns for c in per_row]))
    return {"temperature": temperature, **result}


def episode_summary(columns: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Over all episodes: ``env/turns`` and ``env/done`` (means), and the mean per episode of every
    ``env_info`` counter (``env/tool_calls``, ``env/moves``, ...)."""
    n = max(1, len(columns))
    out = {
        "env/turns": sum(len(c["env_actions"]) for c in columns) / n,
        "env/done": sum(bool(c["env_done"]) for c in columns) / n,
    }
    for key in sorted({k for c in columns for k in c["env_info"]}):
        out[f"env/{key}"] = sum(c["env_info"].get(key, 0) for c in columns) / n
    return out

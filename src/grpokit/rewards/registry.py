"""Turn a reward specification (a callable, a built-in name, an import path, a model directory) into a
reward function: what ``GRPOTrainer(reward_funcs=[...])`` and recipes' ``reward_funcs:`` lists accept."""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

from grpokit.data.integrity import InputError, check_model_dir
from grpokit.rewards.accuracy import accuracy_reward, make_accuracy_reward
from grpokit.rewards.base import RewardFunc
from grpokit.rewards.code import code_execution_reward, make_code_execution_reward
from grpokit.rewards.format import (
    ANSWER_TAG_PATTERN,
    THINK_PATTERN,
    answer_tag_format_reward,
    make_format_reward,
    make_tag_count_reward,
    tag_count_reward,
    think_format_reward,
)
from grpokit.rewards.length import cosine_scaled_reward, repetition_penalty_reward, soft_overlong_punishment


def _think_format(**kwargs: Any) -> RewardFunc:
    return make_format_reward(**{"pattern": THINK_PATTERN, "name": "think_format_reward", **kwargs})


def _answer_format(**kwargs: Any) -> RewardFunc:
    return make_format_reward(**{"pattern": ANSWER_TAG_PATTERN, "name": "answer_tag_format_reward", **kwargs})


BUILTIN_REWARDS: dict[str, tuple[RewardFunc | None, Callable[..., RewardFunc]]] = {
    "accuracy": (accuracy_reward, make_accuracy_reward),
    "think_format": (think_format_reward, _think_format),
    "answer_format": (answer_tag_format_reward, _answer_format),
    "format": (None, make_format_reward),
    "tag_count": (tag_count_reward, make_tag_count_reward),
    "soft_overlong_punishment": (None, soft_overlong_punishment),
    "cosine_scaled": (None, cosine_scaled_reward),
    "repetition_penalty": (None, repetition_penalty_reward),
    "code_execution": (code_execution_reward, make_code_execution_reward),
}
"""name -> (default instance, or None when the factory must be called; factory taking keyword arguments)."""
_ALIASES = {
    "accuracy_reward": "accuracy",
    "think_format_reward": "think_format",
    "answer_tag_format_reward": "answer_format",
    "answer_tag_format": "answer_format",
    "tag_count_reward": "tag_count",
    "cosine_scaled_reward": "cosine_scaled",
    "repetition_penalty_reward": "repetition_penalty",
    "code_execution_reward": "code_execution",
}
_NEEDS_ARGUMENTS = {"soft_overlong_punishment", "format"}


def _builtin(name: str, kwargs: dict[str, Any]) -> RewardFunc:
    instance, factory = BUILTIN_REWARDS[name]
    if not kwargs and name in _NEEDS_ARGUMENTS:
        raise InputError(f"built-in reward {name!r} needs arguments: resolve_reward({name!r}, **kwargs)")
    return factory(**kwargs) if kwargs or instance is None else instance


def _with_run_lengths(spec: Any, max_completion_length: int) -> Any:
    """``soft_overlong_punishment`` (a name, or a mapping missing the lengths) with the run's lengths."""
    options = dict(spec) if isinstance(spec, Mapping) else {"name": spec} if isinstance(spec, str) else None
    name = None if options is None else options.get("name")
    if _ALIASES.get(name, name) != "soft_overlong_punishment":
        return spec
    options.setdefault("max_completion_len", max_completion_length)
    options.setdefault("soft_punish_cache", options["max_completion_len"] // 5)
    return options


def _is_model_dir(spec: str) -> bool:
    return os.path.isdir(spec) and os.path.isfile(os.path.join(spec, "config.json"))


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def _is_hub_model(spec: str) -> bool:
    """Whether ``spec`` is a Hub model id (``org/name``, as TRL takes a reward model) whose ``config.json``
    is in the local Hugging Face cache or, unless ``HF_HUB_OFFLINE`` is set, can be fetched from the Hub."""
    if not _HUB_ID.match(spec) or os.path.exists(spec):
        return False
    from transformers.utils import cached_file

    try:
        return cached_file(spec, "config.json", _raise_exceptions_for_missing_entries=False) is not None
    except OSError:  # not on the Hub, no network, or offline and not cached
        return False


def _import(spec: str) -> Any:
    """``package.module:attr`` or ``package.module.attr`` -> the object; None when it does not import."""
    module_name, _, attr = spec.partition(":") if ":" in spec else spec.rpartition(".")
    if not module_name or not attr:
        return None
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name and (module_name + ".").startswith(error.name + "."):
            return None  # no such module: not an import path (a missing dependency inside it is re-raised)
        raise
    except (TypeError, ValueError):  # relative or empty module name
        return None
    target = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise InputError(f"reward {spec!r}: module {module_name!r} has no attribute {attr!r}")
        target = getattr(target, part)
    return target


def resolve_reward(spec: Any, **kwargs: Any) -> Any:
    """A reward function from a specification; ``kwargs`` go to factories (and to :class:`RewardModel`).

    * a callable: returned as is (kwargs: error);
    * a built-in name (``sorted(BUILTIN_REWARDS)``; ``_reward`` suffixes accepted): the default instance,
      or the factory called with ``kwargs``. ``soft_overlong_punishment`` and ``format`` need arguments;
    * a local directory with a ``config.json``: a :class:`RewardModel` (sequence classification);
    * a Hub model id (``org/name``) in the local Hugging Face cache or on the Hub: the same, as TRL;
    * ``package.module:attr`` or ``package.module.attr``: the imported object, called with ``kwargs`` when
      there are any (then it is a factory);
    * a mapping ``{"name": spec, **kwargs}`` (for YAML recipes): ``resolve_reward(spec, **kwargs)``.

    Anything else raises ValueError listing the built-in names.
    """
    if isinstance(spec, Mapping):  # {"name": ..., **kwargs}: a YAML recipe's way to pass arguments
        options = dict(spec)
        if "name" not in options:
            raise InputError(f"a reward given as a mapping needs a 'name' key, got keys {sorted(options)}")
        return resolve_reward(options.pop("name"), **options, **kwargs)
    if is_reward_model_spec(spec) and not isinstance(spec, (str, os.PathLike)):  # a loaded classifier
        from grpokit.rewards.reward_model import RewardModel

        source = str(getattr(spec.config, "_name_or_path", "") or "")
        tokenizer = kwargs.pop("tokenizer", None) or (source or None)
        name = kwargs.pop("name", None) or (source.rstrip("/").split("/")[-1] or None)
        return RewardModel(spec, tokenizer, name=name, **kwargs)
    if callable(spec):
        if kwargs:
            raise InputError(f"resolve_reward: keyword arguments {sorted(kwargs)} given for a callable")
        return spec
    if not isinstance(spec, (str, os.PathLike)):
        raise InputError(f"a reward must be a callable or a string, got {type(spec).__name__}")
    text = os.fspath(spec)
    name = _ALIASES.get(text, text)
    if name in BUILTIN_REWARDS:
        return _builtin(name, kwargs)
    if _is_model_dir(text) or _is_hub_model(text):
        from grpokit.rewards.reward_model import RewardModel

        return RewardModel(text, **kwargs)
    target = _import(text) if ("." in text or ":" in text) else None
    if target is not None:
        return target(**kwargs) if kwargs else target
    raise InputError(
        f"unknown reward {text!r}: not a built-in ({', '.join(sorted(BUILTIN_REWARDS))}), "
        "not a directory holding a sequence-classification model, not a Hugging Face Hub model id "
        "(org/name) found in the local cache or on the Hub, and not an importable module:attr path"
    )


def check_reward_specs(specs: Any, what: str = "reward_funcs", max_completion_length: int = 256) -> None:
    """Every reward specification of ``specs`` (one or a list) resolves, checked without loading a model:
    built-in names and import paths are resolved, a reward-model directory's files are checked
    (``check_model_dir``), a Hub id (``org/name``) is left to loading. An InputError naming ``what``
    otherwise. ``max_completion_length``: the run's (``soft_overlong_punishment``'s default lengths)."""
    for spec in list(specs) if isinstance(specs, (list, tuple)) else [specs]:
        spec = _with_run_lengths(spec, max_completion_length)
        if spec is None:
            continue
        if isinstance(spec, Mapping) and isinstance(spec.get("name"), (str, os.PathLike)):
            name = os.fspath(spec["name"])
            if _is_model_dir(name) or _is_hub_model(name):
                continue
        elif isinstance(spec, (str, os.PathLike)):
            text = os.fspath(spec)
            if _is_model_dir(text):
                check_model_dir(text, what)
                continue
            if _HUB_ID.match(text) and not os.path.exists(text):
                continue  # a Hub id: found (or not) when the run loads it
        try:
            resolve_reward(spec)
        except InputError as error:
            raise InputError(f"{what}: {error}") from None


def is_reward_model_spec(spec: Any) -> bool:
    """Whether ``spec`` names or is a sequence-classification reward model: a loaded ``transformers`` model
    (a module with a ``config``), a model directory or a Hub model id."""
    if isinstance(spec, (str, os.PathLike)):
        text = os.fspath(spec)
        return _is_model_dir(text) or _is_hub_model(text)
    import torch

    return isinstance(spec, torch.nn.Module) and hasattr(spec, "config")


def _processing_classes(classes: Any, count: int) -> list[Any]:
    """TRL's ``reward_processing_classes``: None, one tokenizer (for a single reward function) or one per
    reward function (None where the function is not a model, or where the model's own tokenizer is meant)."""
    if classes is None:
        return [None] * count
    if not isinstance(classes, (list, tuple)):
        classes = [classes]
    if len(classes) != count:
        raise InputError(
            f"reward_processing_classes: {len(classes)} given for {count} reward function(s); the "
            "numbers must match: give one per reward function (None where it is not a reward model)"
        )
    return list(classes)


def resolve_rewards(
    specs: Any,
    *,
    device: Any = None,
    allow_empty: bool = False,
    max_completion_length: int | None = None,
    processing_classes: Any = None,
) -> list[Any]:
    """A list of reward specifications (or one) -> reward functions (:func:`resolve_reward` each; None entries
    skipped); reward models are moved to ``device``. An empty list is an error unless ``allow_empty``.

    With ``max_completion_length`` (the run's), ``soft_overlong_punishment`` named without arguments (or
    with only some) takes DAPO's lengths from it: ``max_completion_len`` = max_completion_length and
    ``soft_punish_cache`` = a fifth of it (DAPO: a 4,096-token interval below 20,480)."""
    specs = list(specs) if isinstance(specs, (list, tuple)) else [specs]
    tokenizers = _processing_classes(processing_classes, len(specs))
    pairs = [(f, t) for f, t in zip(specs, tokenizers) if f is not None]
    if not pairs and not allow_empty:
        raise InputError(
            "No reward source provided: reward_funcs needs at least one reward function (or pass "
            "process_reward_funcs, an environment whose own reward scores its episodes, or an "
            "environment_factory whose environment defines a get_reward method)"
        )
    if max_completion_length is not None:
        pairs = [(_with_run_lengths(f, max_completion_length), t) for f, t in pairs]
    resolved = [
        resolve_reward(f, tokenizer=t) if t is not None and is_reward_model_spec(f) else resolve_reward(f)
        for f, t in pairs
    ]
    if device is not None:
        from grpokit.rewards.reward_model import RewardModel

        resolved = [func.to(device) if isinstance(func, RewardModel) else func for func in resolved]
    return resolved

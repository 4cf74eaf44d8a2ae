"""Recipes: flat YAML files of TrainArgs and GRPOConfig fields (``base: other-recipe`` extends another), and
the ``grpokit train`` command line on top of them (``key=value`` or ``--key value`` overrides, parsed by
``tyro``).

Every source is merged as raw values first: the ``base:`` chain, the recipe, then the command line; the
``GRPOConfig`` is built once, from the merged values, so an override of a source (``save_steps=4`` over a
recipe) is never met by a value derived from the recipe alone. Recipes are read by YAML 1.2's rules and each
value is typed by its field's declared type (``grpokit.config.values``): ``save_strategy: no`` is the
strategy "no", ``learning_rate: 1e-5`` a number.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import tyro

from grpokit.cli.train_args import TrainArgs
from grpokit.cli.trl_options import TRL_SCRIPT_OPTIONS, from_trl_script_options
from grpokit.config import GRPOConfig
from grpokit.config.trl_fields import TYPES, check_trl_fields
from grpokit.config.values import YAMLError, admits_none, field_types, load_yaml, load_yaml_file, typed
from grpokit.data.integrity import InputError

__all__ = [
    "DEFAULT_RECIPE",
    "RECIPES_DIR",
    "TYRO_MARKERS",
    "find_recipe",
    "load_recipe",
    "option_types",
    "parse_train_args",
    "recipe_values",
    "to_flag_arguments",
]

RECIPES_DIR = Path(__file__).parent.parent / "recipes"
DEFAULT_RECIPE = "arithmetic-tiny"
TYRO_MARKERS = (tyro.conf.FlagConversionOff,)
_TRL_ONLY = set(TYPES)
_BOOL_WORDS = {
    **dict.fromkeys(("true", "yes", "on", "y", "t", "1"), "True"),
    **dict.fromkeys(("false", "no", "off", "n", "f", "0"), "False"),
}
"""A boolean option's words -> the text tyro reads."""


def find_recipe(name_or_path: str) -> Path:
    """A recipe file path, or the name of a recipe shipped with grpokit (``arithmetic-tiny``)."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        raise SystemExit(f"grpokit: recipe {name_or_path!r} is a directory; give a recipe's .yaml file")
    if path.exists():
        return path
    shipped = RECIPES_DIR / f"{name_or_path.removesuffix('.yaml')}.yaml"
    if shipped.exists():
        return shipped
    names = sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))
    raise SystemExit(f"grpokit: no recipe {name_or_path!r} (a file path, or one of: {', '.join(names)})")


def recipe_values(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The option: value mapping of a recipe, as written; ``base: NAME`` first loads that recipe, then this
    one's values override it. A file that is not valid YAML stops with one line naming the file and line."""
    try:
        values = load_yaml_file(path) or {}
    except YAMLError as err:
        raise SystemExit(f"grpokit: {err}") from None
    if not isinstance(values, dict):
        raise SystemExit(f"grpokit: {path} must be a mapping of option: value")
    base = values.pop("base", None)
    if base is None:
        return values
    base_path = find_recipe(str(base))
    if base_path.resolve() in seen:
        raise SystemExit(f"grpokit: {path}: recipe bases form a cycle through {base_path}")
    return {**recipe_values(base_path, (*seen, path.resolve())), **values}


def option_types() -> dict[str, Any]:
    """``{option: declared type}`` of every ``grpokit train`` option (TrainArgs' and GRPOConfig's fields)."""
    top = {name: kind for name, kind in field_types(TrainArgs).items() if name != "config"}
    return {**field_types(GRPOConfig), **top}


def load_recipe(path: Path) -> TrainArgs:
    """TrainArgs from a recipe file (its ``base:`` chain first), the GRPOConfig built once; unknown keys and
    values that do not convert to their option's type are an error naming the file."""
    defaults = _recipe_defaults(recipe_values(path), path)
    try:
        config = GRPOConfig(**_field_values(defaults.config))
        return TrainArgs(**{**_field_values(defaults), "config": config})
    except ValueError as err:
        raise SystemExit(f"grpokit: {path}: {err}") from None


def parse_train_args(argv: list[str]) -> TrainArgs:
    """``[RECIPE] [key=value | --key value ...]``: the recipe's values, the command line's over them, typed
    by each option's declared type; the GRPOConfig built once from the merged values (by tyro)."""
    recipe_arg = argv[0] if argv and not argv[0].startswith("-") and "=" not in argv[0] else None
    overrides = argv[1:] if recipe_arg is not None else argv
    overrides, config_file = _config_option(overrides)  # TRL's --config FILE: the recipe
    if config_file is not None and recipe_arg is not None:
        raise SystemExit(f"grpokit: give the recipe once: {recipe_arg} and --config {config_file}")
    path = find_recipe(config_file or recipe_arg or DEFAULT_RECIPE)
    values = _set_environment(recipe_values(path), path)
    if config_file is not None:  # a TRL config: no built-in task unless it names one
        values.setdefault("task", None)
    overrides, script_options = _trl_script_options(overrides)
    try:  # TRL's script options (model_name_or_path, dataset_name, dtype, ...), from both sources
        values = from_trl_script_options(values, str(path))
        values = {**values, **from_trl_script_options(script_options, "the command line")}
    except InputError as err:
        raise SystemExit(f"grpokit: {err}") from None
    _check_trl_only(_trl_only(overrides), "the command line")
    overrides = _with_eval_strategy(values, overrides)
    defaults = _recipe_defaults(values, path)
    try:
        return tyro.cli(
            Annotated[TrainArgs, tyro.conf.OmitArgPrefixes],
            default=defaults,
            args=to_flag_arguments(overrides),
            prog="grpokit train [RECIPE.yaml]",
            description="Train with GRPO. Options below may also be given as key=value.",
            use_underscores=True,
            config=TYRO_MARKERS,
        )
    except ValueError as err:  # GRPOConfig / TrainArgs validation
        raise SystemExit(f"grpokit: {err}") from None


def to_flag_arguments(overrides: list[str], types: Mapping[str, Any] | None = None) -> list[str]:
    """``key=value`` -> ``--key value``, each value written as tyro reads its option's declared type
    (``types``, default ``option_types()``): a list or a mapping (YAML flow syntax) becomes several
    arguments; YAML's null is None where the type admits it; a boolean option takes true/false, yes/no,
    on/off, 1/0. Words stay words everywhere else (``save_strategy=no`` is the strategy "no")."""
    types = option_types() if types is None else types
    arguments: list[str] = []
    key: str | None = None  # the option whose values follow (``--key v1 v2``)
    bare = False  # ``--key`` not followed by a value yet
    for item in overrides:
        name, equals, raw = item.removeprefix("--").partition("=")
        if item.startswith("--") or (equals and not item.startswith("-")):
            if bare and _is_bool(types.get(key)):
                arguments.append("True")  # TRL's form: a bare --flag is true
            arguments.append(f"--{name.strip()}")
            key = None if equals else name.strip()
            bare = not equals
            if equals:
                arguments.extend(_flag_values(types.get(name.strip()), raw))
        elif key is not None and not item.startswith("-"):
            arguments.append(_scalar_flag(types.get(key), item, _parsed(item)))
            bare = False
        else:
            arguments.append(item)
    if bare and _is_bool(types.get(key)):
        arguments.append("True")
    return arguments


def _parsed(raw: str) -> Any:
    """``raw`` as YAML 1.2 reads it (the text itself when it is no valid YAML)."""
    try:
        return load_yaml(raw) if raw.strip() else raw
    except YAMLError:
        return raw


def _flag_values(annotation: Any, raw: str) -> list[str]:
    """The arguments tyro reads for ``raw``, one option's value from ``key=value``."""
    value = _parsed(raw)
    if isinstance(value, list):
        return [_scalar_text(v) for v in value]
    if isinstance(value, dict):  # {dtype: bfloat16, ...} -> key value pairs
        return [_scalar_text(v) for pair in value.items() for v in pair]
    return [_scalar_flag(annotation, raw, value)]


def _scalar_flag(annotation: Any, raw: str, value: Any) -> str:
    """One scalar value as tyro reads it for ``annotation``: "None" for null, "True"/"False" for a boolean
    option's words, else the text as given."""
    if value is None and admits_none(annotation):
        return "None"
    if _is_bool(annotation) and raw.strip().lower() in _BOOL_WORDS:
        return _BOOL_WORDS[raw.strip().lower()]
    return raw


def _is_bool(annotation: Any) -> bool:
    return annotation is bool or (admits_none(annotation) and bool in getattr(annotation, "__args__", ()))


def _scalar_text(value: Any) -> str:
    if value is None:
        return "None"
    return str(value).lower() if isinstance(value, bool) else str(value)


def _config_option(overrides: list[str]) -> tuple[list[str], str | None]:
    """``--config FILE`` (TRL's ``TrlParser`` form, ``--config=FILE`` too) taken out of the arguments."""
    kept, found = [], None
    items = iter(overrides)
    for item in items:
        if item == "--config":
            found = next(items, None)
            if found is None:
                raise SystemExit("grpokit: --config needs a file")
        elif item.startswith("--config="):
            found = item.split("=", 1)[1]
        else:
            kept.append(item)
    return kept, found


def _set_environment(values: dict[str, Any], path: Path) -> dict[str, Any]:
    """A TRL config's ``env:`` mapping sets those environment variables (as ``TrlParser`` does)."""
    env = values.pop("env", None)
    if env is None:
        return values
    if not isinstance(env, dict):
        raise SystemExit(f"grpokit: {path}: env must be a mapping of environment variables, got {env!r}")
    os.environ.update({str(k): str(v) for k, v in env.items()})
    return values


def _trl_script_options(overrides: list[str]) -> tuple[list[str], dict[str, Any]]:
    """TRL's script options (``trl_options``) on the command line, taken out of the arguments with their
    values: ``key=value``, ``--key value`` or a bare ``--key`` (true)."""
    kept: list[str] = []
    found: dict[str, Any] = {}
    index = 0
    while index < len(overrides):
        item = overrides[index]
        name, equals, raw = item.removeprefix("--").partition("=")
        name = name.strip()
        if name in TRL_SCRIPT_OPTIONS and (item.startswith("--") or equals):
            if equals:
                found[name] = _parsed(raw)
            elif index + 1 < len(overrides) and not overrides[index + 1].startswith("--"):
                index += 1
                found[name] = _parsed(overrides[index])
            else:
                found[name] = True
        else:
            kept.append(item)
        index += 1
    return kept, found


def _with_eval_strategy(values: Mapping[str, Any], overrides: list[str]) -> list[str]:
    """``eval_steps`` given (in the recipe or on the command line, and not null in the end) without
    ``eval_strategy`` evaluates every ``eval_steps`` steps: ``eval_strategy=steps`` is added. (GRPOConfig
    keeps TRL's rule, where eval_strategy "no" is the default and eval_steps alone does nothing: there it
    is refused.)"""
    given = {**values, **_given_on_the_command_line(overrides)}
    if given.get("eval_steps") is None or "eval_strategy" in given:
        return overrides
    return [*overrides, "eval_strategy=steps"]


def _given_on_the_command_line(overrides: list[str]) -> dict[str, Any]:
    """``{option: value}`` of the ``key=value`` and ``--key value`` arguments (YAML-typed)."""
    given: dict[str, Any] = {}
    for index, item in enumerate(overrides):
        name, equals, raw = item.removeprefix("--").partition("=")
        if equals:
            given[name.strip()] = _parsed(raw)
        elif item.startswith("--") and index + 1 < len(overrides) and overrides[index + 1][:1] != "-":
            given[name.strip()] = _parsed(overrides[index + 1])
    return given


def _trl_only(overrides: list[str]) -> dict[str, Any]:
    """TRL's fields that grpokit does not use, given as ``key=value``: checked before parsing, so that a
    refusal names the command line (they are parsed as the other fields then)."""
    found = {}
    for item in overrides:
        name, equals, raw = item.removeprefix("--").partition("=")
        if equals and name.strip() in _TRL_ONLY and not item.startswith("-"):
            found[name.strip()] = _parsed(raw)
    return found


def _recipe_defaults(values: Mapping[str, Any], path: Path) -> TrainArgs:
    """TrainArgs carrying the recipe's ``values`` (typed by their options' types) as tyro's defaults, not
    constructed: nothing is validated or derived before the command line is merged in. TRL's fields that
    grpokit does not use are checked here too (``config.trl_fields``). Unknown options and values that do
    not convert stop with a message naming ``path``."""
    top_types = {name: kind for name, kind in field_types(TrainArgs).items() if name != "config"}
    config_types = field_types(GRPOConfig)
    unknown = sorted(set(values) - set(top_types) - set(config_types))
    if unknown:
        names = ", ".join(unknown)
        raise SystemExit(f"grpokit: {path}: unknown option(s) {names}; see `grpokit train --help`")
    _check_trl_only({k: v for k, v in values.items() if k in _TRL_ONLY}, str(path))
    try:
        config = _unconstructed(GRPOConfig, config_types, values, "GRPOConfig")
        return _unconstructed(TrainArgs, top_types, {**values, "config": config}, "TrainArgs")
    except ValueError as err:
        raise SystemExit(f"grpokit: {path}: {err}") from None


def _check_trl_only(values: Mapping[str, Any], source: str) -> None:
    """TRL's fields that grpokit does not use: refused (naming ``source``) when they turn a feature on,
    logged when without effect (``config.trl_fields``)."""
    try:
        check_trl_fields(values)
    except ValueError as err:
        raise SystemExit(f"grpokit: {source}: {err}") from None


def _unconstructed(cls: type, types: Mapping[str, Any], values: Mapping[str, Any], owner: str) -> Any:
    """An instance of the dataclass ``cls`` holding ``values`` (typed) and the defaults of the other fields,
    made without calling its constructor (tyro reads its fields as defaults, then builds the real one)."""
    instance = object.__new__(cls)
    for spec in dataclasses.fields(cls):
        default = spec.default_factory() if spec.default_factory is not dataclasses.MISSING else spec.default
        value = values.get(spec.name, default)
        if spec.name in types:
            if value is None and not admits_none(types[spec.name]):
                value = default  # None for "not set" (TRL's convention)
            value = typed(types[spec.name], value, f"{owner}.{spec.name}")
        setattr(instance, spec.name, value)
    return instance


def _field_values(instance: Any) -> dict[str, Any]:
    return {spec.name: getattr(instance, spec.name) for spec in dataclasses.fields(instance)}

"""A field's value typed by the field's declared type, however it arrives: from Python, a recipe or config
file, or the command line.

Files are read by YAML 1.2's rules (``load_yaml``): only ``true``/``false`` are booleans, so ``no``, ``yes``,
``on`` and ``off`` stay words (``save_strategy: no`` is the strategy "no", not False), and ``1e-5`` is a
number, not the text "1e-5". Then each value is converted to its field's type (``typed``): the text "1e-5"
for a float field is 1e-5, "no" for a bool field is False, 5 for a text field is "5", a single name for a
list field is a list of one; a value that does not convert is refused with a ValueError naming the field,
the value and the type. None for a field whose type does not admit None means the field's default (TRL
writes None for "not set").

The values of the ``*_kwargs`` mappings have no type beyond "text, number or boolean": a text value there is
typed as YAML 1.1 reads it (``typed_value``: "false" and "no" -> False, "0.02" -> 0.02), because the command
line gives them as text and the text "false" is true in a Jinja chat template.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from grpokit.data.integrity import InputError

__all__ = [
    "YAMLError",
    "admits_none",
    "describe",
    "field_types",
    "load_yaml",
    "load_yaml_file",
    "require",
    "typed",
    "typed_value",
]

_TRUE_WORDS = frozenset({"true", "yes", "on", "y", "t", "1"})
_FALSE_WORDS = frozenset({"false", "no", "off", "n", "f", "0"})
_BOOL_TAG, _FLOAT_TAG = "tag:yaml.org,2002:bool", "tag:yaml.org,2002:float"


class YAMLError(ValueError):
    """A YAML file or value that does not parse: the message names the file and line."""


class _Yaml12Loader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's booleans (true/false only) and floats (``1e-5`` included)."""


_Yaml12Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_BOOL_TAG, _FLOAT_TAG)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Yaml12Loader.add_implicit_resolver(
    _BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_Yaml12Loader.add_implicit_resolver(
    _FLOAT_TAG,
    re.compile(
        r"^(?:[-+]?(?:\.[0-9]+|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
    ),
    list("-+0123456789."),
)


def require(condition: bool, name: str, why: str) -> None:
    """Raise ``InputError("GRPOConfig.<name> <why>")`` unless ``condition`` (``why`` may start with the
    value: ``"=True needs ..."``)."""
    if not condition:
        raise InputError(f"GRPOConfig.{name}{'' if why.startswith('=') else ' '}{why}")


def load_yaml(text: str, source: str = "<string>") -> Any:
    """``text`` parsed by YAML 1.2's rules (see the module docstring). A syntax error is a ``YAMLError`` of
    one sentence naming ``source`` and the line."""
    try:
        return yaml.load(text, Loader=_Yaml12Loader)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"{source}, line {mark.line + 1}" if mark is not None else source
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise YAMLError(f"{where}: not valid YAML ({problem})") from None


def load_yaml_file(path: str | Path) -> Any:
    """The YAML file at ``path`` (``load_yaml``)."""
    return load_yaml(Path(path).read_text(), str(path))


def typed_value(value: Any) -> Any:
    """A mapping value of a ``*_kwargs`` field typed as YAML reads it (``"false"`` -> False, ``"3"`` -> 3,
    ``"0.5"`` -> 0.5); other text, and values that are not text, unchanged."""
    if not isinstance(value, str):
        return value
    try:
        parsed = yaml.safe_load(value)
    except yaml.YAMLError:
        return value
    return parsed if isinstance(parsed, (bool, int, float)) else value


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
    """``{field name: its declared type}`` of the dataclass ``cls``, the annotations evaluated."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _options(annotation: Any) -> tuple[Any, ...] | None:
    """The members of a union type (``X | Y``, ``Optional[X]``), or None for any other type."""
    if typing.get_origin(annotation) in (Union, types.UnionType):
        return typing.get_args(annotation)
    return None


def admits_none(annotation: Any) -> bool:
    """Whether ``annotation`` is ``X | None``."""
    options = _options(annotation)
    return options is not None and type(None) in options


def describe(annotation: Any) -> str:
    """A type in words, for messages: "an integer", "one of 'no', 'steps', 'epoch'", "a list of numbers"."""
    options = _options(annotation)
    if options is not None:
        words = [describe(option) for option in options if option is not type(None)]
        if "an integer" in words and "a number" in words:
            words.remove("an integer")
        return " or ".join([*words, "null"] if type(None) in options else words)
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return "one of " + ", ".join(repr(choice) for choice in typing.get_args(annotation))
    if origin is list:
        inner = describe(typing.get_args(annotation)[0]).removeprefix("a ").removeprefix("an ")
        return f"a list of {inner}s"
    if origin is dict or annotation is dict:
        return "a mapping"
    words = {bool: "true or false", int: "an integer", float: "a number", str: "text"}
    return words.get(annotation, "a value")


def typed(annotation: Any, value: Any, where: str) -> Any:
    """``value`` converted to ``annotation`` (see the module docstring); ValueError naming ``where`` (e.g.
    ``GRPOConfig.learning_rate``) when it does not convert. None is kept only where the type admits it."""
    if value is None:
        if admits_none(annotation) or annotation is Any:
            return None
        raise InputError(f"{where} must be {describe(annotation)}, got None")
    options = _options(annotation)
    if options is not None:
        for option in options:
            if option is type(None):
                continue
            try:
                return typed(option, value, where)
            except ValueError:
                continue
        raise InputError(f"{where} must be {describe(annotation)}, got {value!r}")
    convert = _CONVERTERS.get(annotation) or _CONVERTERS.get(typing.get_origin(annotation))
    if convert is None:
        return value  # Any, or a type the config does not use: unchanged
    return convert(annotation, value, where)


def _refuse(annotation: Any, value: Any, where: str) -> InputError:
    return InputError(f"{where} must be {describe(annotation)}, got {value!r}")


def _to_bool(annotation: Any, value: Any, where: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE_WORDS | _FALSE_WORDS:
        return value.strip().lower() in _TRUE_WORDS
    raise _refuse(annotation, value, where)


def _to_int(annotation: Any, value: Any, where: str) -> int:
    if isinstance(value, bool):
        raise _refuse(annotation, value, where)
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            value = _number_or_text(value)
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise _refuse(annotation, value, where)


def _to_float(annotation: Any, value: Any, where: str) -> float:
    if isinstance(value, bool):
        raise _refuse(annotation, value, where)
    number = _number_or_text(value) if isinstance(value, str) else value
    if isinstance(number, (int, float)) and not math.isnan(number):
        return float(number)
    raise _refuse(annotation, value, where)


def _number_or_text(text: str) -> float | str:
    try:
        return float(text.strip())
    except ValueError:
        return text


def _to_str(annotation: Any, value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise _refuse(annotation, value, where)


def _to_choice(annotation: Any, value: Any, where: str) -> str:
    choices = typing.get_args(annotation)
    if isinstance(value, str) and value in choices:
        return value
    raise _refuse(annotation, value, where)


def _to_list(annotation: Any, value: Any, where: str) -> list[Any]:
    (item,) = typing.get_args(annotation) or (Any,)
    items = list(value) if isinstance(value, (list, tuple)) else [value]  # one name: a list of one
    return [typed(item, v, where) for v in items]


def _to_dict(annotation: Any, value: Any, where: str) -> dict[str, Any]:
    if isinstance(value, str) and value.strip().startswith("{"):  # its JSON (or YAML flow) text, as the
        try:  # command line gives it (HfArgumentParser: --model_init_kwargs '{"dtype": "bfloat16"}')
            value = json.loads(value)
        except ValueError:
            value = _parsed_mapping(value)
    if not isinstance(value, Mapping):
        raise _refuse(annotation, value, where)
    _, item = typing.get_args(annotation) or (str, Any)
    if item is str:
        return {str(k): typed(str, v, f"{where}[{k!r}]") for k, v in value.items()}
    return {str(k): typed_value(v) for k, v in value.items()}


def _parsed_mapping(text: str) -> Any:
    try:
        return load_yaml(text)
    except YAMLError:
        return text


_CONVERTERS = {
    bool: _to_bool,
    int: _to_int,
    float: _to_float,
    str: _to_str,
    Literal: _to_choice,
    list: _to_list,
    dict: _to_dict,
}

"""Recipes: flat YAML files of TrainArgs and GRPOConfig fields (``base: other-recipe`` extends another), and
the ``grpokit train`` command line on top of them (``key=value`` overrides, parsed by ``tyro``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any

import tyro
import yaml

from grpokit.cli.train_command import TrainArgs
from grpokit.config import GRPOConfig

__all__ = [
    "DEFAULT_RECIPE",
    "RECIPES_DIR",
    "TYRO_MARKERS",
    "find_recipe",
    "load_recipe",
    "parse_train_args",
    "recipe_values",
    "to_flag_arguments",
]

RECIPES_DIR = Path(__file__).parent.parent / "recipes"
DEFAULT_RECIPE = "arithmetic-tiny"
TYRO_MARKERS = (tyro.conf.FlagConversionOff,)


def find_recipe(name_or_path: str) -> Path:
    """A recipe file path, or the name of a recipe shipped with grpokit (``arithmetic-tiny``)."""
    path = Path(name_or_path)
    if path.exists():
        return path
    shipped = RECIPES_DIR / f"{name_or_path.removesuffix('.yaml')}.yaml"
    if shipped.exists():
        return shipped
    names = sorted(p.stem for p in RECIPES_DIR.glob("*.yaml"))
    raise SystemExit(f"grpokit: no recipe {name_or_path!r} (a file path, or one of: {', '.join(names)})")


def recipe_values(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The option: value mapping of a recipe; ``base: NAME`` first loads that recipe, then overrides it."""
    values = yaml.safe_load(path.read_text()) or {}
    if not isinstance(values, dict):
        raise SystemExit(f"grpokit: {path} must be a mapping of option: value")
    base = values.pop("base", None)
    if base is None:
        return values
    base_path = find_recipe(str(base))
    if base_path.resolve() in seen:
        raise SystemExit(f"grpokit: {path}: recipe bases form a cycle through {base_path}")
    return {**recipe_values(base_path, (*seen, path.resolve())), **values}


def load_recipe(path: Path) -> TrainArgs:
    """TrainArgs from a flat recipe YAML; unknown keys are an error naming them."""
    values = recipe_values(path)
    top_fields = {f.name for f in dataclasses.fields(TrainArgs)} - {"config"}
    config_fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    unknown = sorted(set(values) - top_fields - config_fields)
    if unknown:
        raise SystemExit(
            f"grpokit: {path}: unknown option(s) {', '.join(unknown)}; see `grpokit train --help`"
        )
    config = GRPOConfig(**{k: v for k, v in values.items() if k in config_fields})
    return TrainArgs(**{k: v for k, v in values.items() if k in top_fields}, config=config)


def to_flag_arguments(overrides: list[str]) -> list[str]:
    """``key=value`` -> ``--key value`` (YAML-typed: a list or a mapping value becomes several arguments)."""
    arguments: list[str] = []
    for item in overrides:
        if item.startswith("-") or "=" not in item:
            arguments.append(item)
            continue
        key, raw = item.split("=", 1)
        arguments.append(f"--{key.strip()}")
        value = yaml.safe_load(raw) if raw.strip() else raw
        if isinstance(value, list):
            arguments.extend(_scalar_text(v) for v in value)
        elif isinstance(value, dict):  # {dtype: bfloat16, ...} -> key value pairs
            arguments.extend(_scalar_text(v) for pair in value.items() for v in pair)
        elif isinstance(value, bool):  # YAML's true/false/yes/no -> the True/False tyro expects
            arguments.append(str(value))
        elif value is None and raw.strip():  # YAML's null / ~ -> the None tyro expects (not the text "null")
            arguments.append("None")
        else:
            arguments.append(raw)
    return arguments


def _scalar_text(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


def parse_train_args(argv: list[str]) -> TrainArgs:
    recipe_arg = argv[0] if argv and not argv[0].startswith("-") and "=" not in argv[0] else None
    overrides = argv[1:] if recipe_arg is not None else argv
    defaults = load_recipe(find_recipe(recipe_arg or DEFAULT_RECIPE))
    flat = Annotated[TrainArgs, tyro.conf.OmitArgPrefixes]
    try:
        return tyro.cli(
            flat,
            default=defaults,
            args=to_flag_arguments(overrides),
            prog="grpokit train [RECIPE.yaml]",
            description="Train with GRPO. Options below may also be given as key=value.",
            use_underscores=True,
            config=TYRO_MARKERS,
        )
    except ValueError as err:  # GRPOConfig validation
        raise SystemExit(f"grpokit: {err}") from err

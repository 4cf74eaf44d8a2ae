"""``grpokit plan [RECIPE] [key=value ...] [num_processes=N] [strategy=...] [device_memory_gb=X]``: the
memory one device needs for a recipe (strategy: ddp, fsdp, zero, zero3), from the model's config alone
(``grpokit.cli.memory_plan``).

The model's config comes from a local directory's config.json, the built-in tiny policy's sizes
(``tiny:<task>``, nothing trained), the configs shipped in ``recipes/model_configs`` (hub ids with "/" as
"--"), or the Hugging Face cache; no network is used. ``device_memory_gb`` is in GiB (an "80 GB" GPU has
80 GiB: nvidia-smi shows 81559 MiB); default 80.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from grpokit.cli.memory_plan import GIB, MemoryPlan, plan_memory
from grpokit.cli.recipes import RECIPES_DIR, parse_train_args
from grpokit.cli.train_args import TrainArgs

__all__ = [
    "DEFAULT_DEVICE_MEMORY_GB",
    "MODEL_CONFIGS_DIR",
    "describe_plan",
    "fit_warning",
    "load_model_config",
    "plan_main",
    "plan_train_args",
]

MODEL_CONFIGS_DIR = RECIPES_DIR / "model_configs"
DEFAULT_DEVICE_MEMORY_GB = 80.0
PLAN_KEYS = ("num_processes", "strategy", "device_memory_gb")
STRATEGIES = ("ddp", "fsdp", "zero", "zero3")
USAGE = (
    "usage: grpokit plan [RECIPE.yaml] [key=value ...] [num_processes=N] [strategy=ddp|fsdp|zero|zero3] "
    "[device_memory_gb=X]\n"
    "Prints the per-device memory of a recipe (see `grpokit train --help` for the recipe options).\n"
    "num_processes: processes (GPUs) of the run, default 1. strategy: default fsdp when the recipe's fsdp "
    "option has full_shard, else ddp. device_memory_gb: GiB per device, default 80."
)


def load_model_config(model: str) -> Any:
    """The ``transformers`` config of a recipe's ``model``: a local directory's config.json; ``tiny:<task>``:
    the built-in tiny policy's (built from its sizes, nothing trained); a hub id: the config shipped in
    ``recipes/model_configs``, else the Hugging Face cache. Raises ValueError naming ``model`` otherwise."""
    from transformers import AutoConfig

    if model.startswith("tiny:"):
        return _tiny_config(model.split(":", 1)[1])
    if Path(model).is_dir():
        if not (Path(model) / "config.json").is_file():
            raise ValueError(f"model: {model!r} is a directory without a config.json")
        return AutoConfig.from_pretrained(model)
    shipped = MODEL_CONFIGS_DIR / f"{model.replace('/', '--')}.json"
    if shipped.is_file():
        values = json.loads(shipped.read_text())
        return AutoConfig.for_model(values.pop("model_type"), **values)
    try:
        return AutoConfig.from_pretrained(model, local_files_only=True)
    except (OSError, ValueError) as err:
        raise ValueError(
            f"model: no config for {model!r}: not a local directory, not shipped with grpokit "
            f"({', '.join(sorted(p.stem.replace('--', '/') for p in MODEL_CONFIGS_DIR.glob('*.json')))}), "
            "not in the Hugging Face cache; pass a local directory holding its config.json"
        ) from err


def _tiny_config(task: str) -> Any:
    """The config ``build_tiny_model`` gives the cold-started policy (``ColdStartSettings`` defaults)."""
    from transformers import AutoConfig

    from grpokit.models import build_char_tokenizer
    from grpokit.tasks import ColdStartSettings, get_task

    try:
        get_task(task)
    except KeyError as err:
        raise ValueError(f"model: tiny:{task}: {err.args[0]}") from None
    settings = ColdStartSettings()
    return AutoConfig.for_model(
        settings.arch,
        vocab_size=len(build_char_tokenizer()),
        hidden_size=settings.hidden_size,
        num_hidden_layers=settings.num_layers,
        num_attention_heads=settings.num_heads,
        num_key_value_heads=settings.num_heads,
        intermediate_size=settings.intermediate_size or 4 * settings.hidden_size,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )


def plan_train_args(
    train_args: TrainArgs,
    num_processes: int = 1,
    strategy: str | None = None,
    device_type: str = "cuda",
    device_memory_gb: float | None = None,
) -> MemoryPlan:
    """The memory plan of a recipe. ``strategy`` None: "fsdp" when its ``fsdp`` option has full_shard,
    "zero" when it names a ``deepspeed`` config, else "ddp". ``device_memory_gb``: the device's memory, of
    which a colocated vLLM engine takes ``vllm_gpu_memory_utilization``."""
    if strategy is None:
        config = train_args.config
        strategy = "fsdp" if "full_shard" in config.fsdp.split() else _zero_strategy(config)
    return plan_memory(
        load_model_config(train_args.model),
        train_args.config,
        num_processes=num_processes,
        strategy=strategy,
        lora_r=train_args.lora_r if train_args.use_peft else None,
        lora_target_modules=train_args.lora_target_modules if train_args.use_peft else None,
        device_type=device_type,
        device_bytes=None if device_memory_gb is None else device_memory_gb * GIB,
    )


def fit_warning(plan: MemoryPlan, device_memory_gb: float) -> str | None:
    """The warning line (with the biggest parts) when the plan's peak exceeds ``device_memory_gb`` GiB."""
    if plan.fits(device_memory_gb * GIB):
        return None
    biggest = ", ".join(f"{name} {value / GIB:.2f}" for name, value in plan.biggest_parts())
    phase = max(plan.phases, key=plan.phases.__getitem__)
    return (
        f"grpokit: WARNING: the plan needs {plan.peak / GIB:.2f} GiB per device, more than the declared "
        f"{device_memory_gb:g} GiB (peak in {phase}; biggest parts, GiB: {biggest})"
    )


def _zero_strategy(config: Any) -> str:
    """ "zero3" / "zero" for a DeepSpeed run (by its ZeRO stage), else "ddp"."""
    if not config.deepspeed:
        return "ddp"
    from grpokit.parallel.zero import zero_stage

    return "zero3" if zero_stage(config) == 3 else "zero"


def describe_plan(
    train_args: TrainArgs,
    num_processes: int,
    strategy: str | None = None,
    device_memory_gb: float | None = None,
) -> str:
    """What ``grpokit train`` prints before it starts: the plan's table and, when it does not fit, the
    warning. ``device_memory_gb`` None: the CUDA device's memory when there is one (else no fit check). A
    model whose config cannot be planned gives one line saying why, never an error."""
    if device_memory_gb is None:
        device_memory_gb = _cuda_memory_gib()
    try:
        device = "cpu" if train_args.config.use_cpu else "cuda"
        plan = plan_train_args(train_args, num_processes, strategy, device, device_memory_gb)
    except ValueError as err:
        return f"grpokit: no memory plan: {err}"
    warning = fit_warning(plan, device_memory_gb) if device_memory_gb is not None else None
    return plan.table() + (f"\n{warning}" if warning else "")


def _cuda_memory_gib() -> float | None:
    torch = sys.modules.get("torch")  # only when the trainer has imported it already
    if torch is None or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / GIB


def _pop_plan_options(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """Split the plan-only options (``key=value``, ``--key value``, ``--key=value``) from the recipe's."""
    options: dict[str, str] = {}
    rest: list[str] = []
    items = iter(argv)
    for item in items:
        key, sep, value = item.removeprefix("--").partition("=")
        if key in PLAN_KEYS and (item.startswith("--") or sep):
            if not sep:
                value = next(items, "")
            options[key] = value
        else:
            rest.append(item)
    return options, rest


def _plan_options(options: dict[str, str]) -> tuple[int, str | None, float]:
    try:
        num_processes = int(options.get("num_processes", "1"))
    except ValueError:
        num_processes = 0
    if num_processes < 1:
        raise SystemExit(f"grpokit: num_processes must be an integer >= 1, got {options['num_processes']!r}")
    strategy = options.get("strategy")
    if strategy is not None and strategy not in STRATEGIES:
        raise SystemExit(f"grpokit: strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    try:
        memory = float(options.get("device_memory_gb", DEFAULT_DEVICE_MEMORY_GB))
    except ValueError:
        memory = 0.0
    if not memory > 0:
        raise SystemExit(
            f"grpokit: device_memory_gb must be a number > 0, got {options['device_memory_gb']!r}"
        )
    return num_processes, strategy, memory


def plan_main(argv: list[str]) -> int:
    """``grpokit plan``: print the table, and the warning when the peak exceeds ``device_memory_gb``."""
    if any(item in ("-h", "--help") for item in argv):
        print(USAGE)
        return 0
    options, rest = _pop_plan_options(argv)
    num_processes, strategy, memory = _plan_options(options)
    train_args = parse_train_args(rest)
    try:
        plan = plan_train_args(train_args, num_processes, strategy, device_memory_gb=memory)
    except ValueError as err:
        raise SystemExit(f"grpokit: {err}") from None
    print(plan.table())
    warning = fit_warning(plan, memory)
    print(warning or f"grpokit: fits in {memory:g} GiB per device ({plan.peak / GIB:.2f} GiB at the peak)")
    return 0

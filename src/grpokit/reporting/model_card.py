"""The model card (``README.md``) written next to a trained model: hub metadata in YAML front matter, then
what the model is, how it was trained, on what, rewarded how, the measured metrics, how to load it, the full
configuration and the citation.

Only measured or configured values are written: a section without data (no metrics, no evaluation, no
known data set) is left out, never filled with placeholders. ``hub_token`` never appears in the card.
"""

from __future__ import annotations

import dataclasses
import math
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

__all__ = ["base_model_name", "dataset_name_of", "render_model_card", "write_model_card"]

CARD_FILE = "README.md"
SECRET_FIELDS = ("hub_token",)
"""Config fields never written to the card."""

LOSS_NAMES = {
    "grpo": "GRPO (DeepSeekMath: token mean per sequence, then mean over sequences)",
    "bnpo": "BNPO (token mean over the batch)",
    "dr_grpo": "Dr. GRPO (token sum over sequences x max_completion_length)",
    "dapo": "DAPO (token sum over the completion tokens of the global batch)",
    "cispo": "CISPO (clipped, stop-gradient importance weight)",
    "sapo": "SAPO (soft gate instead of a hard clip)",
}

TRAINING_METRICS = ("reward", "kl", "completions/mean_length", "entropy", "eval/reward")
"""Rows of the training-metrics table, in order (per-reward means follow ``reward``)."""

EVAL_META = ("num_examples", "num_samples", "temperature", "completions")
"""Keys of an evaluation result that describe it rather than measure the model."""

DATA_FILE_SUFFIXES = (".json", ".jsonl", ".csv", ".parquet", ".arrow", ".txt", ".tsv")

CITATION = """\
@article{shao2024deepseekmath,
    title   = {{DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models}},
    author  = {Zhihong Shao and Peiyi Wang and Qihao Zhu and Runxin Xu and Junxiao Song and Xiao Bi and
               Haowei Zhang and Mingchuan Zhang and Y. K. Li and Y. Wu and Daya Guo},
    year    = 2024,
    eprint  = {arXiv:2402.03300},
}"""


def write_model_card(
    path: str | Path,
    args: Any,
    *,
    base_model: str | None,
    dataset_name: str | None,
    reward_names: list[str],
    metrics: list[dict] | None,
    eval_summary: dict | None = None,
    model_id: str | None = None,
) -> Path:
    """Write ``<path>/README.md`` for the model saved in ``path``; returns the card's path.

    ``args``: the run's ``GRPOConfig``. ``base_model``: the model trained from (hub id or local path; only a
    hub id goes into the metadata). ``dataset_name``: the training data (hub id, file, or a description).
    ``reward_names``: the reward functions, in ``reward_weights`` order. ``metrics``: the logged records
    (``metrics.jsonl``); the first and last logged steps are reported. ``eval_summary``: ``grpokit train``'s
    ``eval_summary.json`` (held-out accuracy ``before`` / ``after``). ``model_id``: what the loading example
    names (default: ``hub_model_id`` when pushing, else ``path``)."""
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    if model_id is None:
        model_id = args.hub_model_id if args.push_to_hub and args.hub_model_id else str(folder)
    text = render_model_card(
        args,
        base_model=base_model,
        dataset_name=dataset_name,
        reward_names=reward_names,
        metrics=metrics,
        eval_summary=eval_summary,
        model_id=model_id,
        adapter=(folder / "adapter_config.json").exists(),
    )
    card = folder / CARD_FILE
    card.write_text(text, encoding="utf-8")
    return card


def render_model_card(
    args: Any,
    *,
    base_model: str | None,
    dataset_name: str | None,
    reward_names: list[str],
    metrics: list[dict] | None,
    eval_summary: dict | None,
    model_id: str,
    adapter: bool = False,
) -> str:
    """The card's text (see ``write_model_card``); ``adapter``: the folder holds PEFT adapters."""
    config = _config_dict(args)
    records = sorted((r for r in metrics or [] if "step" in r), key=lambda r: r["step"])
    sections = [
        _front_matter(args, base_model, dataset_name, adapter),
        _summary(model_id, base_model, adapter),
        _training_procedure(args, records),
        _data(args, dataset_name),
        _rewards(args, reward_names),
        _training_metrics(records, reward_names),
        _evaluation(eval_summary),
        _usage(model_id, adapter),
        _configuration(config),
        _citation(),
    ]
    text = "\n\n".join(section for section in sections if section) + "\n"
    token = getattr(args, "hub_token", None)
    if token:  # should the token also sit in another field (a run name, a path), it is still not written
        text = text.replace(token, "<hub_token>")
    return text


def base_model_name(model: Any) -> str | None:
    """What ``base_model`` to report for ``GRPOTrainer``'s ``model`` argument: a path or hub id as given, or
    a loaded model's ``name_or_path`` (None when unknown)."""
    if isinstance(model, (str, Path)):
        return str(model)
    config = getattr(model, "config", None)
    name = getattr(model, "name_or_path", None) or getattr(config, "_name_or_path", None)
    return str(name) if name else None


def dataset_name_of(dataset: Any) -> str | None:
    """What ``dataset_name`` to report for ``GRPOTrainer``'s ``train_dataset``: a path or name as given, a
    ``datasets.Dataset``'s builder name when it has one, else None (rows given in memory)."""
    if isinstance(dataset, (str, Path)):
        return str(dataset)
    info = getattr(dataset, "info", None)
    name = getattr(info, "dataset_name", None)
    return str(name) if name else None


# ---- sections -------------------------------------------------------------------------------------------
def _front_matter(args: Any, base_model: str | None, dataset_name: str | None, adapter: bool) -> str:
    meta: dict[str, Any] = {}
    if base_model is not None and _hub_id(base_model):
        meta["base_model"] = base_model
    if dataset_name is not None and _hub_id(dataset_name):
        meta["datasets"] = [dataset_name]
    meta["library_name"] = "peft" if adapter else "transformers"
    meta["pipeline_tag"] = "text-generation"
    tags = ["grpokit", "grpo", "reinforcement-learning", args.loss_type]
    if args.importance_sampling_level == "sequence":
        tags.append("gspo")
    tags.append("lora" if adapter else "transformers")
    meta["tags"] = list(dict.fromkeys(tags))
    return "---\n" + yaml.safe_dump(meta, sort_keys=False).rstrip("\n") + "\n---"


def _summary(model_id: str, base_model: str | None, adapter: bool) -> str:
    title = f"# {_display_name(model_id)}"
    what = "LoRA adapters for" if adapter else "A fine-tuned version of"
    base = f" {_model_reference(base_model)}" if base_model else " a causal language model"
    return (
        f"{title}\n\n{what}{base}, trained with Group Relative Policy Optimization (GRPO, DeepSeekMath, "
        f"arXiv:2402.03300) using grpokit {_version('grpokit')}."
    )


def _training_procedure(args: Any, records: list[dict]) -> str:
    variant = LOSS_NAMES.get(args.loss_type, args.loss_type)
    if args.importance_sampling_level == "sequence":
        variant += ", with GSPO's sequence-level importance ratio"
    epsilon_high = args.epsilon if args.epsilon_high is None else args.epsilon_high
    rows = [
        ("loss_type", f"`{args.loss_type}`"),
        ("importance_sampling_level", f"`{args.importance_sampling_level}`"),
        ("scale_rewards", f"`{args.scale_rewards}`"),
        ("beta (KL coefficient)", _number(args.beta)),
        ("clip range (epsilon, epsilon_high)", f"{_number(args.epsilon)}, {_number(epsilon_high)}"),
        ("num_generations (G)", str(args.num_generations)),
        ("num_iterations (mu)", str(args.num_iterations)),
        ("learning_rate", f"{_number(args.learning_rate)} (`{args.lr_scheduler_type}` schedule)"),
    ]
    if records:
        rows.append(("GRPO steps trained", str(records[-1]["step"])))
    return f"## Training procedure\n\nVariant: {variant}.\n\n" + _table(("setting", "value"), rows)


def _data(args: Any, dataset_name: str | None) -> str:
    if not dataset_name:
        return ""
    if _hub_id(dataset_name):
        where = f"[{dataset_name}](https://huggingface.co/datasets/{dataset_name})"
    elif _is_local(dataset_name):
        where = f"the local file `{Path(dataset_name).name}`"
    else:
        where = dataset_name
    return f"## Training data\n\nPrompts from {where}, column `{args.prompt_column}`."


def _rewards(args: Any, reward_names: list[str]) -> str:
    if not reward_names:
        return ""
    weights = args.reward_weights
    if weights is None or len(weights) != len(reward_names):
        weights = [1.0] * len(reward_names)
    rows = [(f"`{name}`", _number(weight)) for name, weight in zip(reward_names, weights)]
    text = "## Reward functions\n\n" + _table(("reward function", "weight"), rows)
    if len(reward_names) > 1:
        text += f"\n\nCombined with `multi_objective_aggregation={args.multi_objective_aggregation}`."
    return text


def _training_metrics(records: list[dict], reward_names: list[str]) -> str:
    if not records:
        return ""
    first, last = records[0], records[-1]
    names = list(TRAINING_METRICS)
    names[1:1] = [f"rewards/{name}/mean" for name in reward_names]
    columns = [first] if first is last else [first, last]
    rows = []
    for name in names:
        values = [_measured(record.get(name)) for record in columns]
        if all(value is not None for value in values):
            rows.append((f"`{name}`", *(_number(value) for value in values)))
    if not rows:
        return ""
    headers = ("metric", *(f"step {record['step']}" for record in columns))
    where = "the first and the last logged step" if len(columns) == 2 else "the only logged step"
    return (
        f"## Training metrics\n\nFrom `metrics.jsonl`, {where} (means over the step's completions):\n\n"
        + _table(headers, rows)
    )


def _evaluation(summary: dict | None) -> str:
    if not summary:
        return ""
    labels = (("before", "before GRPO"), ("after", "after GRPO"))
    columns = [(label, summary[key]) for key, label in labels if isinstance(summary.get(key), dict)]
    held_out = summary.get("held_out") if isinstance(summary.get("held_out"), dict) else {}
    if not columns:
        skipped = held_out.get("skipped")
        return f"## Held-out evaluation\n\nNot measured: {skipped}." if skipped else ""
    names: list[str] = []
    for _, result in columns:
        for name, value in result.items():
            if name not in EVAL_META and name not in names and _measured(value) is not None:
                names.append(name)
    rows = []
    for name in names:
        values = [_measured(result.get(name)) for _, result in columns]
        if all(value is not None for value in values):
            rows.append((f"`{name}`", *(_number(value) for value in values)))
    if not rows:
        return ""
    sizes = {result.get("num_examples") for _, result in columns}
    size = f" of {sizes.pop()} examples" if len(sizes) == 1 and None not in sizes else ""
    temperatures = {result.get("temperature") for _, result in columns}
    decoding = ""
    if len(temperatures) == 1 and None not in temperatures:
        temperature = temperatures.pop()
        decoding = " with greedy decoding" if temperature == 0 else f" sampled at temperature {temperature}"
    if held_out.get("dataset"):  # grpokit train says what it measured (cli.held_out)
        graded = f", graded by {held_out['graded_by']}"
        intro = f"On {held_out['dataset']}{size}{decoding}{graded} (`eval_summary.json`):"
    else:
        task = f", graded as the `{summary['task']}` task grades" if summary.get("task") else ""
        intro = f"On a held-out split{size}{decoding}{task} (`eval_summary.json`):"
    return f"## Held-out evaluation\n\n{intro}\n\n" + _table(
        ("metric", *(label for label, _ in columns)), rows
    )


def _usage(model_id: str, adapter: bool) -> str:
    if adapter:
        code = (
            "from peft import AutoPeftModelForCausalLM\n"
            "from transformers import AutoTokenizer\n\n"
            f'model = AutoPeftModelForCausalLM.from_pretrained("{model_id}")\n'
            f'tokenizer = AutoTokenizer.from_pretrained("{model_id}")\n'
        )
    else:
        code = (
            "from transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
            f'model = AutoModelForCausalLM.from_pretrained("{model_id}")\n'
            f'tokenizer = AutoTokenizer.from_pretrained("{model_id}")\n'
        )
    code += (
        'inputs = tokenizer("Your prompt", return_tensors="pt")\n'
        "output = model.generate(**inputs, max_new_tokens=128)\n"
        'print(tokenizer.decode(output[0][inputs["input_ids"].shape[1]:], skip_special_tokens=True))\n'
    )
    return f"## How to use\n\n```python\n{code}```"


def _configuration(config: dict[str, Any]) -> str:
    text = yaml.safe_dump(config, sort_keys=False).rstrip("\n")
    return (
        "## Configuration\n\n<details>\n<summary>The full GRPOConfig of the run</summary>\n\n"
        f"```yaml\n{text}\n```\n\n</details>"
    )


def _citation() -> str:
    versions = ", ".join(
        f"{name} {_version(name)}" for name in ("grpokit", "transformers", "torch") if _version(name)
    )
    return f"## Citation\n\nGRPO:\n\n```bibtex\n{CITATION}\n```\n\nTrained with {versions}."


# ---- helpers ----------------------------------------------------------------------------------------------
def _config_dict(args: Any) -> dict[str, Any]:
    """Every config field but the secrets, as YAML-safe values."""
    values = args.to_dict() if hasattr(args, "to_dict") else dataclasses.asdict(args)
    return {name: value for name, value in values.items() if name not in SECRET_FIELDS}


def _table(headers: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _measured(value: Any) -> float | None:
    """A finite number, or None (missing, null, NaN, not a number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _number(value: float) -> str:
    """Four significant digits (0.8503, 23.46, 2e-05); integers as integers."""
    if float(value).is_integer() and abs(value) < 1e6:
        return str(int(value)) if isinstance(value, int) else f"{float(value):.1f}"
    return f"{value:.4g}"


def _version(package: str) -> str:
    """The installed version of ``package`` (grpokit's own included), "" when it is not installed."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return ""


def _is_local(name: str) -> bool:
    return Path(name).expanduser().exists() or Path(name).suffix.lower() in DATA_FILE_SUFFIXES


def _hub_id(name: str) -> bool:
    """Whether ``name`` reads as a hub repository id (not a local path, a data file or a description)."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if _is_local(name):
        return False
    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def _model_reference(name: str) -> str:
    if _hub_id(name):
        return f"[{name}](https://huggingface.co/{name})"
    return f"the local model `{Path(name).name}`" if _is_local(name) else f"`{name}`"


def _display_name(model_id: str) -> str:
    return Path(model_id.rstrip("/")).name or model_id

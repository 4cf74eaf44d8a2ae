"""The model card: hub metadata that parses, the measured numbers and nothing else, no secrets."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import yaml
from huggingface_hub import ModelCard

import grpokit
from grpokit import GRPOConfig
from grpokit.reporting.model_card import base_model_name, dataset_name_of, write_model_card

TOKEN = "hf_NotARealTokenButSecretAbCdEf123456"

METRICS = [
    {"step": 1, "reward": 0.41234567, "rewards/exact/mean": 0.3125, "rewards/format/mean": 0.875,
     "kl": 0.0, "completions/mean_length": 12.34567, "loss": 0.01},
    {"step": 5, "reward": 0.63, "kl": 0.0011, "completions/mean_length": 11.0},
    {"step": 10, "reward": 0.85031234, "rewards/exact/mean": 0.78125, "rewards/format/mean": 1.0,
     "kl": 0.00123456, "completions/mean_length": 10.25, "loss": -0.02},
]  # fmt: skip

SUMMARY = {
    "model": "tiny:arithmetic",
    "task": "arithmetic",
    "before": {"accuracy": 0.466, "num_examples": 500, "temperature": 0.0, "format_rate": 0.912},
    "after": {"accuracy": 0.85, "num_examples": 500, "temperature": 0.0, "format_rate": 0.998},
    "wall_time_s": 62.0,
}


def config(tmp_path, **overrides) -> GRPOConfig:
    values = dict(
        output_dir=str(tmp_path / "run"),
        max_steps=10,
        num_generations=4,
        per_device_train_batch_size=8,
        loss_type="dr_grpo",
        scale_rewards="none",
        epsilon_high=0.28,
        learning_rate=2e-5,
        reward_weights=[1.0, 0.5],
        hub_token=TOKEN,
    )
    return GRPOConfig(**{**values, **overrides})


def front_matter(text: str) -> dict:
    assert text.startswith("---\n")
    block = text.split("---\n", 2)[1]
    return yaml.safe_load(block)


def table(text: str, heading: str) -> dict[str, list[str]]:
    """The rows of the first table under ``## heading``: {first cell without backticks: other cells}."""
    section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line.strip("|").split("|") for line in section.splitlines() if line.startswith("| ")]
    return {cells[0].strip().strip("`"): [c.strip() for c in cells[1:]] for cells in rows[1:]}


def full_card(tmp_path, **overrides) -> str:
    path = write_model_card(
        tmp_path / "run",
        config(tmp_path, **overrides),
        base_model="Qwen/Qwen2.5-0.5B-Instruct",
        dataset_name="openai/gsm8k",
        reward_names=["exact", "format"],
        metrics=METRICS,
        eval_summary=SUMMARY,
    )
    assert path == tmp_path / "run" / "README.md"
    return path.read_text()


def test_front_matter_parses_with_the_hub_keys(tmp_path):
    meta = front_matter(full_card(tmp_path, importance_sampling_level="sequence"))
    assert meta["library_name"] == "transformers"
    assert meta["pipeline_tag"] == "text-generation"
    assert meta["base_model"] == "Qwen/Qwen2.5-0.5B-Instruct"
    assert meta["datasets"] == ["openai/gsm8k"]
    assert {"grpokit", "grpo", "reinforcement-learning", "dr_grpo", "gspo"} <= set(meta["tags"])
    card = ModelCard.load(tmp_path / "run" / "README.md")  # huggingface_hub's own parser agrees
    assert card.data.base_model == "Qwen/Qwen2.5-0.5B-Instruct" and card.data.datasets == ["openai/gsm8k"]
    assert card.data.library_name == "transformers" and card.text.lstrip().startswith("# run")


def test_the_numbers_are_the_measured_ones(tmp_path):
    text = full_card(tmp_path)
    rows = table(text, "Training metrics")
    assert "| metric | step 1 | step 10 |" in text  # the first and the last logged step
    first, last = METRICS[0], METRICS[-1]
    for name in ("reward", "rewards/exact/mean", "rewards/format/mean", "kl", "completions/mean_length"):
        shown = [float(cell) for cell in rows[name]]
        assert shown == [pytest.approx(first[name], rel=1e-3), pytest.approx(last[name], rel=1e-3)], name
    assert "loss" not in rows and "entropy" not in rows  # not a card row / never measured
    evaluation = table(text, "Held-out evaluation")
    for name in ("accuracy", "format_rate"):
        assert [float(c) for c in evaluation[name]] == [SUMMARY["before"][name], SUMMARY["after"][name]]
    assert "num_examples" not in evaluation and "500 examples with greedy decoding" in text
    procedure = table(text, "Training procedure")
    assert procedure["loss_type"] == ["`dr_grpo`"] and procedure["scale_rewards"] == ["`none`"]
    assert procedure["clip range (epsilon, epsilon_high)"] == ["0.2, 0.28"]
    assert procedure["beta (KL coefficient)"] == ["0.04"] and procedure["num_generations (G)"] == ["4"]
    assert procedure["learning_rate"] == ["2e-05 (`constant` schedule)"]
    assert procedure["GRPO steps trained"] == ["10"]
    assert table(text, "Reward functions") == {"exact": ["1.0"], "format": ["0.5"]}
    assert f"grpokit {grpokit.__version__}" in text and "arXiv:2402.03300" in text
    assert 'from_pretrained("' + str(tmp_path / "run") + '")' in text  # not pushed: the local path


def test_the_full_config_is_there_without_the_token(tmp_path):
    text = full_card(tmp_path, run_name=f"run-{TOKEN}")  # a token leaking into another field too
    assert TOKEN not in text
    block = re.search(r"<details>.*?```yaml\n(.*?)```\n\n</details>", text, re.S)
    dumped = yaml.safe_load(block.group(1))
    assert "hub_token" not in dumped
    expected = {k: v for k, v in config(tmp_path).to_dict().items() if k not in ("hub_token", "run_name")}
    assert {k: v for k, v in dumped.items() if k != "run_name"} == expected


def test_sections_without_data_are_left_out(tmp_path):
    args = config(tmp_path, reward_weights=None, beta=0.0)
    local_base = tmp_path / "base-model"
    local_base.mkdir()
    text = write_model_card(
        tmp_path / "run",
        args,
        base_model=str(local_base),
        dataset_name=None,
        reward_names=[],
        metrics=None,
        eval_summary=None,
    ).read_text()
    for heading in ("Training metrics", "Held-out evaluation", "Training data", "Reward functions"):
        assert f"## {heading}" not in text, heading
    assert "GRPO steps trained" not in text  # no metrics: the step count is not known
    meta = front_matter(text)
    assert "base_model" not in meta and "datasets" not in meta  # a local path is no hub id
    assert "the local model `base-model`" in text and str(tmp_path) not in text.split("## How to use")[0]
    assert "## How to use" in text and "## Configuration" in text and "## Citation" in text


def test_missing_and_nonfinite_values_make_no_row(tmp_path):
    metrics = [{"step": 1, "reward": 0.5, "kl": None}, {"step": 2, "reward": float("nan"), "kl": 0.1}]
    text = write_model_card(
        tmp_path / "run", config(tmp_path), base_model=None, dataset_name="train.jsonl",
        reward_names=["exact"], metrics=metrics, eval_summary={"model": "m", "stopped_by": "SIGTERM"},
    ).read_text()  # fmt: skip
    assert "## Training metrics" not in text  # reward is NaN at the last step, kl missing at the first
    assert "## Held-out evaluation" not in text  # neither before nor after
    assert not re.search(r"\bnan\b", text, re.IGNORECASE)
    assert "Prompts from the local file `train.jsonl`" in text and "datasets" not in front_matter(text)
    only_after = {"after": {"accuracy": 0.75, "num_examples": 8}}
    text = write_model_card(
        tmp_path / "run", config(tmp_path), base_model=None, dataset_name=None, reward_names=[],
        metrics=[{"step": 3, "reward": 0.25}], eval_summary=only_after,
    ).read_text()  # fmt: skip
    assert table(text, "Training metrics") == {"reward": ["0.25"]} and "| metric | step 3 |" in text
    assert table(text, "Held-out evaluation") == {"accuracy": ["0.75"]} and "before GRPO" not in text


def test_adapters_and_pushed_models_are_loaded_as_such(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "adapter_config.json").write_text("{}")
    args = config(tmp_path, push_to_hub=True, hub_model_id="alice/tiny-grpo")
    text = write_model_card(
        folder, args, base_model="Qwen/Qwen2.5-0.5B", dataset_name=None, reward_names=[], metrics=[]
    ).read_text()
    assert front_matter(text)["library_name"] == "peft" and "lora" in front_matter(text)["tags"]
    assert 'AutoPeftModelForCausalLM.from_pretrained("alice/tiny-grpo")' in text
    assert text.split("\n---\n", 1)[1].lstrip().startswith("# tiny-grpo")
    assert (
        'from_pretrained("bob/other")'
        in write_model_card(
            folder,
            args,
            base_model=None,
            dataset_name=None,
            reward_names=[],
            metrics=[],
            model_id="bob/other",
        ).read_text()
    )


def test_names_of_the_trainer_arguments(tiny_model_dir):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    assert base_model_name("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"
    assert base_model_name(AutoModelForCausalLM.from_pretrained(tiny_model_dir)) == str(tiny_model_dir)
    assert dataset_name_of("data/train.jsonl") == "data/train.jsonl"
    assert dataset_name_of([{"prompt": "1+1="}]) is None
    assert dataset_name_of(Dataset.from_list([{"prompt": "1+1="}])) is None  # built in memory: no name


def test_grpokit_train_rewrites_the_card_with_the_evaluation(tmp_path, monkeypatch):
    """The CLI's last step: the card gains the held-out evaluation and the recipe's names; pushed again."""
    from grpokit.cli.train_args import TrainArgs
    from grpokit.cli.train_command import publish_model_card
    from grpokit.reporting import publish
    from grpokit.reporting.publish import Publisher

    def fake_trainer(args):
        """What publish_model_card reads of a GRPOTrainer: its rewards, metrics log and publisher."""
        return SimpleNamespace(
            reward_names=["exact", "format"], logger=SimpleNamespace(read=lambda: METRICS),
            publisher=Publisher(args.config, "runs/resolved-model-path", None, is_main=True),
        )  # fmt: skip

    args = TrainArgs(config=config(tmp_path))
    trainer = fake_trainer(args)
    publish_model_card(args, args.config, trainer, SUMMARY)
    text = (tmp_path / "run" / "README.md").read_text()
    assert [float(c) for c in table(text, "Held-out evaluation")["accuracy"]] == [0.466, 0.85]
    assert "A fine-tuned version of `tiny:arithmetic`" in text
    assert "Prompts from the built-in `arithmetic` task" in text
    pushed: list[tuple[str, str]] = []
    monkeypatch.setattr(publish, "check_hub_access", lambda cfg: "alice/run")  # the repo pushes go to
    monkeypatch.setattr(
        publish,
        "push_model",
        lambda folder, cfg, commit_message: pushed.append((str(folder), commit_message)),
    )
    args = TrainArgs(config=config(tmp_path, push_to_hub=True))
    publish_model_card(args, args.config, fake_trainer(args), SUMMARY)
    assert pushed == [(str(tmp_path / "run"), "Held-out evaluation")]
    assert 'from_pretrained("alice/run")' in (tmp_path / "run" / "README.md").read_text()

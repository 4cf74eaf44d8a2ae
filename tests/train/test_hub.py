"""push_to_hub: the upload call, pointed at a local stand-in that records it, and the files it would send,
computed by huggingface_hub's own filter on a real run's output folder; the early token check."""

from __future__ import annotations

from pathlib import Path

import httpx2
import pytest
import torch
from huggingface_hub import RepoUrl, constants, get_token
from huggingface_hub.errors import HfHubHTTPError
from huggingface_hub.utils import filter_repo_objects
from huggingface_hub.utils._paths import DEFAULT_IGNORE_PATTERNS

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.data.records import read_jsonl
from grpokit.reporting import hub
from grpokit.reporting.hub import HUB_IGNORE_PATTERNS, check_hub_access, push_model, resolve_repo_id

TOKEN = "hf_NotARealTokenButSecretAbCdEf123456"
ROWS = [
    {"prompt": "1+1=", "solution": "2"},
    {"prompt": "2+3=", "solution": "5"},
    {"prompt": "4+4=", "solution": "8"},
    {"prompt": "7-2=", "solution": "5"},
]


def digit_reward(prompts, completions, completion_ids, solution, **kwargs):
    """Solution present (1.0) plus a small token-id term, so that the tiny policy's groups differ."""
    return [(s in c) + 0.1 * (sum(ids) % 5) for c, s, ids in zip(completions, solution, completion_ids)]


class RecordingApi:
    """An ``HfApi`` stand-in: records every call, answers as the hub would for user ``alice``."""

    def __init__(self, role: str = "write", fail: Exception | None = None) -> None:
        self.calls: list[tuple[str, tuple, dict]] = []
        self.role = role
        self.fail = fail
        self.uploaded: dict[str, str] = {}  # what the folder held when upload_folder was called

    def whoami(self) -> dict:
        self.calls.append(("whoami", (), {}))
        return {"type": "user", "name": "alice", "auth": {"accessToken": {"role": self.role}}}

    def create_repo(self, repo_id: str, **kwargs) -> RepoUrl:
        self.calls.append(("create_repo", (repo_id,), kwargs))
        return RepoUrl(f"https://huggingface.co/{repo_id}")

    def create_branch(self, repo_id: str, **kwargs) -> None:
        self.calls.append(("create_branch", (repo_id,), kwargs))

    def upload_folder(self, **kwargs) -> None:
        self.calls.append(("upload_folder", (), kwargs))
        if self.fail is not None:
            raise self.fail
        card = Path(kwargs["folder_path"]) / "README.md"
        self.uploaded["README.md"] = card.read_text() if card.exists() else ""

    def call(self, name: str) -> tuple[tuple, dict]:
        found = [(args, kwargs) for called, args, kwargs in self.calls if called == name]
        assert len(found) == 1, (name, self.calls)
        return found[0]


def hub_args(output_dir: Path, **overrides) -> GRPOConfig:
    values = dict(output_dir=str(output_dir), push_to_hub=True, hub_token=TOKEN, hub_private_repo=True)
    return GRPOConfig(**{**values, **overrides})


def files_uploaded(folder: Path, ignore_patterns: list[str]) -> set[str]:
    """The files ``upload_folder`` sends from ``folder``: its listing (relative POSIX paths of every file,
    as huggingface_hub lists them) filtered by huggingface_hub's own ``filter_repo_objects`` with the
    patterns given plus the library's defaults, as ``upload_folder`` adds them."""
    listing = [p.relative_to(folder).as_posix() for p in sorted(folder.glob("**/*")) if p.is_file()]
    return set(filter_repo_objects(listing, ignore_patterns=[*ignore_patterns, *DEFAULT_IGNORE_PATTERNS]))


@pytest.fixture(scope="module")
def trained(tiny_model_dir, tmp_path_factory):
    """A real run with ``push_to_hub`` whose hub client is the recording stand-in (``hub.HfApi`` replaced):
    2 steps, a checkpoint each step (pushed: ``hub_strategy="every_save"``), the completion log on, the model
    card the trainer writes, and the config dump ``grpokit train`` writes (which holds the token); plus the
    bare model's files and the stand-in's record of the run's calls."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("hub")
    args = GRPOConfig(
        output_dir=str(root / "tiny-grpo"), max_steps=2, num_generations=4, per_device_train_batch_size=8,
        max_completion_length=4, disable_tqdm=True, seed=0, save_steps=1, log_completions=True,
        push_to_hub=True, hub_token=TOKEN,
    )  # fmt: skip
    api = RecordingApi()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(hub, "HfApi", lambda token=None: api)
        trainer = GRPOTrainer(str(tiny_model_dir), [digit_reward], args, train_dataset=ROWS)
        trainer.train()
    output = Path(args.output_dir)
    args.to_yaml(output / "config.yaml")
    trainer.save_model(root / "bare")  # what save_pretrained writes for this model: model + tokenizer
    model_files = {p.name for p in (root / "bare").iterdir()}
    return output, model_files, api


def test_the_trainer_checks_access_first_then_pushes_every_checkpoint_and_the_end(trained):
    output, _, api = trained
    assert api.calls[0][0] == "whoami"  # check_hub_access, when the trainer was built
    uploads = [kwargs for name, _, kwargs in api.calls if name == "upload_folder"]
    assert [u["folder_path"] for u in uploads] == [
        str(output / "checkpoint-1"),
        str(output / "checkpoint-2"),
        str(output),
    ]
    assert [u["commit_message"] for u in uploads] == [
        "Training in progress, step 1",
        "Training in progress, step 2",
        "End of training",
    ]
    assert all(u["repo_id"] == "alice/tiny-grpo" for u in uploads)
    card = (output / "README.md").read_text()
    assert "alice/tiny-grpo" in card and TOKEN not in card  # the card names the repo the model went to


def test_push_uploads_the_folder_with_the_card(trained):
    output, _, _ = trained
    api = RecordingApi()
    args = hub_args(output, hub_revision="experiment")
    url = push_model(output, args, commit_message="End of training", api=api)
    assert url == "https://huggingface.co/alice/tiny-grpo"  # <whoami name>/<output_dir's last component>
    repo_args, repo_kwargs = api.call("create_repo")
    assert repo_args == ("alice/tiny-grpo",)
    assert repo_kwargs == {"private": True, "exist_ok": True, "repo_type": "model"}
    branch_args, branch_kwargs = api.call("create_branch")
    assert branch_args == ("alice/tiny-grpo",) and branch_kwargs["branch"] == "experiment"
    _, upload = api.call("upload_folder")
    assert upload["repo_id"] == "alice/tiny-grpo" and upload["folder_path"] == str(output)
    assert upload["revision"] == "experiment" and upload["commit_message"] == "End of training"
    assert upload["ignore_patterns"] == list(HUB_IGNORE_PATTERNS)
    assert api.uploaded["README.md"].startswith("---\n") and TOKEN not in api.uploaded["README.md"]


def test_the_files_sent_are_the_model_tokenizer_card_and_metrics(trained):
    output, model_files, _ = trained
    api = RecordingApi()
    push_model(output, hub_args(output), commit_message="End of training", api=api)
    patterns = api.call("upload_folder")[1]["ignore_patterns"]
    sent = files_uploaded(output, patterns)
    assert sent == model_files | {"README.md", "metrics.jsonl", "metrics.png"}
    everything = files_uploaded(output, [])
    assert any(name.startswith("checkpoint-1/") for name in everything)  # the run did write these
    assert {"completions.jsonl", "config.yaml"} <= everything
    assert TOKEN in (output / "config.yaml").read_text()
    assert read_jsonl(output / "metrics.jsonl")  # the metrics go; the completions, the token do not


def test_a_checkpoint_push_sends_the_model_without_the_resume_state(trained):
    output, model_files, _ = trained
    checkpoint = output / "checkpoint-2"
    api = RecordingApi()
    push_model(checkpoint, hub_args(output), commit_message="Training in progress, step 2", api=api)
    assert api.call("create_repo")[0] == ("alice/tiny-grpo",)  # named after output_dir, not the checkpoint
    sent = files_uploaded(checkpoint, api.call("upload_folder")[1]["ignore_patterns"])
    assert sent == model_files | {"README.md"}  # with the card written at every_save
    assert {"optimizer.pt", "rng_state.pt", "trainer_state.json"} <= files_uploaded(checkpoint, [])


def test_repo_names(tmp_path):
    api = RecordingApi()
    assert resolve_repo_id(hub_args(tmp_path / "run", hub_model_id="org/model"), api) == "org/model"
    assert api.calls == []  # a full id needs no account lookup
    assert resolve_repo_id(hub_args(tmp_path / "run", hub_model_id="model"), api) == "alice/model"
    with pytest.raises(RuntimeError, match=r"push_to_hub.*hub_model_id"):
        resolve_repo_id(hub_args(tmp_path / "a run: 2", hub_model_id=None), api)
    url = push_model(tmp_path, hub_args(tmp_path, hub_model_id="org/model"), commit_message="m", api=api)
    assert url == "https://huggingface.co/org/model"
    assert [name for name, _, _ in api.calls].count("create_branch") == 0  # no hub_revision: main


def test_hub_errors_say_what_to_do(tmp_path):
    request = httpx2.Request("POST", "https://huggingface.co/api/models/alice/run/commit/main")
    unauthorized = HfHubHTTPError("401 Unauthorized", response=httpx2.Response(401, request=request))
    with pytest.raises(RuntimeError, match=r"push_to_hub: could not upload .*hf auth login") as info:
        push_model(tmp_path, hub_args(tmp_path), commit_message="m", api=RecordingApi(fail=unauthorized))
    assert f"the model is saved in {tmp_path}" in str(info.value) and TOKEN not in str(info.value)
    forbidden = HfHubHTTPError("403 Forbidden", response=httpx2.Response(403, request=request))
    with pytest.raises(RuntimeError, match="write access"):
        push_model(tmp_path, hub_args(tmp_path), commit_message="m", api=RecordingApi(fail=forbidden))
    with pytest.raises(RuntimeError, match="could not be reached"):
        push_model(tmp_path, hub_args(tmp_path), commit_message="m", api=RecordingApi(fail=ConnectionError()))
    with pytest.raises(FileNotFoundError, match="push_to_hub"):
        push_model(tmp_path / "missing", hub_args(tmp_path), commit_message="m", api=RecordingApi())


@pytest.fixture
def logged_out(tmp_path, monkeypatch):
    """No token anywhere: no HF_TOKEN, an empty HF_HOME, no stored login."""
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "hf-home"
    home.mkdir()
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(home / "stored_tokens"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    assert get_token() is None


def test_check_without_a_token_fails_before_training(tmp_path, logged_out):
    with pytest.raises(RuntimeError, match=r"push_to_hub: no Hugging Face token.*hf auth login.*HF_TOKEN"):
        check_hub_access(hub_args(tmp_path / "run", hub_token=None))


def test_check_with_a_token(tmp_path, logged_out, monkeypatch):
    made: list[str | None] = []

    def make_api(token: str | None = None) -> RecordingApi:
        made.append(token)
        return RecordingApi()

    monkeypatch.setattr(hub, "HfApi", make_api)
    assert check_hub_access(hub_args(tmp_path / "run")) == "alice/run"
    assert made == [TOKEN]  # the config's token is the one used
    monkeypatch.setenv("HF_TOKEN", "hf_fromTheEnvironment")
    assert check_hub_access(hub_args(tmp_path / "run", hub_token=None, hub_model_id="org/m")) == "org/m"
    assert made[-1] is None  # HfApi finds HF_TOKEN itself
    with pytest.raises(RuntimeError, match="read-only"):
        check_hub_access(hub_args(tmp_path / "run"), api=RecordingApi(role="read"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(RuntimeError, match="HF_HUB_OFFLINE"):
        check_hub_access(hub_args(tmp_path / "run"))

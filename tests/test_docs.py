"""Every example in README.md and docs/*.md runs, and every name and path the docs cite exists.

Python blocks: a document's ```python blocks run in order in one namespace (as a reader would type them), in
a temporary working directory. What differs from the text is declared here and nowhere else:

- ``hub``: hub model ids, hub data set names and placeholder paths -> local stand-ins built by the test (this
  machine has no hub): the tiny policy of ``conftest.tiny_model_dir``, a data set folder laid out as the
  hub repository is, a reward-model directory trained by ``grpokit train-rm``;
- ``QUICK``: every ``GRPOConfig`` a block builds trains one step of at most 16 completion tokens;
- ``use_vllm=True`` -> ``False`` where vLLM or a CUDA GPU is missing (docs/migrating-from-trl.md says what a
  machine without them answers; ``tests/test_trl_example.py`` checks that answer).

A block right after ``<!-- not run: <reason> -->`` is skipped, and the reason must be one the test machine
cannot meet (``NOT_RUN_REASONS``). Shell blocks: every ``grpokit ...`` command (also after ``python -m`` or
``accelerate launch ... -m``) goes through the CLI's own parser, and so do the commands and ``key=value``
switches of the README's tables; nothing is trained.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import re
import shlex
from pathlib import Path

import pytest
import torch

import grpokit

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"(<!-- not run: (?P<reason>[^>]*?) -->\n)?```(?P<lang>\w*)\n(?P<code>.*?)```", re.S)
NOT_RUN_REASONS = ("needs a GPU", "needs vLLM", "uploads to the hub")
QUICK = {"max_steps": 1, "disable_tqdm": True}
HAS_VLLM_GPU = torch.cuda.is_available() and importlib.util.find_spec("vllm") is not None


def blocks(doc: Path, langs: tuple[str, ...]) -> list[tuple[int, str, str | None]]:
    """``(line, code, not-run reason)`` of every fenced block of ``doc`` in one of ``langs``."""
    text = doc.read_text()
    return [
        (text[: m.start("code")].count("\n"), m["code"], m["reason"])
        for m in FENCE.finditer(text)
        if m["lang"] in langs
    ]


def python_docs() -> list[Path]:
    return [doc for doc in DOCS if blocks(doc, ("python",))]


@pytest.fixture(scope="module")
def hub(tiny_model_dir, tmp_path_factory) -> dict[str, str]:
    """The stand-ins: hub id or placeholder in the text -> a local path."""
    from grpokit.cli.train_rm_command import TrainRMArgs, run_train_rm

    root = tmp_path_factory.mktemp("hub")
    # data set repositories as the hub holds them: data files, and a README.md naming the configurations
    sums = [(1, 2), (3, 4), (2, 5), (6, 1)]
    questions = [{"question": f"{a}+{b}=", "answer": f"#### {a + b}"} for a, b in sums]
    write_rows(root / "gsm8k" / "train.jsonl", questions)
    write_rows(root / "gsm8k" / "test.jsonl", [{"question": "2+2=", "answer": "#### 4"}])
    (root / "gsm8k" / "README.md").write_text(
        "---\nconfigs:\n- config_name: main\n  data_files:\n  - split: train\n    path: train.jsonl\n"
        "  - split: test\n    path: test.jsonl\n---\n"
    )
    chats = [{"prompt": [{"role": "user", "content": f"{a}+{b}="}], "solution": str(a + b)} for a, b in sums]
    write_rows(root / "deepmath" / "train.jsonl", chats)
    for kind in ("process", "outcome"):  # reward models, as `grpokit train-rm --kind KIND` trains them
        rm = TrainRMArgs(kind=kind, model="tiny", dataset="chain-synthetic", output_dir=str(root / kind),
                         epochs=1, num_samples=16, num_eval_samples=8)  # fmt: skip
        run_train_rm(rm, log=lambda _: None)
    policy = str(tiny_model_dir)
    return {
        "Qwen/Qwen2.5-0.5B-Instruct": policy,
        "path/to/policy": policy,
        "openai/gsm8k": str(root / "gsm8k"),
        "trl-lib/DeepMath-103K": str(root / "deepmath"),
        "runs/chain-prm": str(root / "process"),
        "runs/prm": str(root / "process"),
        "runs/orm": str(root / "outcome"),
    }


def write_rows(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


@pytest.mark.parametrize("doc", python_docs(), ids=lambda p: p.name)
def test_python_examples_run(doc, hub, tmp_path, monkeypatch):
    real_config = grpokit.GRPOConfig

    class QuickConfig(real_config):  # QUICK: one short step, whatever the block asks for
        def __init__(self, *args, **kwargs):
            length = min(kwargs.get("max_completion_length", 16), 16)
            super().__init__(*args, **{**kwargs, **QUICK, "max_completion_length": length})

    monkeypatch.setattr(grpokit, "GRPOConfig", QuickConfig)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    gsm8k = Path(hub["openai/gsm8k"])  # the local folder and file the examples name
    (tmp_path / "gsm8k").symlink_to(gsm8k)
    (tmp_path / "gsm8k_train.jsonl").symlink_to(gsm8k / "train.jsonl")
    namespace: dict = {"__name__": f"docs.{doc.stem}"}
    for line, code, reason in blocks(doc, ("python",)):
        if reason is not None:
            assert reason.startswith(NOT_RUN_REASONS), f"{doc.name}:{line}: not run for {reason!r}"
            continue
        for name, path in hub.items():
            code = code.replace(f'"{name}"', repr(path))
        if not HAS_VLLM_GPU:
            code = code.replace("use_vllm=True", "use_vllm=False")
        exec(compile("\n" * line + code, str(doc), "exec"), namespace)


def command_lines(doc: Path) -> list[tuple[int, list[str]]]:
    """``(line, argv after grpokit)`` of every grpokit command in the shell blocks of ``doc``."""
    found, buffer, start = [], "", 0
    for line, code, _ in blocks(doc, ("bash", "sh", "console")):
        for offset, physical in enumerate(code.splitlines()):
            start = offset if not buffer else start
            if physical.endswith("\\"):  # a command continued on the next line
                buffer += physical[:-1]
                continue
            words, buffer = shlex.split(buffer + physical, comments=True), ""
            for i, word in enumerate(words):
                after = words[i - 1] if i else "&&"  # a command starts the line, or follows && or -m
                if (word, after) in (("grpokit", "&&"), ("grpokit", "-m"), ("grpokit.cli", "-m")):
                    found.append((line + start + 1, words[i + 1 :]))
                    break
    return found


def table_commands(doc: Path) -> list[tuple[int, list[str]]]:
    """The commands in the table rows of ``doc``: a `grpokit ...` span (its seed S as 0), and a
    `key=value ...` span as ``grpokit train`` overrides."""
    rows = [(n, row) for n, row in enumerate(doc.read_text().splitlines(), 1) if row.startswith("|")]
    spans = [(n, span.replace("=S", "=0")) for n, row in rows for span in re.findall(r"`([^`]+)`", row)]
    found = [(n, shlex.split(span)[1:]) for n, span in spans if span.startswith("grpokit ")]
    return found + [(n, ["train", *span.split()]) for n, span in spans if re.fullmatch(r"(\w+=\S+ ?)+", span)]


COMMANDS = [(doc, line, argv) for doc in DOCS for line, argv in command_lines(doc)]
COMMANDS += [(DOCS[0], line, argv) for line, argv in table_commands(DOCS[0])]  # the README's tables


class Parsed(BaseException):  # (not an Exception: main() reports those as errors)
    """Raised where a command would start running, with what the parser made of its arguments."""


@pytest.mark.parametrize(("doc", "line", "argv"), COMMANDS, ids=[f"{d.name}:{n}" for d, n, _ in COMMANDS])
def test_grpokit_commands_parse(doc, line, argv, monkeypatch):
    from grpokit import cli
    from grpokit.cli import eval_command, plan_command, train_command, train_rm_command

    def parsed(*args, **kwargs):
        raise Parsed(args)

    for module, name in ((train_command, "run_training"), (eval_command, "plan_eval"),
                         (train_rm_command, "run_train_rm"), (plan_command, "plan_train_args")):  # fmt: skip
        monkeypatch.setattr(module, name, parsed)
    monkeypatch.chdir(ROOT)
    try:
        status = cli.main(argv)
    except Parsed:
        return
    except SystemExit as stop:  # --help prints and exits 0
        assert stop.code == 0, f"{doc.name}:{line}: grpokit {shlex.join(argv)}: {stop}"
        return
    assert status == 0, f"{doc.name}:{line}: grpokit {shlex.join(argv)}"


def test_the_examples_are_found():
    assert sum(len(blocks(doc, ("python",))) for doc in DOCS) >= 20
    assert {argv[0] for _, _, argv in COMMANDS} >= {"train", "eval", "plan", "train-rm"}


CITED_NAME = re.compile(r"`(grpokit(?:\.\w+)+)")
CITED_PATH = re.compile(r"`((?:src|tests|benchmarks|recipes|examples|docs)/[\w./-]+\.\w+)`")
ROOMS = "|".join(p.name for p in (ROOT / "src" / "grpokit").iterdir() if (p / "__init__.py").exists())
ROOM_FILE = re.compile(rf"`(?:src/grpokit/|grpokit/)?((?:{ROOMS})/[\w/]+\.py)`")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_cited_names_and_paths_exist(doc):
    """``grpokit.x.y`` names import (a module, or an attribute of one) and cited repository files exist."""
    text = doc.read_text()
    for name in sorted(set(CITED_NAME.findall(text))):
        parts, found = name.split("."), None
        for i in range(len(parts), 0, -1):
            try:
                found = importlib.import_module(".".join(parts[:i]))
            except ModuleNotFoundError:
                continue
            for attribute in parts[i:]:
                found = getattr(found, attribute, None)
            break
        assert found is not None, f"{doc.name} cites {name}, which does not exist"
    paths = [ROOT / p for p in CITED_PATH.findall(text)]
    paths += [ROOT / "src" / "grpokit" / p for p in ROOM_FILE.findall(text)]
    for path in sorted(set(paths)):
        assert path.exists(), f"{doc.name} cites {path.relative_to(ROOT)}, which does not exist"

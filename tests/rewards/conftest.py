"""Shared fixtures: a private math-verify pool, a tiny sequence-classification reward model on disk, and a
check that no sandbox process outlives its test."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

try:
    import grpokit  # noqa: F401
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import torch

from grpokit.rewards.isolation.sandbox import MARKER
from grpokit.rewards.isolation.verifier import MathVerifier

SANDBOX_UID = 65534


@pytest.fixture(scope="session")
def verifier():
    """One math-verify worker process for the whole session, closed at the end."""
    pool = MathVerifier(max_workers=2)
    yield pool
    pool.close()


def sandbox_processes() -> list[tuple[int, str, str]]:
    """Live (non-zombie) processes that belong to a sandbox: the marker in their command line, or running
    as the sandbox user. Returns (pid, state, command line)."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            cmdline = Path(entry.path, "cmdline").read_bytes()
            status = Path(entry.path, "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        state = fields.get("State", "?").split()[0]
        uid = int(fields.get("Uid", "-1").split()[0])
        if state not in ("Z", "X") and (MARKER.encode() in cmdline or uid == SANDBOX_UID):
            found.append((int(entry.name), state, cmdline[:80].decode(errors="replace")))
    return found


def wait_no_sandbox_processes(timeout: float = 3.0) -> list[tuple[int, str, str]]:
    """Poll until no sandbox process is alive (SIGKILL is asynchronous); returns what is still alive."""
    deadline = time.monotonic() + timeout
    while (alive := sandbox_processes()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


@pytest.fixture
def no_stray_processes():
    """Fails the test if any sandbox process is alive after it."""
    yield
    assert wait_no_sandbox_processes() == []


@pytest.fixture(scope="session")
def reward_model_dir(tmp_path_factory):
    """A tiny Qwen2ForSequenceClassification (num_labels=1) and a character tokenizer, saved to disk."""
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    from grpokit.models.tiny import CHAT_TEMPLATE, build_char_tokenizer

    path = tmp_path_factory.mktemp("models") / "tiny-rm"
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = CHAT_TEMPLATE
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
        num_labels=1,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    Qwen2ForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path

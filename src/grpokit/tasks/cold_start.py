"""The supervised cold start of the tiny policy (``grpokit.models.tiny``), cached on disk.

Why it looks like this. GRPO can only reinforce what the policy already samples: a
random model never writes a correct answer, so every group has equal rewards and zero advantage. DeepSeek-R1
therefore fine-tunes on a small set of worked solutions before RL. ``cold_start_policy`` does the same,
deliberately short: clean worked solutions (no injected noise) of the task's train split, stopped at the
first probe where greedy accuracy on held-back train questions reaches ``stop_at_accuracy`` (0.4). Stopped
there, the model has the format and the procedure but is unsure of many single-digit facts and carries: its
greedy answer is right about half the time, and sampling at temperature 1 finds the right answer for many
more questions (pass@8 well above greedy accuracy). That gap is what RL turns into greedy accuracy. Stopping
on a measured accuracy rather than a fixed step count keeps the starting point steady across seeds and
machines, where the SFT learning curve jumps steeply. The held-out split is never used for stopping.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from grpokit.core import pad_right
from grpokit.eval import evaluate_accuracy
from grpokit.models.tiny import (
    DEFAULT_TAGS,
    MOE_ARCHITECTURES,
    build_char_tokenizer,
    build_tiny_model,
    build_tiny_moe,
)
from grpokit.tasks.evaluation import game_evaluation, task_episode_accuracy, task_game
from grpokit.tasks.registry import get_task

__all__ = [
    "COLD_START_THREADS",
    "COLD_START_VERSION",
    "ColdStartSettings",
    "build_once",
    "cold_start_blueprint",
    "cold_start_policy",
    "default_cache_root",
]


# Bump when the tokenizer, model construction or SFT procedure changes in a way that changes the result,
# so that caches made by older code are not reused.
COLD_START_VERSION = 2
"""Part of the cache key: bumped when the same settings would train a different checkpoint (2: one thread)."""


@dataclass(frozen=True)
class ColdStartSettings:
    """Everything that determines a cold-started policy (hashed into its cache directory name).

    The supervised cold start (as DeepSeek-R1 does before RL, here deliberately short): train the tiny
    model on worked solutions of the task's TRAIN split, loss on completion tokens only, and stop early, at
    the first check where greedy accuracy on ``probe_size`` train-split questions that SFT never sees
    reaches ``stop_at_accuracy`` (or after ``max_steps``). The held-out split is never looked at. The
    result answers a good share of questions greedily and many more when sampling, which is the room
    GRPO needs.
    """

    # model
    arch: str = "llama"
    """"qwen2" or "llama", or a mixture of experts of ``grpokit.models.tiny.MOE_ARCHITECTURES`` (8 experts,
    2 per token, each ``intermediate_size`` wide)."""
    hidden_size: int = 128
    """Model width."""
    num_layers: int = 2
    """Transformer blocks."""
    num_heads: int = 4
    """Attention heads."""
    intermediate_size: int | None = None
    """MLP width; None = 4 x hidden_size (a mixture of experts: each expert's, None = hidden_size)."""
    # data
    task_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for the task's ``make_splits`` (difficulty); the defaults of the task otherwise."""
    num_sft_examples: int = 20_000
    """Size of the train-split prefix SFT samples from (the probe comes right after it)."""
    # optimisation
    max_steps: int = 600
    """Upper bound on optimizer steps."""
    batch_size: int = 64
    """Sequences per optimizer step."""
    learning_rate: float = 2e-3
    """AdamW peak learning rate (linear warmup, then constant: the run is stopped early anyway)."""
    warmup_steps: int = 50
    """Linear warmup steps."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    max_grad_norm: float = 1.0
    """Gradient clipping by global norm."""
    # early stop
    stop_at_accuracy: float | None = 0.4
    """Stop at the first probe whose greedy accuracy reaches this; None trains for ``max_steps``."""
    probe_every: int = 10
    """Steps between probes."""
    probe_size: int = 128
    """Train-split questions (held back from SFT) in the probe."""
    max_new_tokens: int = 48
    """Generation limit in probes (multi-turn tasks: the whole episode's tokens)."""
    max_turns: int = 16
    """Policy turns per probe episode (multi-turn tasks)."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def default_cache_root() -> Path:
    """Where cold-started policies live: ``$GRPOKIT_CACHE/models`` if set, else
    ``$XDG_CACHE_HOME/grpokit/models``, else ``~/.cache/grpokit/models``."""
    if os.environ.get("GRPOKIT_CACHE"):
        return Path(os.environ["GRPOKIT_CACHE"]).expanduser() / "models"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "grpokit" / "models"


def build_once(final: Path, marker: str, build: Callable[[Path], None], threads: int) -> Path:
    """``final`` (a cache directory, complete when it holds the file ``marker``), built by ``build(tmp)`` on
    first use: with ``threads`` torch threads (restored afterwards), into a temporary directory renamed into
    place, so a crash never leaves a half-written entry and two processes building it at once both end with
    the one that finished first."""
    if (final / marker).is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()  # plain mkdir (not mkdtemp) so the entry gets the user's usual permissions
    try:
        build(tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / marker).is_file():  # not a concurrent writer finishing first
                raise
    finally:
        torch.set_num_threads(previous_threads)
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _task_kwargs(task: Any, settings: ColdStartSettings) -> dict[str, Any]:
    """The task's difficulty defaults overridden by ``settings.task_kwargs`` (split sizes excluded)."""
    kwargs = {k: v for k, v in task.defaults.items() if k not in ("num_train", "num_test")}
    kwargs.update(settings.task_kwargs)
    return kwargs


def _settings_key(task: Any, seed: int, settings: ColdStartSettings) -> str:
    blob = json.dumps(
        {
            "version": COLD_START_VERSION,
            "task": task.name,
            "task_kwargs": _task_kwargs(task, settings),
            "seed": seed,
            "settings": settings.to_dict(),
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


COLD_START_THREADS = 1
"""Torch threads for the cold start unless told otherwise. One, so the checkpoint is the same on every run on
a machine: with more threads the floating-point summation order changes and so does the model (measured here:
held-out accuracy 0.398 after a 2-thread cold start, 0.466 after a 1-thread one, same seed and settings).
A second thread also gains little on a model this small, and on busy cores OpenMP threads that wait on each
other make the run several times slower (2 threads on 2 loaded cores: 191 s of CPU against 31 s)."""


def cold_start_policy(
    task_name: str = "arithmetic",
    cache_dir: str | os.PathLike[str] | None = None,
    seed: int = 0,
    *,
    num_threads: int | None = None,
    progress: bool = True,
    **sft: Any,
) -> Path:
    """A tiny policy given a short supervised cold start on ``task_name``; returns its checkpoint directory.

    ``sft`` overrides fields of ``ColdStartSettings`` (model size, SFT steps, early stop, task difficulty via
    ``task_kwargs``). The checkpoint is ``<cache_dir>/<task_name>-<hash of task, seed and settings>``, with
    ``cache_dir`` defaulting to ``default_cache_root()``; it holds the model and tokenizer
    (``save_pretrained``, loadable with ``AutoModelForCausalLM`` / ``AutoTokenizer``) and ``cold_start.json``
    (settings and training record). If that directory already exists it is returned without training. It is
    written to a temporary directory first and renamed into place, so a crash never leaves a half checkpoint.

    SFT data: ``task.make_splits(seed=seed, num_train=num_sft_examples + probe_size, **task_kwargs)[0]``, the
    TRAIN split; evaluate on the same task's test split (any seed or size: the splits are disjoint).
    ``num_threads``: torch threads while training (default :data:`COLD_START_THREADS`, 1); never more than
    the available cores; the previous setting is restored afterwards. Results differ with the thread count
    (floating-point summation order), so the default is fixed rather than taken from the machine.
    """
    task = get_task(task_name)
    unknown = set(sft) - {f.name for f in dataclasses.fields(ColdStartSettings)}
    if unknown:
        raise TypeError(f"unknown cold-start settings {sorted(unknown)}; see ColdStartSettings")
    settings = ColdStartSettings(**{**task.cold_start, **sft})
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_root()
    final = root / f"{task_name}-{_settings_key(task, seed, settings)}"

    def build(tmp: Path) -> None:
        model, tokenizer, record = _run_cold_start(task, seed, settings, progress)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        meta = {
            "task": task_name,
            "seed": seed,
            "settings": settings.to_dict(),
            "version": COLD_START_VERSION,
        }
        (tmp / "cold_start.json").write_text(json.dumps({**meta, "record": record}, indent=2) + "\n")

    threads = max(1, min(num_threads or COLD_START_THREADS, _available_cores()))
    return build_once(final, "cold_start.json", build, threads)


def cold_start_blueprint(task_name: str = "arithmetic", seed: int = 0, **sft: Any) -> tuple[Any, Any]:
    """(model, tokenizer) of the tiny policy ``cold_start_policy`` would train, before any training: random
    weights, nothing read or written. What a run's checks need before the cold start (the vocabulary, the
    positions, the module names LoRA targets)."""
    task = get_task(task_name)
    return _untrained(task, seed, ColdStartSettings(**{**task.cold_start, **sft}))


def _untrained(task: Any, seed: int, s: ColdStartSettings) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    tokenizer = build_char_tokenizer(tags=(*DEFAULT_TAGS, *task.tokenizer_tags))
    if s.arch in MOE_ARCHITECTURES:
        model = build_tiny_moe(
            tokenizer, s.arch, hidden_size=s.hidden_size, num_layers=s.num_layers, num_heads=s.num_heads,
            num_kv_heads=s.num_heads, expert_size=s.intermediate_size or s.hidden_size, seed=seed,
        )  # fmt: skip
        return model, tokenizer
    model = build_tiny_model(
        tokenizer,
        arch=s.arch,
        hidden_size=s.hidden_size,
        num_layers=s.num_layers,
        num_heads=s.num_heads,
        intermediate_size=s.intermediate_size,
        seed=seed,
    )
    return model, tokenizer


def _run_cold_start(
    task: Any, seed: int, s: ColdStartSettings, progress: bool
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast, dict[str, Any]]:
    start = time.perf_counter()
    task_kwargs = _task_kwargs(task, s)
    rows, _ = task.make_splits(
        seed=seed, num_train=s.num_sft_examples + s.probe_size, num_test=1, **task_kwargs
    )
    sft_rows, probe_rows = rows[: s.num_sft_examples], rows[s.num_sft_examples :]

    model, tokenizer = _untrained(task, seed, s)

    examples = [_example(task, row, tokenizer) for row in sft_rows]
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=s.learning_rate, weight_decay=s.weight_decay, betas=(0.9, 0.98)
    )
    order_rng = random.Random(f"cold-start-{seed}")
    order: list[int] = []
    probes: list[dict[str, Any]] = []
    model.train()
    bar = tqdm(range(1, s.max_steps + 1), desc="cold start (SFT)", disable=not progress)
    loss_value, step = float("nan"), 0
    for step in bar:
        if len(order) < s.batch_size:  # reshuffle per epoch
            order += order_rng.sample(range(len(examples)), len(examples))
        batch = [examples[order.pop()] for _ in range(s.batch_size)]
        input_ids, attention_mask, labels = _collate(batch, tokenizer.pad_token_id)
        for group in optimizer.param_groups:
            group["lr"] = s.learning_rate * min(1.0, step / max(1, s.warmup_steps))
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), s.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss_value = loss.item()
        if step % s.probe_every == 0 or step == s.max_steps:
            acc = _probe_accuracy(task, model, tokenizer, probe_rows, s)
            probes.append({"step": step, "loss": loss_value, "probe_accuracy": acc})
            bar.set_postfix(loss=f"{loss_value:.3f}", probe_acc=f"{acc:.2f}")
            if s.stop_at_accuracy is not None and acc >= s.stop_at_accuracy:
                break
        elif step % 5 == 0:
            bar.set_postfix(loss=f"{loss_value:.3f}")
    bar.close()
    model.eval()
    record = {
        "steps": step,
        "final_loss": loss_value,
        "probe_accuracy": probes[-1]["probe_accuracy"] if probes else None,
        "probes": probes,
        "train_time_s": round(time.perf_counter() - start, 2),
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
        "torch_threads": torch.get_num_threads(),
    }
    return model, tokenizer, record


def _example(task: Any, row: dict[str, Any], tokenizer: Any) -> tuple[list[int], list[int], list[int]]:
    """(prompt ids, completion ids, 1 where the completion token is trained): the worked solution + EOS,
    or a multi-turn task's worked episode: each policy turn + EOS trained, the observations between them
    (tokenized alone, as the episode runner appends them) context only."""

    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    segments = task.worked_episode(row) if task.worked_episode else [(task.worked_solution(row), True)]
    completion, trained = [], []
    for text, is_policy in segments:
        ids = [*encode(text), tokenizer.eos_token_id] if is_policy else encode(text)
        completion += ids
        trained += [int(is_policy)] * len(ids)
    return encode(row["prompt"]), completion, trained


def _probe_accuracy(task: Any, model: Any, tokenizer: Any, rows: list[dict[str, Any]], s: Any) -> float:
    """Greedy accuracy on ``rows`` (episodes in the task's environment for a multi-turn task; a game's
    legal-move rate against the random and the expert player, sampled)."""
    make_game = task_game(task)
    if make_game is not None:
        measured = game_evaluation(make_game, model, tokenizer, rows, max_new_tokens=s.max_new_tokens)
        return measured["game/legal_rate"]
    if task.environment is not None:
        return task_episode_accuracy(
            task, model, tokenizer, rows, max_new_tokens=s.max_new_tokens, max_turns=s.max_turns
        )["accuracy"]
    return evaluate_accuracy(
        model, tokenizer, rows, extract_fn=task.extract_answer, max_new_tokens=s.max_new_tokens
    )["accuracy"]


def _collate(batch: list[tuple[list[int], list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, ...]:
    """Right-padded ``[prompt | completion]`` rows; labels are -100 except on trained completion tokens."""
    input_ids, attention_mask = pad_right([p + c for p, c, _ in batch], pad_id)  # [B, T] each
    labels = torch.full_like(input_ids, -100)  # [B, T]
    for b, (p, c, trained) in enumerate(batch):
        keep = torch.tensor(trained, dtype=torch.bool)
        labels[b, len(p) : len(p) + len(c)] = torch.where(keep, torch.tensor(c), -100)
    return input_ids, attention_mask, labels

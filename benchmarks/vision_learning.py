"""Does GRPO teach a tiny vision-language model something about its images, on a CPU in minutes?

The policy is the tiny LLaVA of ``grpokit.models.tiny_vision`` (``build_tiny_vlm("llava", seed=seed)``:
a random CLIP tower and a 2-layer Llama, character tokenizer; 32x32 images -> 16 image tokens). The task is
made here with PIL, deterministically from the seed: "colour?" about an image holding one filled shape
(square or disc, 8-16 px, anywhere) in one of four colours (red, green, blue, yellow) on a background of
another of them, every shade jittered; the answer is the shape's colour. The train split (256 rows) and
the held-out split (128 rows) are drawn independently. On a grey background the colour is learned before
the spelling of the words (greedy accuracy ~1 while samples at T = 1 are mostly misspelt): no room for
GRPO. With a coloured background the model must find which of two colours is the shape's, and at the end
of the cold start greedy accuracy is ~0.5 while most samples are well-formed colour names.

For each seed:

1. **Cold start** (as ``grpokit.tasks.cold_start``): supervised fine-tuning (plain torch, AdamW lr 3e-3,
   batch 32, loss on the answer and EOS only, the vision tower frozen as GRPO keeps it) on the first 192
   train rows, probed every 5 steps on the other 64 (greedy); stopped at the first probe reaching 0.5 (cap
   300 steps).
2. **Before**: greedy accuracy on the held-out split (``model.generate`` on the processor's batch; right
   when the completion's first word is the answer).
3. **GRPO**: ``grpokit.GRPOTrainer`` on the cold-started model (saved with its processor) and the 256 train
   rows: reward 1 when the completion's first word is the answer; 150 steps of 8 prompts x G = 8, lr 3e-4
   constant, beta 0, T = 1, at most 8 new tokens, fp32.
4. **After**: held-out greedy accuracy of the trained model.

The held-out split is only measured, never used to stop or tune anything per seed (the hyperparameters were
chosen on seeds 0 and 10-12).

Usage (2 CPU cores, 2 torch threads; 20-70 s per seed, depending on the machine's other load):

    python benchmarks/vision_learning.py --seeds 0 1 2 --out benchmarks/results/vision_learning.json

``--quick`` runs tiny sizes for the smoke test (tests/vision/test_vision_learning_script.py); its numbers
mean nothing.
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import mean
from typing import Any

import torch
from PIL import Image, ImageDraw

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.models.tiny_vision import build_tiny_vlm
from grpokit.models.vision import vision_modules

COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (200, 40, 40),
    "green": (40, 160, 50),
    "blue": (40, 60, 200),
    "yellow": (210, 190, 40),
}
QUESTION = "colour?"
IMAGE_SIZE = 32


@dataclass(frozen=True)
class Settings:
    """Sizes and hyperparameters of one run (``--quick`` shrinks them)."""

    train_rows: int = 256
    """Rows of the train split (GRPO prompts); the last ``probe_rows`` of them are the cold start's probe."""
    probe_rows: int = 64
    """Train rows held back from SFT, on which greedy accuracy stops it."""
    held_out_rows: int = 128
    """Rows of the held-out split (measured before and after GRPO, nothing else)."""
    sft_batch: int = 32
    """Sequences per SFT step."""
    sft_lr: float = 3e-3
    """SFT AdamW learning rate (constant)."""
    sft_max_steps: int = 300
    """SFT step cap."""
    probe_every: int = 5
    """SFT steps between probes."""
    stop_at: float = 0.5
    """SFT stops at the first probe whose greedy accuracy reaches this."""
    grpo_steps: int = 150
    """GRPO steps."""
    prompts_per_step: int = 8
    """Prompts per GRPO step."""
    num_generations: int = 8
    """G: completions per prompt."""
    grpo_lr: float = 3e-4
    """GRPO AdamW learning rate (constant)."""
    beta: float = 0.0
    """KL coefficient (0: no reference model)."""
    max_new_tokens: int = 8
    """Completion limit (sampling and greedy evaluation)."""


QUICK = Settings(train_rows=24, probe_rows=8, held_out_rows=8, sft_batch=8, sft_max_steps=4, probe_every=2,
                 grpo_steps=2, prompts_per_step=2, num_generations=4)  # fmt: skip


def draw_image(rng: random.Random, colour: str) -> Image.Image:
    """A ``colour`` square or disc (size, position and shade random) on a background of another of the
    colours (shade random)."""
    background = rng.choice([c for c in COLOURS if c != colour])
    image = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), shade(rng, background))
    size = rng.randint(8, 16)
    x, y = rng.randint(0, IMAGE_SIZE - size), rng.randint(0, IMAGE_SIZE - size)
    draw = ImageDraw.Draw(image)
    box = (x, y, x + size - 1, y + size - 1)
    if rng.random() < 0.5:
        draw.rectangle(box, fill=shade(rng, colour))
    else:
        draw.ellipse(box, fill=shade(rng, colour))
    return image


def shade(rng: random.Random, colour: str) -> tuple[int, int, int]:
    """``colour``'s RGB with each channel moved by up to 30."""
    r, g, b = (min(255, max(0, c + rng.randint(-30, 30))) for c in COLOURS[colour])
    return r, g, b


def make_rows(seed: int, split: str, n: int) -> list[dict[str, Any]]:
    """``n`` rows of ``split`` ("train" or "held_out"), deterministic in (seed, split)."""
    rng = random.Random(f"vision-learning/{seed}/{split}")
    rows = []
    for _ in range(n):
        colour = rng.choice(list(COLOURS))
        rows.append({"prompt": [{"role": "user", "content": QUESTION}], "image": draw_image(rng, colour),
                     "answer": colour})  # fmt: skip
    return rows


def first_word(text: str) -> str:
    words = text.split()
    return words[0] if words else ""


def exact_answer_reward(completions, answer, **_) -> list[float]:
    """1 when the completion's first word is the answer, else 0."""
    return [float(first_word(c[0]["content"]) == a) for c, a in zip(completions, answer)]


def prompt_text(processor, row: dict[str, Any]) -> str:
    """The row's prompt rendered by the chat template, the image part first (where grpokit puts it)."""
    text = row["prompt"][0]["content"]
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]
    return processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def processed(processor, rows: list[dict[str, Any]], texts: list[str]) -> Any:
    """The processor's batch of ``texts`` with the rows' images (no special tokens added, as grpokit)."""
    images = [r["image"] for r in rows]
    return processor(text=texts, images=images, return_tensors="pt", padding=True, add_special_tokens=False)


@torch.no_grad()
def greedy_accuracy(
    model, processor, rows: list[dict[str, Any]], max_new_tokens: int, batch: int = 64
) -> float:
    """Share of rows whose greedy completion's first word is the answer."""
    model.eval()
    tokenizer = processor.tokenizer
    image_token = tokenizer.convert_tokens_to_ids(tokenizer.image_token)
    right = 0
    for start in range(0, len(rows), batch):
        chunk = rows[start : start + batch]
        inputs = processed(processor, chunk, [prompt_text(processor, r) for r in chunk])
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False,
                             bad_words_ids=[[image_token]], eos_token_id=tokenizer.eos_token_id,
                             pad_token_id=tokenizer.pad_token_id)  # fmt: skip
        texts = tokenizer.batch_decode(out[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
        right += sum(first_word(t) == r["answer"] for t, r in zip(texts, chunk))
    return right / len(rows)


def sft_batch(processor, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """The processor's batch of prompt + answer + EOS (right-padded), labels on the answer and EOS only."""
    tokenizer = processor.tokenizer
    texts = [prompt_text(processor, r) + r["answer"] + tokenizer.eos_token for r in rows]
    side, tokenizer.padding_side = tokenizer.padding_side, "right"
    try:
        inputs = processed(processor, rows, texts)
    finally:
        tokenizer.padding_side = side
    labels = torch.full_like(inputs["input_ids"], -100)
    lengths = inputs["attention_mask"].sum(1).tolist()
    for i, r in enumerate(rows):
        n = len(tokenizer(r["answer"] + tokenizer.eos_token, add_special_tokens=False)["input_ids"])
        labels[i, lengths[i] - n : lengths[i]] = inputs["input_ids"][i, lengths[i] - n : lengths[i]]
    inputs["labels"] = labels
    return dict(inputs)


def cold_start(model, processor, rows: list[dict[str, Any]], s: Settings, seed: int) -> tuple[int, float]:
    """SFT on the train rows but the last ``probe_rows`` until greedy accuracy on those reaches ``stop_at``;
    (steps, last probe accuracy)."""
    sft_rows, probe = rows[: -s.probe_rows], rows[-s.probe_rows :]
    for m in vision_modules(model):  # frozen, as GRPO keeps it (freeze_vision_tower)
        m.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=s.sft_lr, weight_decay=0.0)
    rng = random.Random(f"sft/{seed}")
    order: list[int] = []
    accuracy = 0.0
    for step in range(1, s.sft_max_steps + 1):
        if len(order) < s.sft_batch:
            more = list(range(len(sft_rows)))
            rng.shuffle(more)
            order += more
        batch, order = [sft_rows[i] for i in order[: s.sft_batch]], order[s.sft_batch :]
        model.train()
        loss = model(**sft_batch(processor, batch)).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        if step % s.probe_every == 0 or step == s.sft_max_steps:
            accuracy = greedy_accuracy(model, processor, probe, s.max_new_tokens)
            print(f"  sft step {step}: loss {loss.item():.3f}, probe accuracy {accuracy:.3f}", flush=True)
            if accuracy >= s.stop_at:
                break
    for m in vision_modules(model):
        m.requires_grad_(True)
    return step, accuracy


def run_seed(seed: int, s: Settings, threads: int, work: Path) -> dict[str, Any]:
    started = time.perf_counter()
    torch.manual_seed(seed)
    train, held_out = make_rows(seed, "train", s.train_rows), make_rows(seed, "held_out", s.held_out_rows)
    model, processor = build_tiny_vlm("llava", seed=seed)
    initial = greedy_accuracy(model, processor, held_out, s.max_new_tokens)
    steps, probe = cold_start(model, processor, train, s, seed)
    before = greedy_accuracy(model, processor, held_out, s.max_new_tokens)
    print(f"seed {seed}: cold start {steps} steps (probe {probe:.3f}); held-out {before:.3f}", flush=True)
    start_dir = work / f"seed{seed}-cold-start"
    model.save_pretrained(start_dir)
    processor.save_pretrained(start_dir)
    batch = s.prompts_per_step * s.num_generations
    args = GRPOConfig(
        output_dir=str(work / f"seed{seed}-grpo"), max_steps=s.grpo_steps, num_generations=s.num_generations,
        per_device_train_batch_size=batch, max_completion_length=s.max_new_tokens, learning_rate=s.grpo_lr,
        beta=s.beta, temperature=1.0, bf16=False, seed=seed, logging_steps=1, report_to=[],
        disable_tqdm=True, save_steps=0, use_cpu=True, torch_num_threads=threads, freeze_vision_tower=True,
    )  # fmt: skip
    trainer = GRPOTrainer(model=str(start_dir), reward_funcs=[exact_answer_reward], args=args,
                          train_dataset=train)  # fmt: skip
    history = trainer.train()
    after = greedy_accuracy(trainer.model, processor, held_out, s.max_new_tokens)
    rewards = [h["reward"] for h in history if "reward" in h]
    seconds = time.perf_counter() - started
    print(f"seed {seed}: held-out {before:.3f} -> {after:.3f} ({seconds:.0f} s)", flush=True)
    return {
        "seed": seed,
        "accuracy_initial": initial,
        "cold_start_steps": steps,
        "cold_start_probe_accuracy": probe,
        "accuracy_before": before,
        "accuracy_after": after,
        "grpo_steps": s.grpo_steps,
        "reward_first5": mean(rewards[:5]) if rewards else None,
        "reward_last5": mean(rewards[-5:]) if rewards else None,
        "seconds": round(seconds, 1),
    }


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")),
                "unknown")  # fmt: skip


def table(results: list[dict[str, Any]]) -> str:
    lines = ["| seed | cold-start steps | held-out before | held-out after | GRPO steps | seconds |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for r in results:
        lines.append(f"| {r['seed']} | {r['cold_start_steps']} | {r['accuracy_before']:.3f} | "
                     f"{r['accuracy_after']:.3f} | {r['grpo_steps']} | {r['seconds']:.0f} |")  # fmt: skip
    before, after = mean(r["accuracy_before"] for r in results), mean(r["accuracy_after"] for r in results)
    lines.append(f"| mean | | {before:.3f} | {after:.3f} | | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/vision_learning.json"))
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--quick", action="store_true", help="tiny sizes for the smoke test (no claims)")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    settings = QUICK if args.quick else Settings()
    results = []
    with tempfile.TemporaryDirectory(prefix="vision-learning-") as work:
        for seed in args.seeds:
            results.append(run_seed(seed, settings, args.threads, Path(work)))
    argv_used = sys.argv[1:] if argv is None else argv
    summary = {
        "command": shlex.join(["python", "benchmarks/vision_learning.py", *argv_used]),
        "date": datetime.date.today().isoformat(),
        "cpu": cpu_model(),
        "torch_threads": torch.get_num_threads(),
        "quick": args.quick,
        "task": {"question": QUESTION, "colours": list(COLOURS), "image_size": IMAGE_SIZE},
        "settings": asdict(settings),
        "seeds": results,
        "mean_accuracy_before": mean(r["accuracy_before"] for r in results),
        "mean_accuracy_after": mean(r["accuracy_after"] for r in results),
    }
    print(table(results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {args.out}")
    return summary


if __name__ == "__main__":
    main()

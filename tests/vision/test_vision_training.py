"""GRPO on vision-language policies (grpokit.models.vision): the trainer's log-probs equal the model's plain
forward with the same images, the encoder runs once per prompt, learning rate 0 keeps ratio 1 and KL 0
exactly (fp32, bf16, LoRA), the vision encoder stays frozen unless asked, and a run saves a model that
reloads with its processor and resumes exactly. Tiny LLaVA and Gemma 3 built locally
(grpokit.models.tiny_vision)."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image
from transformers import AutoModelForImageTextToText

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.data.integrity import InputError
from grpokit.models.loading import load_processor
from grpokit.models.tiny_vision import build_tiny_vlm
from grpokit.models.vision import placeholder_token_ids, takes_encoder_outputs, vision_modules
from grpokit.rollout.native_decode import native_supported
from grpokit.train.forward import completion_logprobs
from grpokit.train.prompts import ImagePrompts
from tests.vision.architectures import ARCHITECTURES

COLOURS = {"red": (220, 30, 30), "blue": (30, 30, 220), "green": (30, 200, 30)}


def colour_rows(n: int = 4) -> list[dict]:
    """Rows asking an image's colour (one image each, a PIL object), the answer as a column."""
    names = list(COLOURS)
    return [
        {"prompt": [{"role": "user", "content": "colour?"}],
         "image": Image.new("RGB", (32, 32), COLOURS[names[i % 3]]), "answer": names[i % 3]}
        for i in range(n)
    ]  # fmt: skip


def first_letter_reward(completions, answer, **_):
    return [float(c[0]["content"][:1] == a[:1]) for c, a in zip(completions, answer)]


@pytest.fixture(scope="module", params=ARCHITECTURES)
def vlm_dir(request, tmp_path_factory):
    """A tiny VLM and its processor saved to a directory."""
    model, processor = build_tiny_vlm(request.param, seed=0)
    path = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return path


def images_per_encoder_call(model) -> list[int]:
    """A list that fills, per call of the model's vision encoder, with the number of images it received."""
    seen = []

    def count(_module, args, kwargs, _output):
        if "grid_thw" in kwargs:  # Qwen: flattened patches of all images, one grid row per image
            seen.append(kwargs["grid_thw"].shape[0])
        else:
            seen.append((args[0] if args else kwargs["pixel_values"]).shape[0])

    vision_modules(model)[0].register_forward_hook(count, with_kwargs=True)
    return seen


def config(tmp_path, **overrides) -> GRPOConfig:
    values = dict(
        output_dir=str(tmp_path / "run"), max_steps=2, num_generations=4, per_device_train_batch_size=4,
        max_completion_length=5, logging_steps=1, report_to=[], use_cpu=True, disable_tqdm=True, seed=0,
        save_steps=0,
    )  # fmt: skip
    return GRPOConfig(**{**values, **overrides})


def encoded_batch(path, rows, group):
    """prompt ids (left-padded), completions and the rows' images, as the trainer builds them."""
    processor = load_processor(str(path))
    ids, images = ImagePrompts(processor, None, None).encode(rows, [group] * len(rows), "test")
    return processor, ids, images


def test_logprobs_equal_the_models_plain_forward_with_the_same_images(vlm_dir):
    """completion_logprobs (encoder once per prompt, features shared by the G rows) == log_softmax of
    model(input_ids, attention_mask, pixel_values of every row) at the completion tokens."""
    model = AutoModelForImageTextToText.from_pretrained(vlm_dir).eval()
    rows, group = colour_rows(2), 3
    processor, prompt_ids, images = encoded_batch(vlm_dir, rows, group)
    torch.manual_seed(0)
    width = max(len(p) for p in prompt_ids)
    pad = processor.tokenizer.pad_token_id
    p_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompt_ids for _ in range(group)])
    p_mask = (
        torch.arange(width)[None]
        >= width - torch.tensor([len(p) for p in prompt_ids for _ in range(group)])[:, None]
    ).long()
    c_ids = torch.randint(4, 60, (len(p_ids), 5))
    c_mask = torch.ones_like(c_ids)
    c_mask[1, 3:] = 0  # a shorter completion
    ids = torch.cat([p_ids, c_ids], 1)
    types = {}  # the processor's own per-token modality ids over the whole rows (Gemma 3 reads them)
    if images.token_type_key is not None:
        types[images.token_type_key] = torch.tensor(processor.create_mm_token_type_ids(ids.tolist()))
    with torch.no_grad():
        logps, _ = completion_logprobs(model, p_ids, p_mask, c_ids, c_mask, images=images)
        full = model(input_ids=ids, attention_mask=torch.cat([p_mask, c_mask], 1),
                     **images.row_inputs("cpu"), **types).logits  # fmt: skip
    plain = full[:, width - 1 : -1].log_softmax(-1).gather(-1, c_ids[..., None])[..., 0] * c_mask
    torch.testing.assert_close(logps, plain, atol=2e-5, rtol=0)


def test_the_vision_encoder_runs_once_per_prompt_not_once_per_completion(vlm_dir):
    model = AutoModelForImageTextToText.from_pretrained(vlm_dir).eval()
    if not takes_encoder_outputs(model.model):
        pytest.skip("this transformers release takes no precomputed image features (mm_encoder_outputs)")
    rows, group = colour_rows(2), 4
    _, prompt_ids, images = encoded_batch(vlm_dir, rows, group)
    seen = []  # the images each encoder call received

    def count_images(_module, args, kwargs, _output):
        if "grid_thw" in kwargs:  # Qwen: flattened patches, one grid row per image
            seen.append(kwargs["grid_thw"].shape[0])
        else:
            seen.append((args[0] if args else kwargs["pixel_values"]).shape[0])

    vision_modules(model)[0].register_forward_hook(count_images, with_kwargs=True)
    width = max(len(p) for p in prompt_ids)
    p_ids = torch.tensor([[0] * (width - len(p)) + p for p in prompt_ids for _ in range(group)])
    p_mask = (p_ids != 0).long()
    c_ids = torch.randint(4, 60, (len(p_ids), 3))
    with torch.no_grad():
        completion_logprobs(model, p_ids, p_mask, c_ids, torch.ones_like(c_ids), images=images)
    assert seen == [2]  # one encoder call over the 2 prompts' 2 images, for 8 rows


@pytest.mark.parametrize("variant", ["fp32", "bf16", "lora"])
def test_learning_rate_zero_keeps_ratio_one_and_kl_zero(vlm_dir, tmp_path, variant):
    """mu = 2 and beta > 0 at lr 0: the old-policy, reference and update passes see the same images, so the
    ratio is 1 (no clipping) and the KL 0 exactly, in fp32, bf16 and with LoRA adapters."""
    extra = {"bf16": True} if variant == "bf16" else {}
    peft_config = None
    if variant == "lora":
        from peft import LoraConfig

        peft_config = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    args = config(tmp_path, learning_rate=0.0, beta=0.04, num_iterations=2, **extra)
    trainer = GRPOTrainer(model=str(vlm_dir), reward_funcs=first_letter_reward, args=args,
                          train_dataset=colour_rows(4), peft_config=peft_config)  # fmt: skip
    history = trainer.train()
    for entry in history:
        assert entry["kl"] == 0.0
        assert entry["clip_ratio/region_mean"] == 0.0
    if variant == "lora":  # adapters on the language model only: the encoder is frozen by default
        names = [n for n, _ in trainer.model.named_parameters() if "lora_" in n]
        assert names and not any(v in n for n in names for v in ("vision_tower", "vision_model", "visual"))


def test_gradient_checkpointing_gives_the_same_step(vlm_dir, tmp_path):
    """One step at lr > 0 (the encoder training too) with and without gradient checkpointing, from the same
    seed: the same samples, the same loss, the same weights after it (recomputation changes no number that
    matters beyond float rounding)."""

    def varied(completions, **_):  # rewards that differ within a group, so the step has a gradient
        return [float(sum(map(ord, c[0]["content"])) % 5) for c in completions]

    def step(checkpointing):
        args = config(tmp_path / str(checkpointing), learning_rate=1e-2, max_steps=1,
                      gradient_checkpointing=checkpointing)  # fmt: skip
        trainer = GRPOTrainer(model=str(vlm_dir), reward_funcs=varied, args=args,
                              train_dataset=colour_rows(4))  # fmt: skip
        (entry,) = trainer.train()
        return entry, {n: p.detach().clone() for n, p in trainer.model.named_parameters()}

    plain, plain_weights = step(False)
    checkpointed, weights = step(True)
    assert checkpointed["reward"] == plain["reward"]
    assert checkpointed["loss"] == pytest.approx(plain["loss"], abs=1e-6)
    initial = dict(AutoModelForImageTextToText.from_pretrained(vlm_dir).named_parameters())
    assert any(not torch.equal(w, initial[n]) for n, w in weights.items())  # the step moved the weights
    for name, weight in weights.items():
        torch.testing.assert_close(weight, plain_weights[name], atol=1e-5, rtol=0, msg=name)


def test_the_encoder_stays_frozen_unless_asked_and_the_language_model_learns(vlm_dir, tmp_path):
    def varied(completions, **_):  # rewards that differ within a group, so every step has a gradient
        return [float(sum(map(ord, c[0]["content"])) % 5) for c in completions]

    def trained(freeze):
        args = config(tmp_path / str(freeze), learning_rate=1e-2, freeze_vision_tower=freeze, max_steps=1)
        trainer = GRPOTrainer(
            model=str(vlm_dir), reward_funcs=varied, args=args, train_dataset=colour_rows(4)
        )
        before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        trainer.train()
        encoder = {n for m in vision_modules(trainer.model) for n, _ in m.named_parameters()}
        moved = {n for n, p in trainer.model.named_parameters() if not torch.equal(p, before[n])}
        in_encoder = {n for n in moved if any(n.endswith(e) for e in encoder)}
        return moved, in_encoder

    moved, in_encoder = trained(True)
    assert moved and not in_encoder  # the language model learned, the encoder did not move
    for freeze in (False, None):  # None, full fine-tuning: TRL's, every weight trains
        moved, in_encoder = trained(freeze)
        assert in_encoder


def test_a_run_saves_a_model_that_reloads_with_its_processor_and_resumes_exactly(vlm_dir, tmp_path):
    """Two steps in one go == one step, a checkpoint, a new trainer resuming for the second."""
    reward = first_letter_reward
    whole = GRPOTrainer(model=str(vlm_dir), reward_funcs=reward, train_dataset=colour_rows(4),
                        args=config(tmp_path / "whole", learning_rate=1e-2))  # fmt: skip
    whole.train()
    first = GRPOTrainer(model=str(vlm_dir), reward_funcs=reward, train_dataset=colour_rows(4),
                        args=config(tmp_path / "split", learning_rate=1e-2, save_steps=1))  # fmt: skip
    first.max_steps = 1
    first.train()
    again = GRPOTrainer(model=str(vlm_dir), reward_funcs=reward, train_dataset=colour_rows(4),
                        args=config(tmp_path / "split", learning_rate=1e-2, save_steps=1,
                                    resume_from_checkpoint="latest"))  # fmt: skip
    again.train()
    out = tmp_path / "whole" / "run"
    reloaded = AutoModelForImageTextToText.from_pretrained(out)
    for (name, a), b in zip(whole.model.state_dict().items(), reloaded.state_dict().values()):
        assert torch.equal(a, b), name
    for (name, a), b in zip(whole.model.state_dict().items(), again.model.state_dict().values()):
        assert torch.equal(a, b), name
    processor = load_processor(str(out))
    original = load_processor(str(vlm_dir))
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "a b"}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    image = Image.new("RGB", (32, 32), (1, 2, 3))
    got, want = processor(text=[text], images=[image]), original(text=[text], images=[image])
    assert got["input_ids"] == want["input_ids"]
    assert json.loads((out / "grpokit_run.json").read_text())["state"] == "finished"


def test_sampling_with_images_equals_model_generate(vlm_dir, tmp_path):
    """The trainer's greedy draw == model.generate on the processor's own batch of the same prompt."""
    args = config(tmp_path, max_completion_length=6)
    trainer = GRPOTrainer(model=str(vlm_dir), reward_funcs=first_letter_reward, args=args,
                          train_dataset=colour_rows(3))  # fmt: skip
    rows = colour_rows(1)
    samples = trainer.sample(rows, greedy=True)
    # generation_backend auto: the fast sampler where its native decode takes the language model (LLaVA)
    assert (type(trainer.backend).__name__ == "FastSampler") == native_supported(trainer.model)
    processor = load_processor(str(vlm_dir))
    text = processor.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {
        "type": "text", "text": "colour?"}]}], add_generation_prompt=True, tokenize=False)  # fmt: skip
    inputs = processor(text=[text], images=[rows[0]["image"]], return_tensors="pt")
    bad = [[i] for i in trainer.sampling_params().suppress_token_ids]
    out = trainer.model.generate(**inputs, max_new_tokens=6, do_sample=False, bad_words_ids=bad or None,
                                 eos_token_id=processor.tokenizer.eos_token_id)  # fmt: skip
    want = out[0, inputs["input_ids"].shape[1] :].tolist()
    eos = processor.tokenizer.eos_token_id
    want = want[: want.index(eos) + 1] if eos in want else want
    assert samples.generated.completion_ids[0] == want


def test_what_a_text_run_or_a_vision_run_cannot_take(vlm_dir, tmp_path):
    from grpokit.models.tiny import build_char_tokenizer, build_tiny_model

    tokenizer = build_char_tokenizer()
    text_model = build_tiny_model(tokenizer, hidden_size=32, num_layers=1)
    with pytest.raises(InputError, match=r"train_dataset: 4 row\(s\) have images.*text model"):
        GRPOTrainer(model=text_model, processing_class=tokenizer, reward_funcs=first_letter_reward,
                    args=config(tmp_path), train_dataset=colour_rows(4))  # fmt: skip
    with pytest.raises(InputError, match=r"processor for images, but the model .* has no vision encoder"):
        GRPOTrainer(model=text_model, processing_class=load_processor(str(vlm_dir)), args=config(tmp_path),
                    reward_funcs=first_letter_reward, train_dataset=colour_rows(4))  # fmt: skip
    broken = colour_rows(4)
    broken[2]["image"] = str(tmp_path / "missing.png")
    with pytest.raises(InputError, match="train_dataset row 2"):
        GRPOTrainer(model=str(vlm_dir), reward_funcs=first_letter_reward, args=config(tmp_path / "b"),
                    train_dataset=broken)  # fmt: skip


def test_max_prompt_length_cuts_the_text_of_an_image_prompt_and_keeps_every_image_token(vlm_dir, tmp_path):
    """TRL 1.16 has no prompt limit; here max_prompt_length bounds a prompt's text: the earliest text tokens
    go, the image tokens (and the tokens around an image) all stay and do not count."""
    processor = load_processor(str(vlm_dir))
    row = colour_rows(1)[0]
    row["prompt"] = [{"role": "user", "content": "Please look closely. Which colour is this?"}]
    full, tensors, _ = ImagePrompts(processor, None, None).encode_row(row, "row 0")
    image_ids = {processor.image_token_id} | {
        processor.tokenizer.convert_tokens_to_ids(getattr(processor.tokenizer, name))
        for name in ("image_token", "boi_token", "eoi_token", "vision_bos_token", "vision_eos_token")
        if getattr(processor.tokenizer, name, None)
    }  # fmt: skip
    is_image = [t in image_ids for t in full]
    text = [i for i, image in enumerate(is_image) if not image]
    assert len(text) > 10 and sum(is_image) >= 4
    cut, cut_tensors, _ = ImagePrompts(processor, 10, None).encode_row(row, "row 0")
    dropped = set(text[: len(text) - 10])  # by hand: the first text tokens
    assert cut == [t for i, t in enumerate(full) if i not in dropped]
    assert sum(t in image_ids for t in cut) == sum(is_image) and len(cut) == 10 + sum(is_image)
    assert all(torch.equal(cut_tensors[k], tensors[k]) for k in tensors)
    with pytest.raises(InputError, match=rf"row 0: the prompt is {len(text)} tokens besides its "
                       rf"{sum(is_image)} image tokens, longer than max_prompt_length=10"):  # fmt: skip
        ImagePrompts(processor, 10, None, truncation="error").encode_row(row, "row 0")
    # A run whose limit is below an image's tokens trains on the cut prompts.
    args = config(tmp_path, max_prompt_length=4, max_steps=1, learning_rate=0.0)
    trainer = GRPOTrainer(model=str(vlm_dir), reward_funcs=first_letter_reward, args=args,
                          train_dataset=colour_rows(4))  # fmt: skip
    (entry,) = trainer.train()
    assert entry["kl"] == 0.0


def test_a_text_prompt_in_a_vision_run_is_cut_or_refused_as_prompt_truncation_says(vlm_dir):
    processor = load_processor(str(vlm_dir))
    row = {"prompt": "abcdefgh"}
    want = processor.tokenizer("abcdefgh", add_special_tokens=True)["input_ids"][-3:]
    ids, tensors, _ = ImagePrompts(processor, 3, None, truncation="left").encode_row(row, "row 0")
    assert ids == want and tensors is None
    with pytest.raises(InputError, match=r"row 0: the prompt is 8 tokens.*prompt_truncation='error'"):
        ImagePrompts(processor, 3, None, truncation="error").encode_row(row, "row 0")


def test_the_completion_log_names_the_image_each_completion_saw(vlm_dir, tmp_path):
    """log_multimodal (TRL's, default True): a file's path, else the sha256 of the image's RGB pixels."""
    import hashlib

    rows = colour_rows(2)
    path = tmp_path / "blue.png"
    rows[1]["image"].save(path)
    rows[1]["image"] = str(path)
    for log_multimodal in (True, False):
        args = config(tmp_path / str(log_multimodal), max_steps=1, log_completions=True,
                      per_device_train_batch_size=8, log_multimodal=log_multimodal)  # fmt: skip
        trainer = GRPOTrainer(model=str(vlm_dir), reward_funcs=first_letter_reward, args=args,
                              train_dataset=rows)  # fmt: skip
        trainer.train()
        lines = (tmp_path / str(log_multimodal) / "run" / "completions.jsonl").read_text().splitlines()
        records = [json.loads(line) for line in lines]
        assert trainer._logs["images"] == [r["images"] for r in records if "images" in r]  # TRL's table
        if not log_multimodal:
            assert all("images" not in r for r in records) and trainer._logs["images"] == []
            continue
        red = hashlib.sha256(Image.new("RGB", (32, 32), COLOURS["red"]).tobytes()).hexdigest()[:16]
        seen = {tuple(r["images"]) for r in records}
        assert seen == {(f"sha256:{red} 32x32",), (str(path),)}
        assert len(records) == 8 and all("extra" not in r for r in records)


def test_evaluation_generates_with_each_rows_images(vlm_dir):
    """grpokit eval's generation (and grpokit train's before/after evaluation) of an image row == the
    model's own generate on the processor's batch of that row, with its image."""
    from grpokit.cli.eval_command import load_eval_model
    from grpokit.eval import generate_completions
    from grpokit.models.vision import placeholder_token_ids

    model, processor = load_eval_model(str(vlm_dir), device="cpu")
    rows = colour_rows(3)
    bad = [[i] for i in placeholder_token_ids(model.config)]
    eos = processor.tokenizer.eos_token_id
    wants = []
    for row in rows:
        text = processor.apply_chat_template([{"role": "user", "content": [{"type": "image"}, {
            "type": "text", "text": "colour?"}]}], add_generation_prompt=True, tokenize=False)  # fmt: skip
        inputs = processor(text=[text], images=[row["image"]], return_tensors="pt")
        want = model.generate(**inputs, max_new_tokens=6, do_sample=False, bad_words_ids=bad,
                              eos_token_id=eos)[0, inputs["input_ids"].shape[1] :].tolist()  # fmt: skip
        wants.append([want[: want.index(eos) + 1] if eos in want else want])
    out = generate_completions(model, processor, rows, max_new_tokens=6, generation_backend="auto")
    assert out.token_ids == wants
    if native_supported(model):  # LLaVA: the fast sampler, the same greedy completions
        fast = generate_completions(model, processor, rows, max_new_tokens=6, generation_backend="fast")
        assert fast.token_ids == wants
    else:
        with pytest.raises(InputError, match="takes no images"):
            generate_completions(model, processor, rows, max_new_tokens=2, generation_backend="fast")


@pytest.mark.parametrize(
    "sampling",
    [{"dynamic_sampling": True}, {"adaptive_num_generations": True, "max_num_generations": 6},
     {"async_generation": True}],
    ids=["dynamic", "adaptive", "async"],
)  # fmt: skip
def test_images_follow_their_groups_when_dropped_resized_or_drawn_ahead(vlm_dir, tmp_path, sampling):
    """Dynamic sampling regroups the kept groups, adaptive G draws ragged groups (two generate calls over
    subsets of the prompts), async generation draws from a copy: each row must still carry its own prompt's
    image, so at lr 0 (mu 2, beta 0.04) the ratio stays 1 and the KL 0 exactly."""

    def varied(completions, **_):
        return [float(sum(map(ord, c[0]["content"])) % 3) for c in completions]

    args = config(tmp_path, learning_rate=0.0, beta=0.04, num_iterations=2, per_device_train_batch_size=8,
                  max_steps=2, **sampling)  # fmt: skip
    trainer = GRPOTrainer(model=str(vlm_dir), reward_funcs=varied, args=args, train_dataset=colour_rows(6))
    history = trainer.train()
    assert len(history) == 2
    for entry in history:
        assert entry["kl"] == 0.0
        assert entry["clip_ratio/region_mean"] == 0.0


def test_a_model_object_with_its_processor_trains(tmp_path):
    """model= an in-memory vision-language model, processing_class= its processor (TRL's form)."""
    model, processor = build_tiny_vlm("llava", seed=1)
    args = config(tmp_path, max_steps=1, learning_rate=0.0, beta=0.04, num_iterations=2)
    trainer = GRPOTrainer(model=model, processing_class=processor, reward_funcs=first_letter_reward,
                          args=args, train_dataset=colour_rows(4))  # fmt: skip
    (entry,) = trainer.train()
    assert entry["kl"] == 0.0
    assert (tmp_path / "run" / "processor_config.json").exists()


def test_without_precomputed_features_every_row_runs_the_encoder_with_the_same_numbers(vlm_dir, monkeypatch):
    """A transformers release whose backbone takes no ``mm_encoder_outputs`` (before 5.2x) gets each row's
    pixel values: the encoder runs per row, and the log-probs equal the shared-feature ones."""
    from grpokit.train import forward

    model = AutoModelForImageTextToText.from_pretrained(vlm_dir).eval()
    rows, group = colour_rows(2), 4
    _, prompt_ids, images = encoded_batch(vlm_dir, rows, group)
    width = max(len(p) for p in prompt_ids)
    p_ids = torch.tensor([[0] * (width - len(p)) + p for p in prompt_ids for _ in range(group)])
    p_mask = (p_ids != 0).long()
    c_ids = torch.randint(4, 60, (len(p_ids), 3), generator=torch.Generator().manual_seed(0))
    c_mask = torch.ones_like(c_ids)
    with torch.no_grad():
        shared, _ = completion_logprobs(model, p_ids, p_mask, c_ids, c_mask, images=images)
        seen = images_per_encoder_call(model)
        monkeypatch.setattr(forward, "takes_encoder_outputs", lambda backbone: False)
        per_row, _ = completion_logprobs(model, p_ids, p_mask, c_ids, c_mask, images=images)
    assert seen == [8]  # 8 rows' images in one encoder call
    torch.testing.assert_close(per_row, shared, atol=2e-5, rtol=0)


def test_the_fast_sampler_samples_with_images_from_the_models_own_distribution(vlm_dir):
    """LLaVA (a Llama language model): the fast sampler's prefill runs the encoder once per prompt, and
    each sampled token's reported log-prob equals the plain forward's log-softmax with the same images (T =
    1, no truncation; the image placeholders suppressed), so the draws come from the model's distribution.
    Other architectures are refused."""
    from grpokit.rollout.base import SamplingParams, generate_groups
    from grpokit.rollout.fast import FastSampler

    model = AutoModelForImageTextToText.from_pretrained(vlm_dir).eval()
    sampler = FastSampler(model, generator=torch.Generator().manual_seed(0))
    rows, group = colour_rows(2), 3
    processor, prompt_ids, images = encoded_batch(vlm_dir, rows, group)
    prompts = images[torch.tensor([0, group])]  # one row per prompt, as the trainer passes them
    params = SamplingParams(max_new_tokens=5, temperature=1.0, top_p=1.0, top_k=0, do_sample=True,
                            eos_token_ids=(processor.tokenizer.eos_token_id,), pad_token_id=0,
                            suppress_token_ids=placeholder_token_ids(model.config))  # fmt: skip
    if not sampler.accepts_images:
        with pytest.raises(ValueError, match="takes images only with its native decode"):
            generate_groups(sampler, prompt_ids, [group, group], params, images=prompts)
        return
    seen = images_per_encoder_call(model)
    out = generate_groups(sampler, prompt_ids, [group, group], params, images=prompts)
    assert seen == [2]  # one call over the 2 prompts' images, for 6 completions
    placeholders = set(placeholder_token_ids(model.config))
    assert not placeholders & {token for ids in out.completion_ids for token in ids}
    rows_ids = [p for p in prompt_ids for _ in range(group)]
    for i, completion in enumerate(out.completion_ids):
        full = torch.tensor([rows_ids[i] + completion])
        with torch.no_grad():
            logits = model(input_ids=full, **images[torch.tensor([i])].row_inputs("cpu")).logits
        plain = logits[0, len(rows_ids[i]) - 1 : -1]
        plain[:, list(params.suppress_token_ids)] = float("-inf")  # the distribution it samples from
        plain = plain.log_softmax(-1)
        want = plain.gather(-1, torch.tensor(completion)[:, None])[:, 0]
        torch.testing.assert_close(torch.tensor(out.logprobs[i]), want, atol=2e-5, rtol=0)


def test_rows_from_a_datasets_table_with_several_images_and_part_lists_train(vlm_dir, tmp_path):
    """TRL's zen-multi-image shape through ``datasets``: the prompt's content is a list of image and text
    parts (Arrow gives every part every key, ``text: None`` on the image parts) and ``images`` holds two
    images per row. The run takes both images of each row and writes the prompt's text in the log."""
    from datasets import Dataset

    names = list(COLOURS)
    rows = [
        {"prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "image"},
                                                 {"type": "text", "text": "colours?"}]}],
         "images": [Image.new("RGB", (32, 32), COLOURS[names[i % 3]]),
                    Image.new("RGB", (32, 32), COLOURS[names[(i + 1) % 3]])],
         "answer": names[i % 3]}
        for i in range(4)
    ]  # fmt: skip
    dataset = Dataset.from_list(rows)
    assert dataset[0]["prompt"][0]["content"][0]["text"] is None  # what Arrow makes of the image parts
    args = config(tmp_path, max_steps=1, learning_rate=0.0, log_completions=True)
    trainer = GRPOTrainer(model=str(vlm_dir), reward_funcs=first_letter_reward, args=args,
                          train_dataset=dataset)  # fmt: skip
    (entry,) = trainer.train()
    assert entry["kl"] == 0.0
    records = [json.loads(line) for line in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    assert {len(r["images"]) for r in records} == {2}

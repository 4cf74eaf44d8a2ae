"""The off-policy correction with a real mismatch: the tiny Llama policy trains in fp32 while the fast sampler
generates from its bfloat16 copy. The importance weights of each of TRL's four modes (with bounds that bind)
and TRL's metrics equal a hand computation from the batch's old and sampling log-probs; with one precision
nothing changes (no weights, no pi_old pass at mu = 1, and the sampler's log-probs are pi_old's)."""

from __future__ import annotations

import logging

import pytest
import torch

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.core import PolicyLoss
from grpokit.rollout import FastSampler, GenerationOutput, ScriptedBackend
from grpokit.rollout.records import RolloutBatch
from grpokit.sampling.off_policy import CopiedWeightsBackend, generation_copy, make_sampler, refresh_copy
from grpokit.train import trainer as trainer_module
from grpokit.train.batch import pad_samples

from ..conftest import small_config

ROWS = [{"prompt": "1+1=", "solution": "2"}, {"prompt": "2+3=", "solution": "5"}]
MODES = ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
METRICS = [
    "sampling/sampling_logp_difference/mean",
    "sampling/sampling_logp_difference/max",
    "sampling/importance_sampling_ratio/min",
    "sampling/importance_sampling_ratio/mean",
    "sampling/importance_sampling_ratio/max",
]


def reward(prompts, completions, completion_ids, solution, **kwargs):
    return [float(s in c) + 0.1 * (sum(ids) % 5) for c, s, ids in zip(completions, solution, completion_ids)]


def build(tiny_model_dir, tmp_path, rollout_backend=None, **overrides) -> GRPOTrainer:
    """A one-step run of 2 prompts x 4 through the fast sampler, fp32 weights, beta 0."""
    values = {"beta": 0.0, "generation_backend": "fast", "shuffle_dataset": False, **overrides}
    config = small_config(tmp_path, **values)
    return GRPOTrainer(
        str(tiny_model_dir), [reward], config, train_dataset=ROWS, rollout_backend=rollout_backend
    )


def train_and_capture(trainer: GRPOTrainer, monkeypatch) -> tuple[dict[str, float], RolloutBatch]:
    """Train the step; returns its metrics and the batch the update received."""
    batches = []
    original = trainer_module.run_update

    def recording(batch, config, ctx):
        batches.append(batch)
        return original(batch, config, ctx)

    monkeypatch.setattr(trainer_module, "run_update", recording)
    (metrics,) = trainer.train()
    (batch,) = batches
    return metrics, batch


def train_one_step(tiny_model_dir, tmp_path, monkeypatch, **overrides):
    trainer = build(tiny_model_dir, tmp_path, **overrides)
    return (trainer, *train_and_capture(trainer, monkeypatch))


def hand_ratio(batch, mode: str) -> torch.Tensor:
    """exp(old - sampling) per masked token, or exp(sum over the sequence) on all its tokens: [N, C]."""
    mask = batch.completion_mask.bool()
    diff = torch.where(mask, batch.old_logps - batch.sampling_logps, 0.0)  # [N, C]
    if mode.startswith("sequence"):
        diff = diff.sum(-1, keepdim=True).expand_as(diff)
    return torch.exp(diff)


def hand_weights(batch, mode: str, low: float, high: float) -> torch.Tensor:
    rho = hand_ratio(batch, mode)
    weights = (
        rho.clamp(low, high)
        if mode.endswith("truncate")
        else torch.where((rho >= low) & (rho <= high), rho, 0.0)
    )
    return torch.where(batch.completion_mask.bool(), weights, 0.0)


@pytest.fixture(scope="module")
def ratios(tiny_model_dir, tmp_path_factory):
    """The raw token and sequence ratios of the bf16-sampler step (the same samples as every run below:
    same seed, same weights), to put the bounds inside their range so that both bounds bind."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        _, _, batch = train_one_step(
            tiny_model_dir, tmp_path_factory.mktemp("probe"), monkeypatch, generation_dtype="bfloat16",
            vllm_importance_sampling_mode="token_truncate",
        )  # fmt: skip
    mask = batch.completion_mask.bool()
    token = hand_ratio(batch, "token_mask")[mask]
    sequence = hand_ratio(batch, "sequence_mask")[:, 0][mask.any(-1)]
    return {"token": token, "sequence": sequence}


@pytest.mark.parametrize("mode", MODES)
def test_bf16_sampler_weights_and_metrics_equal_a_hand_computation(
    mode, ratios, tiny_model_dir, tmp_path, monkeypatch
):
    values = ratios[mode.split("_")[0]]
    low, high = (float(values.quantile(q)) for q in (0.25, 0.75))
    bounds = {f"{IS}mode": mode, f"{IS}clip_min": low, f"{IS}clip_max": high}
    trainer, metrics, batch = train_one_step(
        tiny_model_dir, tmp_path, monkeypatch, generation_dtype="bfloat16", **bounds
    )
    assert isinstance(trainer.backend, CopiedWeightsBackend)
    assert next(trainer.backend.copied.parameters()).dtype == torch.bfloat16
    assert next(trainer.unwrapped_model.parameters()).dtype == torch.float32
    mask = batch.completion_mask.bool()
    # a real mismatch: the bf16 sampler's log-probs are not pi_old's
    assert batch.old_logps is not None and batch.sampling_logps is not None
    difference = (batch.old_logps - batch.sampling_logps).abs()[mask]
    assert difference.max() > 1e-5
    rho = hand_ratio(batch, mode)[mask]
    assert (rho < low).any() and (rho > high).any()  # both bounds bind
    expected = hand_weights(batch, mode, low, high)
    torch.testing.assert_close(batch.importance_weights, expected, atol=1e-6, rtol=1e-6)
    if mode.endswith("mask"):
        assert (batch.importance_weights[mask] == 0).any() and (batch.importance_weights[mask] > 0).any()
    # TRL's metrics: the difference over masked tokens; the applied ratio over tokens or sequences
    applied = expected[mask] if mode.startswith("token") else expected[:, 0][mask.any(-1)]
    hand = [difference.mean(), difference.max(), applied.min(), applied.mean(), applied.max()]
    for name, value in zip(METRICS, hand):
        assert metrics[name] == pytest.approx(float(value), rel=1e-5, abs=1e-7), name


def test_one_precision_changes_nothing(tiny_model_dir, tmp_path, monkeypatch):
    """generation_dtype auto: the sampler is the policy itself, no weights, no pi_old pass at mu = 1, no
    sampling/ metrics, and the same step as with the correction switched off."""
    trainer = build(tiny_model_dir, tmp_path / "a")
    passes = []
    logprob_pass = trainer.logprob_pass
    trainer.logprob_pass = lambda model, batch, routing=None: (
        passes.append(model) or logprob_pass(model, batch, routing)
    )
    metrics, batch = train_and_capture(trainer, monkeypatch)
    assert isinstance(trainer.backend, FastSampler) and not trainer.correction.active
    assert batch.sampling_logps is not None  # reported, but pi_old's own: nothing to correct
    assert batch.importance_weights is None and batch.old_logps is None and passes == []
    assert not any(name.startswith("sampling/") for name in metrics)
    off = build(tiny_model_dir, tmp_path / "b", vllm_importance_sampling_correction=False)
    off_metrics, _ = train_and_capture(off, monkeypatch)
    timing = ("time/", "tokens_per_second")
    assert {k: v for k, v in metrics.items() if not k.startswith(timing)} == {
        k: v for k, v in off_metrics.items() if not k.startswith(timing)
    }
    for mine, theirs in zip(trainer.unwrapped_model.parameters(), off.unwrapped_model.parameters()):
        assert torch.equal(mine, theirs)


def test_fast_sampler_fp32_logprobs_equal_the_trainers(tiny_model_dir, tmp_path):
    """One precision: the ratio pi_old / pi_sampler would be 1 (to 1e-5 in log space)."""
    trainer = build(tiny_model_dir, tmp_path)
    samples = trainer.sample(ROWS)
    batch = pad_samples(samples, torch.zeros(len(samples.texts)), **trainer._padding())
    logps = trainer.logprob_pass(trainer.placed.scorer, batch)  # [N, C]
    mask = batch.completion_mask.bool()
    torch.testing.assert_close(batch.sampling_logps[mask], logps[mask], atol=1e-5, rtol=0)


def test_the_bf16_copy_is_refreshed_from_the_policy_before_each_generation(tiny_model_dir, tmp_path):
    trainer = build(tiny_model_dir, tmp_path, generation_dtype="bfloat16")
    backend, policy = trainer.backend, trainer.unwrapped_model
    assert isinstance(backend, CopiedWeightsBackend) and backend.inner.model is backend.copied
    buffers = dict(backend.copied.named_buffers())
    assert all(b.dtype == torch.float32 for b in buffers.values())  # rotary frequencies stay fp32
    with torch.no_grad():
        for param in policy.parameters():
            param.add_(0.01)
    trainer.sample(ROWS[:1])
    copies = dict(backend.copied.named_parameters())
    for name, param in policy.named_parameters():
        assert copies[name].dtype == torch.bfloat16
        assert torch.equal(copies[name], param.detach().to(torch.bfloat16)), name


def test_generation_copy_keeps_tied_weights_tied(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.tie_weights()
    copied = generation_copy(model, torch.float16)
    tied = model.get_input_embeddings().weight is model.get_output_embeddings().weight
    assert (copied.get_input_embeddings().weight is copied.get_output_embeddings().weight) == tied
    assert not any(p.requires_grad for p in copied.parameters())
    refresh_copy(copied, model)
    assert torch.equal(copied.get_input_embeddings().weight, model.get_input_embeddings().weight.half())


class LoggedBackend(ScriptedBackend):
    """An outside sampler that reports log-prob -1.5 for every token it returns."""

    def generate(self, prompt_ids, num_generations, params) -> GenerationOutput:
        out = super().generate(prompt_ids, num_generations, params)
        out.logprobs = [[-1.5] * len(ids) for ids in out.completion_ids]
        return out


def test_an_outside_backend_with_logprobs_is_corrected(tiny_model_dir, tmp_path, monkeypatch, char_tok):
    backend = LoggedBackend(char_tok, lambda prompt, i: ["2", "5", "12", "77"][i % 4])
    trainer = build(
        tiny_model_dir, tmp_path, rollout_backend=backend, vllm_importance_sampling_mode="token_truncate",
        vllm_importance_sampling_clip_max=2.0,
    )  # fmt: skip
    metrics, batch = train_and_capture(trainer, monkeypatch)
    mask = batch.completion_mask.bool()
    expected = torch.where(mask, torch.exp(batch.old_logps + 1.5).clamp(max=2.0), 0.0)
    torch.testing.assert_close(batch.importance_weights, expected)
    assert metrics["sampling/importance_sampling_ratio/max"] <= 2.0


def test_an_outside_backend_without_logprobs_is_trained_on_uncorrected(
    tiny_model_dir, tmp_path, monkeypatch, char_tok, caplog
):
    backend = ScriptedBackend(char_tok, lambda prompt, i: ["2", "5", "12", "77"][i % 4])
    trainer = build(tiny_model_dir, tmp_path, rollout_backend=backend)
    with caplog.at_level(logging.WARNING, logger="grpokit.sampling.off_policy"):
        metrics, batch = train_and_capture(trainer, monkeypatch)
    assert trainer.correction.active and batch.importance_weights is None and batch.old_logps is None
    assert "the sampler reports no log-probs" in caplog.text
    assert not any(name.startswith("sampling/") for name in metrics)


def test_a_dtype_copy_of_sharded_weights_is_refused(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    config = GRPOConfig(num_generations=2, generation_dtype="bfloat16")
    with pytest.raises(
        ValueError, match=r"GRPOConfig.generation_dtype='bfloat16' with fsdp needs the copy made before"
    ):
        make_sampler(config, model, None, "fsdp")
    backend, correction = make_sampler(
        GRPOConfig(num_generations=2, generation_dtype="float32"), model, None, "ddp"
    )
    assert isinstance(backend, FastSampler) and not correction.active  # the policy's own dtype: no copy


IS = "vllm_importance_sampling_"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({f"{IS}clip_min": 2.0, f"{IS}clip_max": 1.5},
         rf"GRPOConfig.{IS}clip_min \(2.0\) must be < {IS}clip_max \(1.5\)"),
        ({f"{IS}clip_min": 2.0, f"{IS}clip_max": 2.0}, rf"GRPOConfig.{IS}clip_min \(2.0\) must be <"),
        ({f"{IS}clip_max": 0.0}, rf"GRPOConfig.{IS}clip_max must be > 0"),
        ({f"{IS}clip_min": -0.5}, rf"GRPOConfig.{IS}clip_min must be > 0"),
        ({f"{IS}cap": -1.0}, rf"GRPOConfig.{IS}clip_max must be > 0"),
        ({f"{IS}mode": "truncate"}, rf"GRPOConfig.{IS}mode must be one of"),
        ({f"{IS}mode": "token_truncate", f"{IS}clip_max": None},
         rf"GRPOConfig.{IS}clip_max and {IS}clip_min cannot both be None"),
        ({"generation_dtype": "int8"}, r"GRPOConfig.generation_dtype must be one of"),
    ],
)  # fmt: skip
def test_bad_correction_fields_are_refused_naming_the_field(fields, message):
    with pytest.raises(ValueError, match=message):
        GRPOConfig(**fields)


def test_trl_defaults_and_the_deprecated_cap(caplog):
    config = GRPOConfig()
    assert config.vllm_importance_sampling_correction is True
    assert config.vllm_importance_sampling_mode == "sequence_mask"
    assert (config.vllm_importance_sampling_clip_min, config.vllm_importance_sampling_clip_max) == (None, 3.0)
    assert config.generation_dtype == "auto"
    with caplog.at_level(logging.WARNING, logger="grpokit"):
        capped = GRPOConfig(vllm_importance_sampling_cap=5.0)
    assert capped.vllm_importance_sampling_clip_max == 3.0  # as set; a run uses the cap:
    assert capped.resolved().vllm_importance_sampling_clip_max == 5.0
    assert "vllm_importance_sampling_cap is deprecated" in caplog.text
    # masking with only a lower bound is allowed (TRL: "set clip_max=None"); so is a switched-off truncation
    GRPOConfig(vllm_importance_sampling_clip_min=0.5, vllm_importance_sampling_clip_max=None)
    GRPOConfig(vllm_importance_sampling_correction=False, vllm_importance_sampling_mode="token_truncate",
               vllm_importance_sampling_clip_max=None)  # fmt: skip


class RecordingLoss:
    """The run's PolicyLoss, keeping the weight of the policy term of every call: the sampler correction
    (``sampler_weights``) times the masks (``token_weights``), either of them 1 when not given."""

    def __init__(self, loss: PolicyLoss) -> None:
        self.loss, self.token_weights = loss, []

    @property
    def is_global(self) -> bool:
        return self.loss.is_global

    def __call__(self, *args, token_weights=None, sampler_weights=None, **kwargs):
        factors = [w for w in (sampler_weights, token_weights) if w is not None]
        self.token_weights.append(factors[0] * factors[1] if len(factors) == 2 else next(iter(factors), None))
        return self.loss(*args, token_weights=token_weights, sampler_weights=sampler_weights, **kwargs)


@pytest.mark.parametrize("quantile", [1.0, 0.5])
def test_the_update_weights_the_policy_term_by_the_importance_weights_and_the_entropy_mask(
    tiny_model_dir, quantile
):
    from transformers import AutoModelForCausalLM

    from grpokit.core import top_entropy_mask
    from grpokit.train.forward import PolicyLogprobs
    from grpokit.train.update import UpdateContext, optimizer_step, run_update

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    generator = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    weights = torch.rand(4, 4, generator=generator) * 2 * mask  # [N, C]
    batch = RolloutBatch(
        prompt_ids=torch.randint(4, 60, (4, 3), generator=generator),
        prompt_mask=torch.ones(4, 3, dtype=torch.long),
        completion_ids=torch.randint(4, 60, (4, 4), generator=generator),
        completion_mask=mask,
        advantages=torch.randn(4, generator=generator),
        importance_weights=weights,
    )
    config = GRPOConfig(
        num_generations=2, per_device_train_batch_size=4, beta=0.0, max_completion_length=4,
        top_entropy_quantile=quantile,
    )  # fmt: skip
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    loss = RecordingLoss(config.policy_loss())
    ctx = UpdateContext(
        loss=loss, policy=PolicyLogprobs(model), backward=lambda value: value.backward(),
        step=optimizer_step(optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0), model),
        sum_across_processes=lambda t: t, num_processes=1, generator=torch.Generator().manual_seed(0),
    )  # fmt: skip
    run_update(batch, config, ctx)
    (seen,) = loss.token_weights
    expected = weights
    if quantile < 1.0:
        with torch.no_grad():
            _, entropy = PolicyLogprobs(model)(
                batch.prompt_ids, batch.prompt_mask, batch.completion_ids, mask, with_entropy=True
            )
        expected = weights * top_entropy_mask(entropy, mask.float(), quantile).float()
        assert (expected == 0).sum() > (weights == 0).sum()  # the entropy mask removed tokens
    torch.testing.assert_close(seen, expected)


@pytest.mark.parametrize("padding_free", [None, True, False])
def test_the_samplers_prefill_follows_padding_free(tiny_model_dir, padding_free):
    """``GRPOConfig.padding_free`` reaches the fast sampler's prefill, on the policy and on a dtype copy."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    for dtype in ("float32", "bfloat16"):
        config = GRPOConfig(num_generations=2, generation_dtype=dtype, padding_free=padding_free)
        backend, _ = make_sampler(config, model, None, "ddp")
        sampler = backend.inner if isinstance(backend, CopiedWeightsBackend) else backend
        assert isinstance(sampler, FastSampler) and sampler.padding_free is padding_free

"""``reuse_sampler_logprobs``: with mu = 2 the update needs pi_old's log-probs, and the in-process sampler
reading the fp32 policy reports them already. They are checked against a plain full forward of the policy
(``model(ids).logits``, log-softmax at the temperature), the old-policy pass is counted out, and a run
with the pass and one without take the same losses. Any setting under which the sampler's log-probs are
not pi_old's to float rounding runs the pass."""

from __future__ import annotations

import pytest
import torch

from grpokit import GRPOTrainer
from grpokit.rollout import GenerationOutput, ScriptedBackend
from grpokit.train import trainer as trainer_module

from ..conftest import small_config

ROWS = [{"prompt": "1+1=", "solution": "2"}, {"prompt": "2+3=", "solution": "5"}]
TEMPERATURE = 0.7


def reward(prompts, completions, completion_ids, solution, **kwargs):
    return [float(s in c) + 0.1 * (sum(ids) % 5) for c, s, ids in zip(completions, solution, completion_ids)]


def build(tiny_model_dir, tmp_path, **overrides) -> GRPOTrainer:
    """One step of 2 prompts x 4, mu = 2 (two optimizer steps on the samples), fp32, beta 0 (so the only
    no-gradient pass there can be is pi_old's)."""
    values = dict(
        num_iterations=2, beta=0.0, learning_rate=1e-2, temperature=TEMPERATURE, max_completion_length=6,
        generation_backend="fast", shuffle_dataset=False,
    )  # fmt: skip
    return GRPOTrainer(
        str(tiny_model_dir), [reward], small_config(tmp_path, **{**values, **overrides}), train_dataset=ROWS
    )


def plain_logprobs(model: torch.nn.Module, batch) -> torch.Tensor:
    """log softmax(logits / T) at each completion token from one full forward over [prompt | completion]:
    [N, C], 0 off the completion mask."""
    ids = torch.cat([batch.prompt_ids, batch.completion_ids], dim=1)  # [N, P + C]
    mask = torch.cat([batch.prompt_mask, batch.completion_mask], dim=1)
    positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits.float()  # [N, L, V]
    width = batch.completion_ids.shape[1]
    scores = logits[:, -width - 1 : -1] / TEMPERATURE  # the position before each completion token
    logps = scores.log_softmax(-1).gather(-1, batch.completion_ids[..., None]).squeeze(-1)  # [N, C]
    return torch.where(batch.completion_mask.bool(), logps, 0.0)


def train(trainer: GRPOTrainer, monkeypatch) -> tuple[dict[str, float], list, list[torch.Tensor]]:
    """Train the run's steps; returns the last step's metrics, the batches the update received, and the
    plain-forward log-probs of each batch under the weights it was sampled from (before its update)."""
    batches, plain = [], []
    original = trainer_module.run_update

    def recording(batch, config, ctx):
        batches.append(batch)
        plain.append(plain_logprobs(trainer.unwrapped_model, batch))
        return original(batch, config, ctx)

    monkeypatch.setattr(trainer_module, "run_update", recording)
    history = trainer.train()
    return history[-1], batches, plain


class Counting:
    """Counts the old-policy passes (``LogprobPass`` calls) and the decoder's forward calls."""

    def __init__(self, trainer: GRPOTrainer) -> None:
        self.passes, self.forwards = 0, 0
        logprob_pass = trainer.logprob_pass

        def counted_pass(model, batch, routing=None):
            self.passes += 1
            return logprob_pass(model, batch, routing)

        trainer.logprob_pass = counted_pass
        decoder = trainer.unwrapped_model.model
        decoder.register_forward_pre_hook(lambda module, args: setattr(self, "forwards", self.forwards + 1))


@pytest.mark.parametrize("backend", ["fast", "transformers"])
def test_the_sampler_logprobs_are_pi_old_and_the_pass_is_skipped(
    backend, tiny_model_dir, tmp_path, monkeypatch
):
    trainer = build(tiny_model_dir, tmp_path / "reuse", generation_backend=backend)
    assert trainer.sampler_logprobs.backend is trainer.backend
    counting = Counting(trainer)
    metrics, (batch,), (plain,) = train(trainer, monkeypatch)
    mask = batch.completion_mask.bool()
    assert mask.sum() > 8 and batch.old_logps is not None
    assert (batch.old_logps[mask] - plain[mask]).abs().max() <= 1e-4  # pi_old, by a plain full forward
    assert (batch.old_logps[~mask] == 0).all()
    assert counting.passes == 0 and metrics["old_logprobs/from_sampler"] == 1.0
    assert metrics["time/old_logprobs"] < 0.05
    # the same run with the pass: one more decoder forward (one micro-batch of 8 rows), the same log-probs
    passed = build(
        tiny_model_dir, tmp_path / "pass", generation_backend=backend, reuse_sampler_logprobs=False
    )
    assert passed.sampler_logprobs.backend is None
    passed_counting = Counting(passed)
    passed_metrics, (passed_batch,), _ = train(passed, monkeypatch)
    assert passed_counting.passes == 1 and passed_metrics["old_logprobs/from_sampler"] == 0.0
    assert passed_counting.forwards == counting.forwards + 1
    assert torch.equal(passed_batch.completion_ids, batch.completion_ids)  # the same samples
    assert (passed_batch.old_logps[mask] - batch.old_logps[mask]).abs().max() <= 1e-5


def test_a_run_with_and_without_the_pass_takes_the_same_losses(tiny_model_dir, tmp_path, monkeypatch):
    """Two steps of mu = 2 (four AdamW steps at lr 1e-2): the losses agree to 1e-5, the weights closely."""
    runs = {}
    for reuse in (True, False):
        trainer = build(tiny_model_dir, tmp_path / str(reuse), max_steps=2, reuse_sampler_logprobs=reuse)
        history = trainer.train()
        runs[reuse] = (history, trainer.unwrapped_model)
    (reused, reused_model), (passed, passed_model) = runs[True], runs[False]
    assert [m["old_logprobs/from_sampler"] for m in reused] == [1.0, 1.0]
    for mine, theirs in zip(reused, passed):
        assert mine["loss"] == pytest.approx(theirs["loss"], abs=1e-5)
        assert mine["ratio_mean"] == pytest.approx(theirs["ratio_mean"], abs=1e-5)
        assert mine["grad_norm"] == pytest.approx(theirs["grad_norm"], rel=1e-4)
    # AdamW divides each update by the root of its second moment, so where an element's gradient is near
    # zero the float rounding between the sampler's log-probs and the pass's (products in other
    # orientations) can move it by a few percent of one step's lr (1e-2): 1.1e-4 seen after four steps.
    for mine, theirs in zip(reused_model.parameters(), passed_model.parameters()):
        torch.testing.assert_close(mine, theirs, atol=3e-4, rtol=0)


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"reuse_sampler_logprobs": False}, "reuse_sampler_logprobs=False"),
        ({"top_k": 5}, "sampling with top_k"),
        ({"top_p": 0.9}, "sampling with top_p"),
        ({"min_p": 0.05}, "sampling with min_p"),
        ({"repetition_penalty": 1.1}, "sampling with repetition_penalty"),
        ({"generation_kwargs": {"top_k": 3}}, "sampling with top_k"),
        ({"bf16": True}, "mixed_precision='bf16'"),
        ({"generation_dtype": "bfloat16"}, "the sampler is not pi_old"),
        ({"async_generation": True}, "the sampler is not pi_old"),
        ({"model_init_kwargs": {"dtype": "bfloat16"}}, "the policy's weights are torch.bfloat16"),
    ],
)  # fmt: skip
def test_where_the_sampler_is_not_exactly_pi_old_the_pass_runs(overrides, reason, tiny_model_dir, tmp_path):
    trainer = build(tiny_model_dir, tmp_path, **overrides)
    assert trainer.sampler_logprobs.backend is None
    assert reason in trainer.sampler_logprobs.reason
    assert reason in trainer.sampler_logprobs.describe()


def test_a_filtered_run_uses_the_pass(tiny_model_dir, tmp_path, monkeypatch):
    """top-k: the sampler reports log-probs under the truncated distribution, not pi_old's."""
    trainer = build(tiny_model_dir, tmp_path, top_k=3)
    counting = Counting(trainer)
    metrics, (batch,), (plain,) = train(trainer, monkeypatch)
    mask = batch.completion_mask.bool()
    assert counting.passes == 1 and metrics["old_logprobs/from_sampler"] == 0.0
    assert (batch.old_logps[mask] - plain[mask]).abs().max() <= 1e-4
    assert (batch.sampling_logps[mask] - plain[mask]).abs().max() > 1e-3  # what reusing would have got wrong


class ReportingBackend(ScriptedBackend):
    """A sampler put in after construction that reports log-probs which are not the policy's."""

    def generate(self, prompt_ids, num_generations, params) -> GenerationOutput:
        out = super().generate(prompt_ids, num_generations, params)
        out.logprobs = [[-1.5] * len(ids) for ids in out.completion_ids]
        return out


def test_a_sampler_swapped_in_later_is_not_trusted(tiny_model_dir, tmp_path, monkeypatch, char_tok):
    trainer = build(tiny_model_dir, tmp_path)
    trainer.backend = ReportingBackend(char_tok, lambda prompt, i: ["2", "5", "12", "77"][i % 4])
    metrics, (batch,), (plain,) = train(trainer, monkeypatch)
    mask = batch.completion_mask.bool()
    assert metrics["old_logprobs/from_sampler"] == 0.0
    assert (batch.old_logps[mask] - plain[mask]).abs().max() <= 1e-4


def test_mu_one_needs_no_pi_old(tiny_model_dir, tmp_path, monkeypatch):
    trainer = build(tiny_model_dir, tmp_path, num_iterations=1)
    metrics, (batch,), _ = train(trainer, monkeypatch)
    assert batch.old_logps is None and "old_logprobs/from_sampler" not in metrics

"""TRL 1.16's objective features on the update and the trainer: the logged policy_loss, adaptive entropy
control, off-policy sequence masking, luspo / vespo / cispo runs, cast_lm_head_to_fp32, and TRL's
``get_high_entropy_mask`` / ``get_off_policy_mask`` methods."""

from types import SimpleNamespace

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpokit import GRPOConfig, GRPOTrainer
from grpokit.core import adapted_entropy_coef, applied_entropy_coef
from grpokit.train.entropy_control import EntropyControl
from grpokit.train.forward import PolicyLogprobs
from grpokit.train.update import UpdateContext, optimizer_step, run_update

from .conftest import digit_reward
from .test_update import RecordingOptimizer, make_batch
from .test_update import recorded_update as update


def current_logps(model_dir, batch):
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        logps, _ = PolicyLogprobs(model)(
            batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask,
            temperature=1.0, with_entropy=False,
        )  # fmt: skip
    return logps  # [N, C]


def assert_same_gradients(a, b):
    assert len(a) == len(b)
    for step_a, step_b in zip(a, b):
        for x, y in zip(step_a, step_b):
            torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-7)


# --- policy_loss and the entropy bonus ---------------------------------------------------------------------


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo", "luspo"])
@pytest.mark.parametrize("accumulation", [1, 2])
def test_policy_loss_minus_loss_is_the_entropy_bonus(tiny_model_dir, loss_type, accumulation):
    """loss = policy_loss - entropy_coef * H per optimizer step, H the logged entropy (every token is
    trained on), whatever the loss type's normalisation and the accumulation."""
    _, metrics, _ = update(
        tiny_model_dir, make_batch(), loss_type=loss_type, entropy_coef=0.5,
        per_device_train_batch_size=8 // accumulation, gradient_accumulation_steps=accumulation,
    )  # fmt: skip
    assert metrics["policy_loss"] - metrics["loss"] == pytest.approx(0.5 * metrics["entropy"], rel=1e-5)
    assert metrics["entropy_coef"] == 0.5


def test_without_a_bonus_policy_loss_is_the_loss(tiny_model_dir):
    _, metrics, _ = update(tiny_model_dir, make_batch(), per_device_train_batch_size=8)
    assert metrics["policy_loss"] == metrics["loss"] and "entropy_coef" not in metrics


# --- adaptive entropy control ------------------------------------------------------------------------


def test_adaptive_entropy_rule_by_hand():
    # entropy 0.1 <= target 0.2: up by delta, capped at coef_max; 0.3 > 0.2: down, floored at coef_min.
    bounds = {"target": 0.2, "delta": 0.005, "coef_min": 0.0, "coef_max": 1.0}
    assert adapted_entropy_coef(0.01, 0.1, **bounds) == pytest.approx(0.015)
    assert adapted_entropy_coef(0.998, 0.1, **bounds) == 1.0
    assert adapted_entropy_coef(0.01, 0.3, **bounds) == pytest.approx(0.005)
    assert adapted_entropy_coef(0.003, 0.3, **bounds) == 0.0
    # The bonus applies only after a step whose entropy was at or below the target (none before any step).
    assert applied_entropy_coef(0.01, float("inf"), 0.2) == 0.0
    assert applied_entropy_coef(0.01, 0.2, 0.2) == 0.01
    assert applied_entropy_coef(0.01, 0.25, 0.2) == 0.0


def test_adaptive_entropy_skips_the_first_step_then_applies_and_moves_the_coefficient(tiny_model_dir):
    """Two optimizer steps (steps_per_generation=2), target 15 nats (above any entropy): the first step
    applies no bonus (no measurement yet) and its gradient is the plain loss's; the coefficient then moves
    by delta after each step, and the second step applies 0.01 + 0.005."""
    batch = make_batch()
    two_steps = {"per_device_train_batch_size": 4, "steps_per_generation": 2, "loss_type": "bnpo"}
    control = EntropyControl(0.01, adaptive=True, target=15.0, delta=0.005)
    adaptive, _, _ = update(tiny_model_dir, batch, entropy=control, **two_steps)
    plain, _, _ = update(tiny_model_dir, batch, **two_steps)
    assert_same_gradients(adaptive[:1], plain[:1])
    assert control.coef == pytest.approx(0.02)
    static, _, _ = update(tiny_model_dir, batch, entropy=EntropyControl(0.015), **two_steps)
    assert_same_gradients(adaptive[1:], static[1:])  # same rows, same weights (lr 0), same coefficient


def test_adaptive_entropy_state_survives_a_checkpoint():
    control = EntropyControl(0.01, adaptive=True, target=0.2)
    control.step_done(0.1)
    restored = EntropyControl(0.01, adaptive=True, target=0.2)
    restored.load_state_dict(control.state_dict())
    assert (restored.coef, restored.last_entropy) == (control.coef, 0.1)
    assert EntropyControl(0.3).state_dict() is None  # a constant coefficient has nothing to save


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"entropy_coef_min": 0.5, "entropy_coef_max": 0.1}, "entropy_coef_min"),
        ({"entropy_coef_max": float("inf")}, "entropy_coef_max"),
        ({"entropy_coef_delta": 0.0}, "entropy_coef_delta"),
        ({"entropy_target": -1.0}, "entropy_target"),
        ({"off_policy_mask_threshold": -0.1}, "off_policy_mask_threshold"),
        ({"off_policy_mask_threshold": float("nan")}, "off_policy_mask_threshold"),
        ({"loss_type": "vespo", "vespo_lambda_pos": 0.0}, "vespo_lambda_pos"),
        ({"loss_type": "vespo", "use_vllm": True}, "vllm_importance_sampling_mode"),
        ({"loss_type": "cispo", "epsilon": 0.0}, "epsilon"),
    ],
)
def test_bad_values_are_refused_naming_the_field(values, field):
    with pytest.raises(ValueError, match=rf"GRPOConfig\.{field}\b"):
        GRPOConfig(**values)


# --- off-policy sequence masking -------------------------------------------------------------------------


def test_off_policy_mask_drops_exactly_the_drifted_negative_sequences(tiny_model_dir):
    """pi_old 2 nats above pi_theta on every token (KL 2 > 0.5) for rows 0-3; rows with a negative
    advantage among them are dropped: the gradient equals that of the same batch with their advantages set
    to 0 and no mask (a dropped row and a zero-advantage row both contribute 0 to the policy term)."""
    batch = make_batch()
    batch.advantages = torch.tensor([1.0, -1.0, 0.5, -0.5, -1.0, 1.0, -2.0, 2.0])
    logps = current_logps(tiny_model_dir, batch)  # [8, 5]
    drift = torch.zeros(8, 1)
    drift[:4] = 2.0
    batch.old_logps = logps + drift * batch.completion_mask  # [8, 5]
    masked, metrics, _ = update(
        tiny_model_dir, batch, per_device_train_batch_size=8, off_policy_mask_threshold=0.5
    )
    dropped = torch.tensor([False, True, False, True, False, False, False, False])
    zeroed = make_batch()
    zeroed.advantages = torch.where(dropped, 0.0, batch.advantages)
    zeroed.old_logps = batch.old_logps
    expected, _, _ = update(tiny_model_dir, zeroed, per_device_train_batch_size=8)
    assert_same_gradients(masked, expected)
    mask = batch.completion_mask.float()
    by_hand = float(mask[dropped].sum() / mask.sum())  # the dropped rows' share of the completion tokens
    assert metrics["off_policy_mask/dropped_ratio"] == pytest.approx(by_hand)


def test_off_policy_mask_compares_with_the_sampler_when_it_is_not_pi_old(tiny_model_dir):
    """On-policy (no old_logps) nothing drifts; with an off-policy sampler its own log-probs are the
    reference: 2 nats above pi_theta drops every negative-advantage row."""
    batch = make_batch()
    batch.sampling_logps = current_logps(tiny_model_dir, batch) + 2.0  # [8, 5]
    config = {"per_device_train_batch_size": 8, "off_policy_mask_threshold": 0.5}
    _, on_policy, _ = update(tiny_model_dir, batch, **config)
    assert on_policy["off_policy_mask/dropped_ratio"] == 0.0  # the sampler is pi_old: its logps not read
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    optimizer = RecordingOptimizer(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    args = GRPOConfig(num_generations=2, beta=0.0, max_completion_length=5, **config)
    ctx = UpdateContext(
        loss=args.policy_loss(), policy=PolicyLogprobs(model), backward=lambda loss: loss.backward(),
        step=optimizer_step(optimizer, scheduler, model), sum_across_processes=lambda t: t,
        num_processes=1, generator=torch.Generator().manual_seed(0), off_policy_sampler=True,
    )  # fmt: skip
    off_policy = run_update(batch, args, ctx)
    mask = batch.completion_mask.float()
    negative = batch.advantages < 0
    assert off_policy["off_policy_mask/dropped_ratio"] == pytest.approx(
        float(mask[negative].sum() / mask.sum())
    )


# --- TRL's methods ---------------------------------------------------------------------------------------


class TwoProcesses:
    """An accelerator stand-in for process 0 of 2, whose peer holds ``peer`` (its non-pad entropies)."""

    num_processes = 2

    def __init__(self, peer):
        self.peer = peer

    def pad_across_processes(self, x, dim, pad_index):
        width = max(len(x), len(self.peer))
        return torch.cat([x, torch.full((width - len(x),), pad_index)])

    def gather(self, x):
        peer = torch.cat([self.peer, torch.full((len(x) - len(self.peer),), -1e9)])
        return torch.cat([x, peer])


def test_get_high_entropy_mask_uses_every_process_tokens():
    # Local non-pad entropies 0.1, 0.2 (0.9 is padding); the peer's 0.3 .. 0.8. Over all 8 values,
    # q = 0.5: position 0.5 * 7 = 3.5 -> 0.4 + 0.5 * (0.5 - 0.4) = 0.45: no local token reaches it.
    # Locally alone the threshold would be 0.15 and keep 0.2.
    entropies = torch.tensor([[0.1, 0.2, 0.9]])
    mask = torch.tensor([[1, 1, 0]])
    trainer = SimpleNamespace(accelerator=TwoProcesses(torch.tensor([0.3, 0.4, 0.5, 0.6, 0.7, 0.8])))
    keep = GRPOTrainer.get_high_entropy_mask(trainer, entropies, mask, 0.5)
    assert not keep.any()
    trainer = SimpleNamespace(accelerator=TwoProcesses(torch.tensor([0.05])))
    # All values 0.1, 0.2, 0.05; q = 0.5 -> the median 0.1: keep 0.1 and 0.2, never the padding 0.9.
    keep = GRPOTrainer.get_high_entropy_mask(trainer, entropies, mask, 0.5)
    assert torch.equal(keep, torch.tensor([[True, True, False]]))


def test_get_off_policy_mask_keeps_the_mask_dtype():
    keep = GRPOTrainer.get_off_policy_mask(
        torch.tensor([[-1.0], [1.0]]), torch.full((2, 2), -2.0), torch.zeros(2, 2), torch.ones(2, 2), 1.0
    )
    assert keep.dtype == torch.float32 and torch.equal(keep, torch.tensor([[0.0], [1.0]]))


# --- trainer runs ----------------------------------------------------------------------------------------


def config_for(tmp_path, **overrides):
    values = dict(
        output_dir=str(tmp_path / "run"), max_steps=2, num_generations=4, per_device_train_batch_size=8,
        max_completion_length=6, learning_rate=1e-2, disable_tqdm=True, seed=0, beta=0.0,
    )  # fmt: skip
    return GRPOConfig(**{**values, **overrides})


def changed(before, model):
    return any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize(
    "overrides",
    [
        {"loss_type": "luspo", "importance_sampling_level": "sequence"},
        {"loss_type": "vespo"},
        {"loss_type": "cispo"},  # no epsilon_high: the cap is epsilon, as TRL
        {"off_policy_mask_threshold": 0.5, "num_iterations": 2},
    ],
)
def test_objective_variants_train(tiny_model_dir, rows, tmp_path, overrides):
    trainer = GRPOTrainer(
        str(tiny_model_dir), [digit_reward], config_for(tmp_path, **overrides), train_dataset=rows
    )
    before = {k: v.clone() for k, v in trainer.unwrapped_model.state_dict().items()}
    history = trainer.train()
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in history)
    assert changed(before, trainer.unwrapped_model)
    if "off_policy_mask_threshold" in overrides:
        assert 0.0 <= history[-1]["off_policy_mask/dropped_ratio"] <= 1.0
    if overrides["loss_type" if "loss_type" in overrides else "num_iterations"] == "vespo":
        assert history[-1]["vespo/phi_seq_mean"] == pytest.approx(1.0)  # on-policy: w = 1, phi = 1


def test_adaptive_entropy_trains_and_logs_the_coefficient(tiny_model_dir, rows, tmp_path):
    config = config_for(
        tmp_path, max_steps=3, entropy_coef=0.01, use_adaptive_entropy=True, entropy_target=15.0,
        logging_steps=1,
    )  # fmt: skip
    trainer = GRPOTrainer(str(tiny_model_dir), [digit_reward], config, train_dataset=rows)
    trainer.train()
    steps = trainer.state.global_step
    assert trainer.entropy_coef == pytest.approx(0.01 + 0.005 * steps)
    logged = [h for h in trainer.state.log_history if "entropy_coef" in h and "train_loss" not in h]
    assert [h["entropy_coef"] for h in logged] == pytest.approx(
        [0.01 + 0.005 * s for s in range(1, steps + 1)]
    )
    assert all("policy_loss" in h for h in logged)


def test_cast_lm_head_to_fp32_on_a_bf16_tied_model(tiny_model_dir, rows, tmp_path):
    """bf16 weights with the head tied to the embeddings: the shared weight becomes float32, the logits
    are float32, the embeddings still feed the decoder bf16, and training runs."""
    config = config_for(tmp_path, cast_lm_head_to_fp32=True, model_init_kwargs={"dtype": "bfloat16"})
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16)
    model.config.tie_word_embeddings = True
    model.tie_weights()
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight
    trainer = GRPOTrainer(model, [digit_reward], config, train_dataset=rows)
    head, embed = (
        trainer.unwrapped_model.get_output_embeddings(),
        trainer.unwrapped_model.get_input_embeddings(),
    )
    assert head.weight.dtype == torch.float32
    assert embed(torch.tensor([[5]])).dtype == torch.bfloat16
    assert trainer.unwrapped_model(torch.tensor([[5, 6]])).logits.dtype == torch.float32
    before = {k: v.clone() for k, v in trainer.unwrapped_model.state_dict().items()}
    history = trainer.train()
    assert torch.isfinite(torch.tensor(history[-1]["loss"]))
    assert changed(before, trainer.unwrapped_model)
    assert head.weight.dtype == torch.float32

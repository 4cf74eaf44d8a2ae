"""GRPOTrainer end to end on a tiny model: variants, reference/old log-prob rules, rewards, saving."""

import json
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

import grpokit.train.reference as reference_module
from grpokit import GRPOConfig, GRPOTrainer
from grpokit.core import PolicyLoss
from grpokit.rollout.fake import ScriptedBackend

from .conftest import digit_reward


def make_config(tmp_path, **overrides):
    values = dict(
        output_dir=str(tmp_path / "run"),
        max_steps=1,
        num_generations=4,
        per_device_train_batch_size=8,  # 2 prompts x G=4 per step
        max_completion_length=6,
        learning_rate=1e-3,
        disable_tqdm=True,
        seed=0,
    )
    values.update(overrides)
    return GRPOConfig(**values)


def test_trains_saves_and_logs(tiny_model_dir, rows, tmp_path):
    config = make_config(tmp_path, max_steps=2)
    trainer = GRPOTrainer(
        model=str(tiny_model_dir), reward_funcs=[digit_reward], args=config, train_dataset=rows
    )
    before = {k: v.clone() for k, v in trainer.unwrapped_model.state_dict().items()}
    history = trainer.train()
    assert [h["step"] for h in history] == [1, 2]
    for key in (
        "reward",
        "reward_std",
        "rewards/digit_reward/mean",
        "frac_reward_zero_std",
        "kl",
        "entropy",
        "clip_ratio/region_mean",
        "completions/mean_length",
        "completions/clipped_ratio",
        "learning_rate",
        "grad_norm",
        "time/generate",
        "time/update",
        "tokens_per_second",
        "loss",
    ):
        assert key in history[-1], key
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2]
    assert (tmp_path / "run" / "metrics.png").exists()
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "run")
    changed = any(not torch.equal(before[k], v) for k, v in reloaded.state_dict().items() if k in before)
    assert changed
    for key, value in reloaded.state_dict().items():  # the saved weights are the trained ones
        assert torch.allclose(value, trainer.unwrapped_model.state_dict()[key])


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"])
def test_every_loss_type_runs(tiny_model_dir, rows, tmp_path, loss_type):
    extra = {"epsilon_high": 5.0} if loss_type == "cispo" else {}
    config = make_config(tmp_path, loss_type=loss_type, **extra)
    history = GRPOTrainer(str(tiny_model_dir), [digit_reward], config, train_dataset=rows).train()
    assert torch.isfinite(torch.tensor(history[-1]["loss"]))


@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_every_scale_and_importance_level_runs(tiny_model_dir, rows, tmp_path, scale_rewards, level):
    config = make_config(tmp_path, scale_rewards=scale_rewards, importance_sampling_level=level, beta=0.0)
    history = GRPOTrainer(str(tiny_model_dir), [digit_reward], config, train_dataset=rows).train()
    assert torch.isfinite(torch.tensor(history[-1]["loss"]))


@pytest.mark.parametrize("backend", ["transformers", "fast"])
@pytest.mark.parametrize("precision", [{"model_init_kwargs": {"dtype": "bfloat16"}}, {"bf16": True}])
def test_bf16_weights_or_autocast_train(tiny_model_dir, rows, tmp_path, backend, precision):
    """bf16 weights (model_init_kwargs) or bf16 autocast (bf16=True) through generation, the reference and
    old-policy passes and the update, on either sampler."""
    config = make_config(tmp_path, generation_backend=backend, num_iterations=2, beta=0.04, **precision)
    trainer = GRPOTrainer(str(tiny_model_dir), [digit_reward], config, train_dataset=rows)
    history = trainer.train()
    assert all(torch.isfinite(torch.tensor(history[-1][k])) for k in ("loss", "kl", "grad_norm"))
    weights = {p.dtype for p in trainer.unwrapped_model.parameters()}
    assert weights == ({torch.bfloat16} if "model_init_kwargs" in precision else {torch.float32})
    assert trainer.accelerator.mixed_precision == ("bf16" if precision.get("bf16") else "no")


def test_beta_zero_builds_and_runs_no_reference(tiny_model_dir, rows, tmp_path, monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("a reference model was built with beta=0")

    monkeypatch.setattr(reference_module, "make_reference", forbidden)
    trainer = GRPOTrainer(
        str(tiny_model_dir), [digit_reward], make_config(tmp_path, beta=0.0), train_dataset=rows
    )
    assert trainer.reference is None
    history = trainer.train()
    assert "kl" not in history[-1]


def _record_policy_loss(monkeypatch):
    """Every call of the run's PolicyLoss: its old log-probs, ratio and mask."""
    calls = []
    original = PolicyLoss.__call__

    def spy(self, logps, old_logps, advantages, mask, **kwargs):
        calls.append(
            {
                "old_logps": old_logps,
                "ratio": (logps.detach() - old_logps).exp() if old_logps is not None else None,
                "mask": mask,
                "kwargs": kwargs,
            }
        )
        return original(self, logps, old_logps, advantages, mask, **kwargs)

    monkeypatch.setattr(PolicyLoss, "__call__", spy)
    return calls


def test_mu_one_uses_no_old_logprobs(tiny_model_dir, rows, tmp_path, monkeypatch):
    calls = _record_policy_loss(monkeypatch)
    GRPOTrainer(str(tiny_model_dir), [digit_reward], make_config(tmp_path), train_dataset=rows).train()
    assert calls and all(call["old_logps"] is None for call in calls)


def test_mu_two_computes_old_logprobs_and_ratio_departs_from_one(tiny_model_dir, rows, tmp_path, monkeypatch):
    calls = _record_policy_loss(monkeypatch)
    config = make_config(tmp_path, num_iterations=2, learning_rate=1e-2)
    GRPOTrainer(str(tiny_model_dir), [digit_reward], config, train_dataset=rows).train()
    assert len(calls) == 2  # two epochs x one micro-batch
    first, second = calls
    mask = first["mask"].bool()
    # epoch 1: pi_theta == pi_old, ratio 1 (to float error); epoch 2: after one step the ratio moved
    assert torch.allclose(first["ratio"][mask], torch.ones(int(mask.sum())), atol=1e-5)
    assert (second["ratio"][second["mask"].bool()] - 1).abs().max() > 1e-3


def test_reward_functions_get_columns_state_and_none_is_excluded(tiny_model_dir, tmp_path):
    seen = {}

    def column_reward(prompts, completions, completion_ids, solution, difficulty, trainer_state, **kwargs):
        seen.update(solution=list(solution), difficulty=list(difficulty), state=trainer_state, n=len(prompts))
        assert len(completion_ids) == len(completions)
        return [None if d == "skip" else 1.0 for d in difficulty]

    def constant_two(prompts, completions, completion_ids, **kwargs):
        return [2.0] * len(prompts)

    rows = [
        {"prompt": "1+1=", "solution": "2", "difficulty": "easy"},
        {"prompt": "2+2=", "solution": "4", "difficulty": "skip"},
    ]
    config = make_config(tmp_path, shuffle_dataset=False, beta=0.0)
    history = GRPOTrainer(
        str(tiny_model_dir), [column_reward, constant_two], config, train_dataset=rows
    ).train()
    assert seen["n"] == 8 and seen["solution"] == ["2"] * 4 + ["4"] * 4
    assert seen["difficulty"] == ["easy"] * 4 + ["skip"] * 4
    assert seen["state"]["global_step"] == 0
    # None rows are left out of the per-function mean, not counted as 0: mean of four 1.0 values
    assert history[-1]["rewards/column_reward/mean"] == 1.0
    # combined reward: 1 + 2 = 3 for the first prompt's rows, 2 (None excluded) for the second's -> mean 2.5
    assert history[-1]["reward"] == pytest.approx(2.5)


def test_truncated_completions_are_masked_when_asked(tiny_model_dir, rows, tmp_path, monkeypatch):
    calls = _record_policy_loss(monkeypatch)
    tokenizer_dir = str(tiny_model_dir)
    config = make_config(tmp_path, mask_truncated_completions=True, max_completion_length=4)
    trainer = GRPOTrainer(tokenizer_dir, [digit_reward], config, train_dataset=rows)
    # sample 0 of each prompt is long (cut at 4 tokens, no EOS), the others short
    trainer.backend = ScriptedBackend(trainer.tokenizer, lambda prompt, i: "123456789" if i == 0 else "2")
    history = trainer.train()
    mask = calls[0]["mask"]
    assert history[-1]["completions/clipped_ratio"] == 0.25
    # rows are shuffled for the update: 2 truncated rows carry no loss; the 6 others are "2" + EOS
    assert sorted(mask.sum(dim=1).tolist()) == [0, 0, 2, 2, 2, 2, 2, 2]


def test_conversational_prompts(tiny_model_dir, tmp_path):
    rows = [
        {"prompt": [{"role": "user", "content": "1+1="}], "solution": "2"},
        {"prompt": [{"role": "user", "content": "2+2="}], "solution": "4"},
    ]
    received = []

    def message_reward(prompts, completions, completion_ids, **kwargs):
        received.extend(completions)
        return [float(len(c[0]["content"]) % 2) for c in completions]

    GRPOTrainer(str(tiny_model_dir), [message_reward], make_config(tmp_path), train_dataset=rows).train()
    assert received and all(c[0]["role"] == "assistant" for c in received)


def test_dataset_file_and_bad_rows(tiny_model_dir, tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"prompt": "1+1=", "solution": "2"}\n{"prompt": "2+2=", "solution": "4"}\n')
    trainer = GRPOTrainer(str(tiny_model_dir), [digit_reward], make_config(tmp_path), train_dataset=str(path))
    assert len(trainer.train_rows) == 2
    with pytest.raises(ValueError, match="row 1: missing the 'prompt' field"):
        GRPOTrainer(
            str(tiny_model_dir),
            [digit_reward],
            make_config(tmp_path),
            train_dataset=[{"prompt": "1+1="}, {"question": "2+2="}],
        )
    with pytest.raises(ValueError, match="reward_weights has 2 values but there are 1"):
        GRPOTrainer(
            str(tiny_model_dir),
            [digit_reward],
            make_config(tmp_path, reward_weights=[1.0, 2.0]),
            train_dataset=[{"prompt": "1+1="}],
        )


def test_resume_continues_exactly(tiny_model_dir, rows, tmp_path):
    full = make_config(tmp_path / "full", max_steps=3)
    straight = GRPOTrainer(str(tiny_model_dir), [digit_reward], full, train_dataset=rows)
    straight.train()

    split = make_config(tmp_path / "split", max_steps=3, save_steps=2)
    first = GRPOTrainer(str(tiny_model_dir), [digit_reward], split, train_dataset=rows)
    first.max_steps = 2  # stop after the checkpoint at step 2, as an interrupted run would
    first.train()
    resumed = GRPOTrainer(str(tiny_model_dir), [digit_reward], split, train_dataset=rows)
    resumed.train(resume_from_checkpoint=str(tmp_path / "split" / "run" / "checkpoint-2"))
    assert resumed.step == 3
    for key, value in straight.unwrapped_model.state_dict().items():
        assert torch.allclose(value, resumed.unwrapped_model.state_dict()[key], atol=1e-6), key


def test_reference_sync_makes_reference_equal_policy(tiny_model_dir, rows, tmp_path):
    config = make_config(tmp_path, max_steps=2, sync_ref_model=True, ref_model_sync_steps=2)
    trainer = GRPOTrainer(str(tiny_model_dir), [digit_reward], config, train_dataset=rows)
    trainer.train()
    policy = trainer.unwrapped_model.state_dict()
    for key, value in trainer.reference.model.state_dict().items():
        assert torch.equal(value, policy[key]), key


def test_eval_dataset_is_scored_greedily_every_eval_steps(tiny_model_dir, rows, tmp_path):
    def has_seven(prompts, completions, completion_ids, **kwargs):
        return [float("7" in c) for c in completions]

    config = make_config(tmp_path, max_steps=2, eval_strategy="steps", eval_steps=2, beta=0.0)
    trainer = GRPOTrainer(str(tiny_model_dir), [has_seven], config, train_dataset=rows, eval_dataset=rows[:2])
    # greedy completions: "7" for the first eval prompt, "1" for the second -> mean reward 0.5
    trainer.backend = ScriptedBackend(trainer.tokenizer, lambda prompt, i: "7" if prompt == "1+1=" else "1")
    history = trainer.train()
    assert "eval/reward" not in history[0]
    assert history[1]["eval/reward"] == 0.5
    assert history[1]["eval/rewards/has_seven/mean"] == 0.5


def test_completions_are_logged_and_printed(tiny_model_dir, tmp_path, capsys):
    """log_completions writes every completion of each logged step with its rewards and advantage;
    num_completions_to_print prints that many."""

    def exact(prompts, completions, completion_ids, solution, **kwargs):
        return [1.0 if c == s else 0.0 for c, s in zip(completions, solution)]

    def only_first_prompt(prompts, completions, completion_ids, **kwargs):
        return [0.5 if p == "1+1=" else None for p in prompts]

    rows = [{"prompt": "1+1=", "solution": "2"}, {"prompt": "2+2=", "solution": "4"}]
    config = make_config(
        tmp_path,
        shuffle_dataset=False,
        max_steps=3,
        logging_steps=2,
        log_completions=True,
        num_completions_to_print=2,
    )
    trainer = GRPOTrainer(str(tiny_model_dir), [exact, only_first_prompt], config, train_dataset=rows)
    answers = {"1+1=": "2", "2+2=": "4"}
    trainer.backend = ScriptedBackend(trainer.tokenizer, lambda p, i: answers[p] if i % 2 == 0 else "9")
    trainer.train()
    records = [json.loads(line) for line in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [2] * 8 + [3] * 8  # logged steps only: 2 (every 2) and 3 (last)
    first = records[:4]  # prompt "1+1=", completions right, wrong, right, wrong
    assert [r["completion"] for r in first] == ["2", "9", "2", "9"]
    assert all(r["prompt"] == "1+1=" for r in first)
    assert [r["rewards"] for r in first[:2]] == [
        {"exact": 1.0, "only_first_prompt": 0.5},
        {"exact": 0.0, "only_first_prompt": 0.5},
    ]
    assert records[4]["rewards"] == {"exact": 1.0, "only_first_prompt": None}  # None stays null
    assert [r["reward"] for r in first] == [1.5, 0.5, 1.5, 0.5]
    # group advantages: rewards [1.5, 0.5, 1.5, 0.5] -> (r - 1) / (unbiased std 0.5774 + 1e-4)
    expected = 0.5 / (math.sqrt(1 / 3) + 1e-4)
    assert [r["advantage"] for r in first] == pytest.approx(
        [expected, -expected, expected, -expected], rel=1e-5
    )
    printed = capsys.readouterr().out
    assert printed.count("[step 2]") == 2 and printed.count("[step 3]") == 2
    assert "completion: '2'" in printed


def test_trl_attributes_ref_model_and_datasets(tiny_model_dir, rows, tmp_path):
    """TRL's trainer.ref_model (a frozen copy equal to the policy at the start; None without a KL term) and
    trainer.train_dataset / eval_dataset as given."""
    trainer = GRPOTrainer(
        str(tiny_model_dir), [digit_reward], make_config(tmp_path, beta=0.04), train_dataset=rows,
        eval_dataset=rows[:2],
    )  # fmt: skip
    assert trainer.train_dataset is rows and trainer.eval_dataset == rows[:2]
    reference = trainer.ref_model
    assert reference is not None and reference is not trainer.model
    assert not any(p.requires_grad for p in reference.parameters())
    for (name, ref), (_, param) in zip(reference.named_parameters(), trainer.model.named_parameters()):
        assert torch.equal(ref, param), name
    no_kl = GRPOTrainer(str(tiny_model_dir), [digit_reward], make_config(tmp_path / "b", beta=0.0),
                        train_dataset=rows)  # fmt: skip
    assert no_kl.ref_model is None


def test_named_eval_sets_are_evaluated_each_under_its_name(tiny_model_dir, rows, tmp_path):
    """TRL's eval_dataset={name: data set}: each set's metrics under eval/<name>/, equal to evaluating that
    set alone; an empty dict is refused."""
    sets = {"first": rows[:2], "rest": rows[2:]}
    trainer = GRPOTrainer(
        str(tiny_model_dir), [digit_reward], make_config(tmp_path), train_dataset=rows, eval_dataset=sets
    )
    named = trainer.evaluate()
    keys = [k.removeprefix("eval/") for k in trainer.evaluate(rows[:2]) if k != "eval_loss"]  # reward, ...
    losses = {f"eval_{n}_loss" for n in sets}  # transformers' names of the named sets' losses
    assert set(named) == {f"eval/{n}/{k}" for n in sets for k in keys} | losses
    for name, data in sets.items():
        alone = trainer.evaluate(eval_dataset=data)
        mine = {k.replace(f"eval/{name}/", "eval/"): v for k, v in named.items() if f"/{name}/" in k}
        assert {**mine, "eval_loss": named[f"eval_{name}_loss"]} == alone
    with pytest.raises(ValueError, match="eval_dataset: an empty dict"):
        GRPOTrainer(str(tiny_model_dir), [digit_reward], make_config(tmp_path / "b"), train_dataset=rows,
                    eval_dataset={})  # fmt: skip


def test_pad_to_multiple_of_pads_with_masked_columns_and_changes_nothing(tiny_model_dir, rows, tmp_path):
    """TRL's pad_to_multiple_of: prompts (left) and completions (right) padded to multiples of it, the new
    columns masked: the same loss, KL and gradient norm (mu 2, beta 0.04) and the same weights after."""
    seen = {}
    runs = {}
    for pad in (None, 16):
        config = make_config(tmp_path / f"pad{pad}", pad_to_multiple_of=pad, num_iterations=2, beta=0.04)
        trainer = GRPOTrainer(str(tiny_model_dir), [digit_reward], config, train_dataset=rows)
        trainer.backend = ScriptedBackend(trainer.tokenizer, lambda prompt, i: ["2", "5", "12", "77"][i % 4])
        original = trainer.rollout_batch

        def recording(samples, advantages, pad=pad, original=original):
            batch = original(samples, advantages)
            seen[pad] = (batch.prompt_ids.shape, batch.completion_ids.shape, batch.completion_mask.sum())
            return batch

        trainer.rollout_batch = recording
        runs[pad] = (trainer.train()[-1], trainer.model.state_dict())
    assert seen[16][0][1] == seen[16][1][1] == 16 and seen[None][1][1] < 16  # padded to 16 columns
    assert seen[16][2] == seen[None][2]  # no more trained tokens
    (plain, plain_weights), (padded, padded_weights) = runs[None], runs[16]
    for name in ("loss", "kl", "grad_norm", "ratio_mean"):
        assert padded[name] == pytest.approx(plain[name], rel=1e-5, abs=1e-7), name
    for name, value in plain_weights.items():
        torch.testing.assert_close(padded_weights[name], value, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match=r"GRPOConfig\.pad_to_multiple_of"):
        GRPOConfig(pad_to_multiple_of=0)

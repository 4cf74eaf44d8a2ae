"""The update loop: gradient accumulation is exact, padding is inert, micro-batches see every row once."""

import contextlib

import pytest
import torch
from transformers import AutoModelForCausalLM

from grpokit import GRPOConfig
from grpokit.models import recompute
from grpokit.models.lean_layers import use_lean_layers
from grpokit.rollout.records import RolloutBatch
from grpokit.train import update
from grpokit.train.forward import PolicyLogprobs
from grpokit.train.update import UpdateContext, optimizer_step, run_update


class RecordingOptimizer(torch.optim.SGD):
    """SGD with lr 0 that keeps a copy of the gradients it was asked to apply."""

    def __init__(self, params):
        super().__init__(params, lr=0.0)
        self.seen = []

    def step(self, closure=None):
        self.seen.append([p.grad.detach().clone() for group in self.param_groups for p in group["params"]])
        return super().step(closure)


def make_batch(num_rows=8, prompt_len=3, completion_len=5, seed=0):
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, completion_len + 1, (num_rows,), generator=generator)  # ragged completions
    completion_mask = (torch.arange(completion_len)[None, :] < lengths[:, None]).long()
    return RolloutBatch(
        prompt_ids=torch.randint(4, 90, (num_rows, prompt_len), generator=generator),
        prompt_mask=torch.ones(num_rows, prompt_len, dtype=torch.long),
        completion_ids=torch.randint(4, 90, (num_rows, completion_len), generator=generator),
        completion_mask=completion_mask,
        advantages=torch.randn(num_rows, generator=generator),
    )


def gradients(model_dir, batch, **config_values):
    return recorded_update(model_dir, batch, **config_values)[0]


def recorded_update(model_dir, batch, *, entropy=None, lean=False, **config_values):
    """run_update on a fresh tiny model (``lean``: with the lean layers) with an lr-0 recording optimizer:
    (gradients per optimizer step, metrics, the context)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    if lean:
        assert use_lean_layers(model) > 0
    optimizer = RecordingOptimizer(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    config = GRPOConfig(**{"num_generations": 2, "beta": 0.0, "max_completion_length": 5, **config_values})
    ctx = UpdateContext(
        loss=config.policy_loss(),
        policy=PolicyLogprobs(model),
        backward=lambda loss: loss.backward(),
        step=optimizer_step(optimizer, scheduler, model),
        sum_across_processes=lambda t: t,
        num_processes=1,
        generator=torch.Generator().manual_seed(0),
        entropy=entropy,
    )
    metrics = run_update(batch, config, ctx)
    return optimizer.seen, metrics, ctx


def test_the_update_makes_its_lean_norms_outputs_again_in_the_backward(tiny_model_dir, monkeypatch):
    """The update's forward runs inside ``recompute.recomputed_in_backward``: its backward makes the lean
    norms' outputs again (each micro-batch's), and its gradients are those of the forward without the block,
    bit for bit."""
    batch = make_batch()
    values = {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 2, "lean": True}
    tensor, made = recompute._Recipe.tensor, []
    monkeypatch.setattr(recompute._Recipe, "tensor", lambda self: made.append(1) or tensor(self))
    with_block = gradients(tiny_model_dir, batch, **values)
    assert made
    monkeypatch.setattr(update, "recomputed_in_backward", contextlib.nullcontext)
    made.clear()
    without = gradients(tiny_model_dir, batch, **values)
    assert not made
    for a, b in zip(with_block[0], without[0], strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
def test_batch_8_x_accumulation_1_equals_batch_1_x_accumulation_8(tiny_model_dir, loss_type):
    batch = make_batch()
    whole = gradients(tiny_model_dir, batch, loss_type=loss_type, per_device_train_batch_size=8)
    accumulated = gradients(
        tiny_model_dir,
        batch,
        loss_type=loss_type,
        per_device_train_batch_size=1,
        gradient_accumulation_steps=8,
    )
    assert len(whole) == len(accumulated) == 1  # one optimizer step each
    for a, b in zip(whole[0], accumulated[0]):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-4)


def test_right_padding_does_not_change_the_gradient(tiny_model_dir):
    batch = make_batch()
    padded = RolloutBatch(
        prompt_ids=batch.prompt_ids,
        prompt_mask=batch.prompt_mask,
        completion_ids=torch.cat([batch.completion_ids, torch.full((8, 3), 7)], dim=1),  # 3 junk columns
        completion_mask=torch.cat([batch.completion_mask, torch.zeros(8, 3, dtype=torch.long)], dim=1),
        advantages=batch.advantages,
    )
    plain = gradients(tiny_model_dir, batch, per_device_train_batch_size=8)
    extended = gradients(tiny_model_dir, padded, per_device_train_batch_size=8)
    for a, b in zip(plain[0], extended[0]):
        assert torch.allclose(a, b, atol=1e-6, rtol=1e-4)


def test_left_padding_of_prompts_does_not_change_the_gradient(tiny_model_dir):
    batch = make_batch()
    padded = RolloutBatch(
        prompt_ids=torch.cat([torch.zeros(8, 2, dtype=torch.long), batch.prompt_ids], dim=1),
        prompt_mask=torch.cat([torch.zeros(8, 2, dtype=torch.long), batch.prompt_mask], dim=1),
        completion_ids=batch.completion_ids,
        completion_mask=batch.completion_mask,
        advantages=batch.advantages,
    )
    plain = gradients(tiny_model_dir, batch, per_device_train_batch_size=8)
    extended = gradients(tiny_model_dir, padded, per_device_train_batch_size=8)
    for a, b in zip(plain[0], extended[0]):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-3)


def test_steps_and_epochs_make_the_planned_number_of_optimizer_steps(tiny_model_dir):
    # 8 rows, 2 per micro-batch, 2 micro-batches per optimizer step -> 2 optimizer steps per epoch; mu = 3
    seen = gradients(
        tiny_model_dir,
        make_batch(),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        steps_per_generation=2,
        num_iterations=3,
    )
    assert len(seen) == 6


def test_shuffle_keeps_groups_whole_when_micro_batches_hold_whole_groups():
    from grpokit.train.update import shuffled_rows

    config = GRPOConfig(num_generations=4, per_device_train_batch_size=8)
    order = shuffled_rows(16, config, torch.Generator().manual_seed(0)).view(4, 4)  # [groups, G]
    assert sorted(order.reshape(-1).tolist()) == list(range(16))
    for group in order:  # each block of 4 is one group k*4 .. k*4+3, in order
        assert group.tolist() == list(range(int(group[0]), int(group[0]) + 4)) and int(group[0]) % 4 == 0


@pytest.mark.parametrize("accumulation", [1, 2])
def test_entropy_bonus_gradient_equals_the_plain_computation(tiny_model_dir, accumulation):
    """entropy_coef c with zero advantages (no policy-gradient term, beta 0): the update's gradient is that
    of -c * H, H the mean per-token entropy of each micro-batch's completion tokens averaged over the
    micro-batches (TRL's bonus), computed here from a full forward's logits."""
    batch = make_batch()
    batch.advantages = torch.zeros(len(batch))
    coef, rows = 0.3, 8 // accumulation
    (seen,) = gradients(
        tiny_model_dir, batch, entropy_coef=coef, per_device_train_batch_size=rows,
        gradient_accumulation_steps=accumulation,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    bonus = 0.0
    for start in range(0, len(batch), rows):
        part = batch.select(torch.arange(start, start + rows))
        ids = torch.cat([part.prompt_ids, part.completion_ids], dim=1)
        logits = model(ids).logits[:, part.prompt_ids.shape[1] - 1 : -1].float()  # [n, C, V]
        logp = torch.log_softmax(logits, dim=-1)
        entropy = -(logp.exp() * logp).sum(-1)  # [n, C]
        mask = part.completion_mask.float()
        bonus = bonus + (entropy * mask).sum() / mask.sum() / accumulation
    (-coef * bonus).backward()
    expected = [p.grad for p in model.parameters()]
    assert max(float(g.abs().max()) for g in expected) > 1e-4
    for got, want in zip(seen, expected):
        torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-4)


def test_entropy_coef_must_be_finite():
    with pytest.raises(ValueError, match=r"GRPOConfig.entropy_coef"):
        GRPOConfig(entropy_coef=float("inf"))


# ---- micro-batches filled by a token budget (micro_batch_tokens)
def test_backbone_tokens_count_a_groups_prompt_once_and_every_real_completion_token():
    batch = RolloutBatch(
        prompt_ids=torch.zeros(4, 3, dtype=torch.long),
        prompt_mask=torch.tensor([[0, 1, 1], [0, 1, 1], [1, 1, 1], [1, 1, 1]]),  # left-padded: 2, 2, 3, 3
        completion_ids=torch.zeros(4, 4, dtype=torch.long),
        completion_mask=torch.tensor([[1, 0, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 0, 0]]),  # 1, 3, 4, 2
        advantages=torch.zeros(4),
    )
    assert batch.backbone_tokens(1).tolist() == [3, 5, 7, 5]
    assert batch.backbone_tokens(2).tolist() == [2 + 1 + 3, 3 + 4 + 2]
    batch.context_mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 1]])  # episodes
    assert batch.backbone_tokens(2).tolist() == [2 + 2 + 3, 3 + 4 + 4]
    with pytest.raises(ValueError, match="4 rows do not split into units of 3"):
        batch.backbone_tokens(3)


def test_token_budget_fills_consecutive_units_up_to_the_budget():
    from grpokit.train.batch import token_budget_micro_batches

    # units of 2 rows with 5, 3, 4, 2, 9 tokens, budget 8: [5+3], [4+2], [9 alone: over the budget]
    parts = token_budget_micro_batches([5, 3, 4, 2, 9], unit_size=2, budget=8)
    assert [p.tolist() for p in parts] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    # asked for 5: the fullest micro-batch of two units is cut at its token midpoint until there are 5
    parts = token_budget_micro_batches([5, 3, 4, 2, 9], unit_size=1, budget=8, count=5)
    assert [p.tolist() for p in parts] == [[0], [1], [2], [3], [4]]
    parts = token_budget_micro_batches([1, 1, 6, 1, 1], unit_size=1, budget=20, count=2)
    assert [p.tolist() for p in parts] == [[0, 1, 2], [3, 4]]  # 8 | 2: the first cut where 5 is reached
    with pytest.raises(ValueError, match="cannot make 6 micro-batches from 5 units"):
        token_budget_micro_batches([5, 3, 4, 2, 9], unit_size=1, budget=8, count=6)
    with pytest.raises(ValueError, match="cannot make 2 micro-batches from 5 units that fill 3"):
        token_budget_micro_batches([5, 3, 4, 2, 9], unit_size=1, budget=8, count=2)
    with pytest.raises(ValueError, match="budget must be >= 1"):
        token_budget_micro_batches([5], unit_size=1, budget=0)


def test_token_budget_balances_the_fewest_micro_batches():
    from grpokit.train.batch import token_budget_micro_batches

    # 8 groups of 170 tokens, budget 1,024: filled in order [6 groups = 1,020 | 2 = 340]; as two micro-batches
    # the fullest can hold 4 groups (680 tokens), and the activations it keeps bound the update's memory
    parts = token_budget_micro_batches([170] * 8, unit_size=8, budget=1024)
    assert [len(p) // 8 for p in parts] == [4, 4]
    # 9, 1, 1, 1, 8 with budget 12: filling gives [9+1+1+1 = 12 | 8]; [9+1 | 1+1+8] is two as well, max 10
    parts = token_budget_micro_batches([9, 1, 1, 1, 8], unit_size=1, budget=12)
    assert [p.tolist() for p in parts] == [[0, 1], [2, 3, 4]]
    # a unit over the budget stays alone and the rest are balanced around it
    parts = token_budget_micro_batches([3, 3, 3, 3, 20, 2, 2], unit_size=1, budget=9)
    assert [p.tolist() for p in parts] == [[0, 1], [2, 3], [4], [5, 6]]


def _fewest_then_most_balanced(unit_tokens: list[int], budget: int) -> tuple[int, int]:
    """Every way to cut ``unit_tokens`` into consecutive parts, each within ``budget`` or a single unit: the
    fewest parts, and the smallest largest part among partitions of that many (brute force)."""
    import itertools

    n, best = len(unit_tokens), None
    for cuts in itertools.product((False, True), repeat=n - 1):
        parts, start = [], 0
        for i, cut in enumerate([*cuts, True]):
            if cut:
                parts.append(unit_tokens[start : i + 1])
                start = i + 1
        if all(len(part) == 1 or sum(part) <= budget for part in parts):
            key = (len(parts), max(sum(part) for part in parts))
            best = key if best is None else min(best, key)
    return best


def test_token_budget_micro_batches_are_the_fewest_and_most_balanced():
    """Against every partition of random units into consecutive micro-batches: as few as any partition
    within the budget, and a largest micro-batch no larger than any other partition of that many has."""
    from grpokit.train.batch import token_budget_micro_batches

    generator = torch.Generator().manual_seed(0)
    for _ in range(200):
        n = int(torch.randint(1, 10, (1,), generator=generator))
        units = torch.randint(1, 30, (n,), generator=generator).tolist()
        budget = int(torch.randint(1, 60, (1,), generator=generator))
        parts = token_budget_micro_batches(units, unit_size=1, budget=budget)
        assert torch.cat(parts).tolist() == list(range(n))  # each row once, in order
        sizes = [sum(units[i] for i in p.tolist()) for p in parts]
        assert all(len(p) == 1 or s <= budget for p, s in zip(parts, sizes))
        assert (len(parts), max(sizes)) == _fewest_then_most_balanced(units, budget), (units, budget)


@pytest.mark.parametrize(
    ("loss_type", "entropy_coef"),
    [("grpo", 0.0), ("dr_grpo", 0.0), ("dapo", 0.0), ("luspo", 0.0), ("sapo", 0.0), ("grpo", 0.3)],
)
def test_token_budget_step_equals_one_micro_batch_of_every_row(tiny_model_dir, loss_type, entropy_coef):
    """Micro-batches of unequal rows (filled by real tokens) give the gradient of one micro-batch holding
    the whole optimizer step: each loss weighted by its share of the step's rows, the entropy bonus by its
    share of the step's completion tokens."""
    from grpokit.train.batch import token_budget_micro_batches

    batch = make_batch(num_rows=12, completion_len=9, seed=0)
    budget = 30
    units = batch.backbone_tokens(2).tolist()  # groups of G = 2: 3 prompt tokens + 2 completions
    sizes = [len(p) for p in token_budget_micro_batches(units, 2, budget)]
    assert len(sizes) >= 3 and len(set(sizes)) > 1  # several micro-batches of different sizes
    values = dict(loss_type=loss_type, entropy_coef=entropy_coef, max_completion_length=9)
    whole = gradients(tiny_model_dir, batch, per_device_train_batch_size=12, **values)
    budgeted = gradients(
        tiny_model_dir, batch, per_device_train_batch_size=12, micro_batch_tokens=budget, **values
    )
    rows = gradients(
        tiny_model_dir, batch, per_device_train_batch_size=2, gradient_accumulation_steps=6, **values
    )
    assert len(whole) == len(budgeted) == 1
    for a, b in zip(whole[0], budgeted[0]):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-4)
    if loss_type == "grpo" and entropy_coef:  # TRL's bonus (a mean of per-micro-batch means) differs
        assert any(not torch.allclose(a, b, atol=1e-6, rtol=1e-4) for a, b in zip(whole[0], rows[0]))


def update_forwards(model_dir, batch, **config_values) -> list[tuple[int, int]]:
    """Each forward of one update (G = 2, beta 0, lr 0): its groups and real backbone tokens (each group's
    prompt once, every completion token), counted from what the policy's forward receives."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    policy = PolicyLogprobs(model)
    forward, seen = policy.forward, []

    def counting(prompt_ids, prompt_mask, completion_ids, completion_mask, **options):
        groups = prompt_mask.shape[0] // 2
        seen.append((groups, int(prompt_mask.view(groups, 2, -1)[:, 0].sum() + completion_mask.sum())))
        return forward(prompt_ids, prompt_mask, completion_ids, completion_mask, **options)

    policy.forward = counting
    optimizer = RecordingOptimizer(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    config = GRPOConfig(**{"num_generations": 2, "beta": 0.0, "max_completion_length": 9, **config_values})
    ctx = UpdateContext(
        loss=config.policy_loss(), policy=policy, backward=lambda loss: loss.backward(),
        step=optimizer_step(optimizer, scheduler, model), sum_across_processes=lambda t: t, num_processes=1,
        generator=torch.Generator().manual_seed(0),
    )  # fmt: skip
    run_update(batch, config, ctx)
    return seen


def test_token_budget_bounds_each_micro_batch(tiny_model_dir):
    """Each forward of the update holds whole groups of at most the budget's real tokens (a group over it
    alone), counted from the tokens the policy's forward receives."""
    batch = make_batch(num_rows=12, completion_len=9, seed=0)
    seen = update_forwards(tiny_model_dir, batch, per_device_train_batch_size=12, micro_batch_tokens=25)
    assert sum(groups for groups, _ in seen) == 6  # every group once
    assert all(tokens <= 25 or groups == 1 for groups, tokens in seen)
    assert len(seen) >= 3


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"micro_batch_tokens": 0}, r"GRPOConfig.micro_batch_tokens must be >= 1"),
        (
            {"micro_batch_tokens": 512, "loss_type": "bnpo"},
            r"GRPOConfig.micro_batch_tokens cannot be used with loss_type='bnpo'",
        ),
        (
            {"micro_batch_tokens": 512, "top_entropy_quantile": 0.2},
            r"GRPOConfig.micro_batch_tokens cannot be used with top_entropy_quantile=0.2",
        ),
    ],
)
def test_token_budget_refusals_name_the_field(values, message):
    with pytest.raises(ValueError, match=message):
        GRPOConfig(**values)


# ---- row micro-batches dealt by tokens (balance_micro_batches)
def test_balanced_micro_batches_deal_whole_units_by_tokens():
    from grpokit.train.batch import balanced_micro_batches

    # groups of 2 rows with 1,400, 900, 500 and 450 tokens, two groups per micro-batch: in order the fullest
    # holds 1,400 + 900 = 2,300; dealt, 1,400 + 450 = 1,850 and 900 + 500 = 1,400, the fullest first
    parts = balanced_micro_batches([1400, 900, 500, 450], unit_size=2, units_per_micro_batch=2)
    assert [p.tolist() for p in parts] == [[0, 1, 6, 7], [2, 3, 4, 5]]
    # already balanced in order: the rows' own micro-batches, the fullest first
    parts = balanced_micro_batches([1, 9, 9, 1], unit_size=1, units_per_micro_batch=2)
    assert [p.tolist() for p in parts] == [[0, 1], [2, 3]]
    parts = balanced_micro_batches([1, 2, 9, 9], unit_size=1, units_per_micro_batch=2)
    assert [p.tolist() for p in parts] == [[1, 2], [0, 3]]  # 2 + 9 = 11 | 1 + 9 = 10 (in order 3 | 18)
    with pytest.raises(ValueError, match="5 units do not split into micro-batches of 2 units"):
        balanced_micro_batches([1, 2, 3, 4, 5], unit_size=1, units_per_micro_batch=2)


def test_balanced_micro_batches_are_never_fuller_than_consecutive_ones():
    """Random units against the consecutive micro-batches and against every deal (brute force): each row
    once, equal micro-batches, the fullest never fuller than in the rows' order, and within 4/3 of the best
    deal."""
    import itertools

    from grpokit.train.batch import balanced_micro_batches

    generator = torch.Generator().manual_seed(0)
    for _ in range(200):
        per = int(torch.randint(1, 4, (1,), generator=generator))
        count = int(torch.randint(1, 6 // per + 1, (1,), generator=generator))  # at most 6 units
        units = torch.randint(1, 40, (per * count,), generator=generator).tolist()
        parts = balanced_micro_batches(units, unit_size=1, units_per_micro_batch=per)
        assert sorted(torch.cat(parts).tolist()) == list(range(len(units)))
        assert all(len(p) == per for p in parts)
        fullest = max(sum(units[i] for i in p.tolist()) for p in parts)
        assert fullest <= max(sum(units[b * per : (b + 1) * per]) for b in range(count))
        best = min(
            max(sum(units[i] for i in order[b * per : (b + 1) * per]) for b in range(count))
            for order in itertools.permutations(range(len(units)))
        )
        assert fullest * 3 <= best * 4, (units, per)


def forward_tokens(model_dir, batch, **config_values) -> list[int]:
    """The real backbone tokens of each forward of one update (``update_forwards``)."""
    return [tokens for _, tokens in update_forwards(model_dir, batch, **config_values)]


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo", "luspo", "sapo"])
def test_balanced_micro_batches_hold_fewer_tokens_and_leave_the_gradient(tiny_model_dir, loss_type):
    """Six groups of G = 2 in three micro-batches of two groups: dealt by tokens, the fullest forward holds
    fewer real tokens than in the rows' order, and the step's gradient is that of one micro-batch holding
    every row (as it is in order)."""
    batch = make_batch(num_rows=12, completion_len=9, seed=0)
    values = dict(loss_type=loss_type, max_completion_length=9)
    split = dict(per_device_train_batch_size=4, gradient_accumulation_steps=3)
    dealt = forward_tokens(tiny_model_dir, batch, **values, **split)
    in_order = forward_tokens(tiny_model_dir, batch, **values, **split, balance_micro_batches=False)
    assert sorted(dealt) != sorted(in_order) and sum(dealt) == sum(in_order)
    assert max(dealt) < max(in_order) and dealt == sorted(dealt, reverse=True)  # the fullest first
    whole = gradients(tiny_model_dir, batch, per_device_train_batch_size=12, **values)
    balanced = gradients(tiny_model_dir, batch, **values, **split)
    assert len(whole) == len(balanced) == 1
    for a, b in zip(whole[0], balanced[0]):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize(
    "values",
    [
        {"loss_type": "bnpo"},
        {"top_entropy_quantile": 0.5},
        {"entropy_coef": 0.1},
        {"balance_micro_batches": False},
    ],
)
def test_micro_batches_stay_in_order_where_the_split_defines_the_loss(tiny_model_dir, values):
    """bnpo, a top-entropy quantile and the entropy bonus normalise over each micro-batch: there the rows'
    own consecutive micro-batches (TRL's) are kept, as with balance_micro_batches=False."""
    batch = make_batch(num_rows=12, completion_len=9, seed=0)
    split = dict(per_device_train_batch_size=4, gradient_accumulation_steps=3)
    kept = forward_tokens(tiny_model_dir, batch, **split, **values)
    in_order = forward_tokens(tiny_model_dir, batch, **split, balance_micro_batches=False)
    dealt = forward_tokens(tiny_model_dir, batch, **split)
    assert kept == in_order != dealt

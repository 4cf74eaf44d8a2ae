"""GRPO in one file: the whole step over grpokit's public parts, top to bottom.

DeepSeekMath (arXiv:2402.03300), Algorithm 1. For each prompt q, sample G outputs o_1..o_G from the old
policy, score them, and maximise

    J(theta) = 1/G sum_i 1/|o_i| sum_t [ min(r_it A_i, clip(r_it, 1-eps, 1+eps) A_i) - beta D_KL_it ]

    A_i  = (r_i - mean(r_1..r_G)) / std(r_1..r_G)            the group is the baseline: no value model
    r_it = pi_theta(o_it | q, o_i<t) / pi_old(o_it | q, o_i<t)
    D_KL = pi_ref / pi_theta - log(pi_ref / pi_theta) - 1      (k3, per token, added to the loss)

with mu updates on the same samples. ``GRPOTrainer.training_step`` is this step plus what a real run needs
(several processes, mixed precision, checkpoints, process supervision, logging, hooks); a test checks that
one step of each leaves the same parameters (tests/train/test_minimal_step.py). ``loss_type``, ``beta``,
``epsilon``, ``epsilon_high``, ``scale_rewards`` and ``num_iterations`` of the GRPOConfig switch the variant.

Run it: ``python examples/grpo_minimal.py`` trains the built-in tiny arithmetic policy for a few steps.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch

from grpokit import GRPOConfig
from grpokit.core import combine_rewards, group_advantages, pad_left, pad_right
from grpokit.data import reward_columns
from grpokit.data.chat import as_completion, encode_prompt
from grpokit.models import pad_token_id
from grpokit.rewards import score_completions
from grpokit.rollout import RolloutBackend
from grpokit.train.forward import completion_logprobs, no_grad_logprobs

Phase = Callable[[str], contextlib.AbstractContextManager]


def grpo_step(
    policy: torch.nn.Module,
    reference: torch.nn.Module | None,
    optimizer: torch.optim.Optimizer,
    backend: RolloutBackend,
    tokenizer: Any,
    reward_funcs: Sequence[Callable[..., list[float | None]]],
    rows: list[dict[str, Any]],
    args: GRPOConfig,
    *,
    micro_batch_size: int | None = None,
    phase: Phase = lambda name: contextlib.nullcontext(),
) -> dict[str, float]:
    """One GRPO step on ``rows`` (dataset rows with a ``prompt``). ``reference``: pi_ref (needed when
    args.beta > 0). ``micro_batch_size``: rows per forward/backward (gradient accumulation; default all).
    ``phase(name)``: a context manager timing each phase (the benchmark passes one)."""
    G = args.num_generations
    loss_fn = args.policy_loss()  # loss_type, epsilon(_high), beta, ...: fixed for the run

    # 1. sample G completions per prompt from the current policy, which is pi_old for this step
    with phase("generate"):
        prompt_ids = [encode_prompt(r["prompt"], tokenizer, args.max_prompt_length) for r in rows]
        out = backend.generate(prompt_ids, G, args.sampling_params(tokenizer))
        texts = tokenizer.batch_decode(out.completion_ids, skip_special_tokens=True)

    # 2. score every completion with every reward function (TRL's signature), weighted sum -> [N]
    with phase("reward"):
        rows_g = [r for r in rows for _ in range(G)]  # [N], groups contiguous
        matrix, _ = score_completions(
            reward_funcs,
            prompts=[r["prompt"] for r in rows_g],
            completions=[as_completion(text, r["prompt"]) for r, text in zip(rows_g, texts)],
            completion_ids=out.completion_ids,
            columns=reward_columns(rows_g),
        )  # [N, F], NaN where a function returned None
        weights = None if args.reward_weights is None else torch.tensor(args.reward_weights)
        rewards = combine_rewards(matrix, weights)  # [N]

    # 3. group-relative advantages: (r - group mean) / group std
    advantages = group_advantages(rewards, G, scale=args.scale_rewards, eps=args.advantage_epsilon)  # [N]

    # 4. pad: prompts on the left, completions on the right
    pad = pad_token_id(tokenizer)  # the tokenizer's pad, else its EOS
    p_ids, p_mask = pad_left([ids for ids in prompt_ids for _ in range(G)], pad)  # [N, P]
    c_ids, c_mask = pad_right(out.completion_ids, pad)  # [N, C]
    if args.mask_truncated_completions and out.truncated:  # DAPO: cut-off completions teach nothing
        c_mask = c_mask * ~torch.tensor(out.truncated)[:, None]
    tensors = (p_ids, p_mask, c_ids, c_mask)

    # 5. fixed log-probs: pi_old only if the policy moves before the last update (mu > 1); pi_ref if beta > 0
    fixed = {"temperature": args.temperature, "num_generations": G}
    with phase("old_logps"):
        old_logps = no_grad_logprobs(policy, *tensors, **fixed) if args.num_iterations > 1 else None
    with phase("ref_logps"):
        ref_logps = no_grad_logprobs(reference, *tensors, **fixed) if args.beta > 0 else None

    # 6. mu epochs of policy-gradient updates on the same samples, one optimizer step each
    policy.train()
    size = micro_batch_size or len(rows_g)
    parts = [slice(s, s + size) for s in range(0, len(rows_g), size)]
    num_items = c_mask.sum()  # completion tokens of the optimizer step (the dapo/cispo normaliser)
    for _ in range(args.num_iterations):
        for part in parts:
            with phase("policy_forward"):
                logps, _ = completion_logprobs(policy, *(t[part] for t in tensors), **fixed)  # [n, C]
                loss, metrics = loss_fn(
                    logps,
                    None if old_logps is None else old_logps[part],
                    advantages[part],
                    c_mask[part],
                    ref_logps=None if ref_logps is None else ref_logps[part],
                    num_items_in_batch=num_items,
                )
                if not loss_fn.is_global:  # a per-micro-batch mean: average over the micro-batches
                    loss = loss / len(parts)
            with phase("backward"):
                loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), args.max_grad_norm or float("inf"))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    # 7. log
    return {
        "reward": float(torch.nanmean(rewards)),
        "loss": float(loss.detach()),
        "grad_norm": float(grad_norm),
        **{name: float(value) for name, value in metrics.items()},
    }


def main(steps: int = 20) -> None:
    """Train the built-in tiny arithmetic policy (cold-started and cached on first use) with this step."""
    from transformers import AutoModelForCausalLM

    from grpokit.models import load_tokenizer
    from grpokit.rollout import FastSampler
    from grpokit.tasks import cold_start_policy, get_task

    task = get_task("arithmetic")
    path = cold_start_policy("arithmetic")
    tokenizer = load_tokenizer(str(path))
    policy = AutoModelForCausalLM.from_pretrained(path)
    reference = copy.deepcopy(policy).eval().requires_grad_(False)
    weights = [task.default_reward_weights[name] for name in task.reward_funcs]  # exact answer 1, format 0.1
    args = GRPOConfig(num_generations=8, max_completion_length=40, learning_rate=2e-5, reward_weights=weights)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=args.learning_rate)
    rows, _ = task.make_splits(seed=0, num_train=16 * steps, num_test=1)
    reward_funcs, sampler = list(task.reward_funcs.values()), FastSampler(policy)
    for step in range(steps):
        batch = rows[16 * step : 16 * (step + 1)]  # 16 prompts x G = 8 completions per step
        metrics = grpo_step(policy, reference, optimizer, sampler, tokenizer, reward_funcs, batch, args)
        shown = "  ".join(f"{name} {metrics[name]:.4f}" for name in ("reward", "kl", "loss"))
        print(f"step {step + 1}: {shown}")


if __name__ == "__main__":
    main()

"""Step 5 of a GRPO step: generated token lists -> one padded RolloutBatch with its fixed log-probs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from grpokit.config import BatchPlan, GRPOConfig
from grpokit.rollout.base import GenerationOutput
from grpokit.rollout.hf import left_pad, right_pad
from grpokit.train.batch import RolloutBatch
from grpokit.train.forward import completion_logprobs


def pad_rollout(
    prompt_ids: Sequence[Sequence[int]],
    generated: GenerationOutput,
    advantages: torch.Tensor,
    *,
    num_generations: int,
    pad_token_id: int,
    mask_truncated: bool,
    device: torch.device,
) -> RolloutBatch:
    """Prompts repeated G times and left-padded, completions right-padded; truncated completions masked
    out of the loss when ``mask_truncated`` (DAPO)."""
    repeated = [ids for ids in prompt_ids for _ in range(num_generations)]
    p_ids, p_mask = left_pad(repeated, pad_token_id, device)  # [N, P]
    c_ids, c_mask = right_pad(generated.completion_ids, pad_token_id, device)  # [N, C]
    if mask_truncated and generated.truncated:
        keep = ~torch.tensor(generated.truncated, dtype=torch.bool, device=device)  # [N]
        c_mask = c_mask * keep[:, None].long()
    sampling = None
    if generated.logprobs is not None:
        sampling = torch.zeros(c_ids.shape, dtype=torch.float32, device=device)
        for row, values in enumerate(generated.logprobs):
            sampling[row, : len(values)] = torch.tensor(values, dtype=torch.float32, device=device)
    return RolloutBatch(
        prompt_ids=p_ids,
        prompt_mask=p_mask,
        completion_ids=c_ids,
        completion_mask=c_mask,
        advantages=advantages.to(device=device, dtype=torch.float32),
        sampling_logps=sampling,
    )


@torch.no_grad()
def batched_logprobs(
    model: torch.nn.Module,
    batch: RolloutBatch,
    *,
    temperature: float,
    micro_batch_size: int,
    num_generations: int,
) -> torch.Tensor:
    """Log-probs [N, C] of the batch's completions under ``model`` without gradients, in micro-batches."""
    was_training = model.training
    model.eval()
    try:
        parts = []
        for start in range(0, len(batch), micro_batch_size):
            rows = batch.select(slice(start, start + micro_batch_size))
            logps, _ = completion_logprobs(
                model,
                rows.prompt_ids,
                rows.prompt_mask,
                rows.completion_ids,
                rows.completion_mask,
                temperature=temperature,
                num_generations=num_generations if micro_batch_size % num_generations == 0 else None,
            )
            parts.append(logps)
    finally:
        model.train(was_training)
    return torch.cat(parts)


def needs_old_logprobs(plan: BatchPlan) -> bool:
    """pi_old differs from pi_theta during the update only with mu > 1 or several optimizer steps per step."""
    return plan.optimizer_steps > 1


def build_rollout_batch(
    trainer: Any, prompt_ids: Sequence[Sequence[int]], generated: GenerationOutput, advantages: torch.Tensor
) -> RolloutBatch:
    """Pad the rollout and attach old log-probs (only when needed) and reference log-probs (beta > 0)."""
    args: GRPOConfig = trainer.args
    batch = pad_rollout(
        prompt_ids,
        generated,
        advantages,
        num_generations=args.num_generations,
        pad_token_id=trainer.sampling_params().pad_token_id,
        mask_truncated=args.mask_truncated_completions,
        device=trainer.accelerator.device,
    )
    micro = max(args.per_device_train_batch_size, args.num_generations)
    if needs_old_logprobs(trainer.plan):
        batch.old_logps = batched_logprobs(
            trainer.unwrapped_model,
            batch,
            temperature=args.temperature,
            micro_batch_size=micro,
            num_generations=args.num_generations,
        )
    reference = trainer.reference_model
    if reference is not None:
        with trainer.reference_logprobs_context():
            batch.ref_logps = batched_logprobs(
                reference,
                batch,
                temperature=args.temperature,
                micro_batch_size=micro,
                num_generations=args.num_generations,
            )
    return batch


def completion_metrics(generated: GenerationOutput) -> dict[str, float]:
    """completions/mean_length, min_length, max_length, clipped_ratio (fraction truncated)."""
    lengths = torch.tensor([len(ids) for ids in generated.completion_ids], dtype=torch.float32)
    truncated = torch.tensor(generated.truncated or [False] * len(lengths), dtype=torch.float32)
    return {
        "completions/mean_length": float(lengths.mean()),
        "completions/min_length": float(lengths.min()),
        "completions/max_length": float(lengths.max()),
        "completions/clipped_ratio": float(truncated.mean()),
    }

"""Between the records of one GRPO step (``grpokit.rollout.records``: Samples -> Scores -> RolloutBatch):
:func:`score_samples` (the reward matrix of Samples), :func:`pad_samples` (Samples + advantages ->
RolloutBatch), :class:`LogprobPass` (pi_old, pi_ref) and the update's micro-batches.
N = prompts x G completions of the whole step, n = this process's share; groups are contiguous.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from grpokit.core import pad_left, pad_right
from grpokit.data.chat import as_completion
from grpokit.data.loading import reward_columns
from grpokit.models.routing_replay import RoutedExperts, RoutingUse
from grpokit.rewards.reward_logs import RewardLogs
from grpokit.rewards.scoring import score_completions
from grpokit.rollout.records import RolloutBatch, Samples
from grpokit.train.forward import no_grad_logprobs

logger = logging.getLogger("grpokit")

__all__ = [
    "LogprobPass",
    "balanced_micro_batches",
    "micro_batch_indices",
    "pad_samples",
    "score_samples",
    "token_budget_micro_batches",
]


def score_samples(
    reward_funcs: list[Any],
    samples: Samples,
    trainer_state: dict[str, Any],
    on_error: str,
    timeout: float | None = None,
    reward_logs: RewardLogs | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Samples -> ``(rewards [n, F] with NaN for None, rewards/<name>/failures)``: every reward function
    called with TRL's keywords (completions as the prompt's format has them, the rows' columns,
    ``trainer_state``) under the failure policy ``on_error``, each call within ``timeout`` seconds
    (``grpokit.rewards.score_completions``); their ``log_metric`` / ``log_extra`` calls go to
    ``reward_logs``."""
    rows = samples.rows
    matrix, failures = score_completions(
        reward_funcs,
        prompts=[row["prompt"] for row in rows],
        completions=[as_completion(text, row["prompt"]) for row, text in zip(rows, samples.texts)],
        completion_ids=samples.generated.completion_ids,
        columns=reward_columns(rows),
        trainer_state=trainer_state,
        on_error=on_error,
        timeout=timeout,
        reward_logs=reward_logs,
    )
    unscored = torch.isnan(matrix).all(dim=1) if matrix.shape[1] else torch.zeros(0, dtype=torch.bool)  # [n]
    if bool(unscored.any()):  # such a row counts as reward 0 in its group's advantages
        row = int(unscored.nonzero()[0])
        logger.warning(
            "All reward functions returned None for the following kwargs:\n%s\nfor %d of %d completions this "
            "step; please ensure that at least one reward function returns a valid reward",
            {**rows[row], "completion": samples.texts[row]}, int(unscored.sum()), len(rows),
        )  # fmt: skip
    return matrix, {f"rewards/{name}/failures": float(count) for name, count in failures.items()}


def pad_samples(
    samples: Samples,
    advantages: torch.Tensor,
    *,
    pad_token_id: int,
    mask_truncated: bool,
    device: torch.device,
    multiple: int | None = None,
    num_experts: int | None = None,
) -> RolloutBatch:
    """Prompts repeated G times and left-padded, completions right-padded (with ``multiple``: P and C
    rounded up to multiples of it, the extra columns masked); an episode's environment tokens
    (``policy_mask`` 0) and truncated completions when ``mask_truncated`` (DAPO) masked out of the loss.
    advantages: [n] (this process's rows). ``num_experts``: a mixture-of-experts policy's, for the
    sampler's routing (``routed_experts``) placed in the batch's layout."""
    generated = samples.generated
    repeated = [ids for ids, size in zip(samples.prompt_ids, samples.sizes()) for _ in range(size)]
    p_ids, p_mask = pad_left(repeated, pad_token_id, device)  # [n, P]
    c_ids, c_mask = pad_right(generated.completion_ids, pad_token_id, device)  # [n, C]
    context = None
    if generated.policy_mask is not None:  # environment tokens of episodes: context only, no loss, no KL
        policy, _ = pad_right(generated.policy_mask, 0, device)  # [n, C]
        context, c_mask = c_mask, c_mask * policy
    if mask_truncated and generated.truncated:
        keep = ~torch.tensor(generated.truncated, dtype=torch.bool, device=device)  # [n]
        c_mask = c_mask * keep[:, None].long()
    sampling = None
    if generated.logprobs is not None:
        sampling = torch.zeros(c_ids.shape, dtype=torch.float32, device=device)  # [n, C]
        for row, values in enumerate(generated.logprobs):
            sampling[row, : len(values)] = torch.tensor(values, dtype=torch.float32, device=device)
    if multiple:  # extra masked columns: prompts on the left, completions on the right
        p_ids, p_mask = (
            _widen(t, multiple, value, left=True) for t, value in ((p_ids, pad_token_id), (p_mask, 0))
        )
        c_ids, c_mask, sampling, context = (
            None if t is None else _widen(t, multiple, value, left=False)
            for t, value in ((c_ids, pad_token_id), (c_mask, 0), (sampling, 0.0), (context, 0))
        )
    routed = None
    if generated.routed_experts is not None and num_experts is not None:
        lengths = [len(ids) for ids in repeated]
        routed = RoutedExperts.from_rows(
            generated.routed_experts, lengths, p_ids.shape[1], c_ids.shape[1], num_experts, device
        )
    return RolloutBatch(
        prompt_ids=p_ids,
        prompt_mask=p_mask,
        completion_ids=c_ids,
        completion_mask=c_mask,
        advantages=advantages.to(device=device, dtype=torch.float32),
        sampling_logps=sampling,
        context_mask=context,
        images=samples.images,
        routed_experts=routed,
    )


def _widen(tensor: torch.Tensor, multiple: int, value: float, *, left: bool) -> torch.Tensor:
    """[n, L] -> [n, L rounded up to a multiple of ``multiple``], the new columns filled with ``value``."""
    extra = -tensor.shape[1] % multiple
    return torch.nn.functional.pad(tensor, (extra, 0) if left else (0, extra), value=value)


@dataclass(frozen=True)
class LogprobPass:
    """A log-prob pass without gradients over a RolloutBatch (pi_old, pi_ref): ``micro_batch_size`` rows
    per forward, in eval mode, groups kept whole so the shared-prefix forward applies."""

    temperature: float
    micro_batch_size: int
    num_generations: int | None
    padding_free: bool | None = None  # GRPOConfig.padding_free: packed passes (None: where they pay)

    @classmethod
    def from_config(cls, config: Any) -> LogprobPass:
        """As wide as a training micro-batch, and at least one group. Ragged groups (adaptive group sizes)
        are not cut into equal blocks: no shared-prefix forward then."""
        micro = max(config.per_device_train_batch_size, config.num_generations)
        group = None if config.adaptive_num_generations else config.num_generations
        return cls(config.temperature, micro, group, config.padding_free)

    def __call__(
        self, model: torch.nn.Module, batch: RolloutBatch, routing: RoutingUse | None = None
    ) -> torch.Tensor:
        """Log-probs [N, C] of the batch's completions under ``model``, routed as ``routing`` says (a
        mixture-of-experts policy; ``grpokit.models.routing_replay``)."""
        return no_grad_logprobs(
            model,
            batch.prompt_ids,
            batch.prompt_mask,
            batch.completion_ids,
            batch.completion_mask,
            temperature=self.temperature,
            num_generations=self.num_generations,
            micro_batch_size=self.micro_batch_size,
            context_mask=batch.context_mask,
            images=batch.images,
            routing=routing,
            padding_free=self.padding_free,
        )


def micro_batch_indices(
    num_rows: int, micro_batch_size: int, generator: torch.Generator | None = None, shuffle: bool = True
) -> list[torch.Tensor]:
    """Split row indices 0..num_rows-1 into consecutive micro-batches (shuffled first if ``shuffle``)."""
    order = torch.randperm(num_rows, generator=generator) if shuffle else torch.arange(num_rows)
    return list(order.split(micro_batch_size))


def balanced_micro_batches(
    unit_tokens: list[int], unit_size: int, units_per_micro_batch: int
) -> list[torch.Tensor]:
    """Row indices of micro-batches of exactly ``units_per_micro_batch`` units each, the units dealt so that
    the micro-batch with the most real tokens holds as few as this greedy deal finds: each unit, the largest
    first, goes to the micro-batch with room that holds the fewest tokens so far (longest processing time
    first, with a cardinality limit), unless consecutive units would leave no fuller micro-batch. The
    activations of the fullest forward bound the update's memory: groups of [1,400 | 900 | 500 | 450]
    tokens in pairs run as [1,400 + 450 | 900 + 500], not [1,400 + 900 | 500 + 450].

    ``unit_tokens``: the real backbone tokens of each unit, a unit being ``unit_size`` consecutive rows (a
    whole group, or one row). Micro-batches come largest first (a smaller forward then fits in the memory
    the larger one freed), each unit's rows in order and a micro-batch's units in their order; every row
    once. Ties go to the lower index, so the deal depends on the tokens alone."""
    if units_per_micro_batch < 1 or len(unit_tokens) % units_per_micro_batch:
        raise ValueError(
            f"{len(unit_tokens)} units do not split into micro-batches of {units_per_micro_batch} units"
        )
    count = len(unit_tokens) // units_per_micro_batch
    members: list[list[int]] = [[] for _ in range(count)]
    filled = [0] * count
    for unit in sorted(range(len(unit_tokens)), key=lambda u: (-unit_tokens[u], u)):
        open_bins = [b for b in range(count) if len(members[b]) < units_per_micro_batch]
        chosen = min(open_bins, key=lambda b: (filled[b], b))
        members[chosen].append(unit)
        filled[chosen] += unit_tokens[unit]
    consecutive = [
        list(range(b * units_per_micro_batch, (b + 1) * units_per_micro_batch)) for b in range(count)
    ]
    in_order = [sum(unit_tokens[u] for u in units) for units in consecutive]
    if max(in_order) <= max(filled):  # the deal is a heuristic: never fuller than the rows' own order
        members, filled = consecutive, in_order
    order = sorted(range(count), key=lambda b: (-filled[b], min(members[b])))
    return [
        torch.tensor(
            [u * unit_size + r for u in sorted(members[b]) for r in range(unit_size)], dtype=torch.long
        )
        for b in order
    ]


def token_budget_micro_batches(
    unit_tokens: list[int], unit_size: int, budget: int, count: int | None = None
) -> list[torch.Tensor]:
    """Row indices of micro-batches filled by real tokens rather than by a number of rows.

    ``unit_tokens``: the real backbone tokens of each unit, a unit being ``unit_size`` consecutive rows (a
    whole group, so the shared-prefix forward still applies, or one row). Micro-batches are consecutive
    units, as few as hold at most ``budget`` tokens each (a unit larger than the budget is a micro-batch of
    its own), and among those partitions the one whose largest micro-batch holds the fewest tokens: the
    activations of the fullest forward bound the update's memory, so [6 groups | 2 groups] becomes [4 | 4]
    at the same number of forwards. ``count``: make exactly that many micro-batches (every process must run
    as many forwards when the weights are sharded): the micro-batch with the most tokens among those of two
    or more units is split at its token midpoint until there are ``count``. Returns row indices in order,
    each row once.
    """
    if budget < 1:
        raise ValueError(f"budget must be >= 1 token, got {budget}")
    fewest = len(_fill_up_to(unit_tokens, budget))
    low, high = 1, budget  # the smallest cap that still needs no more micro-batches (counts fall as it grows)
    while low < high:
        cap = (low + high) // 2
        if len(_fill_up_to(unit_tokens, cap)) <= fewest:
            high = cap
        else:
            low = cap + 1
    chunks = _fill_up_to(unit_tokens, low)
    if count is not None:
        if count < len(chunks) or count > len(unit_tokens):
            raise ValueError(
                f"cannot make {count} micro-batches from {len(unit_tokens)} units that fill {len(chunks)}"
            )
        while len(chunks) < count:
            splittable = [i for i, chunk in enumerate(chunks) if len(chunk) > 1]
            i = max(splittable, key=lambda i: sum(unit_tokens[u] for u in chunks[i]))
            chunks[i : i + 1] = _split_at_token_midpoint(chunks[i], unit_tokens)
    return [
        torch.tensor([u * unit_size + r for u in chunk for r in range(unit_size)], dtype=torch.long)
        for chunk in chunks
    ]


def _fill_up_to(unit_tokens: list[int], cap: int) -> list[list[int]]:
    """Consecutive units joined while their tokens stay within ``cap`` (a larger unit alone): the fewest
    micro-batches of at most ``cap`` tokens (each filled as far as it goes)."""
    chunks: list[list[int]] = []
    filled = cap + 1  # tokens in the open micro-batch (none open yet)
    for unit, tokens in enumerate(unit_tokens):
        if filled + tokens > cap:
            chunks.append([])
            filled = 0
        chunks[-1].append(unit)
        filled += tokens
    return chunks


def _split_at_token_midpoint(chunk: list[int], unit_tokens: list[int]) -> list[list[int]]:
    """``chunk`` (two or more units) cut in two where its running token count first reaches half, each part
    keeping at least one unit."""
    half = sum(unit_tokens[u] for u in chunk) / 2
    running, cut = 0, 1
    for k, unit in enumerate(chunk[:-1]):
        running += unit_tokens[unit]
        cut = k + 1
        if running >= half:
            break
    return [chunk[:cut], chunk[cut:]]

"""A policy's strategy in a game, read from its log-probabilities, and the games' exact yardsticks.

At a decision point (a seat's context: the prompt, then its observations and earlier moves) the policy's
probability of each legal move is the probability of that move's answer texts (summed over the forms a
turn making it takes, each ended by EOS) given the context, renormalised over the legal moves: the mass
the policy puts on other texts (unparseable or illegal answers) is left out, so the strategy is the one
its legal play follows.
For Kuhn poker the 12 information sets give the whole strategy, and ``exploitability`` is then exact
(``grpokit.envs.kuhn_poker``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from grpokit.core import pad_right
from grpokit.models.parts import model_device

__all__ = ["answer_probabilities", "kuhn_exploitability", "kuhn_strategy", "play_games"]


def answer_probabilities(
    model: Any,
    tokenizer: Any,
    contexts: Sequence[list[int]],
    answers: Sequence[Sequence[Sequence[list[int]]]],
) -> list[list[float]]:
    """contexts[i]: token ids; answers[i][m]: the continuations (ids) that make candidate m -> for each
    context, each candidate's probability (the sum over its continuations) renormalised over its
    candidates (one forward over every pair, no gradient)."""
    pairs = [(c, a) for c, options in zip(contexts, answers) for texts in options for a in texts]
    ids, mask = pad_right([c + a for c, a in pairs], tokenizer.pad_token_id)  # [M, T]
    device = model_device(model)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits  # [M, T, V]
    finally:
        model.train(was_training)
    targets = ids.to(device)[:, 1:, None]  # [M, T-1, 1]
    logps = torch.log_softmax(logits[:, :-1].float(), dim=-1).gather(2, targets).squeeze(2)  # [M, T-1]
    totals = []
    for m, (context, answer) in enumerate(pairs):  # the answer's tokens only: positions len(c)-1 .. end
        totals.append(logps[m, len(context) - 1 : len(context) + len(answer) - 1].sum())
    out, at = [], 0
    for options in answers:
        scores = []
        for texts in options:  # log of the summed probability of a candidate's continuations
            scores.append(torch.logsumexp(torch.stack(totals[at : at + len(texts)]), dim=0))
            at += len(texts)
        out.append(torch.softmax(torch.stack(scores), dim=0).tolist())
    return out


def kuhn_strategy(model: Any, tokenizer: Any, prompt_ids: list[int]) -> dict[tuple[int, str, str], float]:
    """The policy's probability of the aggressive move (bet, or call facing a bet) at each of Kuhn poker's
    12 information sets, after ``prompt_ids`` (the run's prompt: the rules)."""
    from grpokit.envs.kuhn_poker import decision_points

    eos = tokenizer.eos_token_id

    def encode(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    keys, contexts, answers = [], [], []
    for key, segments, texts in decision_points():
        context = list(prompt_ids)
        for text, is_policy in segments:
            context += encode(text) + ([eos] if is_policy else [])
        keys.append(key)
        contexts.append(context)
        answers.append([[[*encode(text), eos] for text in move_texts] for move_texts in texts])
    probabilities = answer_probabilities(model, tokenizer, contexts, answers)
    return {key: p[0] for key, p in zip(keys, probabilities)}


def kuhn_exploitability(model: Any, tokenizer: Any, prompt_ids: list[int]) -> float:
    """The exact exploitability of the policy's Kuhn poker strategy (:func:`kuhn_strategy`)."""
    from grpokit.envs.kuhn_poker import exploitability

    return exploitability(kuhn_strategy(model, tokenizer, prompt_ids))


def play_games(
    model: Any,
    tokenizer: Any,
    rows: Sequence[dict[str, Any]],
    make_game: Any,
    *,
    opponent: str,
    max_tokens: int,
    max_turn_tokens: int | None = None,
    games_per_seat: int = 1,
    temperature: float = 1.0,
    seed: int = 0,
) -> dict[str, float]:
    """The policy against a scripted ``opponent`` (``"random"`` or ``"expert"``) on each deal row,
    ``games_per_seat`` games in each seat, sampled at ``temperature`` (0: greedy) from ``seed``:
    ``game/<opponent>/win``, ``draw``, ``loss`` (shares of the games; an illegal move loses), ``return``
    (mean) and ``illegal_rate`` (illegal moves per policy turn)."""
    from grpokit.envs.selfplay import GameRunner
    from grpokit.envs.turns import CachedTurnSession
    from grpokit.rollout.base import SamplingParams

    runner = GameRunner(make_game, tokenizer, opponent=opponent, max_tokens=max_tokens,
                        max_turn_tokens=max_turn_tokens)  # fmt: skip
    prompt_ids = [list(tokenizer(row["prompt"], add_special_tokens=False)["input_ids"]) for row in rows]
    sizes = [runner.num_roles * games_per_seat] * len(rows)
    generator = torch.Generator(model_device(model)).manual_seed(seed)
    session = CachedTurnSession(model, prompt_ids, sizes, generator=generator)
    greedy = temperature == 0
    params = SamplingParams.for_tokenizer(tokenizer, greedy=greedy, max_new_tokens=max_tokens,
                                          **({} if greedy else {"temperature": temperature}))  # fmt: skip
    episodes = runner.run(session, rows, sizes, params, seed=seed)
    returns = [e.reward if e.reward is not None else 0.0 for e in episodes]
    turns = sum(len(e.turn_rewards) for e in episodes)
    illegal = sum(e.info.get("illegal_moves", 0) for e in episodes)
    n, prefix = len(episodes), f"game/{opponent}/"
    return {
        f"{prefix}win": sum(r > 0 for r in returns) / n,
        f"{prefix}draw": sum(r == 0 for r in returns) / n,
        f"{prefix}loss": sum(r < 0 for r in returns) / n,
        f"{prefix}return": sum(returns) / n,
        f"{prefix}illegal_rate": illegal / turns if turns else 0.0,
    }

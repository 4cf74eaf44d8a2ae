"""Kuhn poker (H. W. Kuhn, 1950): three cards, two players, one betting round, imperfect information.

Rules. The cards are J < Q < K; each player antes 1 and is dealt one card, the third unseen. Player 0 (the
first) passes or bets 1. After a pass, player 1 passes (showdown for the pot of 2: +1 to the higher card)
or bets 1, and player 0 then calls (showdown for 4: +2) or folds (-1). After a bet, player 1 calls
(showdown: +2) or folds (+1 to player 0). Moves: ``pass``, ``bet``, ``call``, ``fold``.

A strategy is the probability of the aggressive move (bet, or call when facing a bet) at each of the
game's 12 information sets: a player's card and the public history it faces (player 0: "" and
"pass bet"; player 1: "pass" and "bet"). ``exploitability`` computes, exactly, how much a best
responder gains against it: ``(BR_0 + BR_1) / 2`` where ``BR_i`` is the best value player i can get
against the strategy's other player (OpenSpiel's convention, NashConv / 2). It is 0 exactly at the Nash
equilibria (player 0's value -1/18; ``nash_strategy``) and positive elsewhere.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Mapping

from grpokit.envs.game import TurnGame

__all__ = [
    "CARDS",
    "INFORMATION_SETS",
    "KuhnPoker",
    "best_response_value",
    "decision_points",
    "exploitability",
    "game_value",
    "nash_strategy",
]

CARDS = ("J", "Q", "K")
DEALS = tuple(itertools.permutations(range(3), 2))
"""The six deals (player 0's card, player 1's card), equally likely."""
HISTORIES = {0: ("", "pass bet"), 1: ("pass", "bet")}
"""The public histories at which each player acts."""
INFORMATION_SETS = tuple(
    (player, card, history) for player in (0, 1) for card in CARDS for history in HISTORIES[player]
)
"""The 12 information sets ``(player, card, history)``."""

Strategy = Mapping[tuple[int, str, str], float]
"""Probability of the aggressive move (``bet``, or ``call`` when facing a bet) at each information set."""

RULES = (
    "Kuhn poker, 2 players. The deck has three cards, J < Q < K; each player antes 1 chip and gets one "
    "card. Player 1 passes or bets 1 chip. After a pass, player 2 passes (the higher card wins the pot) or "
    "bets 1; facing a bet, a player calls (the higher card wins the pot) or folds (the other player wins "
    "the pot). Answer with your move alone (or in \\boxed{}).\n"
)


class KuhnPoker(TurnGame):
    """Kuhn poker as a :class:`grpokit.envs.game.Game`; ``reset(seed)`` deals ``DEALS[seed % 6]``."""

    roles = ("first player", "second player")
    max_turns = 3
    rules = RULES

    def __init__(self) -> None:
        super().__init__()
        self.cards = (0, 1)
        self.history: list[str] = []

    def reset(self, seed: int) -> None:
        self.cards, self.history, self.turns = DEALS[seed % len(DEALS)], [], 0

    def current_player(self) -> int:
        return len(self.history) % 2

    def legal_moves(self) -> list[str]:
        return ["call", "fold"] if "bet" in self.history else ["pass", "bet"]

    def play(self, move: str) -> None:
        if self.is_over() or move not in self.legal_moves():
            raise ValueError(f"Kuhn poker: {move!r} is not a legal move after {self.history}")
        self.history.append(move)
        self.turns += 1

    def is_over(self) -> bool:
        h = self.history
        return h in (["pass", "pass"], ["bet", "call"], ["bet", "fold"]) or len(h) == 3

    def returns(self) -> list[float]:
        if not self.is_over():
            return [0.0, 0.0]
        if self.history[-1] == "fold":  # the player who folded loses their stake (1)
            folder = (len(self.history) - 1) % 2
            return [1.0, -1.0] if folder == 1 else [-1.0, 1.0]
        stake = 2.0 if "bet" in self.history else 1.0
        return [stake, -stake] if self.cards[0] > self.cards[1] else [-stake, stake]

    def information_set(self) -> tuple[int, str, str]:
        """The acting player's ``(player, card, history)``."""
        player = self.current_player()
        return player, CARDS[self.cards[player]], " ".join(self.history)

    def observation(self, player: int) -> str:
        """``You are player 1. Moves: pass bet. Legal: call, fold. Your card: K``: the seat's card last, the
        move follows it (its first token is predicted at the card's position)."""
        moves = " ".join(self.history) or "none"
        return (
            f"You are player {player + 1}. Moves: {moves}. Legal: {', '.join(self.legal_moves())}. "
            f"Your card: {CARDS[self.cards[player]]}"
        )

    def expert_move(self, rng: random.Random) -> str:
        """A Nash-equilibrium move (``nash_strategy(0)``, sampled)."""
        aggressive, passive = ("call", "fold") if "bet" in self.history else ("bet", "pass")
        return aggressive if rng.random() < nash_strategy(0.0)[self.information_set()] else passive


DecisionPoint = tuple[tuple[int, str, str], list[tuple[str, bool]], tuple[list[str], list[str]]]
"""``(information set, the seat's segments up to its move, (aggressive answers, passive answers))``."""


def decision_points() -> list[DecisionPoint]:
    """Each information set as a seat meets it: ``(key, segments, (aggressive answers, passive answers))``.
    ``segments`` are the seat's completion up to its move, ``(text, is_policy)`` in order: its observations
    and its own earlier move (player 0's pass before facing pass-bet), the policy turns ended by EOS when
    tokenized. A move's answers are the turn texts that make it (``answer``'s form: the move's word). The
    other player's card never shows, so any deal with the seat's card gives these texts."""
    game = KuhnPoker()
    points = []
    for player, card, history in INFORMATION_SETS:
        other = next(c for c in range(3) if c != CARDS.index(card))
        cards = (CARDS.index(card), other) if player == 0 else (other, CARDS.index(card))
        moves = history.split() if history else []
        segments: list[tuple[str, bool]] = []
        if player == 0 and moves:  # player 0's first decision, then its pass
            game.cards, game.history = cards, []
            segments += [(game.observation(0), False), (game.answer(moves[0]), True)]
        game.cards, game.history = cards, list(moves)
        segments.append((game.observation(player), False))
        choice = ("call", "fold") if "bet" in moves else ("bet", "pass")
        texts = tuple([game.answer(move)] for move in choice)
        points.append(((player, card, history), segments, texts))
    return points


def _value(cards: tuple[int, int], history: list[str], choose: Callable[[int, str, str], float]) -> float:
    """Player 0's expected return from ``history`` on, ``choose(player, card, history)`` the probability
    of the aggressive move where a player acts."""
    game = KuhnPoker()
    game.cards, game.history = cards, list(history)
    if game.is_over():
        return game.returns()[0]
    player, card, public = game.information_set()
    aggressive, passive = ("call", "fold") if "bet" in history else ("bet", "pass")
    p = choose(player, card, public)
    return p * _value(cards, [*history, aggressive], choose) + (1 - p) * _value(
        cards, [*history, passive], choose
    )


def game_value(strategy: Strategy) -> float:
    """Player 0's expected return when both play ``strategy``."""
    return sum(_value(deal, [], lambda *i: strategy[i]) for deal in DEALS) / len(DEALS)


def best_response_value(strategy: Strategy, player: int) -> float:
    """The most ``player`` can expect against the other player's part of ``strategy`` (exact: each of its
    information sets chooses the move of higher value, the later ones first)."""
    chosen: dict[tuple[int, str, str], float] = {}

    def choose(p: int, card: str, history: str) -> float:
        return chosen[(p, card, history)] if p == player else strategy[(p, card, history)]

    sign = 1.0 if player == 0 else -1.0
    for history in reversed(HISTORIES[player]):  # the later decision first (perfect recall)
        for card in CARDS:
            values = []
            for move in (1.0, 0.0):  # aggressive, passive
                chosen[(player, card, history)] = move
                values.append(sum(_reach(deal, history, strategy, player) * sign * _value(
                    deal, history.split() if history else [], choose
                ) for deal in DEALS if CARDS[deal[player]] == card))  # fmt: skip
            chosen[(player, card, history)] = 1.0 if values[0] >= values[1] else 0.0
    return sign * sum(_value(deal, [], choose) for deal in DEALS) / len(DEALS)


def _reach(deal: tuple[int, int], history: str, strategy: Strategy, player: int) -> float:
    """The other player's probability of playing to ``history`` (``player``'s own moves there are given)."""
    moves, reach = history.split() if history else [], 1.0
    for i, move in enumerate(moves):
        actor = i % 2
        if actor == player:
            continue
        p = strategy[(actor, CARDS[deal[actor]], " ".join(moves[:i]))]
        reach *= p if move in ("bet", "call") else 1 - p
    return reach


def exploitability(strategy: Strategy) -> float:
    """``(BR_0 + BR_1) / 2``: 0 at a Nash equilibrium, positive elsewhere (module docstring)."""
    return (best_response_value(strategy, 0) + best_response_value(strategy, 1)) / 2


def nash_strategy(alpha: float = 0.0) -> dict[tuple[int, str, str], float]:
    """A Nash equilibrium of Kuhn poker; ``alpha`` in [0, 1/3] picks one of the family (Kuhn's): player 0
    bets J with ``alpha``, K with ``3 alpha``, never Q; after pass-bet calls with Q at ``alpha + 1/3``,
    always with K, never with J. Player 1 facing a bet calls with K, with Q at 1/3, never with J; after a
    pass bets K, J at 1/3, never Q."""
    if not 0.0 <= alpha <= 1 / 3:
        raise ValueError(f"alpha must be in [0, 1/3], got {alpha}")
    return {
        (0, "J", ""): alpha, (0, "Q", ""): 0.0, (0, "K", ""): 3 * alpha,
        (0, "J", "pass bet"): 0.0, (0, "Q", "pass bet"): alpha + 1 / 3, (0, "K", "pass bet"): 1.0,
        (1, "J", "pass"): 1 / 3, (1, "Q", "pass"): 0.0, (1, "K", "pass"): 1.0,
        (1, "J", "bet"): 0.0, (1, "Q", "bet"): 1 / 3, (1, "K", "bet"): 1.0,
    }  # fmt: skip

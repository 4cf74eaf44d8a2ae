"""Nim, the normal play: heaps of stones; a player removes one or more stones from one heap; whoever takes
the last stone wins (+1, the other -1). A longer horizon than tic-tac-toe with a known exact strategy: the
player to move wins exactly when the heaps' XOR (the nim-sum) is not 0, by moving to nim-sum 0
(``perfect_move``; C. L. Bouton, 1901). Moves are ``heap:count`` (``2:3`` takes 3 stones from heap 2, heaps
numbered from 1)."""

from __future__ import annotations

import functools
import operator
import random
from collections.abc import Sequence

from grpokit.envs.game import TurnGame

__all__ = ["Nim", "nim_sum", "perfect_move"]

RULES = (
    "Nim, 2 players. On your turn, take one or more stones from a single heap; whoever takes the last stone "
    "wins. Answer with heap:count (alone, or in \\boxed{}), e.g. 2:3 takes 3 stones from heap 2.\n"
)


def nim_sum(heaps: Sequence[int]) -> int:
    return functools.reduce(operator.xor, heaps, 0)


class Nim(TurnGame):
    """Nim as a :class:`grpokit.envs.game.Game`. ``heaps``: the starting heaps; with ``seed_heaps`` set,
    ``reset(seed)`` draws that many heaps of 1 to ``max_heap`` stones from the seed instead."""

    roles = ("first player", "second player")
    rules = RULES

    def __init__(self, heaps: Sequence[int] = (3, 4, 5), seed_heaps: int = 0, max_heap: int = 5) -> None:
        super().__init__()
        self.start, self.seed_heaps, self.max_heap = tuple(heaps), seed_heaps, max_heap
        self.heaps = list(self.start)
        self.max_turns = sum(self.start) if not seed_heaps else seed_heaps * max_heap

    def reset(self, seed: int) -> None:
        if self.seed_heaps:
            rng = random.Random(seed)
            self.start = tuple(rng.randint(1, self.max_heap) for _ in range(self.seed_heaps))
        self.heaps, self.turns = list(self.start), 0

    def current_player(self) -> int:
        return self.turns % 2

    def legal_moves(self) -> list[str]:
        return [f"{h + 1}:{n}" for h, size in enumerate(self.heaps) for n in range(1, size + 1)]

    def play(self, move: str) -> None:
        if move not in self.legal_moves():
            raise ValueError(f"Nim: {move!r} is not a legal move on heaps {self.heaps}")
        heap, count = (int(x) for x in move.split(":"))
        self.heaps[heap - 1] -= count
        self.turns += 1

    def is_over(self) -> bool:
        return sum(self.heaps) == 0

    def returns(self) -> list[float]:
        if not self.is_over():
            return [0.0, 0.0]
        last = (self.turns - 1) % 2  # took the last stone
        return [1.0, -1.0] if last == 0 else [-1.0, 1.0]

    def observation(self, player: int) -> str:
        heaps = ", ".join(f"heap {i + 1}: {n}" for i, n in enumerate(self.heaps))
        return f"You are player {player + 1}. Heaps: {heaps}.\n"

    def expert_move(self, rng: random.Random) -> str:
        """Bouton's move (``perfect_move``)."""
        return perfect_move(self)


def perfect_move(game: Nim) -> str:
    """Bouton's move to nim-sum 0 where there is one (the first heap that allows it), else one stone from
    the largest heap."""
    total = nim_sum(game.heaps)
    for h, size in enumerate(game.heaps):
        if total and size ^ total < size:
            return f"{h + 1}:{size - (size ^ total)}"
    largest = max(range(len(game.heaps)), key=lambda h: game.heaps[h])
    return f"{largest + 1}:1"


"""The game protocol: turn-based games of two or more players, the policy playing one or every role.

Beside :class:`grpokit.envs.base.Environment` (one policy against a world), a :class:`Game` is played by
several players, each with its own view of it: a player's ``observation`` shows what that player may know
and nothing else (a poker hand never appears in the opponent's prompt). Whose turn it is, the legal moves,
how a move is read from the text of a turn (``parse_move``: the last ``\\boxed{...}`` by default), the end
and each player's return are the game's. ``max_turns`` caps a game: one that reaches it ends as the game's
``returns`` say at that point.

A user's own game is a class with these methods (no base class needed), selected by import path as an
environment is; :class:`TurnGame` gives the move parsing and a turn counter. Built in:
``KuhnPoker``, ``TicTacToe``, ``Nim`` (``grpokit.envs.kuhn_poker``, ``tictactoe``, ``nim``). Imports nothing
of grpokit's outside ``envs``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

__all__ = ["Game", "TurnGame", "boxed_move", "play_out"]

_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def boxed_move(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` in ``text``, stripped and lower-cased; None without one."""
    found = _BOXED.findall(text)
    return found[-1].strip().lower() if found else None


@runtime_checkable
class Game(Protocol):
    """One game between ``num_players`` players; ``roles`` names each player's seat (in the prompt)."""

    roles: Sequence[str]
    max_turns: int

    def reset(self, seed: int) -> None:
        """Start a game; ``seed`` fixes its chance (a deal), so G games from one seed start alike."""
        ...

    def current_player(self) -> int:
        """Whose turn it is (0-based; meaningless once ``is_over``)."""
        ...

    def observation(self, player: int) -> str:
        """What ``player`` knows now: the rules, its private information, the public moves."""
        ...

    def legal_moves(self) -> list[str]:
        """The moves the current player may make, as ``parse_move`` returns them."""
        ...

    def parse_move(self, text: str) -> str | None:
        """The move a turn's text names, or None when it names none (then the game ends, the offender
        penalised; ``selfplay``)."""
        ...

    def play(self, move: str) -> None:
        """Make the current player's ``move`` (one of ``legal_moves``)."""
        ...

    def is_over(self) -> bool: ...

    def returns(self) -> list[float]:
        """Each player's return (at the end; zero-sum games sum to 0)."""
        ...


class TurnGame:
    """Shared parts of the built-in games: moves read from ``\\boxed{...}`` and a turn counter.
    Subclasses set ``roles``, ``max_turns`` (every built-in game ends within it by its rules) and implement
    the rest of :class:`Game` (``legal_moves`` among it, which ``parse_move`` reads)."""

    roles: Sequence[str] = ()
    max_turns: int = 0

    def __init__(self) -> None:
        self.turns = 0

    def parse_move(self, text: str) -> str | None:
        move = boxed_move(text)
        return move if move is not None and move in self.legal_moves() else None


def play_out(game: Game, players: Sequence, seed: int) -> list[float]:
    """Play one game from ``reset(seed)`` with ``players[p](game) -> move`` choosing for player p (scripted
    players, an exact best response); returns the players' returns."""
    game.reset(seed)
    while not game.is_over():
        game.play(players[game.current_player()](game))
    return game.returns()

"""The game protocol: turn-based games of two or more players, the policy playing one or every role.

Beside :class:`grpokit.envs.base.Environment` (one policy against a world), a :class:`Game` is played by
several players, each with its own view of it. ``rules`` is the text every player's prompt holds (the
same for every seat and every deal: it holds no private information); before each of its moves a player
sees its ``observation``: its seat, what only it may know, the public state and its legal moves (a poker
hand never appears in the opponent's context). Whose turn it is, the legal moves, how a move is read from
the text of a turn (``parse_move``: by default the turn's text alone, else the last ``\\boxed{...}``),
the end and each player's return are the game's. ``max_turns`` caps a game: one that reaches it ends as
the game's ``returns`` say at that point. ``expert_move`` (optional) is the game's exact player: a
scripted opponent and an evaluation yardstick (``grpokit.envs.selfplay``).

A user's own game is a class with these methods (no base class needed), selected by import path as an
environment is; :class:`TurnGame` gives the move parsing, a turn counter and the random player. Built in:
``KuhnPoker``, ``TicTacToe``, ``Nim`` (``grpokit.envs.kuhn_poker``, ``tictactoe``, ``nim``). Imports nothing
of grpokit's outside ``envs``.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

__all__ = ["Game", "TurnGame", "boxed_move", "is_game", "play_out"]

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
    rules: str
    """The prompt's text: the rules and the answer format, shared by every seat."""

    def reset(self, seed: int) -> None:
        """Start a game; ``seed`` fixes its chance (a deal), so G games from one seed start alike."""
        ...

    def current_player(self) -> int:
        """Whose turn it is (0-based; meaningless once ``is_over``)."""
        ...

    def observation(self, player: int) -> str:
        """What ``player`` sees before its move: its seat, its private information, the public state, its
        legal moves (a short text ended by a newline; the rules are in the prompt)."""
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
    """Shared parts of the built-in games: moves read from a turn's text (the move alone, or the last
    ``\\boxed{...}``), a turn counter and the uniformly random player. Subclasses set ``roles``, ``rules``,
    ``max_turns`` (every built-in game ends within it by its rules) and implement the rest of :class:`Game`
    (``legal_moves`` among it, which ``parse_move`` reads)."""

    roles: Sequence[str] = ()
    max_turns: int = 0
    rules: str = ""

    def __init__(self) -> None:
        self.turns = 0

    def parse_move(self, text: str) -> str | None:
        """The turn's whole text as a legal move (``bet``, `` 5``), else the last ``\\boxed{}``'s if legal."""
        legal = self.legal_moves()
        word = text.strip().lower()
        if word in legal:
            return word
        move = boxed_move(text)
        return move if move is not None and move in legal else None

    def random_move(self, rng: random.Random) -> str:
        """A uniformly random legal move."""
        return rng.choice(self.legal_moves())

    def answer(self, move: str) -> str:
        """The text of a turn that makes ``move``: the move alone (what ``parse_move`` reads back first)."""
        return move


def is_game(target: object) -> bool:
    """Whether ``target`` (a class or an instance) has the :class:`Game` protocol's methods."""
    return all(callable(getattr(target, name, None)) for name in ("current_player", "legal_moves", "play"))


def play_out(game: Game, players: Sequence, seed: int) -> list[float]:
    """Play one game from ``reset(seed)`` with ``players[p](game) -> move`` choosing for player p (scripted
    players, an exact best response); returns the players' returns."""
    game.reset(seed)
    while not game.is_over():
        game.play(players[game.current_player()](game))
    return game.returns()

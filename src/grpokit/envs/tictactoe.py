"""Tic-tac-toe: X (player 0) and O (player 1) place marks on a 3 x 3 board; three in a row wins (+1, the
loser -1), a full board without one is a draw (0). Moves are cell numbers 1-9, row by row. Perfect
information and small enough to solve: ``perfect_move`` plays minimax (a draw against itself, never a
loss); it is the game's ``expert_move``."""

from __future__ import annotations

import functools
import random

from grpokit.envs.game import TurnGame

__all__ = ["LINES", "TicTacToe", "perfect_move", "winner"]

LINES = ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
MARKS = ("X", "O")

RULES = (
    "Tic-tac-toe, X against O, X first. Players take turns marking a free cell of a 3x3 board; three of "
    "your marks in a row, column or diagonal win. Cells are numbered 1-9, row by row. Answer with the number "
    "of the cell you mark (alone, or in \\boxed{}).\n"
)


def winner(board: str) -> int | None:
    """0 (X) or 1 (O) when that player has three in a row on ``board`` (9 characters: X, O, .); else None."""
    for a, b, c in LINES:
        if board[a] != "." and board[a] == board[b] == board[c]:
            return MARKS.index(board[a])
    return None


class TicTacToe(TurnGame):
    """Tic-tac-toe as a :class:`grpokit.envs.game.Game`; every game starts from the empty board."""

    roles = MARKS
    max_turns = 9
    rules = RULES

    def __init__(self) -> None:
        super().__init__()
        self.board = "." * 9

    def reset(self, seed: int) -> None:
        self.board, self.turns = "." * 9, 0

    def current_player(self) -> int:
        return self.turns % 2

    def legal_moves(self) -> list[str]:
        return [str(i + 1) for i, cell in enumerate(self.board) if cell == "."] if not self.is_over() else []

    def play(self, move: str) -> None:
        if move not in self.legal_moves():
            raise ValueError(f"tic-tac-toe: {move!r} is not a free cell of {self.board}")
        cell = int(move) - 1
        self.board = self.board[:cell] + MARKS[self.current_player()] + self.board[cell + 1 :]
        self.turns += 1

    def is_over(self) -> bool:
        return winner(self.board) is not None or "." not in self.board

    def returns(self) -> list[float]:
        won = winner(self.board)
        return [0.0, 0.0] if won is None else ([1.0, -1.0] if won == 0 else [-1.0, 1.0])

    def observation(self, player: int) -> str:
        """``You are X. Board: 1O3/4X6/789.``: the rows, a free cell shown by its number."""
        cells = "".join(c if c != "." else str(i + 1) for i, c in enumerate(self.board))
        return f"You are {MARKS[player]}. Board: {cells[:3]}/{cells[3:6]}/{cells[6:]}.\n"

    def expert_move(self, rng: random.Random) -> str:
        """The minimax move (``perfect_move``)."""
        return perfect_move(self)


@functools.cache
def _minimax(board: str) -> tuple[int, int]:
    """(value for X, best cell) from ``board`` with X to move when the counts of X and O are equal."""
    won = winner(board)
    if won is not None:
        return (1 if won == 0 else -1), -1
    free = [i for i, c in enumerate(board) if c == "."]
    if not free:
        return 0, -1
    mover = 0 if board.count("X") == board.count("O") else 1
    best: tuple[int, int] | None = None
    for cell in free:  # lowest cell first among equals: deterministic
        value, _ = _minimax(board[:cell] + MARKS[mover] + board[cell + 1 :])
        if best is None or (value > best[0] if mover == 0 else value < best[0]):
            best = (value, cell)
    return best  # type: ignore[return-value]


def perfect_move(game: TicTacToe) -> str:
    """The minimax move (never loses)."""
    return str(_minimax(game.board)[1] + 1)


"""A text-grid maze environment (AlphaMaze-style), for the ``maze`` task (``grpokit.tasks.maze``).

The maze is a grid of characters: ``#`` wall, ``.`` open, ``S`` start, ``E`` exit. Cells sit at odd
coordinates ``(2r+1, 2c+1)``; the character between two neighbouring cells is ``#`` (a wall) or open (a
passage). One move (``U`` up, ``D`` down, ``L`` left, ``R`` right) goes from a cell to its neighbour, two
grid characters away, when the character between them is not ``#``. Positions are ``[row, col]`` in grid
coordinates.

Two modes:

- ``"step"``: one move per turn. The action is exactly one letter of ``UDLR`` (surrounding whitespace
  allowed). The observation is the open directions from the (new) cell in ``UDLR`` order, then a newline:
  ``"DR\\n"``; the same prefixed with ``#`` when the move hit a wall (position unchanged): ``"#DR\\n"``.
  Each turn's reward is ``-step_penalty`` (``-step_penalty - wall_penalty`` on a wall hit); reaching the
  exit ends the episode with reward ``1.0 - step_penalty`` and no observation. Any other action (not one
  move letter) ends the episode with reward ``-invalid_penalty`` (default 0.0). With a step penalty, set
  ``invalid_penalty`` above what a failing episode can lose in penalties: otherwise ending an episode at once
  with an invalid action pays better than searching (measured: with step_penalty 0.02 alone the policy
  stopped playing, docs/environments.md). The prompt of a step-mode row already ends with the open
  directions from ``S`` (see :func:`observation`), so every action follows an observation line.
- ``"path"``: one turn. The action is the whole path (letters of ``UDLR``, whitespace ignored), simulated
  from ``S``: a move into a wall fails (reward 0.0); reaching ``E`` succeeds (reward 1.0) the moment it
  happens, and the moves after that are not simulated -- as in step mode, where reaching the exit ends the
  episode (AlphaMaze likewise counts reaching the exit). A path that stops short of ``E`` gets 0.0; an
  empty action or any other character is invalid (0.0). Penalties apply to step mode only.

Counters (``Turn.info``, summed per episode and logged as ``env/<key>``): ``moves`` (moves that changed the
position), ``wall_hits``, ``invalid_actions`` and ``solved`` (1 on reaching the exit: what
:func:`maze_solved_reward` grades, whatever the penalties). Imports nothing of grpokit but the protocol.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from grpokit.envs.base import Turn

__all__ = [
    "MAZE_MODES",
    "MOVES",
    "WALL",
    "MazeEnvironment",
    "maze_solved_reward",
    "observation",
    "open_directions",
]

WALL = "#"
MAZE_MODES = ("step", "path")
MOVES: dict[str, tuple[int, int]] = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
"""Move letter -> (row, col) direction; the order is the order of :func:`open_directions`."""

_REQUIRED_COLUMNS = ("grid", "start", "exit")


def is_open(grid: Sequence[str], pos: Sequence[int], move: str) -> bool:
    """Whether ``move`` from the cell at ``pos`` goes through a passage (the character next to the cell
    in that direction is inside the grid and not a wall)."""
    dr, dc = MOVES[move]
    row, col = pos[0] + dr, pos[1] + dc
    return 0 <= row < len(grid) and 0 <= col < len(grid[row]) and grid[row][col] != WALL


def open_directions(grid: Sequence[str], pos: Sequence[int]) -> str:
    """The letters of the open moves from the cell at ``pos``, in ``UDLR`` order (``"DR"``)."""
    return "".join(move for move in MOVES if is_open(grid, pos, move))


def observation(grid: Sequence[str], pos: Sequence[int], hit_wall: bool = False) -> str:
    """What the policy sees at ``pos`` in step mode: ``"DR\\n"``, or ``"#DR\\n"`` after a wall hit."""
    return (WALL if hit_wall else "") + open_directions(grid, pos) + "\n"


def moved(pos: Sequence[int], move: str) -> list[int]:
    """The cell one move from ``pos`` (two grid characters away); no wall check."""
    dr, dc = MOVES[move]
    return [pos[0] + 2 * dr, pos[1] + 2 * dc]


class MazeEnvironment:
    """One maze episode (see the module docstring for the modes, observations and rewards).

    ``mode``: ``"step"`` or ``"path"``; None takes each row's ``mode`` column. ``step_penalty`` is
    subtracted from every step-mode turn's reward (the exit turn's included), ``wall_penalty`` from each
    step-mode turn whose move hit a wall.
    """

    observation_role = "user"

    def __init__(
        self,
        mode: str | None = None,
        step_penalty: float = 0.0,
        wall_penalty: float = 0.0,
        invalid_penalty: float = 0.0,
    ):
        if mode is not None and mode not in MAZE_MODES:
            raise ValueError(f"MazeEnvironment: mode must be one of {MAZE_MODES} or None, got {mode!r}")
        self.mode = mode
        self.step_penalty = float(step_penalty)
        self.wall_penalty = float(wall_penalty)
        self.invalid_penalty = float(invalid_penalty)
        self.grid: list[str] = []
        self.position: list[int] = []
        self.exit: list[int] = []
        self.episode_mode = ""
        self.done = True

    def reset(self, row: dict[str, Any]) -> None:
        """Start an episode on ``row``: reads its ``grid`` (list of lines), ``start`` and ``exit``
        (``[row, col]`` in grid coordinates) and, when this environment has no mode of its own, ``mode``."""
        required = _REQUIRED_COLUMNS + (("mode",) if self.mode is None else ())
        missing = [name for name in required if name not in row]
        if missing:
            raise ValueError(
                f"MazeEnvironment: the row has no {', '.join(repr(m) for m in missing)} column(s); maze rows "
                "come from grpokit.tasks.maze.make_maze_splits"
            )
        mode = self.mode if self.mode is not None else row["mode"]
        if mode not in MAZE_MODES:
            raise ValueError(f"MazeEnvironment: the row's mode must be one of {MAZE_MODES}, got {mode!r}")
        self.grid = [str(line) for line in row["grid"]]
        self.position = [int(v) for v in row["start"]]
        self.exit = [int(v) for v in row["exit"]]
        self.episode_mode = mode
        self.done = False

    def step(self, action: str) -> Turn:
        """The policy's action -> the maze's answer (a RuntimeError before ``reset`` or after the end)."""
        if self.done:
            raise RuntimeError("MazeEnvironment: the episode is over (or never started); call reset(row)")
        turn = self._step_move(action) if self.episode_mode == "step" else self._step_path(action)
        self.done = turn.done
        return turn

    def _step_move(self, action: str) -> Turn:
        move = action.strip()
        if move not in MOVES:
            return self._invalid()
        if not is_open(self.grid, self.position, move):
            reward = -self.step_penalty - self.wall_penalty
            return Turn(observation(self.grid, self.position, hit_wall=True), reward, False, {"wall_hits": 1})
        self.position = moved(self.position, move)
        if self.position == self.exit:
            return Turn(None, 1.0 - self.step_penalty, True, {"moves": 1, "solved": 1})
        return Turn(observation(self.grid, self.position), -self.step_penalty, False, {"moves": 1})

    def _invalid(self) -> Turn:
        return Turn(None, -self.invalid_penalty, True, {"invalid_actions": 1})

    def _step_path(self, action: str) -> Turn:
        path = "".join(action.split())
        if not path or any(move not in MOVES for move in path):
            return self._invalid()
        moves = 0
        for move in path:
            if not is_open(self.grid, self.position, move):
                return Turn(None, 0.0, True, {"moves": moves, "wall_hits": 1})
            self.position = moved(self.position, move)
            moves += 1
            if self.position == self.exit:
                return Turn(None, 1.0, True, {"moves": moves, "solved": 1})
        return Turn(None, 0.0, True, {"moves": moves})


def maze_solved_reward(prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list[float]:
    """1.0 for an episode that reached the exit, else 0.0 (reward-function signature; reads the episode's
    ``env_info`` counters): the solve rate, whatever step or wall penalties the training reward has."""
    return [float(info.get("solved", 0) > 0) for info in columns["env_info"]]

"""A built-in multi-turn task: text-grid mazes (AlphaMaze-style), generated from a seed.

A maze is a random perfect maze (one path between any two cells: a randomized depth-first search, the
"recursive backtracker") over ``height x width`` cells, drawn as ``2*height+1`` lines of ``2*width+1``
characters: ``#`` wall, ``.`` open, ``S`` start, ``E`` exit. Cells sit at odd coordinates; a move
(``U``/``D``/``L``/``R``) goes to the neighbouring cell when the character between them is open. Start and
exit are distinct random cells at least :data:`MIN_PATH_MOVES` moves apart. The environment that plays the
episodes is :class:`grpokit.envs.maze.MazeEnvironment`.

Prompt, mode ``"path"`` (a plain string: the grid lines, each ended by a newline)::

    #########
    #.#..S..#
    #.#.###.#
    #E#.#...#
    #.###.###
    #.....#.#
    #.#####.#
    #.......#
    #########

and the policy answers with the whole shortest path in one turn (EOS is a token appended at tokenization,
not part of the text)::

    RDLDLLU

Mode ``"step"``: the same grid, then the open directions from ``S`` and a newline (``"LR\\n"`` here). The
episode alternates one move letter of the policy (one turn, ended by EOS) and the environment's answer:
the open directions from the new cell (``"DL\\n"``), or ``#`` and the open directions of the unchanged cell
after a wall hit (``"#LR\\n"``), until the policy reaches ``E`` (reward 1.0) or the trainer's ``max_turns``
cuts the episode. The cold start (:func:`worked_episode`) follows the shortest path; here, policy turns and
observations alternating::

    R | DL\\n | D | UL\\n | L | DR\\n | D | UL\\n | L | LR\\n | L | UDR\\n | U

At the default 4x4 cells a prompt is about 93 characters and the shortest path about 5.6 moves (at most 15).

Reward: the environment's own (``grpokit.envs.base.environment_reward``); :func:`extract_path` reads the
moves of a path-mode completion. The train and held-out splits never share a maze (a hash of the grid
text, see :func:`is_held_out`), for any seed, size or mode.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections import deque
from collections.abc import Sequence
from typing import Any

from grpokit.data.chat import completion_text
from grpokit.envs.maze import MAZE_MODES, MOVES, is_open, moved, observation

__all__ = [
    "HELD_OUT_FRACTION",
    "MIN_PATH_MOVES",
    "count_mazes",
    "extract_path",
    "is_held_out",
    "make_maze_splits",
    "maze_prompt",
    "shortest_path",
    "worked_episode",
    "worked_solution",
]

HELD_OUT_FRACTION = 0.1
MIN_PATH_MOVES = 2
"""The fewest moves from start to exit in a generated maze."""

# Special-token markers (``<|endoftext|>``, ``<|pad|>``) left by decoding without skipping them.
_SPECIAL_MARKER = re.compile(r"<\|[A-Za-z_]+\|>")
# Above this many cells the maze count is astronomically large: no need to count exactly.
_COUNTED_CELLS = 36


def make_maze_splits(
    seed: int = 0,
    num_train: int = 5000,
    num_test: int = 200,
    *,
    height: int = 4,
    width: int = 4,
    mode: str = "step",
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Generate ``(train, test)`` rows from ``seed``; the same arguments always give the same rows.

    Each row: ``prompt`` (see the module docstring), ``solution`` (the shortest path, ``"RRDL"``),
    ``grid`` (the rendered lines), ``start`` and ``exit`` (``[row, col]`` in grid coordinates) and
    ``mode``. Mazes are distinct within a split; the splits are disjoint whatever the seeds, sizes and
    modes: a fixed ~10% of all mazes (by a hash of the grid text, see :func:`is_held_out`) may only appear
    in the test split, the rest only in the train split. Each split has its own random stream, so a
    smaller ``num_train`` (``num_test``) gives a prefix of a larger one, and the two modes draw the same
    mazes.
    """
    if height < 2 or width < 2:
        raise ValueError(f"a maze needs height >= 2 and width >= 2 cells, got height={height} width={width}")
    if mode not in MAZE_MODES:
        raise ValueError(f"mode must be one of {MAZE_MODES}, got {mode!r}")
    if num_train < 0 or num_test < 0:
        raise ValueError(f"num_train and num_test must be >= 0, got {num_train} and {num_test}")
    space = count_mazes(height, width)
    if space is not None and (
        num_train > space * (1 - HELD_OUT_FRACTION) / 2 or num_test > space * HELD_OUT_FRACTION / 2
    ):
        raise ValueError(
            f"asked for {num_train} train and {num_test} held-out mazes but at most {space} exist at "
            f"{height}x{width}; lower num_train/num_test or raise height/width"
        )

    def draw(stream: str, n: int, held_out: bool) -> list[dict[str, Any]]:
        rng = random.Random(f"grpokit-maze-{stream}-{seed}")
        rows: list[dict[str, Any]] = []
        seen: set[str] = set()
        for _ in range(100 * n + 10_000):
            if len(rows) == n:
                break
            row = _draw_maze(rng, height, width, mode)
            text = "\n".join(row["grid"])
            if text not in seen and is_held_out(text) == held_out:
                seen.add(text)
                rows.append(row)
        if len(rows) < n:
            raise ValueError(
                f"could not draw {n} distinct {stream} mazes at {height}x{width}; lower num_{stream} or "
                "raise height/width"
            )
        return rows

    return draw("train", num_train, held_out=False), draw("test", num_test, held_out=True)


def _draw_maze(rng: random.Random, height: int, width: int, mode: str) -> dict[str, Any]:
    """One maze row: carve, then pick start and exit at least :data:`MIN_PATH_MOVES` moves apart."""
    lines = _carve(rng, height, width)
    cells = [(2 * r + 1, 2 * c + 1) for r in range(height) for c in range(width)]
    while True:
        start, exit_ = rng.sample(cells, 2)
        path = shortest_path(["".join(line) for line in lines], start, exit_)
        if path is not None and len(path) >= MIN_PATH_MOVES:
            break
    lines[start[0]][start[1]] = "S"
    lines[exit_[0]][exit_[1]] = "E"
    grid = ["".join(line) for line in lines]
    row = {"grid": grid, "start": list(start), "exit": list(exit_), "mode": mode}
    return {"prompt": maze_prompt(row), "solution": path, **row}


def _carve(rng: random.Random, height: int, width: int) -> list[list[str]]:
    """A perfect maze by randomized depth-first search from a random cell, as rows of characters."""
    lines = [["#"] * (2 * width + 1) for _ in range(2 * height + 1)]
    first = (rng.randrange(height), rng.randrange(width))
    visited, stack = {first}, [first]
    lines[2 * first[0] + 1][2 * first[1] + 1] = "."
    while stack:
        r, c = stack[-1]
        options = [
            (r + dr, c + dc)
            for dr, dc in MOVES.values()
            if 0 <= r + dr < height and 0 <= c + dc < width and (r + dr, c + dc) not in visited
        ]
        if not options:
            stack.pop()
            continue
        nr, nc = rng.choice(options)
        lines[r + nr + 1][c + nc + 1] = "."  # the wall between (r, c) and (nr, nc)
        lines[2 * nr + 1][2 * nc + 1] = "."
        visited.add((nr, nc))
        stack.append((nr, nc))
    return lines


def shortest_path(grid: Sequence[str], start: Sequence[int], exit_: Sequence[int]) -> str | None:
    """The shortest move string from ``start`` to ``exit_`` (grid coordinates) by breadth-first search, or
    None when the exit cannot be reached."""
    begin, goal = (int(start[0]), int(start[1])), (int(exit_[0]), int(exit_[1]))
    previous: dict[tuple[int, int], tuple[tuple[int, int], str]] = {}
    queue, seen = deque([begin]), {begin}
    while queue:
        pos = queue.popleft()
        if pos == goal:
            moves = []
            while pos != begin:
                pos, move = previous[pos]
                moves.append(move)
            return "".join(reversed(moves))
        for move in MOVES:
            row, col = moved(pos, move)
            if is_open(grid, pos, move) and (row, col) not in seen:
                seen.add((row, col))
                previous[(row, col)] = (pos, move)
                queue.append((row, col))
    return None


def maze_prompt(row: dict[str, Any]) -> str:
    """The prompt of a row: its grid lines, each ended by a newline, then for mode ``"step"`` the open
    directions from the start and a newline (the first observation)."""
    text = "".join(line + "\n" for line in row["grid"])
    return text + (observation(row["grid"], row["start"]) if row["mode"] == "step" else "")


def count_mazes(height: int, width: int) -> int | None:
    """An upper bound on the distinct mazes (perfect maze, start, exit) at this size: the number of
    spanning trees of the cell grid (Kirchhoff's theorem) times the ordered cell pairs at least two moves
    apart; None when the grid has more than 36 cells (the count is then astronomically large)."""
    cells = height * width
    if cells > _COUNTED_CELLS:
        return None
    index = {(r, c): r * width + c for r in range(height) for c in range(width)}
    laplacian = [[0] * cells for _ in range(cells)]
    for (r, c), i in index.items():
        for dr, dc in MOVES.values():
            j = index.get((r + dr, c + dc))
            if j is not None:
                laplacian[i][i] += 1
                laplacian[i][j] -= 1
    trees = _determinant([row[1:] for row in laplacian[1:]])
    # A tree on n cells has n - 1 edges: 2(n - 1) of the n(n - 1) ordered pairs are one move apart.
    return trees * (cells - 1) * (cells - 2)


def _determinant(matrix: list[list[int]]) -> int:
    """Exact determinant of an integer matrix (Bareiss fraction-free elimination)."""
    a = [list(row) for row in matrix]
    n, sign, prev = len(a), 1, 1
    for k in range(n - 1):
        if a[k][k] == 0:
            pivot = next((i for i in range(k + 1, n) if a[i][k] != 0), None)
            if pivot is None:
                return 0
            a[k], a[pivot], sign = a[pivot], a[k], -sign
        for i in range(k + 1, n):
            for j in range(k + 1, n):
                a[i][j] = (a[i][j] * a[k][k] - a[i][k] * a[k][j]) // prev
        prev = a[k][k]
    return sign * a[n - 1][n - 1] if n else 1


def is_held_out(maze_text: str) -> bool:
    """Whether a maze (its grid lines joined by newlines) belongs to the held-out part of the maze space (a
    fixed ~10%, chosen by a hash of the text, the same for every seed, split size and mode)."""
    digest = hashlib.blake2b(maze_text.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % 1000 < HELD_OUT_FRACTION * 1000


def worked_episode(row: dict[str, Any]) -> list[tuple[str, bool]]:
    """The cold start's episode along the shortest path, as ``(text, is_policy)`` segments in order.

    Mode ``"path"``: ``[(solution, True)]``. Mode ``"step"``: each move ``(move, True)``, each followed by
    the observation the environment answers ``(observation, False)`` except the last (reaching the exit
    ends the episode); the first observation is the end of the prompt.
    """
    path = str(row["solution"])
    if row["mode"] == "path":
        return [(path, True)]
    segments: list[tuple[str, bool]] = []
    position = list(row["start"])
    for i, move in enumerate(path):
        position = moved(position, move)
        segments.append((move, True))
        if i < len(path) - 1:
            segments.append((observation(row["grid"], position), False))
    return segments


def worked_solution(row: dict[str, Any]) -> str:
    """The shortest path as a move string (``"RRDL"``), for display."""
    return str(row["solution"])


def extract_path(completion: Any) -> str | None:
    """The moves of a path-mode completion (a string or chat messages): its ``UDLR`` letters once
    whitespace and special-token markers (``<|endoftext|>``) are removed, or None when anything else is
    left or nothing is."""
    text = "".join(_SPECIAL_MARKER.sub("", completion_text(completion)).split())
    return text if text and all(move in MOVES for move in text) else None

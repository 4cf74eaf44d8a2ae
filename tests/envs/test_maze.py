"""The maze task and environment: a hand-checked maze, seeded splits, shortest paths, worked episodes."""

from __future__ import annotations

from collections import deque

import pytest

import grpokit.tasks.maze as maze_task
from grpokit.envs.base import Environment, Turn
from grpokit.envs.maze import MazeEnvironment
from grpokit.tasks.maze import (
    count_mazes,
    extract_path,
    is_held_out,
    make_maze_splits,
    maze_prompt,
    worked_episode,
    worked_solution,
)

# 2 x 3 cells, hand-checked. Passages: S-(1,3), S-(3,1), (1,3)-(3,3), (3,3)-(3,5), (3,5)-E.
# Shortest path S -> E: R D R U. (3,1) is a dead end (open: U only).
GRID = [
    "#######",
    "#S..#E#",
    "#.#.#.#",
    "#.#...#",
    "#######",
]


def hand_row(mode: str = "step") -> dict:
    return {"grid": list(GRID), "start": [1, 1], "exit": [1, 5], "mode": mode, "solution": "RDRU"}


def started(row: dict, **kwargs) -> MazeEnvironment:
    env = MazeEnvironment(**kwargs)
    env.reset(row)
    return env


# ---------------------------------------------------------------- step mode, by hand


def test_step_mode_walk_with_penalties():
    env = started(hand_row(), step_penalty=0.1, wall_penalty=0.5)
    assert isinstance(env, Environment) and MazeEnvironment.observation_role == "user"
    assert env.step("U") == Turn("#DR\n", -0.6, False, {"wall_hits": 1})  # wall: position unchanged
    assert env.step(" R\n") == Turn("DL\n", -0.1, False, {"moves": 1})  # surrounding whitespace is fine
    assert env.step("D") == Turn("UR\n", -0.1, False, {"moves": 1})
    assert env.step("R") == Turn("UL\n", -0.1, False, {"moves": 1})
    assert env.step("U") == Turn(None, pytest.approx(0.9), True, {"moves": 1, "solved": 1})
    with pytest.raises(RuntimeError, match="episode is over"):
        env.step("D")


def test_step_mode_default_rewards_are_zero_until_the_exit():
    env = started(hand_row())
    turns = [env.step(move) for move in "LDRU"]
    # L: wall at S; D: into the dead end (3,1); R: wall; U: back to S.
    assert [t.observation for t in turns] == ["#DR\n", "U\n", "#U\n", "DR\n"]
    assert [t.reward for t in turns] == [0.0, 0.0, 0.0, 0.0]
    assert [t.info for t in turns] == [{"wall_hits": 1}, {"moves": 1}, {"wall_hits": 1}, {"moves": 1}]
    assert not any(t.done for t in turns)
    assert [env.step(m).reward for m in "RDRU"] == [0.0, 0.0, 0.0, 1.0]


@pytest.mark.parametrize("action", ["X", "RR", "", "  ", "r", "R D", "<|endoftext|>", "#"])
def test_step_mode_invalid_action_ends_the_episode(action):
    env = started(hand_row(), step_penalty=0.1)
    env.step("R")
    assert env.step(action) == Turn(None, 0.0, True, {"invalid_actions": 1})
    with pytest.raises(RuntimeError):
        env.step("D")


def test_step_before_reset_is_an_error():
    with pytest.raises(RuntimeError, match="reset"):
        MazeEnvironment().step("R")


# ---------------------------------------------------------------- path mode, by hand


@pytest.mark.parametrize(
    ("action", "turn"),
    [
        ("RDRU", Turn(None, 1.0, True, {"moves": 4, "solved": 1})),
        (" R D\nR U ", Turn(None, 1.0, True, {"moves": 4, "solved": 1})),
        ("DURDRU", Turn(None, 1.0, True, {"moves": 6, "solved": 1})),  # a detour is fine
        (
            "RDRUDD",
            Turn(None, 1.0, True, {"moves": 4, "solved": 1}),
        ),  # reaching E ends it: later moves unplayed
        ("RDR", Turn(None, 0.0, True, {"moves": 3})),  # stops short of E
        ("RR", Turn(None, 0.0, True, {"moves": 1, "wall_hits": 1})),
        ("L", Turn(None, 0.0, True, {"moves": 0, "wall_hits": 1})),
        ("RDXU", Turn(None, 0.0, True, {"invalid_actions": 1})),
        ("rdru", Turn(None, 0.0, True, {"invalid_actions": 1})),
        ("", Turn(None, 0.0, True, {"invalid_actions": 1})),
    ],
)
def test_path_mode(action, turn):
    env = started(hand_row("path"), step_penalty=0.3, wall_penalty=0.3)  # penalties: step mode only
    assert env.step(action) == turn
    with pytest.raises(RuntimeError):
        env.step("RDRU")


def test_environment_mode_overrides_the_rows():
    assert started(hand_row("step"), mode="path").step("RDRU").reward == 1.0
    assert started(hand_row("path"), mode="step").step("R") == Turn("DL\n", 0.0, False, {"moves": 1})
    row = hand_row()
    del row["mode"]
    assert started(row, mode="step").step("R").observation == "DL\n"  # no mode column needed


def test_missing_columns_and_bad_modes():
    for column in ("grid", "start", "exit", "mode"):
        row = hand_row()
        del row[column]
        with pytest.raises(ValueError, match=f"no '{column}' column"):
            MazeEnvironment().reset(row)
    with pytest.raises(ValueError, match="mode must be one of"):
        MazeEnvironment(mode="walk")
    with pytest.raises(ValueError, match="mode must be one of"):
        MazeEnvironment().reset({**hand_row(), "mode": "walk"})


def test_worked_episode_of_the_hand_maze():
    assert worked_episode(hand_row()) == [
        ("R", True),
        ("DL\n", False),
        ("D", True),
        ("UR\n", False),
        ("R", True),
        ("UL\n", False),
        ("U", True),
    ]
    assert worked_episode(hand_row("path")) == [("RDRU", True)]
    assert worked_solution(hand_row()) == "RDRU"
    assert maze_prompt(hand_row()) == "\n".join(GRID) + "\nDR\n"
    assert maze_prompt(hand_row("path")) == "\n".join(GRID) + "\n"


def test_extract_path():
    assert extract_path("RDRU") == "RDRU"
    assert extract_path(" RD\nRU <|endoftext|>") == "RDRU"
    assert extract_path([{"role": "assistant", "content": "LR"}]) == "LR"
    for bad in ("", "  ", "RDXU", "rdru", "<answer>R</answer>", "<|endoftext|>"):
        assert extract_path(bad) is None


# ---------------------------------------------------------------- generated splits


def grid_text(row: dict) -> str:
    return "\n".join(row["grid"])


def bfs_char_distance(grid: list[str], start: list[int], goal: list[int]) -> int:
    """Independent check: breadth-first search over grid characters (every non-# char a node)."""
    dist = {tuple(start): 0}
    queue = deque([tuple(start)])
    while queue:
        r, c = queue.popleft()
        for nr, nc in ((r - 1, c), (r + 1, c), (r, c - 1), (r, c + 1)):
            if grid[nr][nc] != "#" and (nr, nc) not in dist:
                dist[(nr, nc)] = dist[(r, c)] + 1
                queue.append((nr, nc))
    return dist[tuple(goal)]


def check_maze(row: dict, height: int, width: int, mode: str) -> None:
    grid, (sr, sc), (er, ec) = row["grid"], row["start"], row["exit"]
    assert len(grid) == 2 * height + 1 and {len(line) for line in grid} == {2 * width + 1}
    assert set("".join(grid)) <= set("#.SE") and "".join(grid).count("S") == 1 == "".join(grid).count("E")
    assert grid[sr][sc] == "S" and grid[er][ec] == "E" and sr % 2 == sc % 2 == er % 2 == ec % 2 == 1
    assert grid[0] == grid[-1] == "#" * (2 * width + 1) and all(line[0] == line[-1] == "#" for line in grid)
    assert all(grid[r][c] == "#" for r in range(0, 2 * height + 1, 2) for c in range(0, 2 * width + 1, 2))
    passages = sum(ch != "#" for line in grid for ch in line) - height * width
    assert passages == height * width - 1  # a spanning tree: with connectivity (below), a perfect maze
    path = row["solution"]
    assert set(path) <= set("UDLR") and len(path) >= 2
    step = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
    r, c = sr, sc
    for move in path:  # walk it char by char: never through a wall
        for _ in range(2):
            r, c = r + step[move][0], c + step[move][1]
            assert grid[r][c] != "#"
    assert (r, c) == (er, ec)
    assert 2 * len(path) == bfs_char_distance(grid, row["start"], row["exit"])  # shortest
    cells = [(2 * i + 1, 2 * j + 1) for i in range(height) for j in range(width)]
    assert all(bfs_char_distance(grid, row["start"], list(cell)) >= 0 for cell in cells)  # connected
    assert row["mode"] == mode
    assert row["prompt"] == maze_prompt(row) and row["prompt"].startswith(grid_text(row) + "\n")


@pytest.mark.parametrize(("height", "width", "mode"), [(4, 4, "step"), (3, 5, "path"), (2, 2, "step")])
def test_generated_mazes_are_well_formed_with_shortest_solutions(height, width, mode):
    num_train = 10 if (height, width) == (2, 2) else 150
    train, test = make_maze_splits(
        seed=1, num_train=num_train, num_test=1, height=height, width=width, mode=mode
    )
    for row in train + test:
        check_maze(row, height, width, mode)


def test_splits_are_seeded_distinct_disjoint_and_prefix_stable():
    a = make_maze_splits(seed=3, num_train=300, num_test=30)
    assert a == make_maze_splits(seed=3, num_train=300, num_test=30)
    other = make_maze_splits(seed=4, num_train=300, num_test=30)
    assert a[0] != other[0] and a[1] != other[1]
    small = make_maze_splits(seed=3, num_train=100, num_test=10)
    assert small == (a[0][:100], a[1][:10])
    train, test = {grid_text(r) for r in a[0]}, {grid_text(r) for r in a[1]}
    assert len(train) == 300 and len(test) == 30 and not train & test
    assert all(is_held_out(t) for t in test) and not any(is_held_out(t) for t in train)
    # Disjoint across seeds, sizes and modes: the held-out part of the maze space is fixed.
    trains, tests = set(train), set(test)
    for seed, height, width, mode in [
        (4, 4, 4, "path"),
        (5, 3, 3, "step"),
        (6, 3, 3, "path"),
        (7, 5, 4, "step"),
    ]:
        tr, te = make_maze_splits(
            seed=seed, num_train=200, num_test=20, height=height, width=width, mode=mode
        )
        trains |= {grid_text(r) for r in tr}
        tests |= {grid_text(r) for r in te}
    assert not trains & tests
    # Both modes draw the same mazes.
    path_train, _ = make_maze_splits(seed=3, num_train=100, num_test=0, mode="path")
    assert [grid_text(r) for r in path_train] == [grid_text(r) for r in a[0][:100]]


@pytest.mark.parametrize(("height", "width"), [(4, 4), (3, 5)])
@pytest.mark.parametrize("mode", ["step", "path"])
def test_worked_episode_replays_through_the_environment(height, width, mode):
    train, test = make_maze_splits(seed=2, num_train=200, num_test=20, height=height, width=width, mode=mode)
    for row in train + test:
        segments = worked_episode(row)
        assert [is_policy for _, is_policy in segments] == [i % 2 == 0 for i in range(len(segments))]
        assert "".join(text for text, is_policy in segments if is_policy) == worked_solution(row)
        env = started(row)
        for i in range(0, len(segments), 2):
            turn = env.step(segments[i][0])
            if i + 1 < len(segments):
                assert turn == Turn(segments[i + 1][0], 0.0, False, {"moves": 1})
        assert turn.done and turn.reward == 1.0


def test_bad_sizes_and_counts():
    with pytest.raises(ValueError, match="height >= 2 and width >= 2"):
        make_maze_splits(height=1, width=4)
    with pytest.raises(ValueError, match="height >= 2 and width >= 2"):
        make_maze_splits(height=4, width=0)
    with pytest.raises(ValueError, match="mode must be one of"):
        make_maze_splits(mode="walk")
    with pytest.raises(ValueError, match="must be >= 0"):
        make_maze_splits(num_train=-1)
    # 2x2: 4 spanning trees (paths through the 4 cells) x 3 x 2 ordered pairs two or three moves apart.
    assert count_mazes(2, 2) == 24 and count_mazes(2, 3) == 15 * 5 * 4 and count_mazes(7, 7) is None
    with pytest.raises(ValueError, match="at most 24 exist at 2x2"):
        make_maze_splits(num_train=100, num_test=1, height=2, width=2)


def test_running_out_of_mazes_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(maze_task, "is_held_out", lambda text: False)  # no maze may be held out
    with pytest.raises(ValueError, match="could not draw 1 distinct test mazes at 2x2"):
        make_maze_splits(num_train=5, num_test=1, height=2, width=2)


def test_invalid_penalty_and_the_solved_grade():
    from grpokit.envs.maze import maze_solved_reward

    env = started(hand_row("step"), step_penalty=0.02, invalid_penalty=0.5)
    assert env.step("go") == Turn(None, -0.5, True, {"invalid_actions": 1})
    infos = [{"moves": 4, "solved": 1}, {"moves": 16}, {"invalid_actions": 1}]
    assert maze_solved_reward(["p"] * 3, ["c"] * 3, env_info=infos) == [1.0, 0.0, 0.0]

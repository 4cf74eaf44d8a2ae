"""Built-in game tasks: deals to play from, a cold start on random legal play, and the games' grading.

A game task's rows are deals: ``prompt`` (the game's rules, short enough for the tiny policy) and
``game_seed`` (the game's chance: Kuhn poker's cards are ``DEALS[game_seed % 6]``; tic-tac-toe has none).
The policy plays them through ``grpokit.envs.selfplay`` (``game_opponent``). The splits draw seeds from
separate streams; for a game with a handful of starts the held-out rows are the same starts, played again
(what is held out is the play, not the position).

The cold start (``worked_episode``) is a seat's part of a game of uniformly random legal moves: its
observations (context) and its moves (the move alone + EOS, trained), so the policy learns the format
and the legal moves and starts from near-uniform play. Kuhn poker's uniform strategy is exploitable by
11/24 (``grpokit.envs.kuhn_poker``); self-play has to bring it down.
"""

from __future__ import annotations

import random
from typing import Any

from grpokit.envs.kuhn_poker import KuhnPoker
from grpokit.envs.tictactoe import TicTacToe

__all__ = ["GAME_PROMPTS", "game_splits", "worked_game", "worked_move"]

GAME_PROMPTS = {
    "kuhn_poker": "Kuhn poker: J<Q<K. Your move follows your card.\n",
    "tictactoe": "Tic-tac-toe: three in a row wins. Your move: a free cell.\n",
}
"""The built-in tasks' prompts: the rules as short as the tiny character-level policy needs them (a real
model's data set can hold the game's full ``rules``)."""

GAMES = {"kuhn_poker": KuhnPoker, "tictactoe": TicTacToe}


def game_splits(
    game: str, seed: int = 0, num_train: int = 5000, num_test: int = 60
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(train, test)`` deal rows of ``game`` (``GAMES``' names) from ``seed``."""
    if game not in GAMES:
        raise ValueError(f"unknown game {game!r}; built in: {', '.join(GAMES)}")
    if num_train < 0 or num_test < 0:
        raise ValueError(f"num_train and num_test must be >= 0, got {num_train} and {num_test}")

    def draw(stream: str, n: int) -> list[dict[str, Any]]:
        rng = random.Random(f"grpokit-{game}-{stream}-{seed}")
        prompt = GAME_PROMPTS[game]
        return [{"prompt": prompt, "game_seed": rng.randrange(2**31), "game": game} for _ in range(n)]

    return draw("train", num_train), draw("test", num_test)


def worked_game(row: dict[str, Any]) -> list[tuple[str, bool]]:
    """The cold start's episode of a deal row: one seat's part of a game of uniformly random legal moves (the
    seat and the moves drawn from the row's ``game_seed``), as ``(text, is_policy)`` segments."""
    game = GAMES[row["game"]]()
    game.reset(int(row["game_seed"]))
    rng = random.Random(f"worked-{row['game_seed']}")
    seat = rng.randrange(len(game.roles))
    segments: list[tuple[str, bool]] = []
    while not game.is_over():
        move = game.random_move(rng)
        if game.current_player() == seat:
            segments += [(game.observation(seat), False), (game.answer(move), True)]
        game.play(move)
    return segments


def worked_move(row: dict[str, Any]) -> str:
    """The first move of the row's worked game, for display."""
    moves = [text for text, is_policy in worked_game(row) if is_policy]
    return moves[0] if moves else ""

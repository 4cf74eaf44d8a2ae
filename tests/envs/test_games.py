"""The built-in games' rules, against outcomes worked out by hand, and Kuhn poker's exact exploitability
against values known in closed form (the Nash family: 0 and player 0's value -1/18; always aggressive: 1/3,
derived in the test; uniform play: 11/24, OpenSpiel's published value)."""

from __future__ import annotations

import itertools
import random
from fractions import Fraction

import pytest

from grpokit.envs.game import Game, boxed_move, play_out
from grpokit.envs.kuhn_poker import (
    INFORMATION_SETS,
    KuhnPoker,
    best_response_value,
    exploitability,
    game_value,
    nash_strategy,
)
from grpokit.envs.nim import Nim, nim_sum
from grpokit.envs.nim import perfect_move as nim_perfect
from grpokit.envs.tictactoe import TicTacToe, perfect_move, winner


def _kuhn(cards: tuple[int, int], *moves: str) -> KuhnPoker:
    game = KuhnPoker()
    game.reset(0)
    game.cards = cards
    for move in moves:
        game.play(move)
    return game


# ------------------------------------------------------------------------------------------- Kuhn poker
@pytest.mark.parametrize(
    ("moves", "high_first", "returns"),
    [
        (("pass", "pass"), True, [1, -1]),  # showdown for the antes
        (("pass", "pass"), False, [-1, 1]),
        (("bet", "fold"), False, [1, -1]),  # player 1 gives up its ante
        (("bet", "call"), True, [2, -2]),  # showdown for ante + bet
        (("bet", "call"), False, [-2, 2]),
        (("pass", "bet", "fold"), True, [-1, 1]),  # player 0 folds holding the better card
        (("pass", "bet", "call"), True, [2, -2]),
        (("pass", "bet", "call"), False, [-2, 2]),
    ],
)
def test_kuhn_outcomes(moves, high_first, returns):
    game = _kuhn((2, 0) if high_first else (0, 2), *moves)
    assert game.is_over() and game.returns() == returns and sum(game.returns()) == 0


def test_kuhn_turns_moves_and_hidden_cards():
    game = _kuhn((2, 1))
    assert game.current_player() == 0 and game.legal_moves() == ["pass", "bet"]
    game.play("pass")
    assert game.current_player() == 1 and game.legal_moves() == ["pass", "bet"]
    game.play("bet")
    assert game.current_player() == 0 and game.legal_moves() == ["call", "fold"]
    assert game.information_set() == (0, "K", "pass bet")
    assert "Your card: K" in game.observation(0) and "Your card: Q" in game.observation(1)
    assert (
        "Q" not in game.observation(0).split("Your card")[1]
        and "K" not in game.observation(1).split("Your card")[1]
    )
    with pytest.raises(ValueError, match="not a legal move"):
        game.play("pass")
    assert game.parse_move("I call. \\boxed{Call}") == "call" and game.parse_move("\\boxed{raise}") is None
    assert game.parse_move("no box") is None and isinstance(game, Game)
    assert game.parse_move(" Call") == "call" and game.parse_move("bet") is None  # the move alone; not legal


def test_kuhn_deals_are_the_six_permutations():
    game = KuhnPoker()
    deals = set()
    for seed in range(6):
        game.reset(seed)
        deals.add(game.cards)
    assert deals == set(itertools.permutations(range(3), 2))


@pytest.mark.parametrize("alpha", [0.0, 1 / 6, 1 / 3])
def test_nash_family_value_and_zero_exploitability(alpha):
    strategy = nash_strategy(alpha)
    assert game_value(strategy) == pytest.approx(-1 / 18, abs=1e-12)
    assert best_response_value(strategy, 0) == pytest.approx(-1 / 18, abs=1e-12)
    assert best_response_value(strategy, 1) == pytest.approx(1 / 18, abs=1e-12)
    assert exploitability(strategy) == pytest.approx(0.0, abs=1e-12)


def test_always_aggressive_exploitability_derived_by_hand():
    """Both players always bet / call. Player 1's best response facing a bet: K calls (+2), Q calls (0: wins
    against J, loses against K), J folds (-1): 1/3. Player 0's against "call a bet, bet after a pass":
    K bets (+2), Q gets 0 either way, J passes and folds (-1): 1/3. Exploitability (1/3 + 1/3) / 2."""
    strategy = dict.fromkeys(INFORMATION_SETS, 1.0)
    assert best_response_value(strategy, 1) == pytest.approx(Fraction(1, 3))
    assert best_response_value(strategy, 0) == pytest.approx(Fraction(1, 3))
    assert exploitability(strategy) == pytest.approx(1 / 3)
    assert game_value(strategy) == pytest.approx(0.0)  # every hand is called: even
    assert exploitability(dict.fromkeys(INFORMATION_SETS, 0.5)) == pytest.approx(11 / 24)  # uniform play


def test_exploitability_is_positive_off_equilibrium():
    strategy = nash_strategy(0.0)
    strategy[(1, "J", "bet")] = 0.5  # calling a bet with the worst card
    assert exploitability(strategy) > 0.01
    with pytest.raises(ValueError, match="alpha"):
        nash_strategy(0.5)


# ------------------------------------------------------------------------------------------- tic-tac-toe
def test_tictactoe_rules():
    game = TicTacToe()
    game.reset(0)
    for move in ("1", "4", "2", "5"):
        game.play(move)
    assert not game.is_over() and game.legal_moves() == ["3", "6", "7", "8", "9"]
    assert game.parse_move("\\boxed{3}") == "3" and game.parse_move("\\boxed{4}") is None  # taken
    game.play("3")  # X: 1 2 3
    assert game.is_over() and game.returns() == [1.0, -1.0] and winner(game.board) == 0
    with pytest.raises(ValueError, match="not a free cell"):
        game.play("9")
    draw = TicTacToe()
    draw.reset(0)
    for move in ("1", "2", "3", "5", "4", "6", "8", "7", "9"):  # X O X / X O O / O X X
        draw.play(move)
    assert draw.is_over() and draw.returns() == [0.0, 0.0] and draw.legal_moves() == []
    assert draw.observation(1) == "You are O. Board: XOX/XOO/OXX.\n"


def test_perfect_player_draws_itself_and_never_loses_to_random():
    rng = random.Random(0)
    assert play_out(TicTacToe(), [perfect_move, perfect_move], 0) == [0.0, 0.0]
    for seat in (0, 1):
        for _ in range(40):
            players = [lambda g: g.random_move(rng)] * 2
            players[seat] = perfect_move
            assert play_out(TicTacToe(), players, 0)[seat] >= 0.0


# ------------------------------------------------------------------------------------------- Nim
def test_nim_rules_and_bouton():
    game = Nim(heaps=(1, 2))
    game.reset(0)
    assert game.legal_moves() == ["1:1", "2:1", "2:2"] and nim_sum(game.heaps) == 3
    assert nim_perfect(game) == "2:1"  # to heaps (1, 1): nim-sum 0
    game.play("2:1")
    game.play("1:1")
    game.play("2:1")  # player 0 takes the last stone
    assert game.is_over() and game.returns() == [1.0, -1.0]
    assert game.parse_move("\\boxed{1:1}") is None  # heap 1 is empty
    rng = random.Random(1)
    for seed in range(30):  # the player to move from a nonzero nim-sum wins with Bouton's moves
        nim = Nim(seed_heaps=3, max_heap=5)
        nim.reset(seed)
        first_wins = nim_sum(nim.start) != 0
        seat = 0 if first_wins else 1
        players = [lambda g: g.random_move(rng)] * 2
        players[seat] = nim_perfect
        assert play_out(nim, players, seed)[seat] == 1.0


def test_boxed_move_reads_the_last_box():
    assert boxed_move("first \\boxed{a} then \\boxed{ B }") == "b"
    assert boxed_move("nothing") is None

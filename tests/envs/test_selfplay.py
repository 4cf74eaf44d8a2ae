"""Self-play rollouts (``grpokit.envs.selfplay``): a game's seats are episodes on one key/value cache, the
seats that wait keep their context exact (log-probs equal a full forward over each seat's episode, cached
equals re-prefilled), hidden information stays hidden, illegal moves end the game with the penalty, the
scripted opponents play as documented, and the returns land on each seat's last turn."""

from __future__ import annotations

import itertools

import pytest
import torch

from grpokit.envs.episodes import as_generation_output
from grpokit.envs.kuhn_poker import CARDS, KuhnPoker
from grpokit.envs.selfplay import GameRunner, game_metrics
from grpokit.envs.tictactoe import TicTacToe
from grpokit.envs.turns import CachedTurnSession, ReprefillSession
from grpokit.models.tiny import build_char_tokenizer, build_tiny_model
from grpokit.rollout import SamplingParams
from grpokit.rollout.fast import FastSampler
from tests.rollout.test_turns import full_forward_logprobs


class Dialogue:
    """A user's game in a few lines: two players speak in turn (any text is a legal move), 5 turns; the
    longer total speech wins. Every turn is legal, so an untrained policy plays whole games."""

    roles = ("first", "second")
    max_turns = 5
    rules = "Talk.\n"

    def reset(self, seed: int) -> None:
        self.said: list[str] = []
        self.turns = 0

    def current_player(self) -> int:
        return self.turns % 2

    def observation(self, player: int) -> str:
        return f"p{player}:{len(self.said)}:" + "|".join(s[:2] for s in self.said) + "\n"

    def legal_moves(self) -> list[str]:
        return []

    def parse_move(self, text: str) -> str:
        return text

    def play(self, move: str) -> None:
        self.said.append(move)
        self.turns += 1

    def is_over(self) -> bool:
        return self.turns >= self.max_turns

    def returns(self) -> list[float]:
        lead = sum(len(s) for s in self.said[0::2]) - sum(len(s) for s in self.said[1::2])
        sign = float(lead > 0) - float(lead < 0)
        return [sign, -sign]


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model(request, tokenizer):
    model = build_tiny_model(tokenizer, arch=request.param, hidden_size=32, num_layers=2, num_heads=4, seed=5)
    return model.eval()


def sampling(tokenizer, greedy: bool = False) -> SamplingParams:
    return SamplingParams(max_new_tokens=64, do_sample=not greedy, eos_token_ids=(tokenizer.eos_token_id,),
                          pad_token_id=tokenizer.pad_token_id)  # fmt: skip


ROWS = [{"prompt": "Talk.\n", "game_seed": 0}, {"prompt": "Talk now.\n", "game_seed": 1}]
SIZES = [4, 6]  # 2 and 3 games of two seats


def prompt_ids(tokenizer, rows=ROWS):
    return [tokenizer(r["prompt"], add_special_tokens=False)["input_ids"] for r in rows]


def play(session, tokenizer, game=Dialogue, params=None, opponent="self", rows=ROWS, sizes=SIZES, **kw):
    runner = GameRunner(game, tokenizer, opponent=opponent, max_tokens=kw.pop("max_tokens", 120),
                        max_turn_tokens=kw.pop("max_turn_tokens", 6), **kw)  # fmt: skip
    return runner, runner.run(session, rows, sizes, params or sampling(tokenizer), seed=0)


def test_waiting_seats_stay_exact_every_policy_token_equals_a_full_forward(model, tokenizer):
    ids = prompt_ids(tokenizer)
    session = CachedTurnSession(model, ids, SIZES, generator=torch.Generator().manual_seed(0))
    _, episodes = play(session, tokenizer)
    prompts = [p for p, size in zip(ids, SIZES) for _ in range(size)]
    for prompt, episode in zip(prompts, episodes):
        assert len(episode.actions) == (3 if episode.seat == "first" else 2)  # 5 turns, alternating
        mask = torch.tensor(episode.policy_mask, dtype=torch.bool)
        expected = full_forward_logprobs(model, prompt, episode.completion_ids)[mask]
        torch.testing.assert_close(torch.tensor(episode.logprobs)[mask], expected, atol=2e-5, rtol=0)


def test_cached_seats_equal_re_prefilled_seats(model, tokenizer):
    ids, greedy = prompt_ids(tokenizer), sampling(tokenizer, greedy=True)
    _, cached = play(CachedTurnSession(model, ids, SIZES), tokenizer, params=greedy)
    _, again = play(ReprefillSession(FastSampler(model), ids, SIZES), tokenizer, params=greedy)
    assert [e.completion_ids for e in cached] == [e.completion_ids for e in again]
    assert [e.policy_mask for e in cached] == [e.policy_mask for e in again]


def test_layout_is_role_major_and_the_seats_of_a_game_see_each_others_moves(model, tokenizer):
    ids = prompt_ids(tokenizer)
    session = CachedTurnSession(model, ids, SIZES, generator=torch.Generator().manual_seed(1))
    runner, episodes = play(session, tokenizer)
    assert [e.seat for e in episodes] == ["first"] * 2 + ["second"] * 2 + ["first"] * 3 + ["second"] * 3
    first, second = episodes[0], episodes[2]  # deal 0, game 0: seats 0 and 1
    said = [first.actions[0], second.actions[0], first.actions[1], second.actions[1], first.actions[2]]
    game = Dialogue()
    game.reset(0)
    for move in said:
        game.play(move)
    assert [first.reward, second.reward] == game.returns()  # the seats' returns are that game's
    observed = tokenizer.decode([t for t, m in zip(second.completion_ids, second.policy_mask) if not m])
    assert "p1:1:" + said[0][:2] + "\n" in observed  # the second seat saw the first's move
    assert first.turn_rewards[:-1] == [None, None] and second.info["game_turns"] == 5
    metrics = game_metrics(episodes, runner.roles)
    assert metrics["selfplay/game_length"] == 5 and metrics["selfplay/illegal_rate"] == 0
    output = as_generation_output(episodes)
    assert output.policy_mask == [e.policy_mask for e in episodes]


def test_a_poker_seat_never_sees_the_other_card(model, tokenizer):
    rows = [{"prompt": "Kuhn.\n", "game_seed": deal} for deal in range(6)]
    session = CachedTurnSession(model, prompt_ids(tokenizer, rows), [2] * 6,
                                generator=torch.Generator().manual_seed(0))  # fmt: skip
    game = KuhnPoker()
    # the untrained policy names no move: every first seat's turn is illegal, the second never moves
    _, episodes = play(session, tokenizer, KuhnPoker, rows=rows, sizes=[2] * 6, illegal_move_reward=-2.0)
    for deal, (first, second) in enumerate(zip(episodes[0::2], episodes[1::2])):
        game.reset(deal)
        text = tokenizer.decode([t for t, m in zip(first.completion_ids, first.policy_mask) if not m])
        assert text == game.observation(0) and text.endswith(f"Your card: {CARDS[game.cards[0]]}")
        assert CARDS[game.cards[1]] not in text  # (no word of an observation holds an upper-case J, Q or K)
        assert first.info["illegal_moves"] == 1 and first.reward == -2.0 and first.done
        assert second.completion_ids == [] and second.reward is None  # never moved: no sample, no return


def test_scripted_opponents(tokenizer):
    """The perfect tic-tac-toe player never loses; every board a seat is shown has the opponent's move
    since its last one (X to move: as many X as O; O to move: one X more), and the policy's own move (the
    first free cell here) is on it."""
    model = build_tiny_model(tokenizer, hidden_size=32, num_layers=2, num_heads=4, seed=5).eval()

    class AnyCell(TicTacToe):  # the untrained policy's turn: the first free cell (a user's parse_move)
        def parse_move(self, text: str) -> str:
            return self.legal_moves()[0]

    rows = [{"prompt": "T.\n", "game_seed": 0}] * 2
    for opponent in ("expert", "random"):
        session = CachedTurnSession(model, prompt_ids(tokenizer, rows), [4, 4],
                                    generator=torch.Generator().manual_seed(0))  # fmt: skip
        _, episodes = play(session, tokenizer, AnyCell, opponent=opponent, rows=rows, sizes=[4, 4],
                           max_tokens=200)  # fmt: skip
        assert [e.seat for e in episodes] == ["X", "X", "O", "O"] * 2
        assert all(e.done and e.reward is not None for e in episodes)
        if opponent == "expert":
            assert all(e.reward <= 0 for e in episodes)  # minimax never loses
        for episode in episodes:
            text = tokenizer.decode([t for t, m in zip(episode.completion_ids, episode.policy_mask) if not m])
            boards = [line.split("Board: ")[1].rstrip(".").replace("/", "") for line in text.splitlines()]
            for before, after in itertools.pairwise(boards):
                mine = before[[c.isdigit() for c in before].index(True)]  # the first free cell, taken
                assert after[int(mine) - 1] == episode.seat
                assert sum(a != b for a, b in zip(before, after)) == 2  # its move and the opponent's
            for board in boards:
                assert board.count("X") - board.count("O") == (0 if episode.seat == "X" else 1)
    assert {e.reward for e in episodes} <= {-1.0, 0.0, 1.0}


def test_refusals(tokenizer):
    with pytest.raises(ValueError, match="game_opponent must be one of"):
        GameRunner(KuhnPoker, tokenizer, opponent="league", max_tokens=8)
    with pytest.raises(ValueError, match="no expert_move"):
        GameRunner(Dialogue, tokenizer, opponent="expert", max_tokens=8)
    runner = GameRunner(KuhnPoker, tokenizer, max_tokens=8)
    with pytest.raises(ValueError, match="multiple of the number of roles"):
        runner.seats([{"game_seed": 0}], [3], seed=0)


def test_a_snapshot_plays_the_other_seats(model, tokenizer):
    """``"pool"``: the other seat of each game is played by the snapshot ``opponent_model()`` returns (here
    another model): greedy, its first move as the first player equals greedy decoding of that model after
    the prompt and its observation (a plain loop of full forwards); the policy's seat is exact as before."""
    snapshot = build_tiny_model(tokenizer, hidden_size=32, num_layers=2, num_heads=4, seed=9).eval()
    ids, greedy = prompt_ids(tokenizer), sampling(tokenizer, greedy=True)
    runner = GameRunner(Dialogue, tokenizer, opponent="pool", max_tokens=120, max_turn_tokens=6)
    calls = []
    runner.opponent_model = lambda: calls.append(1) or snapshot
    episodes = runner.run(CachedTurnSession(model, ids, SIZES), ROWS, SIZES, greedy, seed=0, prompt_ids=ids)
    assert calls == [1]  # one snapshot a step
    assert [e.seat for e in episodes] == ["first", "first", "second", "second", "first", "first", "first",
                                          "second", "second", "second"]  # fmt: skip
    second = episodes[2]  # the policy as the second player: the snapshot moved first
    game = Dialogue()
    game.reset(0)
    context = ids[0] + tokenizer(game.observation(0), add_special_tokens=False)["input_ids"]
    move = []
    with torch.no_grad():
        for _ in range(6):
            token = int(snapshot(input_ids=torch.tensor([context + move])).logits[0, -1].argmax())
            move.append(token)
            if token == tokenizer.eos_token_id:
                break
    text = tokenizer.decode([t for t in move if t != tokenizer.eos_token_id], skip_special_tokens=True)
    seen = tokenizer.decode([t for t, m in zip(second.completion_ids, second.policy_mask) if not m])
    assert seen.startswith(f"p1:1:{text[:2]}\n")
    for prompt, episode in zip([ids[0]] * 4 + [ids[1]] * 6, episodes):
        mask = torch.tensor(episode.policy_mask, dtype=torch.bool)
        expected = full_forward_logprobs(model, prompt, episode.completion_ids)[mask]
        torch.testing.assert_close(torch.tensor(episode.logprobs)[mask], expected, atol=2e-5, rtol=0)
        assert len(episode.actions) == (3 if episode.seat == "first" else 2)  # only its own seat's turns

"""Self-play rollouts: the policy plays a game's seats, against itself or a scripted opponent.

Layout. A step's rows are deals (each row's ``game_seed`` fixes the game's chance: the cards of a poker
hand; 0 when the row has none). A deal's ``num_generations`` episodes are seats, role-major: the first
``num_generations / R`` episodes play role 0, the next role 1, ... (R roles). So each role's episodes of
a deal are one contiguous group of the advantage computation (``core.role_group_sizes``): every role is
measured against its own baseline, never against the other seat's.

Opponents (``opponent``):

- ``"self"``: the j-th episodes of the R roles of a deal are the seats of one game; the policy plays them
  all and every one of its turns is a training sample (G/R games per deal);
- ``"random"`` / ``"expert"``: each episode is a game of its own, the policy in its seat, every other seat
  played by a scripted player (a uniformly random legal move, or the game's ``expert_move``: minimax, a
  Nash strategy);
- ``"pool"``: each episode is a game of its own, every other seat played by a frozen snapshot of the
  policy: the model ``opponent_model()`` returns when a step's games start (``train.selfplay`` keeps the
  snapshots). Its seats are contexts of their own on that model's key/value cache, never trained on.

An episode's context is the prompt (the game's rules), then, before each move of its seat, that seat's
``observation`` (context only: masked out of the loss and the KL), then its turn. The key/value cache is
kept across turns (``envs.turns``); a game's other seats wait while one plays. A turn whose text names no
legal move ends the game: the offender's return is ``illegal_move_reward`` (SPIRAL: -1.5), every other
seat's 0, and it is counted (``selfplay/illegal_rate``). A game that reaches its ``max_turns``, or whose
acting seat's observation and turn would not fit ``max_tokens``, ends with the returns the game gives at
that point (truncated). Each episode's reward is its seat's return (the ``env_reward`` column: the
built-in ``environment_reward``); a seat that never moved (its game ended before its turn) has none.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from grpokit.envs.episodes import Episode, turn_texts
from grpokit.envs.observations import ObservationEncoder
from grpokit.envs.turns import CachedTurnSession, TurnSession
from grpokit.models.parts import model_device
from grpokit.rollout.base import SamplingParams

__all__ = ["OPPONENTS", "GameRunner", "Seat", "game_metrics"]

OPPONENTS = ("self", "random", "expert", "pool")
"""Who plays the seats the policy does not (module docstring)."""


@dataclass
class Seat:
    """One game in progress: the game and, per player, the episode the policy plays there (None: scripted)."""

    game: Any
    episodes: list[int | None]
    rng: random.Random
    over: bool = False
    offender: int | None = None
    """The player whose turn named no legal move (it ended the game), or None."""
    moves: int = 0
    """Moves made so far (the game's ``max_turns`` caps them)."""
    opponents: list[int | None] | None = None
    """``"pool"``: per player, its context in the opponent's session (None: the policy's seat)."""

    def play(self, move: str) -> None:
        """Make the current player's move; the game is over once it says so or reaches ``max_turns``."""
        self.game.play(move)
        self.moves += 1
        self.over = self.game.is_over() or self.moves >= self.game.max_turns


class GameRunner:
    """Plays a run's games (module docstring).

    Args:
        make_game: a no-argument factory of fresh games.
        tokenizer: decodes turns, encodes observations.
        opponent: ``"self"``, ``"random"``, ``"expert"`` or ``"pool"``.
        illegal_move_reward: the return of a seat whose turn names no legal move.
        max_tokens: completion tokens (observations and turns) per episode at most.
        max_turn_tokens: policy tokens per turn at most (None: what is left of ``max_tokens``).
    """

    def __init__(
        self,
        make_game: Callable[[], Any],
        tokenizer: Any,
        *,
        opponent: str = "self",
        illegal_move_reward: float = -1.5,
        max_tokens: int,
        max_turn_tokens: int | None = None,
    ) -> None:
        if opponent not in OPPONENTS:
            raise ValueError(f"game_opponent must be one of {OPPONENTS}, got {opponent!r}")
        probe = make_game()
        if opponent == "expert" and not callable(getattr(probe, "expert_move", None)):
            raise ValueError(f"game_opponent='expert': {type(probe).__name__} has no expert_move(rng)")
        self.make_game, self.tokenizer, self.opponent = make_game, tokenizer, opponent
        self.roles = tuple(probe.roles)
        self.game_type = type(probe)
        self.name = self.game_type.__name__
        self.illegal_move_reward = float(illegal_move_reward)
        self.max_tokens, self.max_turn_tokens = max_tokens, max_turn_tokens
        self.encoder = ObservationEncoder(tokenizer, chat=False)
        self.template_kwargs: dict[str, Any] = {}
        self.opponent_model: Callable[[], Any] | None = None
        """``"pool"``: returns the model that plays the other seats of a step's games (set by the trainer)."""

    @property
    def num_roles(self) -> int:
        return len(self.roles)

    def seats(self, rows: Sequence[dict[str, Any]], group_sizes: Sequence[int], seed: int) -> list[Seat]:
        """The games of a step: per deal (row k, ``group_sizes[k]`` episodes, role-major), G/R games of R
        policy seats (``"self"``) or G games of one policy seat each."""
        roles, seats, first = self.num_roles, [], 0
        for k, (row, size) in enumerate(zip(rows, group_sizes)):
            if size % roles:
                raise ValueError(f"deal {k}: {size} episodes do not split into the game's {roles} roles "
                                 "(num_generations must be a multiple of the number of roles)")  # fmt: skip
            per_role = size // roles
            deal = int(row.get("game_seed", 0))
            if self.opponent == "self":
                layouts = [[first + r * per_role + j for r in range(roles)] for j in range(per_role)]
            else:
                layouts = [
                    [first + i if p == i // per_role else None for p in range(roles)] for i in range(size)
                ]
            for episodes in layouts:
                game = self.make_game()
                game.reset(deal)
                seat = Seat(game, episodes, random.Random(f"{seed}-{len(seats)}"))
                if self.opponent == "pool":  # the other seats: contexts in the opponent's session, in order
                    others = [p for p, e in enumerate(episodes) if e is None]
                    seat.opponents = [None] * roles
                    for n, p in enumerate(others):
                        seat.opponents[p] = (roles - 1) * len(seats) + n
                seats.append(seat)
            first += size
        return seats

    def run(
        self,
        session: TurnSession,
        rows: Sequence[dict[str, Any]],
        group_sizes: Sequence[int],
        params: SamplingParams,
        seed: int | None = None,
        prompt_ids: Sequence[Sequence[int]] | None = None,
    ) -> list[Episode]:
        """``group_sizes[k]`` episodes of deal ``rows[k]``, in the session's episode order. ``seed``: the
        scripted players' chance (None: drawn from torch's random state, which a resumed run restores);
        ``prompt_ids``: the deals' prompts (``"pool"``: the snapshot's seats start from them too)."""
        if seed is None:
            seed = int(torch.randint(2**62, (1,)).item())
        total = sum(group_sizes)
        episodes = [Episode() for _ in range(total)]
        for seat in (seats := self.seats(rows, group_sizes, seed)):
            for player, index in enumerate(seat.episodes):
                if index is not None:
                    episodes[index].seat = self.roles[player]
        others = self._opponent_side(group_sizes, prompt_ids, seed)  # "pool": the snapshot's contexts
        while True:
            acting: dict[int, tuple[Seat, int]] = {}  # episode -> (its game, its player)
            against: dict[int, tuple[Seat, int]] = {}  # the snapshot's context -> (its game, its player)
            for seat in seats:
                self._play_scripted(seat)
                if seat.over:
                    continue
                player = seat.game.current_player()
                if seat.episodes[player] is not None:
                    acting[seat.episodes[player]] = (seat, player)  # type: ignore[index]
                else:
                    against[seat.opponents[player]] = (seat, player)  # type: ignore[index]
            feeds = self._observations(acting, episodes, episodes)
            if feeds:
                live = {i for seat in seats if not seat.over for i in seat.episodes if i is not None}
                self._turns(session, feeds, acting, episodes, sorted(live - set(feeds)), params, episodes)
            if others is not None:  # the snapshot's seats (the games the policy just ended are over)
                session_b, contexts = others
                opposing = self._observations(against, contexts, episodes)
                if opposing:
                    live = {i for seat in seats if not seat.over for i in seat.opponents or []}
                    live.discard(None)
                    self._turns(session_b, opposing, against, contexts, sorted(live - set(opposing)), params,
                                episodes)  # fmt: skip
                feeds = feeds or opposing
            if not feeds:
                break
        for seat in seats:
            self._settle(seat, episodes)
        return episodes

    def _opponent_side(
        self, group_sizes: Sequence[int], prompt_ids: Sequence[Sequence[int]] | None, seed: int
    ) -> tuple[TurnSession, list[Episode]] | None:
        """``"pool"``: a session on the step's snapshot (``opponent_model()``) with one context per seat it
        plays (the other seats of each game, in game order), and those contexts; otherwise None."""
        if self.opponent != "pool":
            return None
        if self.opponent_model is None or prompt_ids is None:
            raise ValueError("game_opponent='pool' needs opponent_model (a trainer sets it) and prompt_ids")
        model = self.opponent_model()
        sizes = [size * (self.num_roles - 1) for size in group_sizes]  # one game per policy seat
        generator = torch.Generator(model_device(model)).manual_seed(seed % 2**63)
        session = CachedTurnSession(model, prompt_ids, sizes, generator=generator)
        return session, [Episode() for _ in range(sum(sizes))]

    def _turns(
        self, session: TurnSession, feeds: dict[int, list[int]], acting: dict[int, tuple[Seat, int]],
        contexts: list[Episode], waiting: list[int], params: SamplingParams, episodes: list[Episode],
    ) -> None:  # fmt: skip
        """One round of a session: the acting contexts (policy episodes or the snapshot's) observe their
        ``feeds`` and move, ``waiting`` ones go on unchanged; the moves are made in the games."""
        order = sorted(feeds)
        session.observe(feeds, waiting=waiting)
        limits = [contexts[i].turn_limit(self.max_tokens, self.max_turn_tokens) for i in order]
        turns = session.act(order, params, limits, waiting=waiting)
        for i, (tokens, logprobs, _), text in zip(order, turns, turn_texts(self.tokenizer, turns, params)):
            self._record_turn(contexts[i], tokens, logprobs, text)
            seat, player = acting[i]
            self._move(seat, player, seat.game.parse_move(text), episodes)

    # ------------------------------------------------------------------ a round's parts
    def _play_scripted(self, seat: Seat) -> None:
        """Scripted seats (``"random"``, ``"expert"``) move until the policy's turn or the end."""
        game = seat.game
        seat.over = seat.over or game.is_over() or seat.moves >= game.max_turns
        if self.opponent not in ("random", "expert"):
            return
        while not seat.over and seat.episodes[game.current_player()] is None:
            random_move = self.opponent == "random"
            seat.play(seat.rng.choice(game.legal_moves()) if random_move else game.expert_move(seat.rng))

    def _observations(
        self, acting: dict[int, tuple[Seat, int]], contexts: list[Episode], episodes: list[Episode]
    ) -> dict[int, list[int]]:
        """Each acting seat's observation tokens, appended to its context (a policy episode or the
        snapshot's); a seat whose observation and a turn would not fit ``max_tokens`` ends its game (the
        policy's ``episodes`` there truncated)."""
        feeds: dict[int, list[int]] = {}
        for i, (seat, player) in acting.items():
            tokens = self.encoder(seat.game.observation(player))
            if len(contexts[i].completion_ids) + len(tokens) + 1 > self.max_tokens:
                seat.over = True
                for j in seat.episodes:
                    if j is not None:
                        episodes[j].truncated = True
                continue
            contexts[i].add_observation(tokens)
            feeds[i] = tokens
        for i in [i for i in feeds if acting[i][0].over]:  # a game another seat's budget ended
            del feeds[i]
        return feeds

    @staticmethod
    def _record_turn(episode: Episode, tokens: list[int], logprobs: list[float], text: str) -> None:
        episode.add_turn(tokens, logprobs)
        episode.actions.append(text)
        episode.turn_rewards.append(None)  # the seat's return goes on its last turn (``_settle``)

    def _move(self, seat: Seat, player: int, move: str | None, episodes: list[Episode]) -> None:
        """Play a parsed move; no legal move ends the game with the offender penalised (counted when it is
        the policy's seat)."""
        if move is None:
            seat.over = True
            if seat.episodes[player] is not None:
                episodes[seat.episodes[player]].info["illegal_moves"] += 1  # type: ignore[index]
            seat.offender = player
            return
        seat.play(move)

    def _settle(self, seat: Seat, episodes: list[Episode]) -> None:
        """Each policy seat's return on its last turn; the game's length and outcome in its counters."""
        game, offender = seat.game, seat.offender
        if offender is not None:
            returns = [self.illegal_move_reward if p == offender else 0.0 for p in range(self.num_roles)]
        else:
            returns = list(game.returns())
        for player, index in enumerate(seat.episodes):
            if index is None:
                continue
            episode = episodes[index]
            episode.info["game_turns"] += seat.moves + (offender is not None)
            episode.done = game.is_over() or offender is not None
            if episode.turn_rewards:  # a seat that never moved has no sample to carry a return
                episode.turn_rewards[-1] = float(returns[player])


def game_metrics(episodes: Sequence[Episode], roles: Sequence[str]) -> dict[str, float]:
    """``selfplay/return/<role>`` (mean over that seat's episodes that moved; spaces in a role's name as
    ``_``), ``selfplay/win_rate/<role>`` (the share of them with a positive return),
    ``selfplay/illegal_rate`` (illegal moves per policy turn) and ``selfplay/game_length`` (moves per game,
    the illegal one counted, mean over episodes)."""
    played = [e for e in episodes if e.turn_rewards]
    if not played:
        return {}
    turns = sum(len(e.turn_rewards) for e in played)
    out = {
        "selfplay/illegal_rate": sum(e.info.get("illegal_moves", 0) for e in played) / turns,
        "selfplay/game_length": sum(e.info.get("game_turns", 0) for e in played) / len(played),
    }
    for role in roles:
        mine = [e.reward for e in played if e.seat == role and e.reward is not None]
        if mine:
            name = role.replace(" ", "_")
            out[f"selfplay/return/{name}"] = sum(mine) / len(mine)
            out[f"selfplay/win_rate/{name}"] = sum(r > 0 for r in mine) / len(mine)
    return out

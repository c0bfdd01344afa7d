"""From the forest to training rows (docs/episode-format.md, section 3): one row per leaf, each call trained once."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple

import msgspec
import numpy as np

from callgrove.episode import Agent, Call, Episode
from callgrove.episode.spread import spread_over_completions
from callgrove.errors import InvalidValue
from callgrove.forest import Forest, build_forest
from callgrove.formats.ranges import check_choice
from callgrove.rows.columns import RowColumns
from callgrove.rows.schemes import BACKGROUND_REWARDS, BRANCH_CREDIT, SCHEMES


class RowSettings(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """How an episode's calls become rows (`[rows]` of a training config)."""

    scheme: str = "exactly_once"
    """Which leaves make rows and which calls each trains (`callgrove.rows.schemes`):
    `exactly_once` trains every kept call once; `leader_only`, `drop_subagents`, `per_agent` and
    `first_branch` are the baselines other systems ship."""
    background_reward: str = "own"
    """What a background agent's calls are credited with: `own` (its own rewards when it has
    them, else the episode's), `episode` (the episode's), `none` (they do not train)."""
    train_compaction: bool = True
    """Whether compaction (summary) calls train."""
    max_identical_trained: int = 1
    """How many rows with identical token sequences may train (the rest get a zero mask)."""

    def __post_init__(self) -> None:
        check_choice("scheme", self.scheme, tuple(SCHEMES))
        check_choice("background_reward", self.background_reward, BACKGROUND_REWARDS)
        if self.max_identical_trained < 1:
            raise InvalidValue("max_identical_trained must be at least 1")

    def may_train(self, episode: Episode, call: Call) -> bool:
        """Whether the settings let `call` train at all (whatever row holds it)."""
        if not self.train_compaction and call.purpose == "compaction":
            return False
        return not (
            self.background_reward == "none" and episode.agent_of(call).start == "background"
        )

    def reward_of(self, episode: Episode, agent: Agent) -> float:
        """The reward an agent's rows and credit use: `Episode.reward_of`, but a background
        agent's is the episode's under `background_reward = "episode"`."""
        if self.background_reward == "episode" and agent.start == "background":
            return episode.reward
        return episode.reward_of(agent)

    def for_credit(self, episode: Episode) -> Episode:
        """The episode as credit should score it: itself, or under `background_reward =
        "episode"` a copy sharing its calls (advantages written there land on them) whose
        background agents hold no rewards of their own, so they are scored by the episode's.
        The episode's own record keeps every reward."""
        if self.background_reward != "episode" or not any(
            a.start == "background" and a.rewards is not None for a in episode.agents
        ):
            return episode
        agents = [
            dataclasses.replace(a, rewards=None) if a.start == "background" else a
            for a in episode.agents
        ]
        return dataclasses.replace(episode, agents=agents)


class CallSpan(NamedTuple):
    """Where a call's own tokens sit in a row: new tokens [start, end), completion [prompt_end, end)."""

    call: Call
    start: int
    prompt_end: int
    end: int


@dataclass(eq=False)
class Row:
    """The walk from a leaf up to its root, shown root first, with what it trains.

    A plain value: its tokens, loss mask and logprobs are its episode's columns, read through
    the `EpisodeRows` that holds it (`EpisodeRows.token_ids(row)` and the like)."""

    episode: Episode
    index: int
    path: list[Call]
    trains: list[Call]
    context: list[Call]
    reward: float
    duplicate_of: int | None = None
    forest: Forest | None = field(default=None, repr=False)
    path_index: list[int] = field(default_factory=list, repr=False)

    @property
    def leaf(self) -> Call:
        return self.path[-1]

    def __repr__(self) -> str:
        duplicate = "" if self.duplicate_of is None else f", duplicate_of={self.duplicate_of}"
        return (
            f"Row(episode={self.episode.id!r}, index={self.index}, "
            f"path={[c.id for c in self.path]}, trains={[c.id for c in self.trains]}, "
            f"reward={self.reward:g}{duplicate})"
        )

    @property
    def agent(self) -> Agent:
        return self.episode.agent_of(self.leaf)

    @property
    def num_tokens(self) -> int:
        return self.leaf.full_len

    def spans(self) -> list[CallSpan]:
        spans = []
        start = 0
        for call in self.path:
            spans.append(CallSpan(call, start, call.prompt_len, call.full_len))
            start = call.full_len
        return spans


@dataclass(eq=False)
class EpisodeRows:
    """An episode's forest and rows."""

    episode: Episode
    forest: Forest
    rows: list[Row] = field(default_factory=list)
    settings: RowSettings = field(default_factory=RowSettings)
    owner: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64), repr=False)
    """The first row that trains each of the forest's calls (-1: none)."""
    trained_again: bool = False
    """Whether some call trains in more than one row (the `per_agent` scheme)."""

    def __post_init__(self) -> None:
        if len(self.owner) != len(self.forest.calls):  # rows given without it: read it off them
            owner = [-1] * len(self.forest.calls)
            for row in self.rows:
                trained = {id(c) for c in row.trains}
                for index, call in zip(row.path_index, row.path, strict=True):
                    if id(call) in trained:
                        self.trained_again = self.trained_again or owner[index] >= 0
                        if owner[index] < 0:
                            owner[index] = row.index
            self.owner = np.asarray(owner, dtype=np.int64)

    @property
    def walk_trained(self) -> np.ndarray | None:
        """Per call of every row's walk (rows end to end): does the row train it? None unless
        `trained_again` (then `owner`, one row a call, cannot say it)."""
        if not self.trained_again:
            return None
        flags = []
        for row in self.rows:
            trained = {id(c) for c in row.trains}
            flags.extend(id(call) in trained for call in row.path)
        return np.asarray(flags, dtype=bool)

    @property
    def credit_by_branch(self) -> bool:
        """Whether each row's trained calls take its leaf's advantage (`BRANCH_CREDIT`)."""
        return self.settings.scheme in BRANCH_CREDIT

    @cached_property
    def columns(self) -> RowColumns:
        """The rows' tokens, loss mask and call of every token, laid out once for all rows."""
        return RowColumns.of([self])

    def __repr__(self) -> str:
        return f"EpisodeRows(episode={self.episode.id!r}, rows={len(self.rows)})"

    def index_of(self, row: Row) -> int:
        """`row`'s place in `rows` (its index); a row held by another `EpisodeRows` (or by
        none) is refused by name, never read at another row's place."""
        if not (0 <= row.index < len(self.rows) and self.rows[row.index] is row):
            raise InvalidValue(f"{row!r} is not a row of {self!r}")
        return row.index

    def _columns_of(self, row: Row) -> tuple[RowColumns, int]:
        return self.columns, self.index_of(row)

    def loss_calls(self, row: Row) -> list[Call]:
        """The trained calls whose completion tokens carry loss in `row` (`RowColumns`)."""
        columns, index = self._columns_of(row)
        return columns.loss_calls(index)

    def num_loss_tokens(self, row: Row) -> int:
        return sum(len(c.completion_ids) for c in self.loss_calls(row))

    def token_ids(self, row: Row) -> np.ndarray:
        """The row's leaf's full sequence (int32), a view into the columns."""
        columns, index = self._columns_of(row)
        return columns.token_ids[columns.row(index)]

    def loss_mask(self, row: Row) -> np.ndarray:
        """1 on the completion tokens of the calls with loss in `row`, 0 elsewhere (uint8, a
        view into the columns)."""
        columns, index = self._columns_of(row)
        return columns.loss_mask[columns.row(index)]

    def logprobs(self, row: Row) -> np.ndarray | None:
        """Sampling logprobs on `row`'s loss tokens, 0.0 elsewhere; None if a call it trains
        has none."""
        self.index_of(row)
        if any(c.logprobs is None for c in row.trains):
            return None
        values = np.zeros(row.num_tokens, dtype=np.float64)
        values[self.loss_mask(row).view(bool)] = spread_over_completions(
            self.loss_calls(row), "logprobs"
        )
        return values


def build_rows(
    episode: Episode, settings: RowSettings | None = None, forest: Forest | None = None
) -> EpisodeRows:
    """The rows of `settings.scheme`, ordered by leaf `seq` (by default one per leaf, each kept
    call trained in exactly one row)."""
    settings = settings or RowSettings()
    forest = forest or build_forest(episode)
    walks = [forest.path_to(leaf) for leaf in forest.leaves]
    chosen = SCHEMES[settings.scheme](forest, walks)
    rewards: dict[int, float] = {}  # by agent index: an agent's reward, summed once
    barred = _barred(episode, forest, settings)
    trained_calls: list[int] = []  # every (call, row) trained, row after row
    trained_in: list[int] = []
    rows = []
    for path, trained in zip(walks, chosen, strict=True):
        if trained is None:
            continue
        number = len(rows)
        calls = [forest.calls[i] for i in path]
        agent = calls[-1].agent_index
        reward = rewards.get(agent)
        if reward is None:
            reward = rewards[agent] = settings.reward_of(episode, episode.agent_of(calls[-1]))
        if barred:
            trained = [i for i in trained if i not in barred]
        trains, context = [], []
        next_trained = iter([*trained, -1]).__next__  # a scheme's calls come in walk order
        wanted = next_trained()
        for call, i in zip(calls, path, strict=True):
            if i == wanted:
                wanted = next_trained()
                trains.append(call)
            else:
                context.append(call)
        trained_calls.extend(trained)
        trained_in.extend([number] * len(trained))
        rows.append(
            Row(
                episode=episode,
                index=number,
                path=calls,
                trains=trains,
                context=context,
                reward=reward,
                forest=forest,
                path_index=path,
            )
        )
    _mark_duplicates(rows, forest, settings)
    owner = np.full(len(forest.calls), -1, dtype=np.int64)
    owner[trained_calls[::-1]] = trained_in[::-1]  # the last write wins: the first row
    return EpisodeRows(
        episode=episode,
        forest=forest,
        rows=rows,
        settings=settings,
        owner=owner,
        trained_again=len(set(trained_calls)) < len(trained_calls),
    )


def _barred(episode: Episode, forest: Forest, settings: RowSettings) -> set[int]:
    """The forest's calls that `settings` keeps from training in any row."""
    if settings.train_compaction and settings.background_reward != "none":
        return set()
    return {i for i, call in enumerate(forest.calls) if not settings.may_train(episode, call)}


def _mark_duplicates(rows: list[Row], forest: Forest, settings: RowSettings) -> None:
    """Rows with identical token sequences: the first `max_identical_trained` train, the rest not.

    Rows are told apart by their leaf's full hash; only rows whose hash was seen before are
    compared token by token."""
    if len(rows) <= settings.max_identical_trained:
        return  # every row may train
    pool = forest.pool
    known = dict(forest.same_sequences)  # a copy: what rows learn stays with these rows
    hashes = forest.full_hash[[row.path_index[-1] for row in rows]].tolist()
    trained_copies: dict[int, list[tuple[int, Row]]] = {}
    for row, key in zip(rows, hashes, strict=True):
        leaf = forest.ledger_index[row.path_index[-1]]
        group = trained_copies.setdefault(key, [])
        same = [r for other, r in group if pool.same_sequence(other, leaf, known)]
        if len(same) >= settings.max_identical_trained:
            row.duplicate_of = same[0].index
        else:
            group.append((leaf, row))

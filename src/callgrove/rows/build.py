"""From the forest to training rows (docs/episode-format.md, section 3): one row per leaf, each call trained once."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple

import numpy as np

from callgrove.episode import Agent, Call, Episode
from callgrove.episode.spread import spread_over_completions
from callgrove.forest import Forest, build_forest
from callgrove.rows.columns import RowColumns


@dataclass(frozen=True, slots=True)
class RowSettings:
    """How many rows with identical token sequences may train (the rest get a zero mask)."""

    max_identical_trained: int = 1

    def __post_init__(self) -> None:
        if self.max_identical_trained < 1:
            raise ValueError("max_identical_trained must be at least 1")


class CallSpan(NamedTuple):
    """Where a call's own tokens sit in a row: new tokens [start, end), completion [prompt_end, end)."""

    call: Call
    start: int
    prompt_end: int
    end: int


@dataclass(eq=False)
class Row:
    """The walk from a leaf up to its root, shown root first, with what it trains."""

    episode: Episode
    index: int
    path: list[Call]
    trains: list[Call]
    context: list[Call]
    reward: float
    duplicate_of: int | None = None
    forest: Forest | None = field(default=None, repr=False)
    path_index: list[int] = field(default_factory=list, repr=False)
    episode_rows: EpisodeRows | None = field(default=None, repr=False)

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

    @property
    def loss_calls(self) -> list[Call]:
        """The trained calls whose completion tokens carry loss in this row (`RowColumns`)."""
        return self._columns.loss_calls(self.index)

    @property
    def num_loss_tokens(self) -> int:
        return sum(len(c.completion_ids) for c in self.loss_calls)

    @property
    def token_ids(self) -> np.ndarray:
        """The leaf's full sequence (int32), a view into the episode's `RowColumns`."""
        columns = self._columns
        return columns.token_ids[columns.row(self.index)]

    @property
    def loss_mask(self) -> np.ndarray:
        """1 on the completion tokens of the calls with loss here, 0 elsewhere (uint8, a view)."""
        columns = self._columns
        return columns.loss_mask[columns.row(self.index)]

    def logprobs(self) -> np.ndarray | None:
        """Sampling logprobs on the loss tokens, 0.0 elsewhere; None if a trained call has none."""
        if any(c.logprobs is None for c in self.trains):
            return None
        values = np.zeros(self.num_tokens, dtype=np.float64)
        values[self.loss_mask.view(bool)] = spread_over_completions(self.loss_calls, "logprobs")
        return values

    @property
    def _columns(self) -> RowColumns:
        if self.episode_rows is None:
            raise ValueError(f"{self!r} was not made by build_rows: it has no token columns")
        return self.episode_rows.columns

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
    """The row that trains each of the forest's calls."""

    def __post_init__(self) -> None:
        if len(self.owner) != len(self.forest.calls):  # rows given without it: read it off them
            owner = np.full(len(self.forest.calls), -1, dtype=np.int64)
            for row in self.rows:
                trained = {c.id for c in row.trains}
                for index, call in zip(row.path_index, row.path, strict=True):
                    if call.id in trained:
                        owner[index] = row.index
            self.owner = owner

    @cached_property
    def columns(self) -> RowColumns:
        """The rows' tokens, loss mask and call of every token, laid out once for all rows."""
        return RowColumns.of([self])

    def __repr__(self) -> str:
        return f"EpisodeRows(episode={self.episode.id!r}, rows={len(self.rows)})"

    def owner_of(self, call: Call) -> Row:
        for row in self.rows:
            if any(c is call for c in row.trains):
                return row
        raise KeyError(call.id)


def build_rows(
    episode: Episode, settings: RowSettings | None = None, forest: Forest | None = None
) -> EpisodeRows:
    """One row per leaf, ordered by leaf `seq`; each kept call trained in exactly one row."""
    settings = settings or RowSettings()
    forest = forest or build_forest(episode)
    paths = [forest.path_to(leaf) for leaf in forest.leaves]
    owners = _owners(forest, paths)
    rewards: dict[int, float] = {}  # by agent index: an agent's reward, summed once
    rows = []
    for number, path in enumerate(paths):
        calls = [forest.calls[i] for i in path]
        agent = calls[-1].agent_index
        reward = rewards.get(agent)
        if reward is None:
            reward = rewards[agent] = episode.reward_of(episode.agent_of(calls[-1]))
        trains, context = [], []
        for call, i in zip(calls, path, strict=True):
            (trains if owners[i] == number else context).append(call)
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
    result = EpisodeRows(
        episode=episode,
        forest=forest,
        rows=rows,
        settings=settings,
        owner=np.asarray(owners, dtype=np.int64),
    )
    for row in rows:
        row.episode_rows = result
    return result


def _owners(forest: Forest, paths: list[list[int]]) -> list[int]:
    """The row that trains each call: the lowest-seq leaf of its own agent, else the lowest-seq leaf.

    Leaves are visited in ascending `seq`, so the first row seen for a call is the lowest.
    """
    any_leaf = [-1] * len(forest.calls)
    own_leaf = [-1] * len(forest.calls)
    for number, path in enumerate(paths):
        leaf_agent = forest.calls[path[-1]].agent_index
        for i in path:
            if any_leaf[i] < 0:
                any_leaf[i] = number
            if own_leaf[i] < 0 and forest.calls[i].agent_index == leaf_agent:
                own_leaf[i] = number
    return [own if own >= 0 else first for own, first in zip(own_leaf, any_leaf, strict=True)]


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

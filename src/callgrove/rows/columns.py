"""Rows as flat columns: the one place that says which token of a row carries loss.

A row is its walk from the root down to its leaf; each call on the walk adds its new tokens
(what it appends to its parent's full sequence: new prompt tokens, then its completion). A
call's completion carries loss in a row when the row trains the call (it owns it), the row is
not a duplicate (docs/episode-format.md, duplicates) and the call's agent is trainable; every
other token of the row is context. Per-token values (logprobs, advantages) sit on the tokens
that carry loss, spread over each call's completion by `spread_over_completions`.

`RowColumns.of` lays out the rows of one episode or of a whole step at once: one token source
for every episode's pool, one gather for the token ids, one repeat for the loss mask and the
call of every token, with no per-row or per-token Python work.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain, pairwise
from typing import Protocol

import numpy as np

from callgrove.episode import Call, Episode
from callgrove.episode.spread import per_call_scalars, spread_over_completions
from callgrove.errors import InvalidValue
from callgrove.forest import Forest

MASK_DTYPE = np.uint8


class RowWalk(Protocol):
    """What the layout reads of a row (a `Row` is one): its place, its walk by forest index
    (root first), and whether it repeats an earlier row."""

    @property
    def index(self) -> int: ...
    @property
    def path_index(self) -> list[int]: ...
    @property
    def duplicate_of(self) -> int | None: ...


class EpisodeWalks(Protocol):
    """What the layout reads of one episode's rows (an `EpisodeRows` is one), so that the
    columns depend on no builder of rows: the episode, its forest, its rows, each call's
    owning row, and where ownership or credit is not one row a call."""

    @property
    def episode(self) -> Episode: ...
    @property
    def forest(self) -> Forest: ...
    @property
    def rows(self) -> Sequence[RowWalk]: ...
    @property
    def owner(self) -> np.ndarray: ...
    @property
    def trained_again(self) -> bool: ...
    @property
    def walk_trained(self) -> np.ndarray | None: ...
    @property
    def credit_by_branch(self) -> bool: ...


@dataclass(slots=True, eq=False)
class RowColumns:
    """Every row of some episodes end to end, as flat arrays.

    Calls are numbered across the episodes (each episode's kept calls in forest order, episode
    after episode); a walk is the (row, call) pairs of every row, root first, row after row.
    """

    calls: list[Call]  # every kept call; `call_index` and `walk_call` point here
    call_episode: list[str]  # the episode id of each call, for errors
    completion_len: np.ndarray  # int64 (C,)
    prompt_len: np.ndarray  # int64 (C,): the new prompt tokens each call adds to its parent's
    row_bounds: np.ndarray  # int64 (R+1,): row r is tokens [row_bounds[r], row_bounds[r+1])
    token_ids: np.ndarray  # int32 (T,)
    loss_mask: np.ndarray  # uint8 (T,): 1 on the completion tokens that carry loss
    walk_bounds: np.ndarray  # int64 (R+1,): row r's walk is pairs [walk_bounds[r], ...[r+1])
    walk_call: np.ndarray  # int64 (P,)
    walk_owned: np.ndarray  # bool (P,): the row trains the call
    walk_loss: np.ndarray  # bool (P,): the call's completion carries loss in the row
    walk_credit: np.ndarray  # int64 (P,): the call whose advantage the pair's loss tokens take

    @classmethod
    def of(cls, parts: Sequence[EpisodeWalks]) -> RowColumns:
        return _layout(parts)

    @property
    def num_rows(self) -> int:
        return len(self.row_bounds) - 1

    @property
    def call_index(self) -> np.ndarray:
        """int64 (T,): the call that adds each token to its row."""
        walk = self.walk_call
        return np.repeat(walk, self.prompt_len[walk] + self.completion_len[walk])

    def row(self, index: int) -> slice:
        return slice(int(self.row_bounds[index]), int(self.row_bounds[index + 1]))

    def row_slices(self) -> list[slice]:
        return [slice(first, last) for first, last in pairwise(self.row_bounds.tolist())]

    def walk(self, index: int) -> slice:
        return slice(int(self.walk_bounds[index]), int(self.walk_bounds[index + 1]))

    def segment_lengths(self) -> np.ndarray:
        """Each walk pair adds two segments to its row: its new prompt tokens, then its
        completion; their lengths, pair after pair."""
        return _segment_lengths(self.walk_call, self.prompt_len, self.completion_len)

    def values(self, name: str, dtype: type = np.float64) -> np.ndarray:
        """A call value ("logprobs", "advantages") per row token: the call's value on the
        completion tokens that carry loss (spread by `spread_over_completions`), 0 elsewhere."""
        scalars = per_call_scalars(self.calls, name, dtype)
        walk = self.walk_call
        if name == "advantages" and not np.array_equal(self.walk_credit, walk):
            if scalars is None:
                raise InvalidValue(
                    "rows that credit their branch (the leaf's advantage on every call they "
                    "train) need one advantage per call, not one per token"
                )
            walk = self.walk_credit
        if scalars is not None:  # one value per call: repeated over each loss segment
            segment_values = np.zeros(2 * len(walk), dtype=dtype)
            segment_values[1::2] = np.where(self.walk_loss, scalars[walk], 0)
            return np.repeat(segment_values, self.segment_lengths())
        # Every call's value is checked; only the calls with loss somewhere are laid out, in
        # walk order, which is the order of the loss tokens in the rows.
        loss_calls = walk[self.walk_loss].tolist()
        spread = spread_over_completions(
            self.calls, name, dtype, self.call_episode, laid_out=loss_calls
        )
        values = np.zeros(len(self.token_ids), dtype=dtype)
        values[self.loss_mask.view(bool)] = spread
        return values

    def owned_without(self, name: str) -> np.ndarray:
        """Per row: does a call the row trains hold no `name` (None)?"""
        missing = np.fromiter(
            (getattr(call, name) is None for call in self.calls), bool, len(self.calls)
        )
        return _any_per_row(missing[self.walk_call] & self.walk_owned, self.walk_bounds)

    def loss_calls(self, index: int) -> list[Call]:
        """The calls whose completion carries loss in row `index`, root first."""
        walk = self.walk(index)
        return [self.calls[c] for c in self.walk_call[walk][self.walk_loss[walk]].tolist()]


def _layout(parts: Sequence[EpisodeWalks]) -> RowColumns:
    """One pass over all the parts: their calls and rows end to end, then array operations
    over the whole set (no per-episode numpy work beyond each forest's own new tokens)."""
    forests = [part.forest for part in parts]
    calls = [call for forest in forests for call in forest.calls]
    call_counts = [len(forest.calls) for forest in forests]
    call_episode = list(
        chain.from_iterable([p.episode.id] * n for p, n in zip(parts, call_counts, strict=True))
    )
    new = [forest.new_tokens() for forest in forests]
    start, length = _joined([n.start for n in new]), _joined([n.length for n in new])
    prompt_length = _joined([n.prompt_length for n in new])
    rows = [row for part in parts for row in part.rows]
    depth = np.fromiter((len(row.path_index) for row in rows), np.int64, len(rows))
    # Each walk pair's episode (its place in `parts`), then its call numbered across parts.
    row_part = np.repeat(np.arange(len(parts)), [len(part.rows) for part in parts])
    pair_part = np.repeat(row_part, depth)
    first_call = np.cumsum(call_counts, dtype=np.int64) - call_counts
    walk_call = np.fromiter(
        chain.from_iterable(row.path_index for row in rows), np.int64, int(depth.sum())
    )
    walk_call += first_call[pair_part]
    number = np.fromiter((row.index for row in rows), np.int64, len(rows))
    trains = np.fromiter((row.duplicate_of is None for row in rows), bool, len(rows))
    walk_owned = _joined([part.owner for part in parts])[walk_call] == np.repeat(number, depth)
    if any(part.trained_again for part in parts):  # calls trained in several rows
        part_pairs = np.bincount(pair_part, minlength=len(parts))
        for part, first in zip(parts, (np.cumsum(part_pairs) - part_pairs).tolist(), strict=True):
            if (flags := part.walk_trained) is not None:
                walk_owned[first : first + len(flags)] = flags
    trainable = _trainable_calls(parts, calls, call_counts)
    walk_loss = walk_owned & trainable[walk_call] & np.repeat(trains, depth)
    walk_credit = walk_call.copy()
    if any(part.credit_by_branch for part in parts):
        leaf = walk_call[_bounds(depth)[1:] - 1]  # each row's leaf
        by_branch = np.fromiter((part.credit_by_branch for part in parts), bool, len(parts))
        branch_pairs = by_branch[pair_part]
        walk_credit[branch_pairs] = np.repeat(leaf, depth)[branch_pairs]
    completion_length = length - prompt_length
    # Token ids: views of each episode's new tokens, concatenated once (no pool-wide copy).
    sources = [n.tokens for n in new]
    pair_start, pair_length = start[walk_call], length[walk_call]
    views = [
        sources[part][first : first + count]
        for part, first, count in zip(
            pair_part.tolist(), pair_start.tolist(), pair_length.tolist(), strict=True
        )
    ]
    token_ids = np.concatenate(views) if views else np.zeros(0, np.int32)
    segment_lengths = _segment_lengths(walk_call, prompt_length, completion_length)
    segment_loss = np.zeros(2 * len(walk_call), dtype=MASK_DTYPE)
    segment_loss[1::2] = walk_loss
    walk_bounds = _bounds(depth)
    return RowColumns(
        calls=calls,
        call_episode=call_episode,
        completion_len=completion_length,
        prompt_len=prompt_length,
        row_bounds=_bounds(pair_length)[walk_bounds],
        token_ids=token_ids,
        loss_mask=np.repeat(segment_loss, segment_lengths),
        walk_bounds=walk_bounds,
        walk_call=walk_call,
        walk_owned=walk_owned,
        walk_loss=walk_loss,
        walk_credit=walk_credit,
    )


def _trainable_calls(
    parts: Sequence[EpisodeWalks], calls: list[Call], call_counts: list[int]
) -> np.ndarray:
    """Per call (numbered across parts): is its agent trainable? A call whose agent index is
    not one of its episode's agents is the error `Episode.agent_of` raises."""
    agents = [part.episode.agents for part in parts]
    trainable = np.fromiter(
        (agent.trainable for episode_agents in agents for agent in episode_agents), bool
    )
    agent_counts = np.array([len(a) for a in agents], dtype=np.int64)
    call_part = np.repeat(np.arange(len(parts)), call_counts)
    agent_index = np.fromiter((c.agent_index for c in calls), np.int64, len(calls))
    bad = np.flatnonzero((agent_index < 0) | (agent_index >= agent_counts[call_part]))
    if bad.size:
        first = int(bad[0])
        parts[int(call_part[first])].episode.agent_of(calls[first])  # raises, naming the call
    first_agent = np.cumsum(agent_counts) - agent_counts
    return trainable[agent_index + first_agent[call_part]]


def _segment_lengths(walk: np.ndarray, prompt_len: np.ndarray, completion_len: np.ndarray):
    lengths = np.empty(2 * len(walk), dtype=np.int64)
    lengths[0::2], lengths[1::2] = prompt_len[walk], completion_len[walk]
    return lengths


def _joined(parts: list[np.ndarray], dtype: type = np.int64) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, dtype)


def _bounds(lengths: np.ndarray) -> np.ndarray:
    bounds = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=bounds[1:])
    return bounds


def _any_per_row(flags: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    counts = _bounds(flags.astype(np.int64))
    return counts[bounds[1:]] - counts[bounds[:-1]] > 0

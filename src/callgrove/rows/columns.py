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
from typing import TYPE_CHECKING

import numpy as np

from callgrove.episode import Call
from callgrove.episode.spread import per_call_scalars, spread_over_completions

if TYPE_CHECKING:
    from callgrove.rows.build import EpisodeRows

MASK_DTYPE = np.uint8


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

    @classmethod
    def of(cls, parts: Sequence[EpisodeRows]) -> RowColumns:
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

    def spread(self, per_completion_token: np.ndarray, dtype: type = np.float64) -> np.ndarray:
        """Per row token: the value of its call at that completion token where it carries loss,
        0 elsewhere. `per_completion_token` holds every call's completion values end to end (as
        `spread_over_completions` lays them out)."""
        walk = self.walk_call
        longest = int(max(self.prompt_len.max(initial=0), self.completion_len.max(initial=0)))
        # The source: a run of zeros every segment without loss reads from, then the values.
        source = np.zeros(longest + len(per_completion_token), dtype=dtype)
        source[longest:] = per_completion_token
        completion_starts = np.cumsum(self.completion_len) - self.completion_len + longest
        segment_starts = np.zeros(2 * len(walk), dtype=np.int64)
        segment_starts[1::2] = np.where(self.walk_loss, completion_starts[walk], 0)
        return _gathered(source, segment_starts, self.segment_lengths(), dtype)

    def segment_lengths(self) -> np.ndarray:
        """Each walk pair adds two segments to its row: its new prompt tokens, then its
        completion; their lengths, pair after pair."""
        return _segment_lengths(self.walk_call, self.prompt_len, self.completion_len)

    def values(self, name: str, dtype: type = np.float64) -> np.ndarray:
        """A call value ("logprobs", "advantages") per row token, by `spread`."""
        scalars = per_call_scalars(self.calls, name, dtype)
        if scalars is not None:  # one value per call: repeated over each loss segment
            walk = self.walk_call
            segment_values = np.zeros(2 * len(walk), dtype=dtype)
            segment_values[1::2] = np.where(self.walk_loss, scalars[walk], 0)
            return np.repeat(segment_values, self.segment_lengths())
        spread = spread_over_completions(self.calls, name, dtype, self.call_episode)
        return self.spread(spread, dtype)

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


def _layout(parts: Sequence[EpisodeRows]) -> RowColumns:
    calls: list[Call] = []
    call_episode: list[str] = []
    sources, starts, lengths, prompt_lengths = [], [], [], []
    walks, owned, loss, depths = [], [], [], []
    call_offset = token_offset = 0
    for part in parts:
        forest, rows = part.forest, part.rows
        new = forest.new_tokens()
        sources.append(new.tokens)
        starts.append(new.start + token_offset)
        lengths.append(new.length)
        prompt_lengths.append(new.prompt_length)
        depth = np.fromiter((len(row.path_index) for row in rows), np.int64, len(rows))
        walk = np.fromiter(
            chain.from_iterable(row.path_index for row in rows), np.int64, int(depth.sum())
        )
        trainable = np.fromiter(
            (part.episode.agent_of(c).trainable for c in forest.calls), bool, len(forest.calls)
        )
        trains = np.fromiter((row.duplicate_of is None for row in rows), bool, len(rows))
        number = np.fromiter((row.index for row in rows), np.int64, len(rows))
        is_owned = part.owner[walk] == np.repeat(number, depth)
        walks.append(walk + call_offset)
        owned.append(is_owned)
        loss.append(is_owned & trainable[walk] & np.repeat(trains, depth))
        depths.append(depth)
        calls += forest.calls
        call_episode += [part.episode.id] * len(forest.calls)
        call_offset += len(forest.calls)
        token_offset += len(new.tokens)
    start, length, prompt_length = _joined(starts), _joined(lengths), _joined(prompt_lengths)
    walk_call, walk_loss, depth = _joined(walks), _joined(loss, bool), _joined(depths)
    completion_length = length - prompt_length
    source = np.concatenate(sources) if sources else np.zeros(0, np.int32)
    pair_lengths = length[walk_call]
    token_ids = _gathered(source, start[walk_call], pair_lengths, source.dtype)
    segment_lengths = _segment_lengths(walk_call, prompt_length, completion_length)
    segment_loss = np.zeros(2 * len(walk_call), dtype=MASK_DTYPE)
    segment_loss[1::2] = walk_loss
    walk_bounds = _bounds(depth)
    return RowColumns(
        calls=calls,
        call_episode=call_episode,
        completion_len=completion_length,
        prompt_len=prompt_length,
        row_bounds=_bounds(pair_lengths)[walk_bounds],
        token_ids=token_ids,
        loss_mask=np.repeat(segment_loss, segment_lengths),
        walk_bounds=walk_bounds,
        walk_call=walk_call,
        walk_owned=_joined(owned, bool),
        walk_loss=walk_loss,
    )


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


def _gathered(source: np.ndarray, starts: np.ndarray, lengths: np.ndarray, dtype) -> np.ndarray:
    """The concatenation of `source[s : s + n]` for each start `s` and length `n`.

    Concatenating views copies each token once; an index array would be built, then read, for
    every token (several times the memory traffic for the few hundred ranges of an episode).
    """
    stops = (starts + lengths).tolist()
    views = [source[first:last] for first, last in zip(starts.tolist(), stops, strict=True)]
    return np.concatenate(views) if views else np.zeros(0, dtype)


def _any_per_row(flags: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    counts = _bounds(flags.astype(np.int64))
    return counts[bounds[1:]] - counts[bounds[:-1]] > 0

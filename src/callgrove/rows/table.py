"""Rows as records (`callgrove rows --json`, docs/episode-format.md section 4) and as Arrow tables for Parquet."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa

from callgrove.errors import InvalidValue
from callgrove.rows.build import EpisodeRows, Row


def row_record(result: EpisodeRows, row: Row, tokens: bool = False) -> dict[str, Any]:
    """The JSON object for one of `result`'s rows (docs/episode-format.md, section 4); with
    `tokens`, its token ids, loss mask and logprobs."""
    record: dict[str, Any] = {
        "episode": row.episode.id,
        "group": row.episode.group,
        "row": row.index,
        "leaf": row.leaf.id,
        "agent": row.agent.id,
        "path": [c.id for c in row.path],
        "trains": [c.id for c in row.trains],
        "context": [c.id for c in row.context],
        "num_tokens": row.num_tokens,
        "num_loss_tokens": result.num_loss_tokens(row),
        "reward": row.reward,
        "duplicate_of": row.duplicate_of,
        "objective": row.episode.objective,
    }
    if tokens:
        record["token_ids"] = result.token_ids(row)
        record["loss_mask"] = result.loss_mask(row)
        record["logprobs"] = result.logprobs(row)
    return record


def rows_table(parts: Iterable[EpisodeRows], rows: Iterable[Row] | None = None) -> pa.Table:
    """One table row per training row: metadata columns plus token, mask and logprob lists.
    `rows`: some of the parts' rows, in any order (by default all of them, part after part).

    The lists come from each episode's `RowColumns` (one chunk per run of rows of an episode),
    sharing its memory where the run is all of the episode's rows: a table costs little more
    than the rows' tokens, never a copy of every row."""
    parts = list(parts)
    held = _held_by(parts, rows)
    rows = [row for _, row in held]
    chunks = [_list_chunks(part, indices) for part, indices in _runs(held)]
    columns = {
        "episode": pa.array([r.episode.id for r in rows], pa.string()),
        "group": pa.array([r.episode.group for r in rows], pa.string()),
        "row": pa.array([r.index for r in rows], pa.int32()),
        "leaf": pa.array([r.leaf.id for r in rows], pa.string()),
        "agent": pa.array([r.agent.id for r in rows], pa.string()),
        "agent_name": pa.array([r.agent.name for r in rows], pa.string()),
        "path": pa.array([[c.id for c in r.path] for r in rows], pa.list_(pa.string())),
        "trains": pa.array([[c.id for c in r.trains] for r in rows], pa.list_(pa.string())),
        "context": pa.array([[c.id for c in r.context] for r in rows], pa.list_(pa.string())),
        "num_tokens": pa.array([r.num_tokens for r in rows], pa.int64()),
        "num_loss_tokens": pa.array([p.num_loss_tokens(r) for p, r in held], pa.int64()),
        "reward": pa.array([r.reward for r in rows], pa.float64()),
        "duplicate_of": pa.array([r.duplicate_of for r in rows], pa.int32()),
        "objective": pa.array([r.episode.objective for r in rows], pa.string()),
    }
    for number, (name, value_type) in enumerate(_LISTS):
        columns[name] = pa.chunked_array([chunk[number] for chunk in chunks], pa.list_(value_type))
    return pa.table(columns)


_LISTS = (("token_ids", pa.int32()), ("loss_mask", pa.uint8()), ("logprobs", pa.float32()))


def _held_by(parts: list[EpisodeRows], rows: Iterable[Row] | None) -> list[tuple[EpisodeRows, Row]]:
    """(the part holding it, the row) for each row, in the given order (by default every row
    of every part); a row that none of the parts holds is refused by name."""
    if rows is None:
        return [(part, row) for part in parts for row in part.rows]
    holder = {id(row): part for part in parts for row in part.rows}
    held = []
    for row in rows:
        part = holder.get(id(row))
        if part is None:
            raise InvalidValue(f"{row!r} is not a row of the episode rows given")
        held.append((part, row))
    return held


def _runs(held: list[tuple[EpisodeRows, Row]]) -> list[tuple[EpisodeRows, list[int]]]:
    """The rows as runs of one episode's rows: (its rows, their indices), in the given order."""
    runs: list[tuple[EpisodeRows, list[int]]] = []
    for part, row in held:
        if runs and runs[-1][0] is part:
            runs[-1][1].append(row.index)
        else:
            runs.append((part, [row.index]))
    return runs


def _list_chunks(part: EpisodeRows, indices: list[int]) -> tuple[pa.Array, ...]:
    """Token ids, loss mask and logprobs (null where a trained call has none) of rows
    `indices` of one episode, as list arrays over its columns' buffers."""
    columns = part.columns
    logprobs = columns.values("logprobs", np.float32)
    missing = columns.owned_without("logprobs")[indices]
    values = (columns.token_ids, columns.loss_mask, logprobs)
    if indices == list(range(columns.num_rows)):
        offsets = columns.row_bounds
    else:
        pieces = [columns.row(index) for index in indices]
        offsets = np.zeros(len(pieces) + 1, dtype=np.int64)
        np.cumsum([piece.stop - piece.start for piece in pieces], out=offsets[1:])
        values = tuple(np.concatenate([array[p] for p in pieces]) for array in values)
    starts = pa.array(offsets.astype(np.int32))
    tokens, mask, logprob_values = (pa.array(array) for array in values)
    return (
        pa.ListArray.from_arrays(starts, tokens),
        pa.ListArray.from_arrays(starts, mask),
        pa.ListArray.from_arrays(starts, logprob_values, mask=pa.array(missing, pa.bool_())),
    )

"""Writing episodes as Parquet or Arrow IPC: buffered into record batches, each column built from
numpy in one concatenation, the file moved into place only when complete."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from callgrove.episode.binary.schema import (
    AGENT_TYPE,
    BATCH_EPISODES,
    BATCH_TOKENS,
    BINARY_SUFFIXES,
    CALL_TYPE,
    FLOAT_DTYPE,
    JSON_CALL_FIELDS,
    PARQUET_PAGE_BYTES,
    PARQUET_ROUTES_COLUMN,
    PARQUET_SUFFIX,
    ROUTES_TYPE,
    SCHEMA,
    is_binary,
)
from callgrove.episode.checks import CallColumns, ListColumn, call_problems, raise_first
from callgrove.episode.codec import PLAIN_CALL_FIELDS
from callgrove.episode.provenance import gaps_to_json, join_spawn
from callgrove.episode.record import ROUTE_DTYPE, TOKEN_DTYPE, Agent, Call, Episode
from callgrove.errors import InvalidValue
from callgrove.formats.output import NewFile
from callgrove.formats.problems import InputError, Problem
from callgrove.formats.wire import WireError, WireRun

_json_encoder = msgspec.json.Encoder()

# The calls' list fields, each with the type its values are stored as.
LIST_DTYPES = {
    "prompt_suffix_ids": TOKEN_DTYPE,
    "completion_ids": TOKEN_DTYPE,
    "logprobs": FLOAT_DTYPE,
    "advantages": FLOAT_DTYPE,
}


def _json_text(value: Any) -> str | None:
    return None if value is None else _json_encoder.encode(value).decode()


def _offsets(lengths: Iterable[int]) -> pa.Array:
    counts = np.fromiter(lengths, dtype=np.int64)
    offsets = np.zeros(len(counts) + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    return pa.array(offsets)


def _list_column(
    columns: list[ListColumn], dtype: type, value_type: pa.DataType, values: np.ndarray | None
) -> pa.Array:
    """One list column of a batch from its episodes' gathered columns (`checks.CallColumns`,
    the buffers the rules were checked on); `values`: all of theirs, one after the other,
    where the writer gathered them so (else they are concatenated here)."""
    if values is None:
        values = np.concatenate([c.values for c in columns], dtype=dtype)
    lengths = np.concatenate([c.lengths for c in columns])
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    null = np.concatenate([c.null for c in columns])
    return pa.ListArray.from_arrays(
        pa.array(offsets),
        pa.array(values, type=value_type),
        mask=pa.array(null) if null.any() else None,
    )


def _cumulative(lengths: np.ndarray) -> pa.Array:
    """List offsets from lengths; an InvalidValue where they pass what a list column can index."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if offsets[-1] > np.iinfo(np.int32).max:
        raise InvalidValue(f"{offsets[-1]} values are more than one batch's list column holds")
    return pa.array(offsets.astype(np.int32))


def _route_values(routes: np.ndarray) -> np.ndarray:
    """A call's routes as the `int16` values they are stored as; an InvalidValue for an array of
    another shape, or values its type cannot hold (unchecked writes)."""
    if routes.ndim != 3:
        raise InvalidValue(f"routes have shape {list(routes.shape)}, not [positions, layers, k]")
    if routes.dtype == ROUTE_DTYPE:
        return routes
    if routes.dtype.kind not in "iu":
        raise InvalidValue(f"routes are {routes.dtype}, not integers")
    bounds = np.iinfo(ROUTE_DTYPE)
    if routes.size and (routes.min() < bounds.min or routes.max() > bounds.max):
        raise InvalidValue(f"routes hold an expert index outside {ROUTE_DTYPE.__name__}")
    return routes.astype(ROUTE_DTYPE)


def _routes_array(calls: list[Call]) -> pa.Array:
    """The calls' `routes` as lists per position of lists per layer of experts: every level's
    offsets built from the shapes at once, the values one concatenation. Calls without routes
    are null, and a batch without any costs one all-null column."""
    routed = [(index, call.routes) for index, call in enumerate(calls) if call.routes is not None]
    if not routed:
        return pa.nulls(len(calls), ROUTES_TYPE)
    arrays = [_route_values(routes) for _index, routes in routed]
    shapes = np.array([a.shape for a in arrays], dtype=np.int64).reshape(-1, 3)
    positions, layers, experts = shapes.T
    per_call = np.zeros(len(calls), dtype=np.int64)
    per_call[[index for index, _routes in routed]] = positions
    null = np.ones(len(calls), dtype=bool)
    null[[index for index, _routes in routed]] = False
    values = np.concatenate([a.ravel() for a in arrays])
    experts_lists = pa.ListArray.from_arrays(
        _cumulative(np.repeat(experts, positions * layers)), pa.array(values, type=pa.int16())
    )
    layer_lists = pa.ListArray.from_arrays(_cumulative(np.repeat(layers, positions)), experts_lists)
    return pa.ListArray.from_arrays(
        _cumulative(per_call),
        layer_lists,
        type=ROUTES_TYPE,
        mask=pa.array(null) if null.any() else None,
    )


def _typed(schema: pa.StructType | pa.Schema) -> Callable[[str, list[Any]], pa.Array]:
    """A column builder for `schema`: values into an array of the named field's type."""

    def column(name: str, values: list[Any]) -> pa.Array:
        return pa.array(values, type=schema.field(name).type)

    return column


def _calls_array(
    calls: list[Call], gathered: list[CallColumns], values: dict[str, np.ndarray]
) -> pa.StructArray:
    column = _typed(CALL_TYPE)

    def lists(name: str, dtype: type, value_type: pa.DataType) -> pa.Array:
        return _list_column(
            [getattr(g, name) for g in gathered], dtype, value_type, values.get(name)
        )

    children = [
        column("id", [c.id for c in calls]),
        column("seq", [c.seq for c in calls]),
        column("prompt_from", [c.prompt_from for c in calls]),
        column(
            "prompt_from_len", [None if c.prompt_from is None else c.prompt_from_len for c in calls]
        ),
        lists("prompt_suffix_ids", TOKEN_DTYPE, pa.int32()),
        lists("completion_ids", TOKEN_DTYPE, pa.int32()),
        lists("logprobs", FLOAT_DTYPE, pa.float32()),
        column("advantage", [a for g in gathered for a in g.advantage]),
        lists("advantages", FLOAT_DTYPE, pa.float32()),
    ]
    for info in PLAIN_CALL_FIELDS:
        values = [getattr(c, info.name) for c in calls]
        if info.name in JSON_CALL_FIELDS:
            values = [_json_text(v) for v in values]
        children.append(column(info.name, values))
    children.append(_routes_array(calls))
    children.append(column("routes_from", [c.routes_from for c in calls]))
    return pa.StructArray.from_arrays(children, fields=list(CALL_TYPE))


def _agents_array(
    agents: list[Agent], gathered: list[CallColumns], values: dict[str, np.ndarray]
) -> pa.StructArray:
    column = _typed(AGENT_TYPE)

    calls = [c for a in agents for c in a.calls]
    children = [
        column("id", [a.id for a in agents]),
        column("name", [a.name for a in agents]),
        column("parent", [a.parent for a in agents]),
        column("start", [a.start for a in agents]),
        column("trainable", [a.trainable for a in agents]),
        column("rewards", [None if a.rewards is None else list(a.rewards.items()) for a in agents]),
        column("meta", [_json_text(join_spawn(a.spawn, a.meta)) for a in agents]),
        pa.ListArray.from_arrays(
            _offsets(len(a.calls) for a in agents),
            _calls_array(calls, gathered, values),
            type=AGENT_TYPE.field("calls").type,
        ),
    ]
    return pa.StructArray.from_arrays(children, fields=list(AGENT_TYPE))


def _run_dict(run: WireRun | None) -> dict[str, Any] | None:
    if run is None:
        return None
    policy = None if run.policy is None else {"start": run.policy.start, "end": run.policy.end}
    return {"id": run.id, "type": run.type, "step": run.step, "policy": policy}


def _error_dict(error: WireError) -> dict[str, Any]:
    return {
        "type": error.type,
        "message": error.message,
        "agent": None if error.agent is msgspec.UNSET else error.agent,
        "call": None if error.call is msgspec.UNSET else error.call,
    }


def episodes_to_batch(
    episodes: list[Episode],
    gathered: list[CallColumns] | None = None,
    values: dict[str, np.ndarray] | None = None,
) -> pa.RecordBatch:
    """One record batch holding `episodes`, one row each; `gathered[i]`, where given, is
    episode i's calls gathered into columns (`CallColumns.of_calls`), taken as they are, and
    `values[field]` all of a list field's values where they were gathered one after the other."""
    if gathered is None:
        gathered = [CallColumns.of_calls(list(e.calls())) for e in episodes]
    values = {} if values is None else values
    column = _typed(SCHEMA)

    agents = [a for e in episodes for a in e.agents]
    columns = [
        column("id", [e.id for e in episodes]),
        column("group", [e.group for e in episodes]),
        column(
            "env",
            [None if e.env is None else {"id": e.env.id, "name": e.env.name} for e in episodes],
        ),
        column("task", [_json_text(e.task) for e in episodes]),
        column("run", [_run_dict(e.run) for e in episodes]),
        column("ok", [e.ok for e in episodes]),
        column("errors", [[_error_dict(x) for x in e.errors] for e in episodes]),
        column("rewards", [list(e.rewards.items()) for e in episodes]),
        column("objective", [e.objective for e in episodes]),
        column("gaps", [_json_text(gaps_to_json(e.gaps)) for e in episodes]),
        column("meta", [_json_text(e.meta) for e in episodes]),
        pa.ListArray.from_arrays(
            _offsets(len(e.agents) for e in episodes),
            _agents_array(agents, gathered, values),
            type=SCHEMA.field("agents").type,
        ),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=SCHEMA)


def _stored_tokens(episode: Episode, columns: CallColumns) -> int:
    """What the episode adds to its batch, in tokens: its stored token ids, and its routes
    counted by their bytes (an `int16` value half a token id), so that a batch of routed
    episodes holds about as much memory as one without."""
    routes = sum(c.routes.size for c in episode.calls() if c.routes is not None)
    tokens = columns.prompt_suffix_ids.offsets[-1] + columns.completion_ids.offsets[-1]
    return int(tokens) + routes // 2


class BinaryEpisodeWriter:
    """Writes episodes as Parquet (`.parquet`; uncompressed unless `compression` names a
    codec: "zstd" makes smaller files that read about half as fast) or Arrow IPC (`.arrow`,
    always uncompressed, so it is memory-mapped and read without decoding).

    Episodes are buffered and written a record batch (a Parquet row group) at a time; `sync()`
    closes the current batch. The file is written beside its final name and moved into place
    by `close()`, so a failure or a crash leaves the previous file (or none), never a broken
    one (see `callgrove.formats.output`).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        batch_tokens: int = BATCH_TOKENS,
        batch_episodes: int = BATCH_EPISODES,
        compression: str = "none",
    ):
        self.path = Path(path)
        if not is_binary(self.path):
            raise InvalidValue(
                f"{self.path}: binary episode files end in {' or '.join(BINARY_SUFFIXES)}"
            )
        self.lines = 0
        self._batch_tokens = batch_tokens
        self._batch_episodes = batch_episodes
        self._pending: list[tuple[Episode, CallColumns]] = []
        self._buffers = {field: np.empty(0, dtype) for field, dtype in LIST_DTYPES.items()}
        self._filled = dict.fromkeys(LIST_DTYPES, 0)
        self._pending_tokens = 0
        self._new = NewFile(self.path)
        try:
            if self.path.suffix == PARQUET_SUFFIX:
                # Token ids are near-random: dictionaries and min/max statistics cost time and
                # save nothing; large pages keep the per-page work of decoding small. Routes
                # hold a few hundred expert indices at most, stored as int32 without one (Parquet
                # has no int16): their dictionary makes them several times smaller, and quicker
                # to read.
                self._writer: Any = pq.ParquetWriter(
                    self._new.temp,
                    SCHEMA,
                    compression=compression,
                    use_dictionary=[PARQUET_ROUTES_COLUMN],
                    # A CRC per page: a damaged byte is found on reading, never read as data.
                    write_page_checksum=True,
                    write_statistics=False,
                    data_page_size=PARQUET_PAGE_BYTES,
                )
            else:
                self._writer = ipc.new_file(str(self._new.temp), SCHEMA)
        except BaseException:
            self._new.discard()
            raise

    def write(self, episode: Episode) -> None:
        """Buffer the episode as it is (unchecked: `save` and `open_writer` check first)."""
        self.write_gathered(episode, CallColumns.of_calls(list(episode.calls()), self.room))

    def room(self, field: str, count: int) -> np.ndarray:
        """Where the next episode's `count` values of a list field go: straight after the
        pending ones in this field's batch buffer (grown as needed, reused batch after batch),
        so a batch's column is built without another copy."""
        buffer, filled = self._buffers[field], self._filled[field]
        if filled + count > len(buffer):
            grown = np.empty(max(2 * len(buffer), filled + count), dtype=buffer.dtype)
            grown[:filled] = buffer[:filled]
            self._buffers[field] = buffer = grown
        return buffer[filled : filled + count]

    def write_gathered(self, episode: Episode, calls: CallColumns) -> None:
        """Buffer the episode with its calls gathered into this writer's `room` (the columns
        its checks ran on): their values are what the file gets."""
        if any(getattr(calls, f).values.dtype != self._buffers[f].dtype for f in LIST_DTYPES):
            # a value its stored type cannot hold stayed out of the room (`ListColumn.of`)
            raise_first(call_problems(calls), calls.ids, 0, len(calls.ids), episode.id)
        for field in LIST_DTYPES:
            self._filled[field] += len(getattr(calls, field).values)
        self._pending.append((episode, calls))
        self._pending_tokens += _stored_tokens(episode, calls)
        self.lines += 1
        if self._pending_tokens >= self._batch_tokens or len(self._pending) >= self._batch_episodes:
            self.sync()

    def sync(self) -> None:
        """Write the buffered episodes as one batch."""
        if not self._pending:
            return
        episodes = [episode for episode, _calls in self._pending]
        values = {field: self._buffers[field][: self._filled[field]] for field in LIST_DTYPES}
        batch = _checked_batch(episodes, [calls for _episode, calls in self._pending], values)
        if isinstance(self._writer, pq.ParquetWriter):
            self._writer.write_batch(batch, row_group_size=batch.num_rows)
        else:
            self._writer.write_batch(batch)
        del batch  # the buffers are free again: the batch was written
        self._pending = []
        self._pending_tokens = 0
        self._filled = dict.fromkeys(LIST_DTYPES, 0)

    def close(self) -> None:
        """Write what is buffered and move the finished file into place."""
        try:
            self.sync()
            self._writer.close()
        except BaseException:
            self.discard()
            raise
        self._new.commit()

    def discard(self) -> None:
        """Stop without touching the target: the partly written file is removed."""
        with contextlib.suppress(Exception):
            self._writer.close()
        self._new.discard()

    def __enter__(self) -> BinaryEpisodeWriter:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self.close()
        else:  # leave no half-written file behind, and the target as it was
            self.discard()


def _checked_batch(
    episodes: list[Episode], gathered: list[CallColumns], values: dict[str, np.ndarray]
) -> pa.RecordBatch:
    """`episodes_to_batch`, with a value the columns cannot hold (an integer past 64 bits, say)
    reported as an `InputError` naming its episode."""
    try:
        return episodes_to_batch(episodes, gathered, values)
    except (pa.ArrowException, OverflowError, TypeError, ValueError):
        culprit = episodes[0].id
        for episode, calls in zip(episodes, gathered, strict=True):
            try:
                episodes_to_batch([episode], [calls])
            except (pa.ArrowException, OverflowError, TypeError, ValueError) as found:
                culprit, error = episode.id, found
                break
        raise InputError(
            Problem(
                f"cannot be written in the binary form: {error}", episode=culprit, kind="invalid"
            )
        ) from None


def write_binary_episodes(
    path: str | os.PathLike[str], episodes: Iterable[Episode], compression: str = "none"
) -> int:
    """Write episodes to a `.parquet` or `.arrow` file; returns how many were written."""
    with BinaryEpisodeWriter(path, compression=compression) as writer:
        for episode in episodes:
            writer.write(episode)
        return writer.lines

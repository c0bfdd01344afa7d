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
    PARQUET_SUFFIX,
    SCHEMA,
    is_binary,
)
from callgrove.episode.codec import PLAIN_CALL_FIELDS
from callgrove.episode.provenance import gaps_to_json, join_spawn
from callgrove.episode.record import TOKEN_DTYPE, Agent, Call, Episode
from callgrove.formats.output import NewFile
from callgrove.formats.problems import InputError, Problem
from callgrove.formats.wire import WireError, WireRun

_json_encoder = msgspec.json.Encoder()


def _json_text(value: Any) -> str | None:
    return None if value is None else _json_encoder.encode(value).decode()


def _offsets(lengths: Iterable[int]) -> pa.Array:
    counts = np.fromiter(lengths, dtype=np.int64)
    offsets = np.zeros(len(counts) + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    return pa.array(offsets)


def _list_column(arrays: list[np.ndarray | None], dtype: type, value_type: pa.DataType) -> pa.Array:
    """A list column from numpy arrays (None = a null list) in one concatenation."""
    present = [np.zeros(0, dtype=dtype) if a is None else a for a in arrays]
    values = np.concatenate(present, dtype=dtype) if present else np.zeros(0, dtype=dtype)
    mask = None
    if any(a is None for a in arrays):
        mask = pa.array([a is None for a in arrays])
    return pa.ListArray.from_arrays(
        _offsets(len(a) for a in present), pa.array(values, type=value_type), mask=mask
    )


def _typed(schema: pa.StructType | pa.Schema) -> Callable[[str, list[Any]], pa.Array]:
    """A column builder for `schema`: values into an array of the named field's type."""

    def column(name: str, values: list[Any]) -> pa.Array:
        return pa.array(values, type=schema.field(name).type)

    return column


def _calls_array(calls: list[Call]) -> pa.StructArray:
    column = _typed(CALL_TYPE)

    per_token = [c.advantages if isinstance(c.advantages, np.ndarray) else None for c in calls]
    scalar = [
        None if c.advantages is None or isinstance(c.advantages, np.ndarray) else c.advantages
        for c in calls
    ]
    children = [
        column("id", [c.id for c in calls]),
        column("seq", [c.seq for c in calls]),
        column("prompt_from", [c.prompt_from for c in calls]),
        column(
            "prompt_from_len", [None if c.prompt_from is None else c.prompt_from_len for c in calls]
        ),
        _list_column([c.prompt_suffix for c in calls], TOKEN_DTYPE, pa.int32()),
        _list_column([c.completion_ids for c in calls], TOKEN_DTYPE, pa.int32()),
        _list_column([c.logprobs for c in calls], FLOAT_DTYPE, pa.float32()),
        column("advantage", scalar),
        _list_column(per_token, FLOAT_DTYPE, pa.float32()),
    ]
    for info in PLAIN_CALL_FIELDS:
        values = [getattr(c, info.name) for c in calls]
        if info.name in JSON_CALL_FIELDS:
            values = [_json_text(v) for v in values]
        children.append(column(info.name, values))
    return pa.StructArray.from_arrays(children, fields=list(CALL_TYPE))


def _agents_array(agents: list[Agent]) -> pa.StructArray:
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
            _calls_array(calls),
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


def episodes_to_batch(episodes: list[Episode]) -> pa.RecordBatch:
    """One record batch holding `episodes`, one row each."""
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
            _agents_array(agents),
            type=SCHEMA.field("agents").type,
        ),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=SCHEMA)


def _stored_tokens(episode: Episode) -> int:
    return sum(len(c.prompt_suffix) + len(c.completion_ids) for c in episode.calls())


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
            raise ValueError(
                f"{self.path}: binary episode files end in {' or '.join(BINARY_SUFFIXES)}"
            )
        self.lines = 0
        self._batch_tokens = batch_tokens
        self._batch_episodes = batch_episodes
        self._pending: list[Episode] = []
        self._pending_tokens = 0
        self._new = NewFile(self.path)
        try:
            if self.path.suffix == PARQUET_SUFFIX:
                # Token ids are near-random: dictionaries and min/max statistics cost time and
                # save nothing; large pages keep the per-page work of decoding small.
                self._writer: Any = pq.ParquetWriter(
                    self._new.temp,
                    SCHEMA,
                    compression=compression,
                    use_dictionary=False,
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
        self._pending.append(episode)
        self._pending_tokens += _stored_tokens(episode)
        self.lines += 1
        if self._pending_tokens >= self._batch_tokens or len(self._pending) >= self._batch_episodes:
            self.sync()

    def sync(self) -> None:
        """Write the buffered episodes as one batch."""
        if not self._pending:
            return
        batch = _checked_batch(self._pending)
        if isinstance(self._writer, pq.ParquetWriter):
            self._writer.write_batch(batch, row_group_size=batch.num_rows)
        else:
            self._writer.write_batch(batch)
        self._pending = []
        self._pending_tokens = 0

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


def _checked_batch(episodes: list[Episode]) -> pa.RecordBatch:
    """`episodes_to_batch`, with a value the columns cannot hold (an integer past 64 bits, say)
    reported as an `InputError` naming its episode."""
    try:
        return episodes_to_batch(episodes)
    except (pa.ArrowException, OverflowError, TypeError, ValueError):
        culprit = episodes[0].id
        for episode in episodes:
            try:
                episodes_to_batch([episode])
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

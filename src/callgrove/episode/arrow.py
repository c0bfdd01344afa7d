"""The binary episode form: the same records as Parquet or Arrow IPC, one row per episode.

Tokens are `int32` list columns and per-token floats (logprobs, advantages) `float32` list
columns, nested as episode -> agents -> calls exactly like the JSON record (docs/format.md has
the layout). Reading turns each record batch's columns into numpy once and hands every call
views into those buffers, so a call's arrays are never copied; a reader holds one batch at a
time, so memory is bounded by the batch, not the file. Prompts stay compact: a call stores the
call its prompt starts from, how many of its tokens, and the suffix it adds.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from callgrove.episode.codec import (
    check_agent_links,
    check_run,
    check_unique_calls,
    share_histories,
)
from callgrove.episode.provenance import gaps_from_json, gaps_to_json, join_spawn, split_spawn
from callgrove.episode.record import AGENT_STARTS, PURPOSES, TOKEN_DTYPE, Agent, Call, Episode
from callgrove.formats.problems import Diagnostics, InputError, Problem
from callgrove.formats.wire import FORMAT, WireEnv, WireError, WirePolicy, WireRun

LAYOUT = "callgrove.binary/1"
PARQUET_SUFFIX = ".parquet"
ARROW_SUFFIX = ".arrow"
BINARY_SUFFIXES = (PARQUET_SUFFIX, ARROW_SUFFIX)
FLOAT_DTYPE = np.float32

# A record batch (a Parquet row group) is closed once it holds this many tokens or episodes:
# the unit a reader holds in memory at once.
BATCH_TOKENS = 1_000_000
BATCH_EPISODES = 256
PARQUET_PAGE_BYTES = 8 << 20

_TOKENS = pa.list_(pa.int32())
_FLOATS = pa.list_(pa.float32())
_REWARDS = pa.map_(pa.string(), pa.float64())
_JSON = pa.string()  # free-form JSON values, stored as their JSON text

CALL_TYPE = pa.struct(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("prompt_from", pa.string()),
        pa.field("prompt_from_len", pa.int64()),
        pa.field("prompt_suffix_ids", _TOKENS, nullable=False),
        pa.field("completion_ids", _TOKENS, nullable=False),
        pa.field("logprobs", _FLOATS),
        pa.field("policy_version", pa.int64()),
        pa.field("purpose", pa.string(), nullable=False),
        pa.field("kept", pa.bool_(), nullable=False),
        pa.field("advantage", pa.float64()),
        pa.field("advantages", _FLOATS),
        pa.field("content", _JSON),
    ]
)
AGENT_TYPE = pa.struct(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("name", pa.string(), nullable=False),
        pa.field("parent", pa.string()),
        pa.field("start", pa.string(), nullable=False),
        pa.field("trainable", pa.bool_(), nullable=False),
        pa.field("rewards", _REWARDS),
        pa.field("meta", _JSON),
        pa.field("calls", pa.list_(pa.field("item", CALL_TYPE, nullable=False)), nullable=False),
    ]
)
ENV_TYPE = pa.struct([pa.field("id", pa.string()), pa.field("name", pa.string())])
POLICY_TYPE = pa.struct(
    [pa.field("start", pa.int64(), nullable=False), pa.field("end", pa.int64(), nullable=False)]
)
RUN_TYPE = pa.struct(
    [
        pa.field("id", pa.string()),
        pa.field("type", pa.string(), nullable=False),
        pa.field("step", pa.int64()),
        pa.field("policy", POLICY_TYPE),
    ]
)
ERROR_TYPE = pa.struct(
    [
        pa.field("type", pa.string(), nullable=False),
        pa.field("message", pa.string(), nullable=False),
        pa.field("agent", pa.string()),
        pa.field("call", pa.string()),
    ]
)
SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("group", pa.string()),
        pa.field("env", ENV_TYPE),
        pa.field("task", _JSON),
        pa.field("run", RUN_TYPE),
        pa.field("ok", pa.bool_(), nullable=False),
        pa.field("errors", pa.list_(pa.field("item", ERROR_TYPE, nullable=False)), nullable=False),
        pa.field("rewards", _REWARDS, nullable=False),
        pa.field("objective", pa.string()),
        pa.field("gaps", _JSON),
        pa.field("meta", _JSON),
        pa.field("agents", pa.list_(pa.field("item", AGENT_TYPE, nullable=False)), nullable=False),
    ],
    metadata={"format": FORMAT, "layout": LAYOUT},
)

_json_encoder = msgspec.json.Encoder()


def is_binary(path: str | os.PathLike[str]) -> bool:
    return str(path).endswith(BINARY_SUFFIXES)


# ---------------------------------------------------------------------------------------------
# Writing


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


def _calls_array(calls: list[Call]) -> pa.StructArray:
    def column(name: str, values: list[Any]) -> pa.Array:
        return pa.array(values, type=CALL_TYPE.field(name).type)

    per_token = [c.advantages if isinstance(c.advantages, np.ndarray) else None for c in calls]
    scalar = [
        None if c.advantages is None or isinstance(c.advantages, np.ndarray) else c.advantages
        for c in calls
    ]
    children = [
        column("id", [c.id for c in calls]),
        column("seq", [c.seq for c in calls]),
        column("prompt_from", [None if c.prompt_base is None else c.prompt_base.id for c in calls]),
        column(
            "prompt_from_len", [None if c.prompt_base is None else c.prompt_base_len for c in calls]
        ),
        _list_column([c.prompt_suffix for c in calls], TOKEN_DTYPE, pa.int32()),
        _list_column([c.completion_ids for c in calls], TOKEN_DTYPE, pa.int32()),
        _list_column([c.logprobs for c in calls], FLOAT_DTYPE, pa.float32()),
        column("policy_version", [c.policy_version for c in calls]),
        column("purpose", [c.purpose for c in calls]),
        column("kept", [c.kept for c in calls]),
        column("advantage", scalar),
        _list_column(per_token, FLOAT_DTYPE, pa.float32()),
        column("content", [_json_text(c.content) for c in calls]),
    ]
    return pa.StructArray.from_arrays(children, fields=list(CALL_TYPE))


def _agents_array(agents: list[Agent]) -> pa.StructArray:
    def column(name: str, values: list[Any]) -> pa.Array:
        return pa.array(values, type=AGENT_TYPE.field(name).type)

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

    def column(name: str, values: list[Any]) -> pa.Array:
        return pa.array(values, type=SCHEMA.field(name).type)

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
    by `close()`, so a crash leaves either the previous file or none, never a broken one.
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
        self._partial = self.path.with_name(self.path.name + ".partial")
        if self.path.suffix == PARQUET_SUFFIX:
            # Token ids are near-random: dictionaries and min/max statistics cost time and
            # save nothing; large pages keep the per-page work of decoding small.
            self._writer: Any = pq.ParquetWriter(
                self._partial,
                SCHEMA,
                compression=compression,
                use_dictionary=False,
                write_statistics=False,
                data_page_size=PARQUET_PAGE_BYTES,
            )
        else:
            self._writer = ipc.new_file(self._partial, SCHEMA)

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
        batch = episodes_to_batch(self._pending)
        if isinstance(self._writer, pq.ParquetWriter):
            self._writer.write_batch(batch, row_group_size=batch.num_rows)
        else:
            self._writer.write_batch(batch)
        self._pending = []
        self._pending_tokens = 0

    def close(self) -> None:
        self.sync()
        self._writer.close()
        os.replace(self._partial, self.path)

    def __enter__(self) -> BinaryEpisodeWriter:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self.close()
        else:  # leave no half-written file behind
            self._writer.close()
            self._partial.unlink(missing_ok=True)


def write_binary_episodes(
    path: str | os.PathLike[str], episodes: Iterable[Episode], compression: str = "none"
) -> int:
    """Write episodes to a `.parquet` or `.arrow` file; returns how many were written."""
    with BinaryEpisodeWriter(path, compression=compression) as writer:
        for episode in episodes:
            writer.write(episode)
        return writer.lines


# ---------------------------------------------------------------------------------------------
# Reading


def _file_problem(file: str, message: str) -> InputError:
    return InputError(Problem(message, file=file, kind="malformed"))


def _record_batches(path: str | os.PathLike[str]) -> Iterator[pa.RecordBatch]:
    """The file's record batches, one at a time; Arrow IPC files are memory-mapped."""
    file = str(path)
    try:
        if file.endswith(PARQUET_SUFFIX):
            parquet = pq.ParquetFile(file, memory_map=True)
            schema = parquet.schema_arrow
        else:
            reader = ipc.open_file(pa.memory_map(file, "r"))
            schema = reader.schema
    except (pa.ArrowException, OSError) as error:
        raise _file_problem(file, f"not a readable {Path(file).suffix} file: {error}") from None
    metadata = schema.metadata or {}
    if metadata.get(b"format") != FORMAT.encode() or metadata.get(b"layout") != LAYOUT.encode():
        found = metadata.get(b"format", b"none").decode(errors="replace")
        raise _file_problem(
            file, f"not a callgrove episode file (format {found!r}, expected {FORMAT!r})"
        )
    try:
        if file.endswith(PARQUET_SUFFIX):
            for group in range(parquet.num_row_groups):
                yield from parquet.read_row_group(group).to_batches()
        else:
            for index in range(reader.num_record_batches):
                yield reader.get_batch(index)
    except (pa.ArrowException, OSError) as error:
        raise _file_problem(file, f"unreadable data: {error}") from None


def _relative_offsets(lists: pa.ListArray) -> tuple[list[int], pa.Array]:
    """Offsets into `lists.flatten()` (as Python ints) and that flattened child."""
    offsets = lists.offsets.to_numpy()
    return (offsets - offsets[0]).tolist(), lists.flatten()


class _ListColumn:
    """A list column of one batch as a numpy buffer plus offsets: item i is a view."""

    def __init__(self, lists: pa.ListArray, dtype: type):
        values = lists.values
        self.bad_values = np.zeros(0, dtype=bool)
        if values.null_count:
            self.bad_values = values.is_null().to_numpy(zero_copy_only=False)
            values = values.fill_null(0)
        self.values = values.to_numpy(zero_copy_only=True)
        if self.values.dtype != dtype:
            raise TypeError(f"a list column holds {self.values.dtype}, expected {np.dtype(dtype)}")
        offsets = lists.offsets.to_numpy()
        self.lengths = np.diff(offsets)
        self.starts = offsets[:-1].tolist()
        self.ends = offsets[1:].tolist()
        self.null = lists.is_null().to_numpy(zero_copy_only=False)
        self._offsets = offsets

    def views(self) -> list[np.ndarray | None]:
        """Item i as a view into the buffer, None where the list is null."""
        values = self.values
        return [
            None if null else values[start:end]
            for start, end, null in zip(self.starts, self.ends, self.null.tolist(), strict=True)
        ]

    def items_where(self, bad_values: np.ndarray) -> np.ndarray:
        """Indices of the items that hold a flagged value."""
        positions = np.flatnonzero(bad_values) if bad_values.size else bad_values
        return np.unique(np.searchsorted(self._offsets, positions, side="right") - 1)


class _Calls:
    """Every call of one batch, checked column-wise before any call is built."""

    def __init__(self, calls: pa.StructArray):
        field = calls.field
        self.ids = field("id").to_pylist()
        self.seqs = field("seq").to_pylist()
        self.prompt_from = field("prompt_from").to_pylist()
        self.prompt_from_len = field("prompt_from_len").to_pylist()
        self.policy_versions = field("policy_version").to_pylist()
        self.purposes = field("purpose").to_pylist()
        self.kept = field("kept").to_pylist()
        self.advantage = field("advantage").to_pylist()
        self.content = field("content").to_pylist()
        self.suffix = _ListColumn(field("prompt_suffix_ids"), TOKEN_DTYPE)
        self.completion = _ListColumn(field("completion_ids"), TOKEN_DTYPE)
        self.logprobs = _ListColumn(field("logprobs"), FLOAT_DTYPE)
        self.advantages = _ListColumn(field("advantages"), FLOAT_DTYPE)
        self.problems: dict[int, str] = {}
        self._check()

    def _flag(self, indices: Iterable[int], message: str) -> None:
        for index in indices:
            self.problems.setdefault(int(index), message)

    def _check(self) -> None:
        """Each rule is first checked over the whole batch at once; only a batch that breaks
        it is searched for the calls that do."""
        for name, column in (
            ("prompt_suffix_ids", self.suffix),
            ("completion_ids", self.completion),
        ):
            self._flag(np.flatnonzero(column.null), f"{name} is missing")
            self._flag(column.items_where(column.bad_values), f"{name} holds a null token id")
            if column.values.size and column.values.min() < 0:
                self._flag(
                    column.items_where(column.values < 0), f"{name} holds a negative token id"
                )
        self._flag(
            np.flatnonzero(self.completion.lengths == 0),
            "completion_ids is empty (a call samples at least one token)",
        )
        for name, column in (("logprobs", self.logprobs), ("advantages", self.advantages)):
            wrong = np.flatnonzero(~column.null & (column.lengths != self.completion.lengths))
            for index in wrong:
                self._flag(
                    [index],
                    f"{name} has {column.lengths[index]} values but completion_ids has "
                    f"{self.completion.lengths[index]} tokens",
                )
            finite = np.isfinite(column.values)
            if column.bad_values.any() or not finite.all():
                self._flag(
                    column.items_where(
                        ~finite if not column.bad_values.size else ~finite | column.bad_values
                    ),
                    f"{name} holds a value that is not a finite number",
                )
        purposes_known = set(self.purposes) <= set(PURPOSES)
        prompts_paired = [f is None for f in self.prompt_from] == [
            n is None for n in self.prompt_from_len
        ]
        scalars_fine = all(a is None for a in self.advantage)
        missing = None in self.ids or None in self.seqs or None in self.kept
        if purposes_known and prompts_paired and scalars_fine and not missing:
            return
        for index, purpose in enumerate(self.purposes):
            advantage = self.advantage[index]
            if self.ids[index] is None or self.seqs[index] is None or self.kept[index] is None:
                self._flag([index], "call lacks its id, seq or kept")
            elif purpose not in PURPOSES:
                self._flag(
                    [index], f"purpose is {purpose!r}, expected one of {', '.join(PURPOSES)}"
                )
            elif (self.prompt_from[index] is None) != (self.prompt_from_len[index] is None):
                self._flag([index], "call has only one of prompt_from and prompt_from_len")
            elif advantage is not None and not self.advantages.null[index]:
                self._flag([index], "call has both a scalar and a per-token advantage")
            elif advantage is not None and not np.isfinite(advantage):
                self._flag([index], "advantages is not a finite number")

    def build_all(self) -> list[Call]:
        """Every call of the batch in one pass, its arrays views into the column buffers."""
        completion_views, suffix_views = self.completion.views(), self.suffix.views()
        logprob_views = self.logprobs.views()
        advantages = [
            scalar if scalar is not None else per_token
            for scalar, per_token in zip(self.advantage, self.advantages.views(), strict=True)
        ]
        content = [self._content(i, text) for i, text in enumerate(self.content)]
        return [
            Call(
                id=call_id,
                seq=seq,
                completion_ids=completion,
                prompt_suffix=suffix,
                prompt_base_len=base_len or 0,
                logprobs=logprobs,
                policy_version=version,
                purpose=purpose,
                kept=kept,
                advantages=advantage,
                content=value,
            )
            for call_id, seq, completion, suffix, base_len, logprobs, version, purpose, kept, advantage, value in zip(
                self.ids,
                self.seqs,
                completion_views,
                suffix_views,
                self.prompt_from_len,
                logprob_views,
                self.policy_versions,
                self.purposes,
                self.kept,
                advantages,
                content,
                strict=True,
            )
        ]

    def _content(self, index: int, text: str | None) -> Any:
        try:
            return _decode_json(text)
        except InputError:
            self._flag([index], "content is not valid JSON")
            return None

    def check(self, first: int, end: int) -> None:
        """Raise the first problem of calls `first`..`end - 1` (one episode's calls)."""
        for index in range(first, end):
            if index in self.problems:
                raise InputError(Problem(self.problems[index], call=self.ids[index]))


def _resolve_prompts(calls: list[Call], prompt_from: list[str | None], episode: str) -> None:
    """Point each compact prompt at the earlier call it starts from, as the JSON reader does."""
    if not any(prompt_from):
        return
    by_id = {c.id: c for c in calls}
    for call, source_id in zip(calls, prompt_from, strict=True):
        if source_id is None:
            continue
        source = by_id.get(source_id)
        if source is None or source.seq >= call.seq:
            raise InputError(
                Problem(
                    f"prompt_from names {source_id!r}, which is not an earlier call (lower seq) "
                    "of the episode",
                    episode=episode,
                    call=call.id,
                )
            )
        if not 0 <= call.prompt_base_len <= source.full_len:
            raise InputError(
                Problem(
                    f"prompt_from_len {call.prompt_base_len} is outside [0, {source.full_len}], "
                    f"the length of {source.id!r}'s full sequence",
                    episode=episode,
                    call=call.id,
                )
            )
        if call.prompt_base_len:
            call.prompt_base = source


class _Batch:
    """One record batch, decoded column-wise; `episode(i)` builds row i."""

    def __init__(self, batch: pa.RecordBatch):
        column = batch.column
        self.rows = batch.num_rows
        self.ids = column("id").to_pylist()
        self.groups = column("group").to_pylist()
        self.envs = column("env").to_pylist()
        self.tasks = column("task").to_pylist()
        self.runs = column("run").to_pylist()
        self.oks = column("ok").to_pylist()
        self.errors = column("errors").to_pylist()
        self.rewards = column("rewards").to_pylist()
        self.objectives = column("objective").to_pylist()
        self.gaps = column("gaps").to_pylist()
        self.metas = column("meta").to_pylist()
        self.agent_offsets, agents = _relative_offsets(column("agents"))
        self.agent_ids = agents.field("id").to_pylist()
        self.agent_names = agents.field("name").to_pylist()
        self.agent_parents = agents.field("parent").to_pylist()
        self.agent_starts = agents.field("start").to_pylist()
        self.agent_trainable = agents.field("trainable").to_pylist()
        self.agent_rewards = agents.field("rewards").to_pylist()
        self.agent_metas = agents.field("meta").to_pylist()
        self.call_offsets, calls = _relative_offsets(agents.field("calls"))
        self.calls = _Calls(calls)
        self.built = self.calls.build_all()

    def episode(self, row: int) -> Episode:
        episode_id = self.ids[row]
        if episode_id is None or self.oks[row] is None:
            raise InputError(Problem("episode lacks its id or ok"))
        episode = Episode(
            id=episode_id,
            group=self.groups[row],
            env=None if self.envs[row] is None else WireEnv(**self.envs[row]),
            task=_decode_json(self.tasks[row]),
            run=_run(self.runs[row]),
            ok=self.oks[row],
            errors=[_error(e) for e in self.errors[row] or []],
            rewards=dict(self.rewards[row] or []),
            objective=self.objectives[row],
            gaps=gaps_from_json(_decode_json(self.gaps[row]), episode_id),
            meta=_decode_json(self.metas[row]),
        )
        check_run(episode_id, episode.run, episode.rewards)
        for index in range(self.agent_offsets[row], self.agent_offsets[row + 1]):
            episode.agents.append(self._agent(index, episode_id))
        check_agent_links(episode.agents, episode_id)
        calls = [c for a in episode.agents for c in a.calls]
        check_unique_calls(calls, episode_id)
        first_call = self.call_offsets[self.agent_offsets[row]]
        _resolve_prompts(
            calls, self.calls.prompt_from[first_call : first_call + len(calls)], episode_id
        )
        share_histories(episode.agents)  # full prompts held as the JSON reader holds them
        return episode

    def _agent(self, index: int, episode: str) -> Agent:
        agent_id, start = self.agent_ids[index], self.agent_starts[index]
        if (
            agent_id is None
            or self.agent_names[index] is None
            or self.agent_trainable[index] is None
        ):
            raise InputError(Problem("agent lacks its id, name or trainable", episode=episode))
        if start not in AGENT_STARTS:
            raise InputError(
                Problem(
                    f"agent {agent_id!r} has start {start!r}, expected one of {', '.join(AGENT_STARTS)}",
                    episode=episode,
                )
            )
        rewards = self.agent_rewards[index]
        spawn, meta = split_spawn(_decode_json(self.agent_metas[index]))
        first, end = self.call_offsets[index], self.call_offsets[index + 1]
        self.calls.check(first, end)
        return Agent(
            id=agent_id,
            name=self.agent_names[index],
            parent=self.agent_parents[index],
            start=start,
            trainable=self.agent_trainable[index],
            calls=self.built[first:end],
            rewards=None if rewards is None else dict(rewards),
            meta=meta,
            spawn=spawn,
        )


def _decode_json(text: str | None) -> Any:
    try:
        return None if text is None else msgspec.json.decode(text)
    except msgspec.DecodeError:
        raise InputError(Problem(f"not valid JSON: {text[:40]!r}")) from None


def _run(value: dict[str, Any] | None) -> WireRun | None:
    if value is None:
        return None
    policy = value["policy"]
    return WireRun(
        id=value["id"],
        type=value["type"],
        step=value["step"],
        policy=None if policy is None else WirePolicy(start=policy["start"], end=policy["end"]),
    )


def _error(value: dict[str, Any]) -> WireError:
    return WireError(
        type=value["type"],
        message=value["message"] or "",
        agent=msgspec.UNSET if value["agent"] is None else value["agent"],
        call=msgspec.UNSET if value["call"] is None else value["call"],
    )


def _batch_episodes(
    batch: _Batch, first_row: int, file: str, diagnostics: Diagnostics | None
) -> Iterator[tuple[int, Episode]]:
    for row in range(batch.rows):
        number = first_row + row + 1
        try:
            episode = batch.episode(row)
        except InputError as error:
            located = error.located(file=file, line=number, episode=batch.ids[row])
            if diagnostics is None:
                raise located from None
            diagnostics.add(located.problem)
            continue
        yield number, episode


def read_binary_episodes(
    path: str | os.PathLike[str], diagnostics: Diagnostics | None = None
) -> Iterator[tuple[int, Episode]]:
    """Stream `(row number from 1, Episode)` from a `.parquet` or `.arrow` file.

    Problems are located by file, row (reported as the line), episode and call. Without
    `diagnostics` the first bad episode raises `InputError`; with it, bad episodes are recorded
    and skipped. A file that cannot be opened at all is one problem for the whole file.
    """
    file = str(path)
    first_row = 0
    try:
        for record_batch in _record_batches(path):
            try:
                batch = _Batch(record_batch)
            except (KeyError, TypeError, ValueError, pa.ArrowException) as error:
                raise _file_problem(file, f"columns do not match {LAYOUT}: {error}") from None
            # Hold no reference to this batch while the next one is read: memory stays at
            # one batch (plus whatever episodes the caller keeps).
            del record_batch
            yield from _batch_episodes(batch, first_row, file, diagnostics)
            first_row += batch.rows
            del batch
    except InputError as error:
        if diagnostics is None or error.problem.line is not None:
            raise
        diagnostics.add(error.problem)

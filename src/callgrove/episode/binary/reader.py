"""Reading Parquet and Arrow IPC episode files one record batch at a time.

Each batch's columns become numpy once and every call gets views into those buffers, so a
call's arrays are never copied and memory is bounded by the batch, not the file. The batch's
calls are checked column-wise (`episode.checks`) before any episode is built.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from callgrove.episode.binary.schema import (
    FLOAT_DTYPE,
    JSON_CALL_FIELDS,
    LATER_CALL_COLUMNS,
    LAYOUT,
    PARQUET_SUFFIX,
    SCHEMA,
)
from callgrove.episode.checks import (
    CallColumns,
    ListColumn,
    call_problems,
    check_agents,
    check_routes,
    check_run,
    check_unique_calls,
    fail,
    lacks,
    raise_first,
    resolve_prompts,
)
from callgrove.episode.codec import PLAIN_CALL_FIELDS
from callgrove.episode.provenance import gaps_from_json, split_spawn
from callgrove.episode.record import (
    ROUTE_DTYPE,
    TOKEN_DTYPE,
    Agent,
    Call,
    Episode,
    share_histories,
)
from callgrove.formats.jsonl import report
from callgrove.formats.problems import Diagnostics, InputError, Problem
from callgrove.formats.streams import readable
from callgrove.formats.wire import FORMAT, WireEnv, WireError, WirePolicy, WireRun


def _file_problem(file: str, message: str) -> InputError:
    return InputError(Problem(message, file=file, kind="malformed"))


def _record_batches(
    path: str | os.PathLike[str], diagnostics: Diagnostics | None
) -> Iterator[pa.RecordBatch]:
    """The file's record batches, one at a time; Arrow IPC files are memory-mapped. Columns
    the layout does not have are named (warnings; none are read where they are refused)."""
    file = str(readable(path))
    try:
        if file.endswith(PARQUET_SUFFIX):
            parquet = pq.ParquetFile(file, memory_map=True, page_checksum_verification=True)
            schema = parquet.schema_arrow
        else:
            reader = ipc.open_file(pa.memory_map(file, "r"))
            schema = reader.schema
    except (pa.ArrowException, OSError, ValueError) as error:
        raise _file_problem(file, f"not a readable {Path(file).suffix} file: {error}") from None
    metadata = schema.metadata or {}
    if metadata.get(b"format") != FORMAT.encode() or metadata.get(b"layout") != LAYOUT.encode():
        found = metadata.get(b"format", b"none").decode(errors="replace")
        raise _file_problem(
            file, f"not a callgrove episode file (format {found!r}, expected {FORMAT!r})"
        )
    try:
        wrong = _wrong_columns(schema)
    except ValueError as error:  # field names that are not text
        raise _file_problem(file, f"damaged schema: {error}") from None
    if wrong:
        raise _file_problem(file, f"columns of the wrong type for {LAYOUT}: {'; '.join(wrong)}")
    unknown = [
        Problem(
            f"column {name} is not part of {LAYOUT}; it is not read",
            file=file,
            severity="warning",
            kind="unknown_field",
        )
        for name in schema.names
        if name not in SCHEMA.names
    ]
    for problem in unknown:
        report(InputError(problem), diagnostics)
    if diagnostics is not None and diagnostics.refuses(unknown):
        return
    try:
        if file.endswith(PARQUET_SUFFIX):
            for group in range(parquet.num_row_groups):
                for batch in parquet.read_row_group(group).to_batches():
                    batch.validate(full=True)
                    yield batch
        else:
            for index in range(reader.num_record_batches):
                batch = reader.get_batch(index)
                # Offsets read from a damaged file must be checked before any are followed.
                batch.validate(full=True)
                yield batch
    except (pa.ArrowException, OSError, ValueError) as error:
        raise _file_problem(file, f"unreadable data: {error}") from None


def _wrong_columns(schema: pa.Schema) -> list[str]:
    """Each column whose type differs from the layout's (nullability aside): a `kept` column of
    strings would otherwise read "false" as true."""
    wrong = []
    for expected in SCHEMA:
        index = schema.get_field_index(expected.name)
        if index < 0:
            wrong.append(f"{expected.name} is missing")
        elif not _same_type(schema.field(index).type, expected.type):
            wrong.append(f"{expected.name} is {schema.field(index).type}, expected {expected.type}")
    return wrong


def _same_type(found: pa.DataType, expected: pa.DataType) -> bool:
    """Type equality that ignores whether nested fields are marked nullable (the rows' own
    checks catch nulls where they are not allowed)."""
    if pa.types.is_struct(expected):
        if not pa.types.is_struct(found):
            return False
        names = {f.name for f in found}
        fields = [f for f in expected if f.name in names or f.name not in LATER_CALL_COLUMNS]
        return [f.name for f in found] == [f.name for f in fields] and all(
            _same_type(a.type, b.type) for a, b in zip(found, fields, strict=True)
        )
    if pa.types.is_map(expected):
        return (
            pa.types.is_map(found)
            and _same_type(found.key_type, expected.key_type)
            and _same_type(found.item_type, expected.item_type)
        )
    if pa.types.is_list(expected):
        return pa.types.is_list(found) and _same_type(found.value_type, expected.value_type)
    return found.equals(expected)


def _relative_offsets(lists: pa.ListArray) -> tuple[list[int], pa.Array]:
    """Offsets into `lists.flatten()` (as Python ints) and that flattened child."""
    offsets = lists.offsets.to_numpy()
    return (offsets - offsets[0]).tolist(), lists.flatten()


def _list_column(lists: pa.ListArray, dtype: type) -> ListColumn:
    """A list column as a numpy buffer plus offsets, without copying the values."""
    values = lists.values
    bad_values = None
    if values.null_count:
        bad_values = values.is_null().to_numpy(zero_copy_only=False)
        values = values.fill_null(0)
    array = values.to_numpy(zero_copy_only=True)
    if array.dtype != dtype:
        raise TypeError(f"a list column holds {array.dtype}, expected {np.dtype(dtype)}")
    offsets = lists.offsets.to_numpy()
    return ListColumn(array, offsets, lists.is_null().to_numpy(zero_copy_only=False), bad_values)


def _spans(null: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """How many of the flagged entries (`null`, one per entry) fall within each list of
    `offsets` (absolute into the entries)."""
    counted = np.zeros(len(null) + 1, dtype=np.int64)
    np.cumsum(null, out=counted[1:])
    return counted[offsets[1:]] - counted[offsets[:-1]]


def _routes_column(lists: pa.ListArray) -> tuple[list[np.ndarray | None], dict[int, str]]:
    """Each call's routes as a view shaped (positions, layers, k) into the column's values
    (None where null), and the calls whose lists no such shape holds (a null inside, or
    layers or experts of unequal counts), by index. Checked level by level with numpy: a
    column of nulls costs nothing, and no level is walked token by token in Python.

    A call routed over no position reads back as (0, 0, 0): the lists hold no layers and k
    for it (`_empty_routes` gives it its episode's)."""
    count = len(lists)
    if lists.null_count == count:
        return [None] * count, {}
    null = lists.is_null().to_numpy(zero_copy_only=False)
    layer_lists = lists.values
    expert_lists = layer_lists.values
    leaf = expert_lists.values
    calls = lists.offsets.to_numpy().astype(np.int64)  # into layer_lists
    layer_offsets = layer_lists.offsets.to_numpy().astype(np.int64)  # into expert_lists
    expert_offsets = expert_lists.offsets.to_numpy().astype(np.int64)  # into leaf
    positions = np.diff(calls)
    first = calls[:-1] - calls[0]  # each call's first position, from the column's first
    # The layers of each position, and each call's (its first position's): all must agree.
    layers_of = np.diff(layer_offsets[calls[0] : calls[-1] + 1])
    call_of = np.repeat(np.arange(count), positions)
    layers = np.zeros(count, dtype=np.int64)
    has = positions > 0
    layers[has] = layers_of[first[has]]
    uneven = np.zeros(count, dtype=bool)
    uneven[call_of[layers_of != layers[call_of]]] = True
    # The experts of each layer list, and each call's (its first one's), likewise.
    base = layer_offsets[calls[0]]
    experts_of = np.diff(expert_offsets[base : layer_offsets[calls[-1]] + 1])
    call_of_layer = np.repeat(call_of, layers_of)
    experts = np.zeros(count, dtype=np.int64)
    has &= layers > 0
    experts[has] = experts_of[layer_offsets[calls[:-1]][has] - base]
    uneven[call_of_layer[experts_of != experts[call_of_layer]]] = True
    starts = expert_offsets[layer_offsets[calls]]  # each call's values, into leaf
    holes = np.zeros(count, dtype=bool)
    for level, offsets in (
        (layer_lists, calls),
        (expert_lists, layer_offsets[calls]),
        (leaf, starts),
    ):
        if level.null_count:
            holes |= _spans(level.is_null().to_numpy(zero_copy_only=False), offsets) > 0
    if leaf.null_count:
        leaf = leaf.fill_null(0)
    values = leaf.to_numpy(zero_copy_only=True)
    if values.dtype != ROUTE_DTYPE:
        raise TypeError(f"routes hold {values.dtype}, expected {np.dtype(ROUTE_DTYPE)}")
    problems: dict[int, str] = {}
    for index in np.flatnonzero(holes & ~null).tolist():
        problems[index] = "routes hold a null"
    for index in np.flatnonzero(uneven & ~null).tolist():
        problems.setdefault(index, "routes hold positions or layers of unequal lengths")
    routes: list[np.ndarray | None] = [None] * count
    good = ~null & ~holes & ~uneven
    for index, start, n, per, k in zip(
        np.flatnonzero(good).tolist(),
        starts[:-1][good].tolist(),
        positions[good].tolist(),
        layers[good].tolist(),
        experts[good].tolist(),
        strict=True,
    ):
        routes[index] = values[start : start + n * per * k].reshape(n, per, k)
    return routes, problems


def _empty_routes(calls: list[Call]) -> None:
    """Routes over no position, read as (0, 0, 0), given the layers and k of the episode's
    other routes (when none has any, they stay so: nothing tells them)."""
    empty = [c for c in calls if c.routes is not None and not len(c.routes)]
    if not empty:
        return
    shape = next(
        (c.routes.shape[1:] for c in calls if c.routes is not None and len(c.routes)), None
    )
    if shape is not None:
        for call in empty:
            call.routes = np.empty((0, *shape), dtype=ROUTE_DTYPE)


def _values(column: pa.Array) -> list[Any]:
    """A column's values as Python objects; one without nulls goes through numpy, which is
    several times quicker for numbers and flags."""
    if column.null_count or not (
        pa.types.is_integer(column.type)
        or pa.types.is_floating(column.type)
        or pa.types.is_boolean(column.type)
    ):
        return column.to_pylist()
    return column.to_numpy(zero_copy_only=False).tolist()


class _Calls:
    """Every call of one batch, checked column-wise before any call is built."""

    def __init__(self, calls: pa.StructArray):
        field = calls.field
        self.calls_type, self.count = calls.type, len(calls)
        self.prompt_from = field("prompt_from").to_pylist()
        self.prompt_from_len = _values(field("prompt_from_len"))
        self.problems: dict[int, str] = {}
        self.plain = {info.name: self._plain(field, info.name) for info in PLAIN_CALL_FIELDS}
        self.columns = CallColumns(
            ids=field("id").to_pylist(),
            seqs=_values(field("seq")),
            policy_versions=self.plain["policy_version"],
            purposes=self.plain["purpose"],
            kept=self.plain["kept"],
            advantage=_values(field("advantage")),
            prompt_suffix_ids=_list_column(field("prompt_suffix_ids"), TOKEN_DTYPE),
            completion_ids=_list_column(field("completion_ids"), TOKEN_DTYPE),
            logprobs=_list_column(field("logprobs"), FLOAT_DTYPE),
            advantages=_list_column(field("advantages"), FLOAT_DTYPE),
            sampling=self.plain["sampling"],
        )
        for index, problem in call_problems(self.columns).items():
            self.problems.setdefault(index, problem)
        half = field("prompt_from").is_null().to_numpy(zero_copy_only=False) != field(
            "prompt_from_len"
        ).is_null().to_numpy(zero_copy_only=False)
        for index in np.flatnonzero(half).tolist():
            self.problems.setdefault(index, "call has only one of prompt_from and prompt_from_len")
        self.routes, self.routes_from, self.routed = self._routes(field)

    def _routes(self, field: Any) -> tuple[list[np.ndarray | None], list[int], bool]:
        """Each call's `routes` and `routes_from`: None and 0 throughout in a file written
        before the columns existed; and whether any call holds either (none: the episodes'
        routes need no check, and cost nothing)."""
        routes: list[np.ndarray | None] = [None] * self.count
        routed = False
        if self.calls_type.get_field_index("routes") >= 0:
            column = field("routes")
            routed = column.null_count < len(column)
            if routed:
                routes, problems = _routes_column(column)
                for index, problem in problems.items():
                    self.problems.setdefault(index, problem)
        if self.calls_type.get_field_index("routes_from") < 0:
            return routes, [0] * self.count, routed
        column = field("routes_from")
        if column.null_count:
            column = column.fill_null(0)
        starts = column.to_numpy(zero_copy_only=False)
        return routes, starts.tolist(), routed or bool(starts.any())

    def build_all(self) -> list[Call]:
        """Every call of the batch in one pass, its arrays views into the column buffers."""
        columns = self.columns
        advantages = [
            scalar if scalar is not None else per_token
            for scalar, per_token in zip(columns.advantage, columns.advantages.views(), strict=True)
        ]
        rows = zip(
            columns.ids,
            columns.seqs,
            columns.completion_ids.views(),
            columns.prompt_suffix_ids.views(),
            self.prompt_from_len,
            columns.logprobs.views(),
            advantages,
            self.routes,
            self.routes_from,
            strict=True,
        )
        calls = [
            Call(
                id=call_id,
                seq=seq,
                completion_ids=sampled,
                prompt_suffix=suffix,
                prompt_from_len=base_len or 0,
                logprobs=logprobs,
                advantages=advantage,
                routes=routes,
                routes_from=start,
            )
            for call_id, seq, sampled, suffix, base_len, logprobs, advantage, routes, start in rows
        ]
        # The plain fields column by column: no per-call dict of them.
        for name, values in self.plain.items():
            for call, value in zip(calls, values, strict=True):
                setattr(call, name, value)
        return calls

    def _plain(self, field: Any, name: str) -> list[Any]:
        if name in LATER_CALL_COLUMNS and self.calls_type.get_field_index(name) < 0:
            return [None] * self.count  # a file written before the column existed
        column = field(name)
        if name not in JSON_CALL_FIELDS:
            return _values(column)
        if column.null_count == len(column):
            return [None] * len(column)
        decoded = []
        for index, text in enumerate(column.to_pylist()):
            try:
                decoded.append(_decode_json(text))
            except InputError:
                self.problems.setdefault(index, f"{name} is not valid JSON")
                decoded.append(None)
        return decoded


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
        self.agents_null = column("agents").is_null().to_pylist()
        self.agent_offsets, agents = _relative_offsets(column("agents"))
        self.agent_ids = agents.field("id").to_pylist()
        self.agent_names = agents.field("name").to_pylist()
        self.agent_parents = agents.field("parent").to_pylist()
        self.agent_starts = agents.field("start").to_pylist()
        self.agent_trainable = agents.field("trainable").to_pylist()
        self.agent_rewards = agents.field("rewards").to_pylist()
        self.agent_metas = agents.field("meta").to_pylist()
        self.calls_null = agents.field("calls").is_null().to_pylist()
        self.call_offsets, calls = _relative_offsets(agents.field("calls"))
        self.calls = _Calls(calls)
        self.built = self.calls.build_all()

    def episode(self, row: int) -> Episode:
        episode_id = self.ids[row]
        # Columns that hold no nulls in a sound file: a null is a field the record lacks.
        values = {"id": episode_id, "ok": self.oks[row], "errors": self.errors[row]}
        values |= {"rewards": self.rewards[row], "agents": not self.agents_null[row] or None}
        gone = [name for name, value in values.items() if value is None]
        if gone:
            raise InputError(Problem(lacks("episode", gone), episode=episode_id))
        episode = Episode(
            id=episode_id,
            group=self.groups[row],
            env=None if self.envs[row] is None else WireEnv(**self.envs[row]),
            task=_decode_json(self.tasks[row]),
            run=_run(self.runs[row]),
            ok=self.oks[row],
            errors=[_error(e, index) for index, e in enumerate(self.errors[row])],
            rewards=dict(self.rewards[row]),
            objective=self.objectives[row],
            gaps=gaps_from_json(_decode_json(self.gaps[row]), episode_id),
            meta=_decode_json(self.metas[row]),
        )
        check_run(episode_id, episode.run, episode.rewards)
        for index in range(self.agent_offsets[row], self.agent_offsets[row + 1]):
            episode.agents.append(self._agent(index, episode_id))
        check_agents(episode.agents, episode_id)
        calls = [c for a in episode.agents for c in a.calls]
        check_unique_calls(calls, episode_id)
        first_call = self.call_offsets[self.agent_offsets[row]]
        resolve_prompts(
            calls, self.calls.prompt_from[first_call : first_call + len(calls)], episode_id
        )
        if self.calls.routed:
            _empty_routes(calls)
            check_routes(calls, episode_id)
        share_histories(episode.agents)  # full prompts held as the JSON reader holds them
        return episode

    def _agent(self, index: int, episode: str) -> Agent:
        agent_id, start = self.agent_ids[index], self.agent_starts[index]
        values = {"id": agent_id, "name": self.agent_names[index], "start": start}
        values |= {
            "trainable": self.agent_trainable[index],
            "calls": not self.calls_null[index] or None,
        }
        gone = [name for name, value in values.items() if value is None]
        if gone:
            raise fail(lacks("agent" if agent_id is None else f"agent {agent_id!r}", gone), episode)
        rewards = self.agent_rewards[index]
        spawn, meta = split_spawn(_decode_json(self.agent_metas[index]))
        first, end = self.call_offsets[index], self.call_offsets[index + 1]
        raise_first(self.calls.problems, self.calls.columns.ids, first, end)
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


def _require(value: dict[str, Any], names: tuple[str, ...], subject: str) -> None:
    """Fields of a nested part that hold no nulls in a sound file."""
    gone = [name for name in names if value[name] is None]
    if gone:
        raise fail(lacks(subject, gone), None)


def _run(value: dict[str, Any] | None) -> WireRun | None:
    if value is None:
        return None
    _require(value, ("type",), "run")
    policy = value["policy"]
    if policy is not None:
        _require(policy, ("start", "end"), "run.policy")
    return WireRun(
        id=value["id"],
        type=value["type"],
        step=value["step"],
        policy=None if policy is None else WirePolicy(start=policy["start"], end=policy["end"]),
    )


def _error(value: dict[str, Any], index: int) -> WireError:
    _require(value, ("type", "message"), f"errors[{index}]")
    return WireError(
        type=value["type"],
        message=value["message"],
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
            where = {"file": file, "line": number, "episode": batch.ids[row]}
            located = error.located(**where, group=batch.groups[row])
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
        for record_batch in _record_batches(path, diagnostics):
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

"""Samples: one per row, every per-token array a trainer needs, plus where the row came from.

A sample is built from a row and the advantages credit wrote onto its calls. A call that has
loss tokens in the row but no advantage (`None`) is an error naming the episode, row and call:
an unassigned advantage never turns into zeros on the way to the trainer. Rows of supervised
episodes (`objective: supervised`, imported transcripts) are the exception: their samples carry
the loss mask and no advantages (`None`), for a cross-entropy loss.

Samples go to files (`write_samples`, read back by `read_samples`) in three forms, told by the
file's suffix: Parquet and Arrow IPC (one table row per sample, per-token arrays as list
columns, `SAMPLE_SCHEMA`) and JSON Lines (one object per sample under the same names, NaN as
`null`); and to torch tensors (torch is the optional `train` extra and is imported only when
asked for).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_type_hints

import msgspec
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from callgrove.episode import TOKEN_DTYPE, Call, Episode
from callgrove.episode.record import NO_ROUTE, ROUTE_DTYPE
from callgrove.errors import InvalidValue
from callgrove.formats.problems import InputError, Problem
from callgrove.formats.wire import SAMPLING_KEYS
from callgrove.rows import EpisodeRows, Row
from callgrove.rows.columns import RowColumns

if TYPE_CHECKING:
    import torch

MASK_DTYPE = np.uint8
VALUE_DTYPE = np.float32  # logprobs and advantages, as trainers take them
POSITION_DTYPE = np.int32
VERSION_DTYPE = np.int32
NO_VERSION = -1  # prompt tokens, and completions of calls that recorded no policy version
TOP_K_DTYPE = np.int32
NO_TOP_K = 0  # no top-k cut

# The distribution of a completion token, per field: the keys of a call's `sampling`
# (`SAMPLING_KEYS`, in their order: the loss stacks them so).
SAMPLING_FIELDS = dict(zip(("temperatures", "top_p", "top_k"), SAMPLING_KEYS, strict=True))
# Per-token arrays in the order samples, Parquet files and micro-batches list them.
TOKEN_FIELDS = (
    "token_ids",
    "loss_mask",
    "logprobs",
    "advantages",
    "position_ids",
    "policy_versions",
    *SAMPLING_FIELDS,
)
FIELD_DTYPES = {
    "token_ids": TOKEN_DTYPE,
    "loss_mask": MASK_DTYPE,
    "logprobs": VALUE_DTYPE,
    "advantages": VALUE_DTYPE,
    "position_ids": POSITION_DTYPE,
    "policy_versions": VERSION_DTYPE,
    "temperatures": VALUE_DTYPE,
    "top_p": VALUE_DTYPE,
    "top_k": TOP_K_DTYPE,
}
# What a per-token field holds on tokens nothing sampled (prompt tokens, padding): the untouched
# distribution, never scored.
UNSAMPLED = {"policy_versions": NO_VERSION, "temperatures": 1.0, "top_p": 1.0, "top_k": NO_TOP_K}
# ... and on the completion tokens of a call that recorded no `sampling` (unknown): the
# learner scores these with the run's own settings (`fill_unknown_sampling`), never a guess.
UNKNOWN_SAMPLING = {"temperatures": np.nan, "top_p": np.nan, "top_k": NO_TOP_K}


@dataclass(slots=True, eq=False)
class Sample:
    """One row as a trainer takes it.

    Per token: `token_ids`, `loss_mask` (1 on the completion tokens the row trains),
    `logprobs` (sampling logprobs on the mask, 0 off it; None when a call the row trains
    recorded none, so no importance ratio can be formed), `advantages` (each trained call's
    advantage on its loss tokens, 0 off the mask; None for a supervised episode's row, which
    trains by cross-entropy), `position_ids` (0, 1, ...) and
    `policy_versions` (the version that sampled each completion token, `NO_VERSION` on prompt
    tokens and where none was recorded), and the distribution each completion token was
    sampled from, from its call's `sampling`: `temperatures`, `top_p` and `top_k` (`NO_TOP_K`:
    no top-k cut); NaN temperature and top-p where the call recorded none (unknown), 1, 1 and
    no cut on prompt tokens. Metadata: the episode and group, the leaf agent's id
    and seat (its name), the row index within the episode, the leaf call's id, the root call's
    id (rows with the same episode and root share a call tree), the row reward (docs/episode-format.md, rows) and
    the row it duplicates, if any. A mixture of experts' samples carry `routes`, (tokens,
    layers, k), what each token was routed through when sampled (`NO_ROUTE` for the last);
    None for a dense model's.

    Samples built together hold views into shared arrays (`position_ids` into one read-only
    `arange`); copy an array before changing it in place.
    """

    token_ids: np.ndarray
    loss_mask: np.ndarray
    logprobs: np.ndarray | None
    advantages: np.ndarray | None
    position_ids: np.ndarray
    policy_versions: np.ndarray
    temperatures: np.ndarray
    top_p: np.ndarray
    top_k: np.ndarray
    episode: str
    group: str | None
    agent: str
    seat: str
    row: int
    leaf: str
    root: str
    reward: float
    duplicate_of: int | None = None
    routes: np.ndarray | None = None  # (tokens, layers, k) of a mixture of experts, or None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_loss_tokens(self) -> int:
        return int(np.count_nonzero(self.loss_mask))

    def arrays(self) -> dict[str, np.ndarray | None]:
        return {name: getattr(self, name) for name in TOKEN_FIELDS}

    def __repr__(self) -> str:
        return (
            f"Sample(episode={self.episode!r}, row={self.row}, leaf={self.leaf!r}, "
            f"tokens={self.num_tokens}, loss_tokens={self.num_loss_tokens}, reward={self.reward:g})"
        )

    def to_torch(self) -> dict[str, torch.Tensor | None]:
        """The per-token arrays as 1-D tensors sharing memory with the sample."""
        return arrays_to_torch(self.arrays())


ROUTES = "routes"  # per token, but (tokens, layers, k): a field of its own in every form
METADATA_FIELDS = tuple(
    f.name for f in fields(Sample) if f.name not in TOKEN_FIELDS and f.name != ROUTES
)


def build_samples(episode_rows: EpisodeRows | Sequence[EpisodeRows]) -> list[Sample]:
    """One sample per row, episode by episode and row by row.

    Raises `InputError` naming the episode, row and call if a call with loss tokens in a row
    has no advantage. All the rows given are laid out together (`RowColumns`): each per-token
    field is computed for every row in a few numpy operations into one array, and each sample
    holds views into it. Passing a whole step's episodes at once is fastest (large arrays, few
    allocations).
    """
    parts = [episode_rows] if isinstance(episode_rows, EpisodeRows) else list(episode_rows)
    rows = [row for part in parts for row in part.rows]
    if not rows:
        return []
    return _build(rows, RowColumns.of(parts))


def sample_from_row(episode_rows: EpisodeRows, row: Row) -> Sample:
    """The sample of one of `episode_rows`' rows (`build_samples` is faster for all of them)."""
    episode_rows.index_of(row)
    (sample,) = _build([row], RowColumns.of([replace(episode_rows, rows=[row])]))
    return sample


def _build(rows: Sequence[Row], columns: RowColumns) -> list[Sample]:
    depths = np.diff(columns.walk_bounds)
    supervised = np.fromiter((row.episode.supervised for row in rows), bool, len(rows))
    walk_call = columns.walk_call
    needs_advantage = columns.walk_loss & ~np.repeat(supervised, depths)
    calls = columns.calls
    missing = np.fromiter((c.advantages is None for c in calls), bool, len(calls))
    unassigned = np.flatnonzero(needs_advantage & missing[walk_call])
    if unassigned.size:
        row_number = int(np.searchsorted(columns.walk_bounds, unassigned[0], side="right")) - 1
        raise _missing_advantage(rows[row_number], calls[int(walk_call[unassigned[0]])].id)
    advantages = columns.values("advantages", VALUE_DTYPE)
    logprobs = columns.values("logprobs", VALUE_DTYPE)
    no_logprobs = columns.owned_without("logprobs")
    per_call = {
        "policy_versions": [
            NO_VERSION if c.policy_version is None else c.policy_version for c in calls
        ],
        **_sampling_per_call(calls),
    }
    segment_lengths = columns.segment_lengths()
    versions, temperatures, top_p, top_k = (
        _on_completions(columns.walk_call, segment_lengths, values, name)
        for name, values in per_call.items()
    )
    bounds = columns.row_bounds
    positions = _positions(int(np.diff(bounds).max()))
    token_ids, loss_mask = columns.token_ids, columns.loss_mask
    samples = []
    for row, first, last, is_supervised, without_logprobs in zip(
        rows,
        bounds[:-1].tolist(),
        bounds[1:].tolist(),
        supervised.tolist(),
        no_logprobs.tolist(),
        strict=True,
    ):
        episode, path = row.episode, row.path
        leaf = path[-1]
        agent = episode.agents[leaf.agent_index]  # checked by the layout (`RowColumns`)
        samples.append(
            Sample(
                token_ids=token_ids[first:last],
                loss_mask=loss_mask[first:last],
                logprobs=None if without_logprobs else logprobs[first:last],
                advantages=None if is_supervised else advantages[first:last],
                position_ids=positions[: last - first],
                policy_versions=versions[first:last],
                temperatures=temperatures[first:last],
                top_p=top_p[first:last],
                top_k=top_k[first:last],
                episode=episode.id,
                group=episode.group,
                agent=agent.id,
                seat=agent.name,
                row=row.index,
                leaf=leaf.id,
                root=path[0].id,
                reward=float(row.reward),
                duplicate_of=row.duplicate_of,
                routes=row_routes(episode, leaf),
            )
        )
    return samples


def row_routes(episode: Episode, leaf: Call) -> np.ndarray | None:
    """A row's routes, one per token: its leaf's (the forest holds them equal to every call's
    on the way, `forest.build`), then `NO_ROUTE` for the last token, which no forward took."""
    routes = episode.routes(leaf)
    if routes is None:
        return None
    last = np.full((1, *routes.shape[1:]), NO_ROUTE, dtype=ROUTE_DTYPE)
    return np.concatenate([routes, last])


def _sampling_per_call(calls: Sequence[Call]) -> dict[str, tuple]:
    """Each call's temperature, top-p and top-k (`UNKNOWN_SAMPLING` where it recorded none)."""
    unknown = tuple(UNKNOWN_SAMPLING.values())
    per_call = [
        unknown
        if (s := c.sampling) is None
        else (s["temperature"], s["top_p"], s.get("top_k") or NO_TOP_K)  # null: no cut
        for c in calls
    ]
    columns = tuple(zip(*per_call, strict=True)) or ((),) * len(SAMPLING_FIELDS)
    return dict(zip(SAMPLING_FIELDS, columns, strict=True))


def _on_completions(
    walk_call: np.ndarray, segment_lengths: np.ndarray, per_call: Any, name: str
) -> np.ndarray:
    """A per-call value of field `name` on each row token of the call's completion, the
    unsampled fill on prompt tokens: each walk pair adds two segments to its row
    (`RowColumns.segment_lengths`)."""
    dtype = FIELD_DTYPES[name]
    values = np.asarray(per_call, dtype=dtype)
    segments = np.full(2 * len(walk_call), UNSAMPLED[name], dtype=dtype)
    segments[1::2] = values[walk_call]
    return np.repeat(segments, segment_lengths)


def fill_unknown_sampling(
    samples: Sequence[Sample], temperature: float, top_p: float, top_k: int | None = None
) -> int:
    """Give the completion tokens whose call recorded no `sampling` these settings (a run's
    own, which a learner then scores them with); returns how many tokens were filled. The
    samples' arrays are changed in place where they are writable (views into arrays built
    for them); a read-only one (a column read from Parquet or Arrow) is replaced by a copy."""
    filled = 0
    for sample in samples:
        unknown = np.isnan(sample.temperatures)
        if unknown.any():
            fills = {
                "temperatures": temperature,
                "top_p": top_p,
                "top_k": NO_TOP_K if top_k is None else top_k,
            }
            for name, value in fills.items():
                array = getattr(sample, name)
                if not array.flags.writeable:
                    array = array.copy()
                    setattr(sample, name, array)
                array[unknown] = value
            filled += int(unknown.sum())
    return filled


_position_buffer = np.zeros(0, dtype=POSITION_DTYPE)


def _positions(length: int) -> np.ndarray:
    """A read-only `arange(length)` view, shared by every sample (positions never change)."""
    global _position_buffer
    if len(_position_buffer) < length:
        _position_buffer = np.arange(max(length, 2 * len(_position_buffer)), dtype=POSITION_DTYPE)
        _position_buffer.flags.writeable = False
    return _position_buffer[:length]


def _missing_advantage(row: Row, call_id: str) -> InputError:
    reason = (
        "the episode did not complete (ok false), so credit gives it none"
        if not row.episode.ok
        else "run credit.finalize_group on its group first"
    )
    message = f"row {row.index}: the call has loss tokens in this row but no advantage ({reason})"
    return InputError(Problem(message, episode=row.episode.id, call=call_id))


# Files ---------------------------------------------------------------------------------------

_NULLABLE = ("logprobs", "advantages")  # samples without them: transcripts, supervised rows
_ARROW_TYPES = {name: pa.from_numpy_dtype(dtype) for name, dtype in FIELD_DTYPES.items()}
_METADATA_SCHEMA = [
    pa.field("episode", pa.string(), nullable=False),
    pa.field("group", pa.string()),
    pa.field("agent", pa.string(), nullable=False),
    pa.field("seat", pa.string(), nullable=False),
    pa.field("row", pa.int32(), nullable=False),
    pa.field("leaf", pa.string(), nullable=False),
    pa.field("root", pa.string(), nullable=False),
    pa.field("reward", pa.float64(), nullable=False),
    pa.field("duplicate_of", pa.int32()),
]
SAMPLE_SCHEMA = pa.schema(
    [
        *_METADATA_SCHEMA,
        *(
            pa.field(name, pa.list_(_ARROW_TYPES[name]), nullable=name in _NULLABLE)
            for name in TOKEN_FIELDS
        ),
        # per sample, per token, per MoE layer, the experts: null for a dense model's samples
        pa.field(ROUTES, pa.list_(pa.list_(pa.list_(pa.from_numpy_dtype(ROUTE_DTYPE))))),
    ]
)
_MAX_BATCH_TOKENS = 2**30  # list offsets are int32: keep each record batch well inside them


def samples_to_table(samples: Sequence[Sample]) -> pa.Table:
    """The samples as an Arrow table with `SAMPLE_SCHEMA` (one table row per sample)."""
    batches = [_record_batch(chunk) for chunk in _token_bounded_chunks(samples)]
    return pa.Table.from_batches(batches, schema=SAMPLE_SCHEMA)


# The forms a samples file takes, by its name's suffix.
SAMPLE_FORMS = {".parquet": "parquet", ".arrow": "arrow", ".jsonl": "jsonl"}


def sample_form(path: str | Path) -> str:
    """The form of samples file `path`, from its suffix; an `InvalidValue` naming it otherwise."""
    form = SAMPLE_FORMS.get(Path(path).suffix)
    if form is None:
        raise InvalidValue(f"{path}: a samples file ends in {', '.join(SAMPLE_FORMS)}")
    return form


def write_samples(
    path: str | Path,
    samples: Sequence[Sample],
    compression: str = "zstd",
    form: str | None = None,
) -> None:
    """Write `samples` to `path` as Parquet, Arrow IPC or JSON Lines: `form`, or the one its
    suffix names (`SAMPLE_FORMS`). `compression` is Parquet's."""
    form = form or sample_form(path)
    if form == "parquet":
        pq.write_table(samples_to_table(samples), path, compression=compression)
    elif form == "arrow":
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, SAMPLE_SCHEMA) as writer:
            for chunk in _token_bounded_chunks(samples):
                writer.write_batch(_record_batch(chunk))
    elif form == "jsonl":
        with open(path, "wb") as stream:
            for sample in samples:
                stream.write(orjson.dumps(_sample_line(sample), option=_JSON_OPTIONS) + b"\n")
    else:
        raise InvalidValue(f"no samples form {form!r}: one of {', '.join(SAMPLE_FORMS.values())}")


def read_samples(path: str | Path) -> list[Sample]:
    """The samples of a file `write_samples` (or `callgrove samples`) wrote, in its form:
    Parquet, Arrow IPC or JSON Lines, told by the suffix.

    Each sample comes back with the arrays `build_samples` gave it (the same dtypes; NaN
    temperatures and top-p where a call recorded no sampling, `None` logprobs or advantages
    where the sample had none). A file that is not a samples file, a bad line or a sample
    whose per-token arrays differ in length raises `InputError` naming the file, the line
    (the row, from 1, in the binary forms) and the episode."""
    form, file = sample_form(path), str(path)
    if Path(path).is_dir():
        raise InputError(Problem("not a samples file: a folder", file=file))
    if form == "jsonl":
        samples = list(_read_jsonl(file))
    else:
        try:
            if form == "parquet":
                _check_columns(pq.read_schema(path))
                table = pq.read_table(path, schema=SAMPLE_SCHEMA)
            else:
                with pa.memory_map(file) as source:
                    table = pa.ipc.open_file(source).read_all()
                if ROUTES not in table.schema.names:  # written before samples carried routes
                    table = table.append_column(
                        SAMPLE_SCHEMA.field(ROUTES),
                        pa.nulls(len(table), SAMPLE_SCHEMA.field(ROUTES).type),
                    )
                if not table.schema.equals(SAMPLE_SCHEMA):
                    raise pa.ArrowInvalid(f"its schema is not the samples schema: {table.schema}")
        except (pa.ArrowException, OSError) as error:
            raise InputError(Problem(f"not a samples file ({error})", file=file)) from None
        samples = samples_from_table(table)
    for number, sample in enumerate(samples, start=1):
        _check_lengths(sample, file, number)
    return samples


def _check_columns(schema: pa.Schema) -> None:
    """Refuse a Parquet file that lacks a samples column (a rows or episodes file, say): read
    with the samples schema, its missing columns would come back as nulls. `routes` may be
    missing (files written before samples carried them): no sample of it has any."""
    missing = [name for name in SAMPLE_SCHEMA.names if name not in schema.names and name != ROUTES]
    if missing:
        raise pa.ArrowInvalid(
            f"it has no {', '.join(missing)} column{'s' if len(missing) > 1 else ''} "
            "(a rows or episodes file? `callgrove samples` writes samples)"
        )


_JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY  # NaN (unknown sampling) is written as null


def _sample_line(sample: Sample) -> dict[str, Any]:
    return {name: getattr(sample, name) for name in (*METADATA_FIELDS, *TOKEN_FIELDS, ROUTES)}


def _line_type() -> type[msgspec.Struct]:
    """A JSON Lines sample as msgspec checks it: the metadata as `Sample` types it, each
    per-token field a list of its dtype's numbers (null only where NaN may stand), the whole
    list null only where `Sample` allows `None`."""
    hints = get_type_hints(Sample)
    columns: list[tuple[str, Any]] = [(name, hints[name]) for name in METADATA_FIELDS]
    for name in TOKEN_FIELDS:
        number: Any = int if np.issubdtype(FIELD_DTYPES[name], np.integer) else float
        if name in SAMPLING_FIELDS and number is float:
            number = number | None
        values: Any = list[number]  # type: ignore[valid-type]
        columns.append((name, values | None if name in _NULLABLE else values))
    columns.append((ROUTES, list[list[list[int]]] | None, None))
    return msgspec.defstruct("SampleLine", columns, forbid_unknown_fields=True)


def _read_jsonl(file: str) -> Iterator[Sample]:
    decoder = msgspec.json.Decoder(_line_type())
    with open(file, "rb") as stream:
        for number, line in enumerate(stream, start=1):
            if not line.strip():
                continue
            try:
                record = decoder.decode(line)
            except msgspec.DecodeError as error:
                raise InputError(
                    Problem(f"not a sample: {error}", file=file, line=number)
                ) from None
            values = {name: getattr(record, name) for name in METADATA_FIELDS}
            try:
                for name in TOKEN_FIELDS:
                    listed = getattr(record, name)
                    values[name] = (
                        None if listed is None else np.array(listed, dtype=FIELD_DTYPES[name])
                    )
                values[ROUTES] = _routes_array(record.routes)
            except (OverflowError, ValueError) as error:
                problem = Problem(
                    f"{name}: {error}", file=file, line=number, episode=record.episode
                )
                raise InputError(problem) from None
            yield Sample(**values)


def _routes_array(listed: list | None) -> np.ndarray | None:
    if listed is None:
        return None
    routes = np.array(listed, dtype=ROUTE_DTYPE)
    if routes.ndim != 3:
        raise InvalidValue(
            f"routes must be tokens x layers x experts, not of shape {list(routes.shape)}"
        )
    return routes


def _check_lengths(sample: Sample, file: str, line: int) -> None:
    lengths = {name: len(array) for name, array in sample.arrays().items() if array is not None}
    if sample.routes is not None:
        lengths[ROUTES] = len(sample.routes)
    if len(set(lengths.values())) > 1:
        shown = ", ".join(f"{name} {length}" for name, length in lengths.items())
        message = f"row {sample.row}: per-token arrays of different lengths ({shown})"
        raise InputError(Problem(message, file=file, line=line, episode=sample.episode))


def samples_from_table(table: pa.Table) -> list[Sample]:
    """Samples back from a table with `SAMPLE_SCHEMA`; per-token arrays are views into it."""
    samples: list[Sample] = []
    for batch in table.to_batches():
        metadata = {name: batch.column(name).to_pylist() for name in METADATA_FIELDS}
        per_token = {name: _split_list_column(batch.column(name)) for name in TOKEN_FIELDS}
        per_token[ROUTES] = _split_routes(batch.column(ROUTES))
        for i in range(batch.num_rows):
            values = {name: column[i] for name, column in per_token.items()}
            values.update((name, column[i]) for name, column in metadata.items())
            samples.append(Sample(**values))
    return samples


def _token_bounded_chunks(samples: Sequence[Sample]) -> Iterator[Sequence[Sample]]:
    start = tokens = 0
    for i, sample in enumerate(samples):
        if tokens and tokens + sample.num_tokens > _MAX_BATCH_TOKENS:
            yield samples[start:i]
            start, tokens = i, 0
        tokens += sample.num_tokens
    yield samples[start:]


def _record_batch(samples: Sequence[Sample]) -> pa.RecordBatch:
    lengths = np.fromiter((s.num_tokens for s in samples), dtype=np.int64, count=len(samples))
    offsets = np.zeros(len(samples) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    columns: list[pa.Array] = [
        pa.array([getattr(s, f.name) for s in samples], type=f.type) for f in _METADATA_SCHEMA
    ]
    for name in TOKEN_FIELDS:
        columns.append(_list_column(name, [getattr(s, name) for s in samples], offsets))
    columns.append(_routes_column([s.routes for s in samples]))
    return pa.RecordBatch.from_arrays(columns, schema=SAMPLE_SCHEMA)


def _routes_column(routes: list[np.ndarray | None]) -> pa.Array:
    """Routes as lists of tokens of layers of experts (a null for a sample without)."""
    kind = SAMPLE_SCHEMA.field(ROUTES).type
    held = [r for r in routes if r is not None]
    if not held:
        return pa.nulls(len(routes), kind)
    layers, k = held[0].shape[1:]
    if any(r.shape[1:] != (layers, k) for r in held):
        raise InvalidValue("samples of one file route through different layers or experts")
    tokens = np.zeros(len(routes) + 1, dtype=np.int32)
    np.cumsum([0 if r is None else len(r) for r in routes], out=tokens[1:])
    total = int(tokens[-1])
    inner = pa.ListArray.from_arrays(
        pa.array(np.arange(0, total * layers * k + 1, k, dtype=np.int32)),
        pa.array(np.concatenate([r.reshape(-1) for r in held]).astype(ROUTE_DTYPE)),
    )
    middle = pa.ListArray.from_arrays(
        pa.array(np.arange(0, total * layers + 1, layers, dtype=np.int32)), inner
    )
    missing = pa.array([r is None for r in routes])
    return pa.ListArray.from_arrays(pa.array(tokens), middle, mask=missing)


def _split_routes(column: pa.Array) -> list[np.ndarray | None]:
    """`_routes_column` read back: each sample's (tokens, layers, k) array, or None."""
    missing = column.is_null().to_numpy(zero_copy_only=False)
    if missing.all():
        return [None] * len(column)
    column = column.cast(SAMPLE_SCHEMA.field(ROUTES).type)
    offsets = column.offsets.to_numpy()
    middle = column.values
    layers = int(np.diff(middle.offsets.to_numpy()[:2])[0])
    k = int(np.diff(middle.values.offsets.to_numpy()[:2])[0])
    values = middle.values.values.to_numpy(zero_copy_only=False).reshape(-1, layers, k)
    base = middle.offsets.to_numpy()[0] // layers
    return [
        None if missing[i] else values[offsets[i] - base : offsets[i + 1] - base]
        for i in range(len(column))
    ]


def _list_column(name: str, arrays: list[np.ndarray | None], offsets: np.ndarray) -> pa.Array:
    dtype = FIELD_DTYPES[name]
    missing = np.array([a is None for a in arrays], dtype=bool)
    if missing.any():  # a null list still spans its sample's length, so offsets stay shared
        lengths = np.diff(offsets)
        arrays = [
            np.zeros(n, dtype) if a is None else a for a, n in zip(arrays, lengths, strict=True)
        ]
    values = np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.zeros(0, dtype)
    mask = pa.array(missing) if missing.any() else None
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values), mask=mask)


def _split_list_column(column: pa.ListArray) -> list[np.ndarray | None]:
    offsets = column.offsets.to_numpy()
    values = column.values.to_numpy(zero_copy_only=False)
    missing = column.is_null().to_numpy(zero_copy_only=False)
    return [None if missing[i] else values[offsets[i] : offsets[i + 1]] for i in range(len(column))]


# Torch --------------------------------------------------------------------------------------


def arrays_to_torch(arrays: dict[str, Any]) -> dict[str, Any]:
    """numpy arrays as torch tensors, sharing memory where the array is writable (read-only
    arrays, such as shared positions or columns read from Parquet, are copied); anything else
    passes through unchanged."""
    import torch  # the optional `train` extra: only needed here

    return {
        name: torch.from_numpy(value if value.flags.writeable else value.copy())
        if isinstance(value, np.ndarray)
        else value
        for name, value in arrays.items()
    }

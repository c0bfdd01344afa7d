"""Samples: one per row, every per-token array a trainer needs, plus where the row came from.

A sample is built from a row and the advantages credit wrote onto its calls. A call that has
loss tokens in the row but no advantage (`None`) is an error naming the episode, row and call:
an unassigned advantage never turns into zeros on the way to the trainer.

Samples go to Parquet (one row per sample, per-token arrays as list columns) and to torch
tensors (torch is the optional `train` extra and is imported only when asked for).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from callgrove.episode import TOKEN_DTYPE
from callgrove.formats.problems import InputError, Problem
from callgrove.rows import EpisodeRows, Row

if TYPE_CHECKING:
    import torch

MASK_DTYPE = np.uint8
VALUE_DTYPE = np.float32  # logprobs and advantages, as trainers take them
POSITION_DTYPE = np.int32
VERSION_DTYPE = np.int32
NO_VERSION = -1  # prompt tokens, and completions of calls that recorded no policy version

# Per-token arrays in the order samples, Parquet files and micro-batches list them.
TOKEN_FIELDS = (
    "token_ids",
    "loss_mask",
    "logprobs",
    "advantages",
    "position_ids",
    "policy_versions",
)
FIELD_DTYPES = {
    "token_ids": TOKEN_DTYPE,
    "loss_mask": MASK_DTYPE,
    "logprobs": VALUE_DTYPE,
    "advantages": VALUE_DTYPE,
    "position_ids": POSITION_DTYPE,
    "policy_versions": VERSION_DTYPE,
}


@dataclass(slots=True, eq=False)
class Sample:
    """One row as a trainer takes it.

    Per token: `token_ids`, `loss_mask` (1 on the completion tokens the row trains),
    `logprobs` (sampling logprobs on the mask, 0 off it; None when a call the row trains
    recorded none, so no importance ratio can be formed), `advantages` (each trained call's
    advantage on its loss tokens, 0 off the mask), `position_ids` (0, 1, ...) and
    `policy_versions` (the version that sampled each completion token, `NO_VERSION` on prompt
    tokens and where none was recorded). Metadata: the episode and group, the leaf agent's id
    and seat (its name), the row index within the episode, the leaf call's id, the row reward
    (spec 3.4) and the row it duplicates, if any.
    """

    token_ids: np.ndarray
    loss_mask: np.ndarray
    logprobs: np.ndarray | None
    advantages: np.ndarray
    position_ids: np.ndarray
    policy_versions: np.ndarray
    episode: str
    group: str | None
    agent: str
    seat: str
    row: int
    leaf: str
    reward: float
    duplicate_of: int | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_loss_tokens(self) -> int:
        return int(np.count_nonzero(self.loss_mask))

    def arrays(self) -> dict[str, np.ndarray | None]:
        return {name: getattr(self, name) for name in TOKEN_FIELDS}

    def to_torch(self) -> dict[str, torch.Tensor | None]:
        """The per-token arrays as 1-D tensors sharing memory with the sample."""
        return arrays_to_torch(self.arrays())


METADATA_FIELDS = tuple(f.name for f in fields(Sample) if f.name not in TOKEN_FIELDS)


def build_samples(episode_rows: EpisodeRows) -> list[Sample]:
    """One sample per row of the episode, in row order."""
    return [sample_from_row(row) for row in episode_rows.rows]


def sample_from_row(row: Row) -> Sample:
    """The row's sample; raises `InputError` if a call with loss tokens here has no advantage."""
    token_ids = row.token_ids
    loss_mask = row.loss_mask
    size = len(token_ids)
    advantages = np.zeros(size, dtype=VALUE_DTYPE)
    policy_versions = np.full(size, NO_VERSION, dtype=VERSION_DTYPE)
    for call, _, prompt_end, end in row.spans():
        if call.policy_version is not None:
            policy_versions[prompt_end:end] = call.policy_version
        if not loss_mask[prompt_end:end].any():
            continue
        if call.advantages is None:
            raise _missing_advantage(row, call.id)
        advantages[prompt_end:end] = call.advantages
    logprobs = row.logprobs()
    episode = row.episode
    return Sample(
        token_ids=token_ids,
        loss_mask=loss_mask,
        logprobs=None if logprobs is None else logprobs.astype(VALUE_DTYPE),
        advantages=advantages,
        position_ids=np.arange(size, dtype=POSITION_DTYPE),
        policy_versions=policy_versions,
        episode=episode.id,
        group=episode.group,
        agent=row.agent.id,
        seat=row.agent.name,
        row=row.index,
        leaf=row.leaf.id,
        reward=float(row.reward),
        duplicate_of=row.duplicate_of,
    )


def _missing_advantage(row: Row, call_id: str) -> InputError:
    reason = (
        "the episode did not complete (ok false), so credit gives it none"
        if not row.episode.ok
        else "run credit.finalize_group on its group first"
    )
    message = f"row {row.index}: the call has loss tokens in this row but no advantage ({reason})"
    return InputError(Problem(message, episode=row.episode.id, call=call_id))


# Parquet ------------------------------------------------------------------------------------

_ARROW_TYPES = {name: pa.from_numpy_dtype(dtype) for name, dtype in FIELD_DTYPES.items()}
_METADATA_SCHEMA = [
    pa.field("episode", pa.string(), nullable=False),
    pa.field("group", pa.string()),
    pa.field("agent", pa.string(), nullable=False),
    pa.field("seat", pa.string(), nullable=False),
    pa.field("row", pa.int32(), nullable=False),
    pa.field("leaf", pa.string(), nullable=False),
    pa.field("reward", pa.float64(), nullable=False),
    pa.field("duplicate_of", pa.int32()),
]
SAMPLE_SCHEMA = pa.schema(
    [
        *_METADATA_SCHEMA,
        *(
            pa.field(name, pa.list_(_ARROW_TYPES[name]), nullable=name == "logprobs")
            for name in TOKEN_FIELDS
        ),
    ]
)
_MAX_BATCH_TOKENS = 2**30  # list offsets are int32: keep each record batch well inside them


def samples_to_table(samples: Sequence[Sample]) -> pa.Table:
    """The samples as an Arrow table with `SAMPLE_SCHEMA` (one table row per sample)."""
    batches = [_record_batch(chunk) for chunk in _token_bounded_chunks(samples)]
    return pa.Table.from_batches(batches, schema=SAMPLE_SCHEMA)


def write_samples(path: str | Path, samples: Sequence[Sample], compression: str = "zstd") -> None:
    pq.write_table(samples_to_table(samples), path, compression=compression)


def read_samples(path: str | Path) -> list[Sample]:
    return samples_from_table(pq.read_table(path, schema=SAMPLE_SCHEMA))


def samples_from_table(table: pa.Table) -> list[Sample]:
    """Samples back from a table with `SAMPLE_SCHEMA`; per-token arrays are views into it."""
    samples: list[Sample] = []
    for batch in table.to_batches():
        metadata = {name: batch.column(name).to_pylist() for name in METADATA_FIELDS}
        per_token = {name: _split_list_column(batch.column(name)) for name in TOKEN_FIELDS}
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
    return pa.RecordBatch.from_arrays(columns, schema=SAMPLE_SCHEMA)


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
    """numpy arrays as torch tensors (zero copy); anything else passes through unchanged."""
    import torch  # the optional `train` extra: only needed here

    return {
        name: torch.from_numpy(value) if isinstance(value, np.ndarray) else value
        for name, value in arrays.items()
    }

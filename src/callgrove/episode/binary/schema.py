"""The binary episode form's layout: one row per episode, nested as episode -> agents -> calls
exactly like the JSON record (docs/episode-storage.md has the table). Tokens are `int32` list
columns, per-token floats (logprobs, advantages) `float32` list columns, a mixture of experts'
routes `int16` lists nested per position and layer as the JSON form nests them, free-form values
JSON text.
"""

from __future__ import annotations

import os
from typing import Any, get_args

import msgspec
import numpy as np
import pyarrow as pa

from callgrove.episode.codec import PLAIN_CALL_FIELDS
from callgrove.formats.wire import FORMAT

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
# The Parquet leaf column of the calls' routes (the one written with a dictionary).
PARQUET_ROUTES_COLUMN = "agents.list.element.calls.list.element.routes" + ".list.element" * 3

_TOKENS = pa.list_(pa.int32())
_FLOATS = pa.list_(pa.float32())
# A call's routes: per position, per MoE layer, the experts chosen (`record.ROUTE_DTYPE`).
ROUTES_TYPE = pa.list_(pa.list_(pa.list_(pa.int16())))
_REWARDS = pa.map_(pa.string(), pa.float64())
_JSON = pa.string()  # free-form JSON values, stored as their JSON text

_SCALARS = {int: pa.int64(), float: pa.float64(), str: pa.string(), bool: pa.bool_()}


def _kind(info: msgspec.structs.FieldInfo) -> tuple[Any, bool]:
    """A plain call field's value type and whether it may be missing, from its `WireCall` type."""
    kinds = set(get_args(info.type)) or {info.type}
    nullable = type(None) in kinds or msgspec.UnsetType in kinds
    kinds -= {type(None), msgspec.UnsetType}
    return (kinds.pop() if len(kinds) == 1 else Any), nullable


def plain_field(info: msgspec.structs.FieldInfo) -> pa.Field:
    """A plain call field's column: a scalar of its kind, or JSON text for anything else."""
    kind, nullable = _kind(info)
    return pa.field(info.name, _SCALARS.get(kind, _JSON), nullable=nullable)


# Call columns added to the layout after files were first written: a file that predates one
# lacks it, and reads as if every call held null there (`sampling`: unknown; `routes`: none
# recorded, and `routes_from` 0 with them).
LATER_CALL_COLUMNS = frozenset({"sampling", "routes", "routes_from"})

# The plain call fields stored as JSON text.
JSON_CALL_FIELDS = frozenset(f.name for f in PLAIN_CALL_FIELDS if _kind(f)[0] not in _SCALARS)


CALL_TYPE = pa.struct(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("prompt_from", pa.string()),
        pa.field("prompt_from_len", pa.int64()),
        pa.field("prompt_suffix_ids", _TOKENS, nullable=False),
        pa.field("completion_ids", _TOKENS, nullable=False),
        pa.field("logprobs", _FLOATS),
        pa.field("advantage", pa.float64()),
        pa.field("advantages", _FLOATS),
        *(plain_field(f) for f in PLAIN_CALL_FIELDS),
        # null: no routes recorded; `routes_from` null reads as 0 (the record's default)
        pa.field("routes", ROUTES_TYPE),
        pa.field("routes_from", pa.int64()),
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


def is_binary(path: str | os.PathLike[str]) -> bool:
    return str(path).endswith(BINARY_SUFFIXES)

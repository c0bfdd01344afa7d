"""Rows as records (`callgrove rows --jsonl`, docs/episode-format.md section 4) and as Arrow tables for Parquet."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa

from callgrove.rows.build import Row


def row_record(row: Row, tokens: bool = False) -> dict[str, Any]:
    """The JSON object for a row (docs/episode-format.md, section 4); with `tokens`, its token ids, loss mask and logprobs."""
    record: dict[str, Any] = {
        "episode": row.episode.id,
        "row": row.index,
        "leaf": row.leaf.id,
        "agent": row.agent.id,
        "path": [c.id for c in row.path],
        "trains": [c.id for c in row.trains],
        "context": [c.id for c in row.context],
        "num_tokens": row.num_tokens,
        "num_loss_tokens": row.num_loss_tokens,
        "reward": row.reward,
        "duplicate_of": row.duplicate_of,
        "objective": row.episode.objective,
    }
    if tokens:
        record["token_ids"] = row.token_ids
        record["loss_mask"] = row.loss_mask
        record["logprobs"] = row.logprobs()
    return record


def _list_column(arrays: list[np.ndarray], value_type: pa.DataType) -> pa.ListArray:
    lengths = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))
    offsets = np.zeros(len(arrays) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    values = np.concatenate(arrays) if arrays else np.zeros(0)
    return pa.ListArray.from_arrays(
        pa.array(offsets), pa.array(values.astype(value_type.to_pandas_dtype()))
    )


def rows_table(rows: Iterable[Row]) -> pa.Table:
    """One table row per training row: metadata columns plus token, mask and logprob lists."""
    rows = list(rows)
    logprobs = [row.logprobs() for row in rows]
    logprob_values = _list_column(
        [lp if lp is not None else np.zeros(0) for lp in logprobs], pa.float32()
    )
    logprob_nulls = pa.array([lp is None for lp in logprobs], pa.bool_())
    logprob_column = pa.ListArray.from_arrays(
        logprob_values.offsets, logprob_values.values, mask=logprob_nulls
    )
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
        "num_loss_tokens": pa.array([r.num_loss_tokens for r in rows], pa.int64()),
        "reward": pa.array([r.reward for r in rows], pa.float64()),
        "duplicate_of": pa.array([r.duplicate_of for r in rows], pa.int32()),
        "objective": pa.array([r.episode.objective for r in rows], pa.string()),
        "token_ids": _list_column([r.token_ids for r in rows], pa.int32()),
        "loss_mask": _list_column([r.loss_mask for r in rows], pa.uint8()),
        "logprobs": logprob_column,
    }
    return pa.table(columns)

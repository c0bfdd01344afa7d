"""The Parquet form of rows is laid out from each episode's row columns, sharing their memory:
the same lists a row gives one by one, for whole episodes and for any subset of rows."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from callgrove.rows import build_rows
from callgrove.rows.table import rows_table
from callgrove.synth import Shape, synth_episodes

SHAPE = Shape(context=512, leader_calls=6, subagent_calls=2)


def _expected(rows) -> dict[str, list]:
    logprobs = [row.logprobs() for row in rows]
    return {
        "token_ids": [row.token_ids.tolist() for row in rows],
        "loss_mask": [row.loss_mask.tolist() for row in rows],
        "logprobs": [None if lp is None else lp.astype(np.float32).tolist() for lp in logprobs],
    }


def test_lists_are_the_rows_and_share_the_columns_memory():
    results = [build_rows(episode) for episode in synth_episodes(SHAPE, 3, seed=4)]
    results[1].episode.agents[0].calls[0].logprobs = None  # rows training it have no logprobs
    results[1] = build_rows(results[1].episode)
    rows = [row for result in results for row in result.rows]
    table = rows_table(rows)
    got = {name: table.column(name).to_pylist() for name in ("token_ids", "loss_mask", "logprobs")}
    assert got == _expected(rows)
    assert None in got["logprobs"] and any(lp is not None for lp in got["logprobs"])
    tokens = table.column("token_ids").chunk(0).values.to_numpy()
    assert np.shares_memory(tokens, results[0].columns.token_ids)


def test_a_subset_of_rows_in_any_order():
    results = [build_rows(episode) for episode in synth_episodes(SHAPE, 2, seed=5)]
    first, second = results[0].rows, results[1].rows
    rows = [first[2], first[0], second[1], first[1]]
    table = rows_table(rows)
    assert table.column("row").to_pylist() == [2, 0, 1, 1]
    for name, values in _expected(rows).items():
        assert table.column(name).to_pylist() == values


def test_no_rows_still_has_every_column():
    table = rows_table([])
    assert table.num_rows == 0
    assert table.schema.field("token_ids").type == pa.list_(pa.int32())

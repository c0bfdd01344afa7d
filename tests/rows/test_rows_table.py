"""The Parquet form of rows is laid out from each episode's row columns, sharing their memory:
the same lists a row gives one by one, for whole episodes and for any subset of rows."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from callgrove.rows import build_rows
from callgrove.rows.table import rows_table
from callgrove.synth import Shape, synth_episodes

SHAPE = Shape(context=512, leader_calls=6, subagent_calls=2)


def _expected(held) -> dict[str, list]:
    """The lists each (episode rows, row) pair gives one by one."""
    logprobs = [result.logprobs(row) for result, row in held]
    return {
        "token_ids": [result.token_ids(row).tolist() for result, row in held],
        "loss_mask": [result.loss_mask(row).tolist() for result, row in held],
        "logprobs": [None if lp is None else lp.astype(np.float32).tolist() for lp in logprobs],
    }


def test_lists_are_the_rows_and_share_the_columns_memory():
    results = [build_rows(episode) for episode in synth_episodes(SHAPE, 3, seed=4)]
    results[1].episode.agents[0].calls[0].logprobs = None  # rows training it have no logprobs
    results[1] = build_rows(results[1].episode)
    table = rows_table(results)
    got = {name: table.column(name).to_pylist() for name in ("token_ids", "loss_mask", "logprobs")}
    assert got == _expected([(result, row) for result in results for row in result.rows])
    assert None in got["logprobs"] and any(lp is not None for lp in got["logprobs"])
    tokens = table.column("token_ids").chunk(0).values.to_numpy()
    assert np.shares_memory(tokens, results[0].columns.token_ids)


def test_a_subset_of_rows_in_any_order():
    results = [build_rows(episode) for episode in synth_episodes(SHAPE, 2, seed=5)]
    first, second = results
    held = [(first, first.rows[2]), (first, first.rows[0]), (second, second.rows[1])]
    held.append((first, first.rows[1]))
    table = rows_table(results, [row for _, row in held])
    assert table.column("row").to_pylist() == [2, 0, 1, 1]
    for name, values in _expected(held).items():
        assert table.column(name).to_pylist() == values


def test_no_rows_still_has_every_column():
    table = rows_table([])
    assert table.num_rows == 0
    assert table.schema.field("token_ids").type == pa.list_(pa.int32())


def test_a_row_of_no_episode_given_is_refused_by_name():
    first, second = (build_rows(episode) for episode in synth_episodes(SHAPE, 2, seed=6))
    with pytest.raises(ValueError, match="is not a row of the episode rows given"):
        rows_table([first], [first.rows[0], second.rows[0]])

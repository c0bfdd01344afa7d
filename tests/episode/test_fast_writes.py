"""The writers' fast paths give what the plain ones give: token and value arrays written as
JSON text straight from numpy are the bytes the encoder writes for their Python lists, and a
whole episode line is the one its list form encodes to."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from callgrove.episode import episode_to_wire
from callgrove.episode.binary.writer import LIST_DTYPES, BinaryEpisodeWriter, episodes_to_batch
from callgrove.episode.checks import ListColumn
from callgrove.episode.io import encode_episode
from callgrove.formats.jsonl import encode_wire_episode, json_numbers
from callgrove.formats.wire import episode_encoder

from .strategies import episodes

integer_arrays = hnp.arrays(
    st.sampled_from([np.int32, np.int64, np.uint32, np.int8]), hnp.array_shapes(max_dims=1)
)
# every magnitude, the thresholds between plain and exponent spelling, nan and infinities
doubles = st.floats() | st.sampled_from([1e15, 1e16, 1e17, 1e-4, 1e-5, 1e21, 5e-324, -0.0])
float_arrays = (
    hnp.arrays(np.float64, hnp.array_shapes(max_dims=1, max_side=20), elements=doubles)
    | hnp.arrays(np.dtype(">f8"), hnp.array_shapes(max_dims=1, max_side=5), elements=doubles)
    | hnp.arrays(np.float32, hnp.array_shapes(max_dims=1), elements=st.floats(width=32))
)


@given(integer_arrays | float_arrays)
@settings(max_examples=400)
def test_numbers_are_the_bytes_of_their_list(values: np.ndarray) -> None:
    assert bytes(json_numbers(values)) == episode_encoder.encode(values.tolist())


def test_numbers_of_a_strided_view_are_the_bytes_of_their_list() -> None:
    values = np.arange(40, dtype=np.int32)[::3]
    assert bytes(json_numbers(values)) == episode_encoder.encode(values.tolist())
    floats = np.linspace(-1e20, 1e20, 9)[::2]
    assert bytes(json_numbers(floats)) == episode_encoder.encode(floats.tolist())


@given(episodes())
@settings(max_examples=60, deadline=None)
def test_an_encoded_episode_is_the_line_of_its_list_form(episode) -> None:
    assert encode_episode(episode) == encode_wire_episode(episode_to_wire(episode))


maybe_token_arrays = st.none() | hnp.arrays(np.int32, st.integers(0, 6))


@given(st.lists(maybe_token_arrays, max_size=8))
def test_a_list_column_holds_each_array_at_its_place(arrays: list[np.ndarray | None]) -> None:
    column = ListColumn.of(arrays, np.int64)
    assert column.null.tolist() == [a is None for a in arrays]
    assert column.lengths.tolist() == [0 if a is None else len(a) for a in arrays]
    for view, array in zip(column.views(), arrays, strict=True):
        assert (view is None) == (array is None)
        if array is not None:
            np.testing.assert_array_equal(view, array)


@given(st.lists(episodes(), min_size=1, max_size=3))
@settings(max_examples=40, deadline=None)
def test_a_batch_from_the_writers_buffers_is_the_batch_of_plain_columns(batch) -> None:
    ids = [f"e{i}" for i in range(len(batch))]
    for episode, episode_id in zip(batch, ids, strict=True):
        episode.id = episode_id
    with tempfile.TemporaryDirectory() as folder:
        writer = BinaryEpisodeWriter(Path(folder) / "x.arrow")
        for episode in batch:
            writer.write(episode)
        pending = [calls for _episode, calls in writer._pending]
        values = {f: writer._buffers[f][: writer._filled[f]] for f in LIST_DTYPES}
        gathered = episodes_to_batch(batch, pending, values)
        writer.discard()
    assert gathered.equals(episodes_to_batch(batch))

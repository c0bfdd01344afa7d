"""The columnar rows of several episodes at once, and the spreading of call values, against the
brute-force reference: the same tokens, masks, calls and per-token values as row by row."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from callgrove.batch import build_samples
from callgrove.episode import Call
from callgrove.episode.spread import spread_over_completions
from callgrove.formats.problems import InputError
from callgrove.rows import build_rows
from callgrove.rows.columns import RowColumns
from forest.reference import reference_rows
from forest.test_properties import episodes


def _plain_spread(call: Call, name: str) -> list[float]:
    value = getattr(call, name)
    if value is None:
        return [0.0] * len(call.completion_ids)
    if isinstance(value, np.ndarray):
        return [float(v) for v in value]
    return [float(value)] * len(call.completion_ids)


@st.composite
def credited(draw):
    """An episode whose calls hold a scalar, a per-token array or no advantage, and logprobs."""
    episode = draw(episodes())
    for call in episode.calls():
        n = len(call.completion_ids)
        kind = draw(st.sampled_from(["scalar", "array", "none"]))
        value = draw(st.floats(-2, 2, width=32))
        call.advantages = {
            "scalar": value,
            "array": np.linspace(value, value + 1, n),
            "none": None,
        }[kind]
        call.logprobs = -np.arange(1, n + 1, dtype=np.float64) / (call.seq + 1)
    return episode


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(credited(), min_size=1, max_size=3))
def test_columns_of_many_episodes_equal_the_reference_row_by_row(batch):
    parts = [build_rows(episode) for episode in batch]
    columns = RowColumns.of(parts)
    expected = [(episode, ref) for episode in batch for ref in reference_rows(episode)]
    slices = columns.row_slices()
    assert len(slices) == len(expected)
    advantages = columns.values("advantages")
    for where, (episode, ref) in zip(slices, expected, strict=True):
        assert np.array_equal(columns.token_ids[where], ref["tokens"])
        assert np.array_equal(columns.loss_mask[where], ref["mask"])
        by_id = {c.id: c for c in episode.calls()}
        path = [by_id[i] for i in ref["path"]]
        owners, plain = [], np.zeros(len(ref["tokens"]))
        start = 0
        for call in path:
            owners += [call.id] * (call.full_len - start)
            start = call.full_len
            if ref["mask"][call.prompt_len] if call.full_len > call.prompt_len else False:
                plain[call.prompt_len : call.full_len] = _plain_spread(call, "advantages")
        assert [columns.calls[i].id for i in columns.call_index[where]] == owners
        np.testing.assert_allclose(advantages[where], plain)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(credited())
def test_spread_equals_the_plain_rule_call_by_call(episode):
    calls = list(episode.calls())
    for name in ("advantages", "logprobs"):
        spread = spread_over_completions(calls, name)
        plain = [v for call in calls for v in _plain_spread(call, name)]
        np.testing.assert_allclose(spread, plain)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(credited(), min_size=1, max_size=3))
def test_samples_of_a_batch_equal_each_rows_own_values(batch):
    parts = [build_rows(episode) for episode in batch]
    for part in parts:
        for call in part.forest.calls:
            if call.advantages is None:
                call.advantages = 0.5
    samples = build_samples(parts)
    held = [(part, row) for part in parts for row in part.rows]
    assert len(samples) == len(held)
    for sample, (part, row) in zip(samples, held, strict=True):
        np.testing.assert_array_equal(sample.token_ids, row.episode.full_ids(row.leaf))
        np.testing.assert_array_equal(sample.loss_mask, part.loss_mask(row))
        np.testing.assert_allclose(sample.logprobs, part.logprobs(row), rtol=1e-6)
        on = part.loss_mask(row).view(bool)
        assert sample.advantages is not None
        np.testing.assert_array_equal(sample.advantages[~on], 0)
        plain = [v for call in part.loss_calls(row) for v in _plain_spread(call, "advantages")]
        np.testing.assert_allclose(sample.advantages[on], plain, rtol=1e-6, atol=1e-30)


def test_a_per_token_value_of_the_wrong_length_names_its_episode_and_call():
    call = Call.make("C1", 1, [1, 2], [3, 4, 5])
    call.advantages = np.zeros(2)
    with pytest.raises(InputError, match="episode E, call C1: advantages has 2 values for 3"):
        spread_over_completions([call], "advantages", episodes=["E"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(credited(), st.data())
def test_laying_out_some_calls_equals_their_own_spread_in_that_order(episode, data):
    calls = list(episode.calls())
    order = data.draw(st.lists(st.integers(0, len(calls) - 1), max_size=2 * len(calls)))
    for name in ("advantages", "logprobs"):
        spread = spread_over_completions(calls, name, laid_out=order)
        plain = [v for i in order for v in _plain_spread(calls[i], name)]
        np.testing.assert_allclose(spread, plain)


def test_a_value_of_the_wrong_length_is_an_error_even_where_it_is_not_laid_out():
    good, bad = Call.make("C1", 1, [1], [2, 3]), Call.make("C2", 2, [1], [4, 5, 6])
    good.logprobs, bad.logprobs = np.zeros(2), np.zeros(1)
    with pytest.raises(InputError, match="episode E2, call C2: logprobs has 1 values for 3"):
        spread_over_completions([good, bad], "logprobs", episodes=["E1", "E2"], laid_out=[0])

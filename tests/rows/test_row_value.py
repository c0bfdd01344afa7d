"""A row is a plain value: nothing in it points back at the `EpisodeRows` that holds it, and
its tokens, loss mask, loss calls and logprobs are read through that holder, which refuses a
row it does not hold instead of reading another row's place."""

from __future__ import annotations

import dataclasses

import pytest

from callgrove.batch import sample_from_row
from callgrove.rows import EpisodeRows, build_rows
from callgrove.synth import Shape, synth_episodes

SHAPE = Shape(context=256, leader_calls=4, subagent_calls=2)


def two_results() -> list[EpisodeRows]:
    return [build_rows(episode) for episode in synth_episodes(SHAPE, 2, seed=7)]


def test_no_field_of_a_row_holds_its_episode_rows():
    for result in two_results():
        for row in result.rows:
            held = [getattr(row, f.name) for f in dataclasses.fields(row)]
            assert not any(isinstance(value, EpisodeRows) for value in held), row


def test_a_row_held_elsewhere_is_refused_by_name():
    first, second = two_results()
    stranger = second.rows[0]  # index 0 is a place in `first` too: it must not be read there
    readers = (
        first.token_ids,
        first.loss_mask,
        first.loss_calls,
        first.num_loss_tokens,
        first.logprobs,
        lambda row: sample_from_row(first, row),
    )
    for read in readers:
        with pytest.raises(ValueError, match=r"Row\(episode=.* is not a row of EpisodeRows"):
            read(stranger)
    stranger.trains[0].logprobs = None  # no logprobs to give: still refused, not None
    with pytest.raises(ValueError, match="is not a row of"):
        first.logprobs(stranger)


def test_a_copy_of_a_row_is_not_read_as_the_row_it_copies():
    (result, _) = two_results()
    copy = dataclasses.replace(result.rows[1])
    with pytest.raises(ValueError, match="is not a row of"):
        result.token_ids(copy)
    assert len(result.token_ids(result.rows[1])) == result.rows[1].num_tokens

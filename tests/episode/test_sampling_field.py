"""A call's `sampling` (which distribution its logprobs are under): written and read back in
every form with any extra keys, absent stays absent (never a default), and a malformed one is
refused by every reader and writer with a message naming the episode and call."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from callgrove.episode import encode_episode, load, sampling_record, save
from callgrove.formats import Diagnostics, InputError

from .helpers import healthy

FORMS = [".jsonl", ".jsonl.gz", ".parquet", ".arrow"]


def with_sampling(**given):
    episode = healthy("s")
    first, _second, third = sorted(episode.calls(), key=lambda c: c.seq)
    first.sampling = sampling_record(0.7, 0.9)
    third.sampling = {**sampling_record(0.0, 1.0, 40), "min_p": 0.05, "engine": {"name": "x"}}
    for key, value in given.items():
        setattr(first, key, value)
    return episode


def by_id(episode):
    return {call.id: call.sampling for call in episode.calls()}


@pytest.mark.parametrize("suffix", FORMS)
def test_sampling_round_trips_with_its_extra_keys_and_absence(tmp_path, suffix):
    path = tmp_path / f"e{suffix}"
    episode = with_sampling()
    save(path, [episode])
    (back,) = load(path)
    assert by_id(back) == by_id(episode)
    assert by_id(back)["C2"] is None  # never recorded: unknown, not a default


def test_the_json_line_leaves_an_unknown_sampling_out():
    line = json.loads(encode_episode(with_sampling()))
    calls = {c["id"]: c for agent in line["agents"] for c in agent["calls"]}
    assert "sampling" not in calls["C2"]
    assert calls["C1"]["sampling"] == {"temperature": 0.7, "top_p": 0.9, "top_k": None}


def test_verifiers_files_carry_sampling_back(tmp_path):
    path = tmp_path / "traces.jsonl"
    episode = with_sampling()
    save(path, [episode], format="verifiers")
    (back,) = load(path)
    assert by_id(back) == by_id(episode)


BAD = {
    "not an object": "greedy",
    "no temperature": {"top_p": 1.0, "top_k": None},
    "no top_p": {"temperature": 1.0},
    "negative temperature": {"temperature": -0.5, "top_p": 1.0},
    "infinite temperature": {"temperature": float("inf"), "top_p": 1.0},
    "temperature as text": {"temperature": "0.7", "top_p": 1.0},
    "temperature as bool": {"temperature": True, "top_p": 1.0},
    "top_p of 0": {"temperature": 1.0, "top_p": 0.0},
    "top_p above 1": {"temperature": 1.0, "top_p": 1.5},
    "top_k of 0": {"temperature": 1.0, "top_p": 1.0, "top_k": 0},
    "top_k as float": {"temperature": 1.0, "top_p": 1.0, "top_k": 4.0},
}


@pytest.mark.parametrize("case", sorted(BAD))
@pytest.mark.parametrize("suffix", FORMS)
def test_a_malformed_sampling_is_refused_naming_episode_and_call(tmp_path, suffix, case):
    path = tmp_path / f"e{suffix}"
    bad = with_sampling(sampling=BAD[case])
    with pytest.raises(InputError) as refused:
        save(path, [bad])
    assert "sampling" in str(refused.value)
    assert refused.value.problem.episode == "s" and refused.value.problem.call == "C1"
    if suffix == ".jsonl" and case != "infinite temperature":  # JSON has no infinity
        # written by hand past the writer's check: the reader refuses it
        line = json.loads(encode_episode(with_sampling()))
        line["agents"][0]["calls"][0]["sampling"] = BAD[case]
        path.write_text(json.dumps(line) + "\n")
        diagnostics = Diagnostics()
        assert list(load(path, diagnostics)) == []
        (problem,) = diagnostics.problems
        assert "sampling" in problem.message
        assert (problem.line, problem.episode) == (1, "s")


finite = st.floats(min_value=0.0, max_value=4.0, allow_nan=False)
nucleus = st.floats(min_value=1e-6, max_value=1.0, exclude_min=False)


@settings(max_examples=40, deadline=None)
@given(temperature=finite, top_p=nucleus, top_k=st.none() | st.integers(1, 1 << 40))
def test_every_valid_sampling_survives_the_binary_form(tmp_path_factory, temperature, top_p, top_k):
    path = tmp_path_factory.mktemp("s") / "e.parquet"
    episode = with_sampling(sampling=sampling_record(temperature, top_p, top_k))
    save(path, [episode])
    (back,) = load(path)
    assert by_id(back) == by_id(episode)


@pytest.mark.parametrize("suffix", [".parquet", ".arrow"])
def test_binary_files_written_before_the_column_read_with_sampling_unknown(suffix):
    """tests/data/before_sampling holds examples/login_bug.jsonl as the binary writer wrote it
    before calls had a `sampling` column."""
    data = Path(__file__).resolve().parents[1] / "data" / "before_sampling"
    (old,) = load(data / f"login_bug{suffix}")
    (same,) = load(Path(__file__).resolve().parents[2] / "examples" / "login_bug.jsonl")
    assert [c.id for c in old.calls()] == [c.id for c in same.calls()]
    assert all(c.sampling is None for c in old.calls())
    for was, now in zip(old.calls(), same.calls(), strict=True):
        assert (old.full_ids(was) == same.full_ids(now)).all()
        assert np.allclose(was.logprobs, now.logprobs, atol=1e-7)  # stored as float32

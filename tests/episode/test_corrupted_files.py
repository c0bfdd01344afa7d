"""Every reader against randomly damaged files: truncations, flipped bytes, wrong types. The
only exception that may come out is `InputError`, and no complete, untouched episode is lost."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from callgrove.episode import EpisodeWriter, load, save
from callgrove.formats import Diagnostics, InputError

from .helpers import cancelled, healthy

IDS = [f"ep-{i}" for i in range(8)]
EPISODES = [healthy(i) if n % 3 else cancelled(i) for n, i in enumerate(IDS)]
SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _read_all(path: Path) -> list[str]:
    """Read with and without diagnostics: only `InputError` may escape; returns the ids read
    with diagnostics."""
    diagnostics = Diagnostics()
    read = [e.id for e in load(path, diagnostics)]
    try:
        for _episode in load(path):
            pass
    except InputError:
        pass
    return read


def _plain(tmp_path: Path) -> tuple[Path, list[tuple[int, int]]]:
    path = tmp_path / "traces.jsonl"
    save(path, EPISODES)
    spans, start = [], 0
    for line in path.read_bytes().splitlines(keepends=True):
        spans.append((start, start + len(line)))
        start += len(line)
    return path, spans


@SETTINGS
@given(data=st.data())
def test_plain_json_lines_damaged_anywhere(tmp_path_factory, data):
    path, spans = _plain(tmp_path_factory.mktemp("plain"))
    original = path.read_bytes()
    damaged = bytearray(original)
    touched: set[int] = set()
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(damaged) - 1))
        damaged[at] = data.draw(st.integers(0, 255))
        touched.add(at)
    cut = data.draw(st.one_of(st.none(), st.integers(0, len(damaged))))
    if cut is not None:
        del damaged[cut:]
    path.write_bytes(bytes(damaged))
    read = _read_all(path)
    for episode_id, (start, end) in zip(IDS, spans, strict=True):
        whole = cut is None or end <= cut or (end - 1 == cut and original[end - 1 : end] == b"\n")
        # the newline before a line is its boundary too: damaged, it joins the line to the last
        if whole and not any(start - 1 <= at < end for at in touched):
            assert episode_id in read, (episode_id, read)
    assert len(read) <= len(IDS)  # plain text has no checksum: a changed id reads as changed


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".jsonl.zst"])
@SETTINGS
@given(data=st.data())
def test_compressed_json_lines_cut_or_damaged(tmp_path_factory, suffix, data):
    path = tmp_path_factory.mktemp("compressed") / f"traces{suffix}"
    ends = []  # the file's size once each episode was written and flushed
    with EpisodeWriter(path, append=True) as writer:
        for episode in EPISODES:
            writer.write(episode)
            writer.sync()
            ends.append(path.stat().st_size)
    original = path.read_bytes()
    if data.draw(st.booleans()):
        cut = data.draw(st.integers(0, len(original)))
        path.write_bytes(original[:cut])
        read = _read_all(path)
        assert read == IDS[: len(read)]
        assert len(read) >= sum(end <= cut for end in ends)
    else:
        damaged = bytearray(original)
        at = data.draw(st.integers(0, len(damaged) - 1))
        damaged[at] ^= data.draw(st.integers(1, 255))
        path.write_bytes(bytes(damaged))
        diagnostics = Diagnostics()
        read = [e.id for e in load(path, diagnostics)]
        _read_all(path)
        # A compressed stream's checksum covers a whole member or frame, checked at its end:
        # data damaged inside one can be read before the damage is found, but it is reported.
        if not set(read) <= set(IDS):
            assert diagnostics.problems


@pytest.mark.parametrize("suffix", [".parquet", ".arrow"])
@SETTINGS
@given(data=st.data())
def test_binary_files_cut_or_damaged(tmp_path_factory, suffix, data):
    path = tmp_path_factory.mktemp("binary") / f"traces{suffix}"
    save(path, EPISODES)
    original = path.read_bytes()
    if data.draw(st.booleans()):
        path.write_bytes(original[: data.draw(st.integers(0, len(original) - 1))])
    else:
        damaged = bytearray(original)
        for _ in range(data.draw(st.integers(1, 3))):
            at = data.draw(st.integers(0, len(damaged) - 1))
            damaged[at] ^= data.draw(st.integers(1, 255))
        path.write_bytes(bytes(damaged))
    assert set(_read_all(path)) <= set(IDS)


WRONG_TYPES = [
    ("ok", "yes"),
    ("rewards", [1.0]),
    ("agents", {"L": {}}),
    ("id", 7),
    ("errors", "none"),
    ("run", {"type": "train", "step": "six"}),
]


@pytest.mark.parametrize(("field", "value"), WRONG_TYPES)
def test_json_field_of_the_wrong_type_loses_only_its_episode(tmp_path, field, value):
    path, _spans = _plain(tmp_path)
    lines = path.read_bytes().splitlines(keepends=True)
    record = json.loads(lines[1])
    record[field] = value
    lines[1] = json.dumps(record).encode() + b"\n"
    path.write_bytes(b"".join(lines))
    diagnostics = Diagnostics()
    assert [e.id for e in load(path, diagnostics)] == [i for i in IDS if i != IDS[1]]
    (problem,) = diagnostics.errors
    assert problem.line == 2


@pytest.mark.parametrize(
    ("column", "values"),
    [
        ("ok", pa.array(["false"] * len(IDS))),
        ("id", pa.array(range(len(IDS)))),
    ],
)
def test_binary_column_of_the_wrong_type_is_refused(tmp_path, column, values):
    path = tmp_path / "traces.parquet"
    save(path, EPISODES)
    table = pq.read_table(path)
    table = table.set_column(table.schema.get_field_index(column), column, values)
    pq.write_table(table.replace_schema_metadata(pq.read_schema(path).metadata), path)
    diagnostics = Diagnostics()
    assert list(load(path, diagnostics)) == []
    (problem,) = diagnostics.errors
    assert f"{column} is" in problem.message and "wrong type" in problem.message
    with pytest.raises(InputError, match="wrong type"):
        list(load(path))


def test_binary_nested_column_of_the_wrong_type_is_refused(tmp_path):
    """`kept` and `trainable` as strings: "false" must never read as true."""
    path = tmp_path / "traces.parquet"
    save(path, EPISODES)
    table = pq.read_table(path)
    agents = table.column("agents").to_pylist()
    for episode in agents:
        for agent in episode:
            agent["trainable"] = str(agent["trainable"]).lower()
            for call in agent["calls"]:
                call["kept"] = "false"
                call["logprobs"] = None
                call["advantages"] = None
    index = table.schema.get_field_index("agents")
    table = table.set_column(index, "agents", pa.array(agents))
    pq.write_table(table, path)
    diagnostics = Diagnostics()
    assert list(load(path, diagnostics)) == []
    (problem,) = diagnostics.errors
    assert "agents is" in problem.message

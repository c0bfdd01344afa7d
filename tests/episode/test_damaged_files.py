"""Truncated and corrupted files: what is reported, what is kept, and that nothing else is
lost."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from callgrove.episode import EpisodeWriter, load, save, write_binary_episodes
from callgrove.formats import Diagnostics, InputError

from .helpers import cancelled, healthy

IDS = ["ok-0", "ok-1", "ok-2", "ok-3"]


def _write(path: Path) -> list[bytes]:
    save(path, [healthy(i) for i in IDS])
    return path.read_bytes().splitlines(keepends=True)


def test_truncated_final_line_is_an_error_and_the_rest_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "traces.jsonl"
    lines = _write(path)
    path.write_bytes(b"".join(lines[:3]) + lines[3][: len(lines[3]) // 2])
    diagnostics = Diagnostics()
    assert [e.id for e in load(path, diagnostics)] == IDS[:3]
    (problem,) = diagnostics.problems  # its episode is lost: an error, the rest still read
    assert (problem.severity, problem.kind, problem.line) == ("error", "truncated", 4)
    assert problem.file == str(path) and problem.episode == "ok-3"
    # without diagnostics the first three are read, then the cut line raises
    read = []
    with pytest.raises(InputError, match="truncated final line"):
        read.extend(e.id for e in load(path))
    assert read == IDS[:3]


def test_final_line_complete_but_for_its_newline_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "traces.jsonl"
    lines = _write(path)
    path.write_bytes(b"".join(lines[:3]) + lines[3].rstrip(b"\n"))
    diagnostics = Diagnostics()
    assert [e.id for e in load(path, diagnostics)] == IDS
    assert diagnostics.problems == []


def test_malformed_middle_line_is_an_error_naming_its_line(tmp_path: Path) -> None:
    path = tmp_path / "traces.jsonl"
    lines = _write(path)
    lines[1] = b'{"format": "callgrove.episode/1", "id": "ok-1",,}\n'  # wrong, not cut short
    path.write_bytes(b"".join(lines))

    diagnostics = Diagnostics()
    assert [e.id for e in load(path, diagnostics)] == ["ok-0", "ok-2", "ok-3"]
    (problem,) = diagnostics.problems
    assert (problem.severity, problem.kind, problem.line) == ("error", "malformed", 2)
    assert "not valid JSON" in problem.message

    read = []
    with pytest.raises(InputError) as raised:
        for episode in load(path):
            read.append(episode.id)
    assert read == ["ok-0"]
    assert raised.value.problem.line == 2


def test_middle_line_cut_short_then_ended_is_a_truncated_error(tmp_path: Path) -> None:
    path = tmp_path / "traces.jsonl"
    lines = _write(path)
    lines[1] = lines[1][:60] + b"\n"  # a crash cut the line; a later write ended it
    path.write_bytes(b"".join(lines))
    diagnostics = Diagnostics()
    assert [e.id for e in load(path, diagnostics)] == ["ok-0", "ok-2", "ok-3"]
    (problem,) = diagnostics.problems
    assert (problem.severity, problem.kind, problem.line) == ("error", "truncated", 2)
    assert problem.episode == "ok-1"


def test_episode_written_straight_after_a_cut_line_is_read(tmp_path: Path) -> None:
    path = tmp_path / "traces.jsonl"
    lines = _write(path)
    path.write_bytes(lines[0] + lines[1][:60] + lines[2] + lines[3])  # no newline after the cut
    diagnostics = Diagnostics()
    assert [e.id for e in load(path, diagnostics)] == ["ok-0", "ok-2", "ok-3"]
    (problem,) = diagnostics.problems
    assert (problem.severity, problem.kind, problem.line) == ("error", "truncated", 2)


def test_several_bad_lines_are_each_reported_once(tmp_path: Path) -> None:
    path = tmp_path / "traces.jsonl"
    lines = _write(path)
    garbage = [b"{not json}\n", b"[1, 2, 3]\n", b'{"format": "callgrove.episode/1"}\n']
    path.write_bytes(lines[0] + garbage[0] + lines[1] + garbage[1] + lines[2] + garbage[2])
    diagnostics = Diagnostics()
    assert [e.id for e in load(path, diagnostics)] == IDS[:3]
    assert [p.line for p in diagnostics.problems] == [2, 4, 6]
    assert diagnostics.counts() == {"malformed": 1, "invalid": 2}
    assert all(p.severity == "error" for p in diagnostics.problems)


def test_blank_lines_are_not_episodes_and_not_problems(tmp_path: Path) -> None:
    path = tmp_path / "traces.jsonl"
    lines = _write(path)
    path.write_bytes(b"\n".join(lines))
    diagnostics = Diagnostics()
    assert [e.id for e in load(path, diagnostics)] == IDS
    assert diagnostics.problems == []


def test_new_file_appears_whole_at_close_and_appends_are_whole_lines(tmp_path: Path) -> None:
    path = tmp_path / "traces.jsonl"
    path.write_bytes(b"earlier contents\n")
    writer = EpisodeWriter(path)
    writer.write(healthy("ok-0"))
    writer.write(cancelled("cancelled-1"))
    writer.sync()
    # until close the target is untouched; the lines written so far are whole
    assert path.read_bytes() == b"earlier contents\n"
    assert [e.id for e in load(writer.written_path)] == ["ok-0", "cancelled-1"]
    writer.write(healthy("ok-2"))
    writer.close()
    assert not writer.written_path.exists() or writer.written_path == path
    appended = EpisodeWriter(path, append=True)
    appended.write(healthy("ok-3"))
    appended.sync()
    # appended lines are on the file at once, whole
    assert [e.id for e in load(path)] == ["ok-0", "cancelled-1", "ok-2", "ok-3"]
    appended.close()
    assert writer.lines == 3
    assert [p.name for p in tmp_path.iterdir()] == ["traces.jsonl"]


@pytest.mark.parametrize("suffix", [".parquet", ".arrow"])
def test_truncated_binary_file_is_one_problem_for_the_file(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"episodes{suffix}"
    save(path, [healthy(i) for i in IDS])
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])
    diagnostics = Diagnostics()
    assert list(load(path, diagnostics)) == []
    (problem,) = diagnostics.problems
    assert (problem.file, problem.severity, problem.kind) == (str(path), "error", "malformed")
    with pytest.raises(InputError):
        list(load(path))


@pytest.mark.parametrize("suffix", [".parquet", ".arrow"])
def test_garbage_with_a_binary_name_is_reported(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"episodes{suffix}"
    path.write_bytes(b"PAR1 this is not a columnar file at all" * 10)
    diagnostics = Diagnostics()
    assert list(load(path, diagnostics)) == []
    assert "not a readable" in diagnostics.problems[0].message


def test_foreign_parquet_file_is_not_taken_for_episodes(tmp_path: Path) -> None:
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"id": ["a"], "tokens": [[1, 2]]}), path)
    diagnostics = Diagnostics()
    assert list(load(path, diagnostics)) == []
    assert "not a callgrove episode file" in diagnostics.problems[0].message


def test_binary_bad_episode_is_skipped_alone_even_inside_a_batch(tmp_path: Path) -> None:
    """One bad row among good ones in the same record batch costs only that row."""
    episodes = [healthy(i) for i in IDS]
    episodes[2].call("C2").purpose = "think"
    path = tmp_path / "episodes.parquet"
    write_binary_episodes(path, episodes)  # as they are: `save` would refuse the bad one
    diagnostics = Diagnostics()
    assert [e.id for e in load(path, diagnostics)] == ["ok-0", "ok-1", "ok-3"]
    (problem,) = diagnostics.problems
    assert (problem.line, problem.episode, problem.call) == (3, "ok-2", "C2")

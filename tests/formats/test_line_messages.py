"""JSON Lines input that is not what it should be: each gets a message naming its cause, and
the episodes around it are still read."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from callgrove.episode import encode_episode, load, save
from callgrove.formats import Diagnostics, InputError, jsonl, open_binary
from episode.helpers import healthy

IDS = ["ok-0", "ok-1", "ok-2"]


def _lines() -> list[bytes]:
    return [encode_episode(healthy(i)) for i in IDS]


def _read(path: Path) -> tuple[list[str], Diagnostics]:
    diagnostics = Diagnostics()
    return [e.id for e in load(path, diagnostics)], diagnostics


def _with_middle(tmp_path: Path, middle: bytes) -> Path:
    lines = _lines()
    path = tmp_path / "traces.jsonl"
    path.write_bytes(lines[0] + middle + lines[2])
    return path


def test_byte_order_mark_is_named(tmp_path):
    path = tmp_path / "traces.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + b"".join(_lines()))
    ids, diagnostics = _read(path)
    assert ids == IDS[1:]
    (problem,) = diagnostics.problems
    assert problem.line == 1 and "byte order mark" in problem.message


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_are_named_with_their_episode(tmp_path, literal):
    record = json.loads(_lines()[1])
    record["rewards"] = {"tests_pass": float(literal.replace("Infinity", "inf"))}
    path = _with_middle(tmp_path, json.dumps(record).encode() + b"\n")  # allow_nan: the default
    ids, diagnostics = _read(path)
    assert ids == ["ok-0", "ok-2"]
    (problem,) = diagnostics.problems
    assert (problem.line, problem.episode, problem.severity) == (2, "ok-1", "error")
    assert f"{literal} at byte" in problem.message and "allow_nan" in problem.message


def test_number_out_of_range_names_its_episode(tmp_path):
    line = _lines()[1].replace(b'"tests_pass":1.0', b'"tests_pass":1e999')
    ids, diagnostics = _read(_with_middle(tmp_path, line))
    assert ids == ["ok-0", "ok-2"]
    (problem,) = diagnostics.problems
    assert problem.episode == "ok-1" and "out of range" in problem.message


def test_deeply_nested_line_is_one_error_not_a_crash(tmp_path):
    deep = b'{"format":"callgrove.episode/1","id":"deep","task":' + b"[" * 100_000
    deep += b"]" * 100_000 + b"}\n"
    ids, diagnostics = _read(_with_middle(tmp_path, deep))
    assert ids == ["ok-0", "ok-2"]
    (problem,) = diagnostics.problems
    assert (problem.line, problem.episode) == (2, "deep")
    assert "nested too deeply" in problem.message
    with pytest.raises(InputError, match="nested too deeply"):
        list(load(_with_middle(tmp_path, deep)))


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".jsonl.zst"])
def test_file_that_is_not_compressed_as_named_is_an_input_error(tmp_path, suffix):
    path = tmp_path / f"traces{suffix}"
    path.write_bytes(b"".join(_lines()))
    ids, diagnostics = _read(path)
    assert ids == []
    (problem,) = diagnostics.problems
    assert problem.kind == "malformed" and problem.file == str(path)
    assert f"not {'gzip' if suffix.endswith('gz') else 'zstd'} data" in problem.message
    with pytest.raises(InputError):
        list(load(path))


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".jsonl.zst"])
def test_trailing_garbage_after_compressed_data_keeps_the_episodes(tmp_path, suffix):
    path = tmp_path / f"traces{suffix}"
    save(path, [healthy(i) for i in IDS])
    path.write_bytes(path.read_bytes() + b"this is not compressed")
    ids, diagnostics = _read(path)
    assert ids == IDS
    (problem,) = diagnostics.problems
    assert problem.line == 4 and "trailing bytes" in problem.message


def test_empty_compressed_files_hold_no_episodes(tmp_path):
    for suffix in (".jsonl.gz", ".jsonl.zst"):
        written = tmp_path / f"written{suffix}"
        save(written, [])
        empty = tmp_path / f"empty{suffix}"
        empty.write_bytes(b"")
        for path in (written, empty):
            assert _read(path) == ([], Diagnostics())


def test_highly_compressed_zstd_streams_in_bounded_memory(tmp_path):
    # Agent histories repeat, so real trace files compress like this: 256 MB in a few KB.
    path = tmp_path / "traces.jsonl.zst"
    line = b'{"format":"x","id":"' + b"a" * 4000 + b'"}\n'
    with open_binary(path, "wb") as stream:
        for _ in range(64):
            stream.write(line * 1024)
    assert path.stat().st_size < 100_000
    script = (
        "import resource, sys\n"
        "from callgrove.formats.jsonl import iter_lines\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "count = sum(1 for _ in iter_lines(sys.argv[1]))\n"
        "grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before\n"
        "print(count, grown)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    count, grown_kib = map(int, done.stdout.split())
    assert count == 64 * 1024
    assert grown_kib < 64 * 1024  # under 64 MiB for 256 MiB of lines


def test_gzip_cut_inside_a_member_keeps_complete_lines(tmp_path):
    path = tmp_path / "traces.jsonl.gz"
    with gzip.open(path, "wb") as stream:
        for line in _lines():
            stream.write(line)
            stream.flush()
    data = path.read_bytes()
    path.write_bytes(data[:-12])  # the member's end (and a little data) never written
    ids, diagnostics = _read(path)
    assert ids == IDS[: len(ids)] and len(ids) >= 2
    assert [p.kind for p in diagnostics.problems] == ["truncated"]


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    text=st.lists(st.sampled_from([b"a", b"bb", b"\n", b" ", b"{}", b"\t"]), max_size=40).map(
        b"".join
    ),
    block=st.integers(1, 9),
)
def test_plain_files_read_in_blocks_give_every_line_as_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: bytes, block: int
) -> None:
    monkeypatch.setattr(jsonl, "_BLOCK_BYTES", block)
    path = tmp_path / "lines.jsonl"
    path.write_bytes(text)
    expected = [
        (number, line, line.endswith(b"\n"))
        for number, line in enumerate(text.splitlines(keepends=True), start=1)
        if not line.isspace()
    ]
    assert list(jsonl.iter_lines(path)) == expected

"""An episode id is unique within a file: a second episode with an earlier one's id is named
and counted, never read (or written) as another copy whose rows would train twice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from callgrove.cli import app
from callgrove.episode import encode_episode, load, save
from callgrove.episode.binary import BinaryEpisodeWriter
from callgrove.formats import Diagnostics, InputError

from .helpers import cancelled, healthy

runner = CliRunner()


def _write(path: Path, ids: list[str]) -> None:
    """Episodes with these ids, as they are (the checked writers refuse a repeated id)."""
    episodes = [healthy(i) if n % 2 == 0 else cancelled(i) for n, i in enumerate(ids)]
    if path.suffix in (".parquet", ".arrow"):
        with BinaryEpisodeWriter(path) as writer:
            for episode in episodes:
                writer.write(episode)
    else:
        path.write_bytes(b"".join(encode_episode(e) for e in episodes))


IDS = ["a", "b", "a", "c", "a", "b"]


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet", ".arrow"])
def test_repeated_ids_are_reported_each_time_and_read_once(tmp_path, suffix):
    path = tmp_path / f"traces{suffix}"
    _write(path, IDS)
    diagnostics = Diagnostics()
    assert [e.id for e in load(path, diagnostics)] == ["a", "b", "c"]
    found = [(p.line, p.episode, p.message) for p in diagnostics.errors]
    message = "episode id appears twice in the file (first at line {}); this copy is not used"
    assert found == [
        (3, "a", message.format(1)),
        (5, "a", message.format(1)),
        (6, "b", message.format(2)),
    ]
    assert diagnostics.counts()["duplicate"] == 3
    with pytest.raises(InputError) as raised:
        list(load(path))
    assert (raised.value.problem.line, raised.value.problem.episode) == (3, "a")


def test_ids_repeated_in_separate_files_are_fine(tmp_path):
    for name in ("one.jsonl", "two.jsonl"):
        _write(tmp_path / name, ["a", "b"])
        assert [e.id for e in load(tmp_path / name)] == ["a", "b"]


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".parquet"])
def test_writers_refuse_a_repeated_id(tmp_path, suffix):
    path = tmp_path / f"traces{suffix}"
    with pytest.raises(InputError, match="appears twice") as raised:
        save(path, [healthy("a"), healthy("b"), healthy("a")])
    assert raised.value.problem.episode == "a"
    assert not path.exists()


def test_rows_of_a_file_with_a_repeated_id_do_not_double(tmp_path):
    path = tmp_path / "traces.jsonl"
    _write(path, ["a", "b", "a"])
    result = runner.invoke(app, ["rows", str(path), "--json"])
    assert result.exit_code == 1
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert sorted({r["episode"] for r in rows}) == ["a"]  # b was cancelled: no rows
    _write(tmp_path / "once.jsonl", ["a"])
    once = runner.invoke(app, ["rows", str(tmp_path / "once.jsonl"), "--json"])
    assert len(rows) == len(once.stdout.splitlines())
    assert f"{path}:3: episode a: episode id appears twice" in result.stderr


@pytest.mark.parametrize(
    "command", [["check"], ["stats", "--skip-bad"], ["convert", "{out}", "--skip-bad"]]
)
def test_every_command_names_and_counts_repeated_ids(tmp_path, command):
    path = tmp_path / "traces.jsonl"
    _write(path, IDS)
    out = tmp_path / "out.jsonl"
    args = [part.format(out=out) for part in command]
    result = runner.invoke(app, [args[0], str(path), *args[1:]])
    assert result.exit_code == 1, result.output
    assert result.output.count("appears twice") == 3, result.output
    if out.exists():
        assert [e.id for e in load(out)] == ["a", "b", "c"]

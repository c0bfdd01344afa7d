"""A field callgrove's format does not have is never passed over quietly: every reader names
it (file, line, episode, call) and counts it; `convert`, whose output would lose it for good,
refuses the episode unless --drop-unknown is given."""

from __future__ import annotations

import gzip
import json
import warnings

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from callgrove.cli import app
from callgrove.episode import encode_episode, load, save
from callgrove.formats import Diagnostics
from callgrove.formats.jsonl import InputWarning

from .helpers import cancelled, healthy

runner = CliRunner()

# every place of an episode line whose keys the format names, with a field it does not have
UNKNOWN = {
    "score": lambda e: e,
    "env.region": lambda e: e["env"],
    "run.seed": lambda e: e["run"],
    "run.policy.lag": lambda e: e["run"]["policy"],
    "agents[1].model": lambda e: e["agents"][1],
    "agents[0].calls[1].tokens_used": lambda e: e["agents"][0]["calls"][1],
}


def _lines(with_unknown: bool) -> list[bytes]:
    """Three episodes; the second holds every unknown field (and an error that holds one)."""
    middle = json.loads(encode_episode(healthy("b")))
    if with_unknown:
        for path, where in UNKNOWN.items():
            where(middle)[path.rsplit(".", 1)[-1]] = 1
        middle["errors"] = [{"type": "Timeout", "message": "slow", "retry": True}]
    return [
        encode_episode(healthy("a")),
        json.dumps(middle).encode() + b"\n",
        encode_episode(cancelled("c")),
    ]


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_each_unknown_field_is_named_where_it_is_and_the_episode_read(tmp_path, suffix):
    path = tmp_path / f"in{suffix}"
    data = b"".join(_lines(True))
    path.write_bytes(gzip.compress(data) if suffix.endswith(".gz") else data)
    diagnostics = Diagnostics()
    assert [e.id for e in load(path, diagnostics)] == ["a", "b", "c"]
    found = {p.message.split()[1]: p for p in diagnostics.problems}
    assert set(found) == {*UNKNOWN, "errors[0].retry"}
    for name, problem in found.items():
        assert (problem.file, problem.line, problem.episode) == (str(path), 2, "b")
        assert (problem.severity, problem.kind) == ("warning", "unknown_field")
        assert problem.call == ("C3" if "calls" in name else None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert [e.id for e in load(path)] == ["a", "b", "c"]
    assert sum(issubclass(w.category, InputWarning) for w in caught) == len(found)


def test_a_file_without_unknown_fields_reports_nothing(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"".join(_lines(False)))
    diagnostics = Diagnostics()
    assert len(list(load(path, diagnostics))) == 3 and diagnostics.problems == []


def test_a_binary_column_the_layout_does_not_have_is_named(tmp_path):
    path = tmp_path / "in.parquet"
    save(path, [healthy("a"), cancelled("c")])
    table = pq.read_table(path)
    pq.write_table(table.append_column("score", pa.array([1, 2])), path)
    diagnostics = Diagnostics()
    assert [e.id for e in load(path, diagnostics)] == ["a", "c"]
    [problem] = diagnostics.problems
    assert problem.kind == "unknown_field" and "column score" in problem.message
    assert problem.file == str(path)
    refusing = Diagnostics(refused=frozenset({"unknown_field"}))
    assert list(load(path, refusing)) == [] and refusing.errors


def test_convert_refuses_to_lose_a_field_unless_told(tmp_path):
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"".join(_lines(True)))
    out = tmp_path / "out.jsonl"
    stopped = runner.invoke(app, ["convert", str(source), str(out)])
    assert stopped.exit_code == 1 and not out.exists()
    assert f"{source}:2: episode b: field score is not part" in stopped.stderr
    assert "--drop-unknown" in stopped.stderr
    skipped = runner.invoke(app, ["convert", "--skip-bad", str(source), str(out)])
    assert skipped.exit_code == 1
    assert [json.loads(line)["id"] for line in out.read_bytes().splitlines()] == ["a", "c"]
    assert "unknown_field 7" in skipped.stderr
    out.unlink()
    dropped = runner.invoke(app, ["convert", "--drop-unknown", str(source), str(out)])
    assert dropped.exit_code == 0, dropped.output
    assert "0 error(s), 7 warning(s) (unknown_field 7)" in dropped.stderr
    written = [json.loads(line) for line in out.read_bytes().splitlines()]
    assert [e["id"] for e in written] == ["a", "b", "c"] and "score" not in written[1]
    stats = runner.invoke(app, ["stats", str(source)])
    assert stats.exit_code == 0 and "field score is not part" in stats.stderr

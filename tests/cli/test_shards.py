"""rows and stats over shards (byte ranges of one file, or many files), on a process pool and on
Ray: the same output as one process, problems at the lines where they are."""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from callgrove.cli import app, shards
from callgrove.episode import save
from callgrove.synth import Shape, synth_episodes

runner = CliRunner()
SHAPE = Shape(context=512, leader_calls=6, subagent_calls=2)


@pytest.fixture
def small_shards(monkeypatch):
    monkeypatch.setattr(shards, "MIN_SHARD_BYTES", 4096)


@pytest.fixture
def episodes_file(tmp_path: Path) -> Path:
    path = tmp_path / "episodes.jsonl"
    save(path, synth_episodes(SHAPE, 24, seed=1))
    return path


def run(*args: str):
    result = runner.invoke(app, [str(a) for a in args])
    return result


def test_a_plain_file_is_cut_at_line_starts_and_covered_whole(small_shards, episodes_file):
    planned = shards.plan_shards([episodes_file], jobs=2)
    data = episodes_file.read_bytes()
    assert len(planned) > 2
    assert planned[0].byte_range[0] == 0 and planned[-1].byte_range[1] == len(data)
    for before, after in pairwise(planned):
        assert before.byte_range[1] == after.byte_range[0]
        assert data[after.byte_range[0] - 1 : after.byte_range[0]] == b"\n"
    assert sum(s.line_count() for s in planned) == data.count(b"\n")


def test_rows_on_a_pool_are_byte_for_byte_the_rows_of_one_process(
    small_shards, episodes_file, tmp_path
):
    other = tmp_path / "more.parquet"
    save(other, synth_episodes(SHAPE, 5, seed=100))
    one = run("rows", "--json", "--tokens", episodes_file, other)
    pooled = run("rows", "--json", "--tokens", "-j", "2", episodes_file, other)
    assert one.exit_code == pooled.exit_code == 0, pooled.output
    assert one.stdout_bytes == pooled.stdout_bytes
    assert len(one.stdout_bytes.splitlines()) > 24
    run("rows", "-o", tmp_path / "one.parquet", episodes_file, other)
    run("rows", "-o", tmp_path / "pooled.parquet", "-j", "2", episodes_file, other)
    assert pq.read_table(tmp_path / "one.parquet").equals(
        pq.read_table(tmp_path / "pooled.parquet")
    )


def test_stats_on_a_pool_add_up_to_the_stats_of_one_process(small_shards, episodes_file):
    one = json.loads(run("stats", "--json", episodes_file).stdout)
    pooled = json.loads(run("stats", "--json", "-j", "2", episodes_file).stdout)
    assert_close(one, pooled)
    assert one["episodes"] == 24 and one["calls"] == 24 * SHAPE.calls


def assert_close(a, b, where="$"):
    """Equal, numbers to 1e-9 (partial sums are added in another order)."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_close(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_close(x, y, f"{where}[{i}]")
    elif isinstance(a, float):
        assert b == pytest.approx(a, rel=1e-9, abs=1e-12), where
    else:
        assert a == b, where


def test_a_bad_line_in_a_later_shard_is_reported_at_its_line(small_shards, episodes_file):
    lines = episodes_file.read_bytes().splitlines(keepends=True)
    lines[17] = b'{"format": "callgrove.episode/1", "id": broken\n'
    episodes_file.write_bytes(b"".join(lines))
    one = run("stats", "--skip-bad", episodes_file)
    pooled = run("stats", "--skip-bad", "-j", "2", episodes_file)
    assert one.exit_code == pooled.exit_code == 1
    assert f"{episodes_file}:18" in one.stderr
    assert f"{episodes_file}:18" in pooled.stderr
    rows = run("rows", "--json", "-j", "2", episodes_file)
    assert rows.exit_code == 1 and f"{episodes_file}:18" in rows.stderr
    assert rows.stdout_bytes == run("rows", "--json", episodes_file).stdout_bytes


def test_rows_shards_need_an_output(episodes_file):
    result = run("rows", "-j", "2", episodes_file)
    assert result.exit_code == 2 and "--json or -o FILE" in result.stderr


def test_ray_gives_what_the_pool_gives(small_shards, episodes_file):
    pytest.importorskip("ray")
    pooled = run("rows", "--json", "-j", "2", episodes_file)
    on_ray = run("rows", "--json", "-j", "2", "--executor", "ray", episodes_file)
    assert on_ray.exit_code == 0, on_ray.output
    assert on_ray.stdout_bytes == pooled.stdout_bytes
    stats_pool = run("stats", "--json", "-j", "2", episodes_file)
    stats_ray = run("stats", "--json", "-j", "2", "--executor", "ray", episodes_file)
    assert stats_ray.exit_code == 0, stats_ray.output
    assert stats_ray.stdout == stats_pool.stdout


@pytest.mark.parametrize("name", ["out.jsonl", "out.jsonl.gz", "out.parquet"])
def test_convert_on_a_pool_writes_what_one_process_writes(
    small_shards, episodes_file, tmp_path, name
):
    one, pooled = tmp_path / "one" / name, tmp_path / "pooled" / name
    one.parent.mkdir()
    pooled.parent.mkdir()
    first = run("convert", episodes_file, one, "--from", "callgrove", "--to", "callgrove")
    second = run(
        "convert", episodes_file, pooled, "--from", "callgrove", "--to", "callgrove", "-j", "2"
    )
    assert first.exit_code == second.exit_code == 0, second.output
    assert first.stderr.replace(str(one), "OUT") == second.stderr.replace(str(pooled), "OUT")
    if name == "out.jsonl":
        assert one.read_bytes() == pooled.read_bytes()
    assert run("rows", "--json", one).stdout_bytes == run("rows", "--json", pooled).stdout_bytes


def test_convert_on_a_pool_stops_as_one_process_stops(small_shards, episodes_file, tmp_path):
    lines = episodes_file.read_bytes().splitlines(keepends=True)
    lines[17] = b"not json\n"
    episodes_file.write_bytes(b"".join(lines))
    one, pooled = tmp_path / "one.jsonl", tmp_path / "pooled.jsonl"
    first = run("convert", episodes_file, one, "--from", "callgrove", "--to", "callgrove")
    second = run(
        "convert", episodes_file, pooled, "--from", "callgrove", "--to", "callgrove", "-j", "2"
    )
    assert first.exit_code == second.exit_code == 1
    assert f"{episodes_file}:18" in second.stderr
    assert not one.exists() and not pooled.exists()  # the first error abandons the output


def test_an_id_repeated_in_another_shard_is_reported_as_one_process_reports_it(
    small_shards, episodes_file, tmp_path
):
    lines = episodes_file.read_bytes().splitlines(keepends=True)
    lines[20] = lines[2]  # the third episode again, in the last byte range
    lines[21] = lines[2]
    episodes_file.write_bytes(b"".join(lines))
    planned = shards.plan_shards([episodes_file], jobs=2)
    starts = [sum(s.line_count() for s in planned[:i]) for i in range(len(planned))]
    assert 3 <= starts[1] <= 20  # the repeats are in another byte range than line 3
    repeat = json.loads(lines[2])["id"]
    for command in (("stats", "--skip-bad"), ("convert", "--skip-bad", "--from", "callgrove")):
        out = (tmp_path / "out.jsonl",) if command[0] == "convert" else ()
        one = run(*command, episodes_file, *out)
        pooled = run(*command, "-j", "2", episodes_file, *out)
        assert one.exit_code == pooled.exit_code == 1, pooled.output
        for result in (one, pooled):
            assert result.stderr.count("appears twice") == 2
            assert f"{episodes_file}:21" in result.stderr and f"{episodes_file}:22" in result.stderr
            assert result.stderr.count("first at line 3") == 2 and repeat in result.stderr
        assert one.stderr == pooled.stderr
    stopped = run("convert", "--from", "callgrove", "-j", "2", episodes_file, tmp_path / "x.jsonl")
    assert stopped.exit_code == 1 and f"{episodes_file}:21" in stopped.stderr
    assert not (tmp_path / "x.jsonl").exists()
    one_rows = run("rows", "--json", episodes_file)
    pooled_rows = run("rows", "--json", "-j", "2", episodes_file)
    assert one_rows.stdout_bytes == pooled_rows.stdout_bytes
    assert pooled_rows.stderr.count("appears twice") == 2
    for jobs in ("1", "2"):
        converted = tmp_path / f"conv{jobs}.jsonl"
        run("convert", "--skip-bad", "--from", "callgrove", "-j", jobs, episodes_file, converted)
        ids = [json.loads(line)["id"] for line in converted.read_bytes().splitlines()]
        assert len(ids) == 22 and ids.count(repeat) == 1

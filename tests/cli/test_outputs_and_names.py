"""Commands with hostile names and outputs: an output that is an input, a missing or folder
output, a failed run, and ids or file names holding markup or control characters."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from xml.etree import ElementTree

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from callgrove.cli import app
from callgrove.episode import load

EXAMPLES = Path(__file__).parents[2] / "examples"
runner = CliRunner()


def run(*args: object):
    return runner.invoke(app, [str(a) for a in args])


@pytest.fixture
def group(tmp_path: Path) -> Path:
    path = tmp_path / "s.jsonl"
    shutil.copy(EXAMPLES / "login_group.jsonl", path)
    return path


@pytest.mark.parametrize(
    "command",
    [
        ["rows", "{in}", "--out", "{in}"],
        ["convert", "{in}", "{in}", "--from", "callgrove", "--to", "callgrove"],
        ["show", "{in}", "--html", "{in}"],
        ["show", "{in}", "--svg", "{in}"],
        ["import", "claude-code", "{in}", "--out", "{in}"],
    ],
)
def test_output_onto_an_input_is_refused_and_the_input_kept(group, command):
    before = group.read_bytes()
    result = run(*(part.format(**{"in": group}) for part in command))
    assert result.exit_code == 2, result.output
    assert "is an input of this command too" in result.output
    assert group.read_bytes() == before


def test_output_onto_a_gzip_input_is_refused(tmp_path):
    path = tmp_path / "s.jsonl.gz"
    run("convert", EXAMPLES / "login_group.jsonl", path, "--from", "callgrove", "--to", "callgrove")
    before = path.read_bytes()
    result = run("rows", path, "--out", path)
    assert result.exit_code == 2 and path.read_bytes() == before


@pytest.mark.parametrize(
    ("where", "command"),
    [
        ("missing/out.parquet", "rows"),
        ("missing/out.parquet", "show"),
        ("folder.parquet", "rows"),
        ("folder.parquet", "show"),
        ("folder.parquet", "convert"),
    ],
)
def test_unwritable_output_is_a_usage_error_not_a_traceback(group, tmp_path, where, command):
    (tmp_path / "folder.parquet").mkdir()
    target = tmp_path / where
    if command == "show":
        target = target.with_suffix(".html")
        (tmp_path / "folder.html").mkdir()
        args = ["show", group, "--html", target]
    elif command == "rows":
        args = ["rows", group, "--out", target]
    else:
        args = ["convert", group, target, "--from", "callgrove", "--to", "callgrove"]
    result = run(*args)
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "cannot write" in result.output


@pytest.mark.parametrize("target", ["new/deeper/out.parquet", "new/out.jsonl.gz", "results"])
def test_convert_makes_the_folder_of_its_output(group, tmp_path, target):
    """`convert IN new/folder/OUT` makes the folder (a verifiers results folder too)."""
    out = tmp_path / target
    to = "verifiers" if target == "results" else "callgrove"
    result = run("convert", group, out, "--from", "callgrove", "--to", to)
    assert result.exit_code == 0, result.output
    written = out / "traces.jsonl" if to == "verifiers" else out
    assert len(list(load(written))) == len(list(load(group)))


def test_convert_stopped_by_a_bad_line_leaves_the_earlier_output(group, tmp_path):
    out = tmp_path / "out.parquet"
    assert run("convert", group, out, "--from", "callgrove", "--to", "callgrove").exit_code == 0
    before = out.read_bytes()
    lines = group.read_bytes().splitlines(keepends=True)
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(lines[0] + b"{not json}\n" + b"".join(lines[1:]))
    result = run("convert", bad, out, "--from", "callgrove", "--to", "callgrove")
    assert result.exit_code == 1
    assert "nothing written" in result.output
    assert out.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    # with --skip-bad the good episodes are converted and the file replaced
    result = run("convert", bad, out, "--from", "callgrove", "--to", "callgrove", "--skip-bad")
    assert result.exit_code == 1
    assert len(list(load(out))) == len(lines)


def test_failed_import_leaves_the_earlier_output(tmp_path, group):
    result = run("import", "claude-code", tmp_path / "nonexistent", "--out", group)
    assert result.exit_code == 1
    assert group.read_bytes() == (EXAMPLES / "login_group.jsonl").read_bytes()


def test_rows_out_parquet_with_no_rows_has_the_columns(group, tmp_path):
    out = tmp_path / "rows.parquet"
    result = run("rows", group, "--out", out, "--episode", "no-such-episode")
    assert result.exit_code == 1  # the episode was not found
    table = pq.read_table(out)
    assert table.num_rows == 0 and "token_ids" in table.column_names


def test_rows_out_parquet_groups_rows_instead_of_one_group_per_episode(tmp_path, monkeypatch):
    from callgrove.cli import rows as rows_module

    path = tmp_path / "many.jsonl"
    lines = (EXAMPLES / "login_group.jsonl").read_bytes().splitlines()
    with path.open("wb") as stream:
        for copy in range(30):
            for line in lines:
                record = json.loads(line)
                record["id"] = f"{record['id']}-{copy}"
                stream.write(json.dumps(record).encode() + b"\n")
    monkeypatch.setattr(rows_module, "ROW_GROUP_TOKENS", 5_000)
    out = tmp_path / "rows.parquet"
    assert run("rows", path, "--out", out).exit_code == 0
    metadata = pq.ParquetFile(out).metadata
    episodes = 30 * len(lines)
    assert 1 < metadata.num_row_groups < episodes
    assert metadata.num_rows == pq.read_table(out).num_rows > episodes


def _hostile(tmp_path: Path) -> Path:
    """Episodes whose ids hold rich markup and control characters, in a file whose name holds
    markup."""
    folder = tmp_path / "in"
    folder.mkdir()
    path = folder / "[red]y.jsonl"
    ids = ["a[/]b", "c[red]d\x1b[31m", "e\x07f\nx", "[bold]g"]
    with path.open("w") as stream:
        for line, new_id in zip(
            (EXAMPLES / "login_group.jsonl").read_text().splitlines(), ids, strict=True
        ):
            record = json.loads(line)
            record["id"] = new_id
            record["agents"][0]["name"] = "name[/]\x1b[2J"
            stream.write(json.dumps(record) + "\n")
    return path


@pytest.mark.parametrize("command", ["rows", "check", "show", "stats"])
def test_markup_and_control_characters_print_as_written(tmp_path, command):
    path = _hostile(tmp_path)
    result = run(command, path)
    assert result.exit_code == 0, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "\x1b" not in result.output and "\x07" not in result.output
    if command in ("check", "show"):
        for shown in ("a[/]b", "c[red]d\\x1b[31m", "e\\x07f\\nx", "[bold]g"):
            assert shown in result.output


def test_markup_in_a_file_name_is_printed_as_written(tmp_path):
    path = _hostile(tmp_path)
    path.write_text("{not json}\n")  # a bad line names the file
    result = run("stats", path)
    assert result.exit_code == 1
    assert "in/[red]y.jsonl" in result.output


def test_svg_of_ids_with_control_characters_is_well_formed_xml(tmp_path):
    path = _hostile(tmp_path)
    out = tmp_path / "picture.svg"
    result = run("show", path, "--episode", "e\x07f\nx", "--svg", out)
    assert result.exit_code == 0, result.output
    ElementTree.fromstring(out.read_text())  # raises on malformed XML
    assert "e\\x07f" in out.read_text() and "\x07" not in out.read_text()


def test_stats_stop_message_comes_right_after_the_first_error(group, tmp_path):
    lines = group.read_bytes().splitlines(keepends=True)
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(lines[0] + b"{not json}\n[1]\n{also not}\n" + b"".join(lines[1:]))
    result = run("stats", bad)
    assert result.exit_code == 1
    reported = [line for line in result.output.splitlines() if line.startswith("error")]
    assert len(reported) == 1 and f"{bad}:2" in reported[0]
    assert f"stopped at the first unusable line ({bad}:2)" in result.output

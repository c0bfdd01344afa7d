"""Bad input answered in one line: a file that is not episodes at all says what it looks like
(once, whichever reader meets it), and the inputs every command reads (a verifiers results
folder, a Gym capture with its invocations) read the same way in each."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import callgrove as cg
from callgrove.bench.contenders import write_gym_captures, write_verifiers_run
from callgrove.cli import app
from callgrove.formats.problems import Diagnostics, InputError

ROOT = Path(__file__).parents[2]
EXAMPLES = ROOT / "examples"
GROUP = EXAMPLES / "login_group.jsonl"
GYM_RECORDS = ROOT / "tests/interop/gym_records.py"  # Gym's own store writes the capture
runner = CliRunner()

MARKDOWN = "# A title\n\nSome prose.\n\n- a list\n- of things\n" * 60
NOT_EPISODES = {
    "markdown.jsonl": (MARKDOWN.encode(), "Markdown"),
    "table.jsonl": (b"episode,reward,ok\n" + b"e1,1.0,true\n" * 300, "CSV"),
    "tabs.jsonl": (b"episode\treward\n" + b"e1\t1.0\n" * 300, "tab-separated"),
    "config.jsonl": ((EXAMPLES / "train.toml").read_bytes(), "TOML"),
    "page.jsonl": (b"<!doctype html>\n<html>\n" + b"<p>x</p>\n" * 300, "HTML"),
    "pretty.jsonl": (
        json.dumps({"format": "callgrove.episode/1", "id": "e", "agents": []}, indent=2).encode(),
        "pretty-printed",
    ),
    "array.jsonl": (b"[\n" + b'  {"id": 1},\n' * 50 + b"]\n", "JSON array"),
    "garbage.jsonl": (bytes(range(256)) * 40, "binary data"),
    "picture.jsonl": (b"\x89PNG\r\n\x1a\n" + bytes(2000), "PNG"),
    "parquet.jsonl": ((b"PAR1" + bytes(300)), "Parquet data (name the file .parquet)"),
    "packed.jsonl": (gzip.compress(GROUP.read_bytes()), "gzip data (name the file .jsonl.gz)"),
    "prose.jsonl.gz": (gzip.compress(b"just some words\n" * 400), "plain text"),
}


def run(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def problem_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith(("error", "warning"))]


@pytest.fixture(params=sorted(NOT_EPISODES))
def not_episodes(request, tmp_path) -> tuple[Path, str]:
    data, looks = NOT_EPISODES[request.param]
    path = tmp_path / request.param
    path.write_bytes(data)
    return path, looks


@pytest.mark.parametrize("command", ["rows", "check", "show", "stats", "samples", "convert"])
def test_a_file_that_is_not_episodes_is_one_message(not_episodes, command, tmp_path):
    path, looks = not_episodes
    extra = {"samples": ["-o", tmp_path / "s.jsonl"], "convert": [tmp_path / "out.jsonl"]}
    result = run(command, path, *extra.get(command, []))
    assert result.exit_code == 1, result.output
    [line] = problem_lines(result.stderr)
    assert str(path) in line and looks in line and "not JSON Lines" in line, line
    assert "one JSON object per line" in line


def test_the_readme_given_to_rows_is_one_line():
    result = run("rows", ROOT / "README.md")
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        "error: "
        f"{ROOT / 'README.md'}:1: Markdown, not JSON Lines (it starts '# callgrove'); the file "
        "should hold one JSON object per line"
    ]


def test_python_readers_say_it_once_too(not_episodes):
    path, looks = not_episodes
    diagnostics = Diagnostics()
    assert list(cg.load(path, diagnostics, format="callgrove")) == []
    [problem] = diagnostics.problems
    assert problem.kind == "not_json_lines" and looks in problem.message
    with pytest.raises(InputError, match="not JSON Lines"):
        list(cg.load(path, format="callgrove"))


def test_verifiers_traces_that_are_not_json_lines_say_it_once(tmp_path):
    path = tmp_path / "traces.jsonl"
    path.write_text(MARKDOWN)
    diagnostics = Diagnostics()
    assert list(cg.load(path, diagnostics, format="verifiers")) == []
    assert [p.kind for p in diagnostics.problems] == ["not_json_lines"]


def test_broken_json_lines_are_still_read_line_by_line(tmp_path):
    """A file of episodes with bad lines among them is JSON Lines gone wrong: every good line
    is read, each bad one named (the file-level message is not for it)."""
    good = GROUP.read_text().splitlines()
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(["{oops", "{still bad", *good]) + "\n")
    diagnostics = Diagnostics()
    assert len(list(cg.load(path, diagnostics))) == len(good)
    assert [p.line for p in diagnostics.problems] == [1, 2]
    assert all(p.kind != "not_json_lines" for p in diagnostics.problems)


def test_a_text_line_above_json_lines_is_not_taken_for_a_text_file(tmp_path):
    good = GROUP.read_text().splitlines()
    path = tmp_path / "headed.jsonl"
    path.write_text("\n".join(["episodes below", *good]) + "\n")
    result = run("rows", path)
    [line] = problem_lines(result.stderr)
    assert f"{path}:1" in line and "not valid JSON" in line
    assert f"read: {len(good)} episode(s) used" in result.stderr
    assert "lost: 1 error(s) in the input" in result.stderr


def test_an_empty_file_is_one_warning(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_bytes(b"")
    for command in ("rows", "check", "stats"):
        result = run(command, path)
        assert result.exit_code == 0, result.output
        assert problem_lines(result.stderr) == [
            f"warning: {path}: an empty file, no episodes in it"
        ]


def test_rows_reads_a_verifiers_results_folder_as_convert_does(tmp_path):
    episodes = list(cg.load(GROUP))
    folder = write_verifiers_run(tmp_path / "run", episodes)
    from_folder = run("rows", folder, "--json")
    assert from_folder.exit_code == 0, from_folder.output
    assert from_folder.stdout == run("rows", folder / "traces.jsonl", "--json").stdout
    for command in ("check", "stats", "show"):
        assert run(command, folder).exit_code == 0, command
    converted = tmp_path / "c.jsonl"
    assert run("convert", folder, converted).exit_code == 0
    assert from_folder.stdout == run("rows", converted, "--json").stdout


def test_a_folder_of_neither_kind_is_a_usage_error(tmp_path):
    result = run("rows", tmp_path)
    assert result.exit_code == 2 and "neither a verifiers traces.jsonl" in result.stderr


def test_rows_of_a_gym_capture_take_its_invocations(tmp_path):
    """A Gym token capture's rows, read with its invocations file, are the rows `convert`
    makes of the same capture and invocations."""
    from nemo_gym.token_id_capture import TokenCaptureStore

    spec = importlib.util.spec_from_file_location("gym_records", GYM_RECORDS)
    records = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(records)
    store = TokenCaptureStore(tmp_path / "tokens")
    records.seed_capture(store)
    invocations = records.write_rows(tmp_path / "rollouts.jsonl", [records.seed_rollout_row()])
    rows = run("rows", store.root, "--invocations", invocations, "--json")
    assert rows.exit_code == 0, rows.output
    agents = {row["agent"] for row in json.loads("[" + ",".join(rows.stdout.split()) + "]")}
    assert agents == {"L", "B", "A", "F"}  # the invocations name the agents
    converted = tmp_path / "c.jsonl"
    made = run("convert", store.root, "--from", "gym", "--invocations", invocations, converted)
    assert made.exit_code == 0, made.output
    assert rows.stdout == run("rows", converted, "--json").stdout
    alone = run("rows", store.root, "--json")  # without them: one agent a call chain
    assert alone.stdout != rows.stdout
    for command in ("check", "show", "stats"):
        assert run(command, store.root, "--invocations", invocations).exit_code == 0, command


def test_invocations_need_one_gym_capture(tmp_path):
    invocations = tmp_path / "rollouts.jsonl"
    invocations.write_text("{}\n")
    result = run("rows", GROUP, "--invocations", invocations)
    assert result.exit_code == 2 and "one NeMo Gym capture" in result.stderr
    folder = write_gym_captures(tmp_path / "gym", list(cg.load(GROUP)))
    missing = run("rows", folder, "--invocations", tmp_path / "none.jsonl")
    assert missing.exit_code == 2 and "no such file" in missing.stderr
    sharded = run("rows", folder, "--invocations", invocations, "-j", "2", "--json")
    assert sharded.exit_code == 2 and "leave out -j" in sharded.stderr

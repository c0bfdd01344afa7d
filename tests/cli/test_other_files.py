"""One of callgrove's own files that holds no episodes (a capture gateway's calls ledger, a
samples or rows file, a training run's metrics, a run or ledger folder) given to a reading
command is one line saying what it is and what to give instead, never an error per line."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

import callgrove as cg
from callgrove.cli import app
from callgrove.episode.files import NOT_EPISODES, NotEpisodes, register
from callgrove.formats.problems import Diagnostics
from callgrove.gateway.ledger import EPISODES_FILE, call_line

ROOT = Path(__file__).parents[2]
GROUP = ROOT / "examples/login_group.jsonl"
runner = CliRunner()
COMMANDS = ["rows", "check", "stats", "show", "samples", "convert"]


def run(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def problem_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith(("error", "warning"))]


def write_ledger(path: Path) -> None:
    """A calls ledger as the gateway writes it: each call in the episode format's form with
    the gateway's fields, then the close."""
    episode = next(iter(cg.load(GROUP)))
    gateway_fields = {
        "agent": {"id": "L", "name": "leader", "parent": None, "start": "root"},
        "history": "ab12",
        "prompt_key": "",
        "tools": "",
        "api": "chat",
        "harness": "claude-code",
        "version": "1",
        "path": "/v1/chat/completions",
        "time": 1.0,
    }
    with path.open("wb") as out:
        for call in episode.calls():
            out.write(call_line(call, gateway_fields))
        out.write(b'{"closing": {"rewards": {"r": 1.0}}}\n{"closed": true}\n')


@pytest.fixture(scope="module")
def other_files(tmp_path_factory) -> dict[str, tuple[Path, str]]:
    """Each kind of file: where it is and the words its one line must hold."""
    folder = tmp_path_factory.mktemp("others")
    files: dict[str, tuple[Path, str]] = {}
    ledger = folder / "ep-1.calls.jsonl"
    write_ledger(ledger)
    files["ledger"] = (
        ledger,
        f"calls ledger (.calls.jsonl: a line per call of one episode, while it is open), not an episode file: read {EPISODES_FILE}",
    )
    renamed = folder / "calls-copy.jsonl"
    shutil.copy(ledger, renamed)
    files["ledger renamed"] = (renamed, "calls ledger")
    for form in ("jsonl", "parquet"):
        samples = folder / f"samples.{form}"
        assert run("samples", GROUP, "--algorithm", "grpo", "-o", samples).exit_code == 0
        files[f"samples {form}"] = (samples, "a samples file")
        rows = folder / f"rows.{form}"
        if form == "jsonl":
            rows.write_bytes(run("rows", GROUP, "--json").stdout_bytes)
        else:
            assert run("rows", GROUP, "-o", rows).exit_code == 0
        files[f"rows {form}"] = (rows, "a rows file")
    metrics = folder / "run" / "metrics.jsonl"
    metrics.parent.mkdir()
    metrics.write_text('{"step": 1, "loss": 0.5, "reward": 1.0}\n{"step": 2, "loss": 0.4}\n')
    files["metrics"] = (metrics, "a training run's metrics.jsonl")
    files["run folder"] = (metrics.parent, "a training run's folder")
    ledger_folder = folder / "ledger"
    ledger_folder.mkdir()
    shutil.copy(ledger, ledger_folder / "ep-1.calls.jsonl")
    (ledger_folder / EPISODES_FILE).write_bytes(GROUP.read_bytes())
    files["ledger folder"] = (ledger_folder, f"ledger folder: give its {EPISODES_FILE}")
    return files


KINDS = [
    "ledger",
    "ledger renamed",
    "samples jsonl",
    "samples parquet",
    "rows jsonl",
    "rows parquet",
    "metrics",
    "run folder",
    "ledger folder",
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("command", COMMANDS)
def test_one_line_says_what_the_file_is(command, kind, other_files, tmp_path):
    path, words = other_files[kind]
    extra = {"samples": ["-o", tmp_path / "s.jsonl"], "convert": [tmp_path / "c.jsonl"]}
    result = run(command, path, *extra.get(command, []))
    assert result.exit_code == 2, result.output
    [line] = problem_lines(result.stderr)
    assert line.startswith(f"error: {path}: ") and words in line, line
    assert not (tmp_path / "s.jsonl").exists() and not (tmp_path / "c.jsonl").exists()


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_asks_the_one_registry(command, tmp_path):
    """A kind registered once is named by every command, with its hint."""
    register(NotEpisodes("notes", (".notes.jsonl",), "a notes file, not an episode file: go"))
    try:
        path = tmp_path / "a.notes.jsonl"
        path.write_bytes(GROUP.read_bytes())
        extra = {"samples": ["-o", tmp_path / "s.jsonl"], "convert": [tmp_path / "c.jsonl"]}
        result = run(command, path, *extra.get(command, []))
    finally:
        del NOT_EPISODES["notes"]
    assert result.exit_code == 2, result.output
    assert problem_lines(result.stderr) == [f"error: {path}: a notes file, not an episode file: go"]


@pytest.mark.parametrize("kind", ["ledger", "samples jsonl", "rows jsonl", "metrics"])
def test_the_python_reader_says_it_once(kind, other_files):
    path, _words = other_files[kind]
    diagnostics = Diagnostics()
    assert list(cg.load(path, diagnostics)) == []
    [problem] = diagnostics.problems
    assert problem.kind == "other_kind" and problem.line == 1
    assert "not callgrove.episode/1 episodes: no record has a `format` field" in problem.message


def test_episodes_missing_their_format_in_one_line_are_still_read_line_by_line(tmp_path):
    lines = GROUP.read_bytes().splitlines()
    lines[1] = lines[1].replace(b'"format":"callgrove.episode/1",', b"", 1)
    path = tmp_path / "one-without.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    diagnostics = Diagnostics()
    assert len(list(cg.load(path, diagnostics))) == 3
    [problem] = diagnostics.problems
    assert problem.line == 2 and "format" in problem.message

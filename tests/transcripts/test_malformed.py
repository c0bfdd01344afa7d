"""Broken transcripts: each bad line is reported with its file and line; the rest imports."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from callgrove.cli import app
from callgrove.transcripts import ImportReport, TranscriptRenderer, import_claude_code, import_codex

from .helpers import (
    CODEX_SMALL,
    FLAT,
    FLAT_DIR,
    KIMUSON,
    STAGE0_SUBAGENT,
    assert_every_line_accounted,
    assert_prefix_stable,
)


def test_truncated_and_malformed_claude_session(tmp_path):
    lines = KIMUSON.read_text().splitlines()
    broken = tmp_path / KIMUSON.name
    # line 30 (a sidechain's one-line API response) is cut in half, line 45 (the second line
    # of a leader response) is not JSON, and the last line (the final answer) was being
    # written when the process died.
    lines[29] = lines[29][: len(lines[29]) // 2]
    lines[44] = "[1, 2"
    broken.write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:50])
    report = ImportReport()
    (transcript,) = import_claude_code(broken, report)
    problems = {(p.line, p.severity, p.message.split(":")[0]) for p in report.diagnostics.problems}
    assert (30, "error", "not valid JSON") in problems
    assert (45, "error", "not valid JSON") in problems
    assert (
        53,
        "warning",
        "truncated final line (no newline, incomplete JSON); ignored",
    ) in problems
    assert all(p.file == str(broken) for p in report.diagnostics.problems)
    # The line after the lost one names a parent that is gone: its history restarts there,
    # and it stays in its sidechain.
    assert any(
        p.line == 31 and p.severity == "warning" and "names no earlier line" in p.message
        for p in report.diagnostics.problems
    )
    # Line 45's response keeps its first line; the sidechain loses line 30's response and the
    # leader its final answer.
    episode = TranscriptRenderer().episode(transcript)
    assert [len(a.calls) for a in episode.agents] == [9, 3, 6]
    assert_every_line_accounted(report)
    assert_prefix_stable(episode)


def test_cli_reports_file_and_line_and_exits_1(tmp_path):
    folder = tmp_path / "project"
    shutil.copytree(FLAT_DIR, folder)
    session = folder / "cb2e607c-c758-415a-8b45-c49e4631906a.jsonl"
    lines = session.read_text().splitlines()
    lines[9] = '{"type": "assistant", "message": '
    session.write_text("\n".join(lines) + "\n")
    out = tmp_path / "episodes.jsonl"
    result = CliRunner().invoke(app, ["import", "claude-code", str(folder), "--out", str(out)])
    assert result.exit_code == 1
    assert f"{session}:10: not valid JSON" in result.output
    assert "supervised training" in result.output
    episode = json.loads(out.read_text())
    assert [len(a["calls"]) for a in episode["agents"]] == [80, 5]


def test_codex_line_before_any_session_meta_and_bad_payload(tmp_path):
    lines = CODEX_SMALL.read_text().splitlines()
    broken = tmp_path / "rollout.jsonl"
    broken.write_text(
        "\n".join([lines[3], "nope", '{"type": "response_item", "payload": 3}', *lines]) + "\n"
    )
    report = ImportReport()
    episodes = [TranscriptRenderer().episode(t) for t in import_codex(broken, report)]
    messages = {(p.line, p.message) for p in report.diagnostics.problems}
    assert (1, "event_msg record before any session_meta; ignored") in messages
    assert any(line == 2 and m.startswith("not valid JSON") for line, m in messages)
    skipped = {(p.line, p.message) for p in report.skipped}
    assert (3, "response_item record without a payload object") in skipped
    assert len(episodes) == 2
    assert_every_line_accounted(report)


def test_subagent_file_without_its_session_and_a_missing_path(tmp_path):
    shutil.copy(FLAT_DIR / "agent-ea02459f.jsonl", tmp_path)
    report = ImportReport()
    (transcript,) = import_claude_code(tmp_path, report)
    assert [len(a.calls) for a in transcript.agents] == [5]
    (warning,) = report.diagnostics.warnings
    assert warning.file == str(tmp_path / "agent-ea02459f.jsonl")
    assert "names no session found beside it" in warning.message
    report = ImportReport()
    assert import_codex(tmp_path / "nowhere", report) == []
    assert [(p.file, p.message) for p in report.diagnostics.errors] == [
        (str(tmp_path / "nowhere"), "no such file or folder")
    ]


def test_a_file_of_the_other_harness_is_an_error_with_a_hint():
    report = ImportReport()
    assert import_codex(KIMUSON, report) == []
    (error,) = report.diagnostics.problems
    assert (error.file, error.severity) == (str(KIMUSON), "error")
    assert error.message == (
        "not a Codex rollout: this is a Claude Code session; "
        "import it with `callgrove import claude-code`"
    )
    assert_every_line_accounted(report)
    report = ImportReport()
    assert import_claude_code(CODEX_SMALL, report) == []
    (error,) = report.diagnostics.problems
    assert error.severity == "error" and error.message == (
        "not a Claude Code session: this is a Codex rollout; import it with `callgrove import codex`"
    )
    assert_every_line_accounted(report)


NOT_TRANSCRIPTS = {
    "LICENSE.jsonl": (
        b"MIT License\n\nPermission is hereby granted, free of charge\n",
        "not JSON Lines",
    ),
    "picture.jsonl": (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00", "a binary file"),
    "numbers.jsonl": (b'{"a": 1}\n{"b": 2}\n', "JSON Lines of another kind"),
    "empty.jsonl": (b"\n\n", "empty"),
}


@pytest.mark.parametrize("name", sorted(NOT_TRANSCRIPTS))
@pytest.mark.parametrize("importer", [import_claude_code, import_codex])
def test_a_file_that_is_no_transcript_is_an_error_and_no_episode(tmp_path, name, importer):
    data, says = NOT_TRANSCRIPTS[name]
    path = tmp_path / name
    path.write_bytes(data)
    report = ImportReport()
    assert importer(path, report) == []  # no episode, so no stand-in agent
    (error,) = report.diagnostics.errors
    assert error.file == str(path) and says in error.message
    assert_every_line_accounted(report)


def test_an_episode_file_given_to_an_importer_says_what_it_is(tmp_path):
    path = tmp_path / "episodes.jsonl"
    shutil.copy(Path(__file__).parents[2] / "examples" / "login_group.jsonl", path)
    for importer in (import_claude_code, import_codex):
        report = ImportReport()
        assert importer(path, report) == []
        (error,) = report.diagnostics.errors
        assert "this is a callgrove episode file" in error.message
        assert "`callgrove rows`" in error.message


def test_a_session_without_model_responses_is_no_episode(tmp_path):
    path = tmp_path / "s.jsonl"
    line = {
        "type": "user",
        "uuid": "u1",
        "parentUuid": None,
        "sessionId": "s",
        "message": {"role": "user", "content": "hello"},
    }
    path.write_text(json.dumps(line) + "\n")
    report = ImportReport()
    assert import_claude_code(path, report) == []
    (warning,) = report.diagnostics.warnings
    assert "no model response" in warning.message


def test_a_missing_subagent_file_is_a_gap_with_a_warning(tmp_path):
    shutil.copy(FLAT, tmp_path)
    report = ImportReport()
    (transcript,) = import_claude_code(tmp_path / FLAT.name, report)
    (gap,) = transcript.gaps
    assert (gap.kind, gap.agent) == ("subagent_file_missing", "agent-ea02459f")
    spawner = next(c for c in transcript.calls() if c.id == gap.call)
    assert any(t.name in ("Task", "Agent") for t in spawner.response.tool_calls)
    (warning,) = report.diagnostics.warnings
    assert "agent-ea02459f.jsonl was not found" in warning.message
    # with the file beside it, the same session has the subagent and no gap
    shutil.copy(FLAT_DIR / "agent-ea02459f.jsonl", tmp_path)
    (transcript,) = import_claude_code(tmp_path / FLAT.name, ImportReport())
    assert transcript.gaps == [] and len(transcript.agents) == 2


@pytest.mark.parametrize("text", ["[1, 2]", '"general-purpose"', "7", "null", "true", "{"])
def test_subagent_meta_file_that_is_not_an_object_is_reported(tmp_path, text):
    session = tmp_path / STAGE0_SUBAGENT.name
    shutil.copy(STAGE0_SUBAGENT, session)
    shutil.copytree(STAGE0_SUBAGENT.with_suffix(""), session.with_suffix(""))
    (meta_file,) = session.with_suffix("").glob("subagents/*.meta.json")
    meta_file.write_text(text)
    report = ImportReport()
    (transcript,) = import_claude_code(session, report)
    (problem,) = report.diagnostics.errors
    assert problem.file == str(meta_file)
    assert problem.message.startswith("not valid JSON" if text == "{" else "not a JSON object")
    # the subagent and its call are still imported, under the default name
    episode = TranscriptRenderer().episode(transcript)
    sub = episode.agents[1]
    assert sub.name == "subagent" and "meta_json" not in sub.meta and len(sub.calls) == 1
    assert_every_line_accounted(report)

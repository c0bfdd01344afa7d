"""Joining a capture: its tokens and logprobs, the transcript's agents, unmatched reported."""

from __future__ import annotations

import json

import numpy as np
from typer.testing import CliRunner

from callgrove.chat import BuiltinFormat
from callgrove.cli import app
from callgrove.episode import Agent, Call, Episode, load, save
from callgrove.forest import build_forest
from callgrove.transcripts import TranscriptRenderer, import_claude_code
from callgrove.transcripts.join import UNMATCHED_AGENT, join_capture

from .helpers import KIMUSON, assert_prefix_stable


def transcript_and_capture() -> tuple[Episode, Episode]:
    """A capture as a gateway would write it: one flat agent, its own ids, exact tokens and
    logprobs, no content; one call the transcript never recorded, one it has but the capture
    lost."""
    (transcript,) = import_claude_code(KIMUSON)
    episode = TranscriptRenderer().episode(transcript)
    (reference,) = import_claude_code(KIMUSON)
    tokens = TranscriptRenderer().episode(reference)  # same tokens, separate objects
    calls = sorted(tokens.calls(), key=lambda c: c.seq)
    lost = calls.pop(5)
    gateway = Agent("gateway", "gateway")
    rng = np.random.default_rng(0)
    for call in calls:
        # its whole prompt: the capture's ids are its own, and the lost call is not in it
        prompt = tokens.prompt_ids(call)
        call.prompt_suffix, call.prompt_from, call.prompt_from_len = prompt, None, 0
    for n, call in enumerate(calls):
        call.id, call.content = f"cap-{n}", None
        call.logprobs = -rng.random(len(call.completion_ids))
        gateway.add(call)
    stray = Call.make(
        "cap-stray", 999, [1, 2, 3], BuiltinFormat().tokenizer.encode("unrelated"), [-0.5] * 9
    )
    gateway.add(stray)
    return episode, Episode("capture-1", agents=[gateway], rewards={"pass": 1.0}), lost.id


def test_join_takes_capture_tokens_with_transcript_structure():
    episode, capture, lost = transcript_and_capture()
    captured = {c.id: (capture.full_ids(c).tolist(), c.logprobs) for c in capture.calls()}
    result = join_capture(episode, capture, BuiltinFormat().decode)
    joined = result.episode
    assert result.unmatched_transcript == [lost]
    assert result.unmatched_capture == ["cap-stray"]
    assert len(result.matched) == len(list(episode.calls())) - 1
    for transcript_id, capture_id in result.matched:
        call = joined.call(capture_id)
        assert joined.agent_of(call).id == episode.agent_of(episode.call(transcript_id)).id
        assert joined.full_ids(call).tolist() == captured[capture_id][0]
        assert call.logprobs is captured[capture_id][1]
        assert call.content["transcript_call"] == transcript_id
    assert [a.id for a in joined.agents] == ["main", "sidechain-1", "sidechain-2", UNMATCHED_AGENT]
    assert [(a.parent, a.start) for a in joined.agents[:3]] == [
        (None, "root"),
        ("main", "fresh"),
        ("main", "fresh"),
    ]
    assert joined.objective == "rl" and joined.rewards == {"pass": 1.0}
    assert joined.gaps[-1].calls == ["cap-stray"]
    assert joined.meta["join"]["unmatched_transcript"] == [lost]
    build_forest(joined)


def test_join_command(tmp_path):
    episode, capture, lost = transcript_and_capture()
    save(tmp_path / "transcript.jsonl", [episode])
    save(tmp_path / "capture.jsonl", [capture])
    out = tmp_path / "joined.jsonl"
    result = CliRunner().invoke(
        app,
        [
            "import",
            "join",
            str(tmp_path / "transcript.jsonl"),
            str(tmp_path / "capture.jsonl"),
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert (
        f"unmatched 1 in the transcript ['{lost}'], 1 in the capture ['cap-stray']" in result.output
    )
    (joined,) = load(out)
    assert joined.agent("sidechain-2").parent == "main"
    assert all(c.logprobs is not None for c in joined.calls())


def test_join_command_summary_as_json(tmp_path):
    episode, capture, lost = transcript_and_capture()
    save(tmp_path / "transcript.jsonl", [episode])
    save(tmp_path / "capture.jsonl", [capture])
    given = ["import", "join", str(tmp_path / "transcript.jsonl"), str(tmp_path / "capture.jsonl")]
    refused = CliRunner().invoke(app, [*given, "--json"])
    assert refused.exit_code == 2 and "write the episodes with -o FILE" in refused.stderr
    result = CliRunner().invoke(app, [*given, "-o", str(tmp_path / "joined.jsonl"), "--json"])
    assert result.exit_code == 0, result.output
    (summary,) = json.loads(result.stdout)["episodes"]
    assert summary["episode"] == episode.id and summary["capture"] == capture.id
    assert summary["unmatched_transcript"] == [lost]
    assert summary["unmatched_capture"] == ["cap-stray"]
    (again,) = load(tmp_path / "transcript.jsonl")
    (captured,) = load(tmp_path / "capture.jsonl")
    expected = join_capture(again, captured, BuiltinFormat().decode)
    assert summary["matched"] == len(expected.matched) > 0


def test_import_commands_write_stdout_or_file(tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["import", "claude-code", str(KIMUSON)])
    assert result.exit_code == 0, result.output
    first = json.loads(result.stdout.splitlines()[0])
    assert first["format"] == "callgrove.episode/1" and first["objective"] == "supervised"
    assert "for supervised training" in result.stderr
    from .helpers import CODEX_SMALL

    out = tmp_path / "codex.jsonl"
    result = runner.invoke(app, ["import", "codex", str(CODEX_SMALL), "--out", str(out)])
    assert result.exit_code == 0, result.output
    episodes = list(load(out))
    assert len(episodes) == 2
    for episode in episodes:
        assert_prefix_stable(episode)
    result = runner.invoke(app, ["import", "codex", str(CODEX_SMALL), "--tokenizer", "x.json"])
    assert result.exit_code == 2

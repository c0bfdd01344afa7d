"""Codex rollouts: the real fixtures, and subagent threads joined across files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from callgrove.forest import build_forest
from callgrove.transcripts import ImportReport, TranscriptRenderer, import_codex

from .helpers import CODEX_SAMPLE, CODEX_SMALL, assert_every_line_accounted, assert_prefix_stable


def imported(path: Path):
    report = ImportReport()
    transcripts = import_codex(path, report)
    return [TranscriptRenderer().episode(t) for t in transcripts], report


def test_three_line_sample():
    (episode,), report = imported(CODEX_SAMPLE)
    (call,) = episode.calls()
    response = call.content["response"]
    assert response["content"] == "Here is a simple hello world function."
    assert response["reasoning_content"] == "I'll include a minimal example and keep it short."
    assert call.content["prompt"] == [
        {"role": "system", "content": "Sample instructions"},
        {"role": "user", "content": "Write a hello world function"},
    ]
    assert episode.objective == "supervised" and call.logprobs is None
    assert_every_line_accounted(report)


def test_stitched_fixture_threads_compactions_and_accounting():
    episodes, report = imported(CODEX_SMALL)
    first, second = episodes
    # The first rollout: one response of parallel tool calls (closed by token_count, its tool
    # outputs following it), the answer, then a compaction.
    calls = sorted(first.calls(), key=lambda c: c.seq)
    assert [c.purpose for c in calls] == ["turn", "turn", "compaction"]
    assert calls[0].content["source"]["lines"] == [7, 9, 10, 12, 14]
    tools = [m["tool_call_id"] for m in calls[1].content["prompt"] if m["role"] == "tool"]
    assert tools == ["call-2", "call-3", "call-1"]
    assert calls[0].content["usage"]["output_tokens"] == 81
    # The second thread names itself as its parent (trimmed ids): a gap, its own episode.
    assert [g.kind for g in second.gaps] == ["subagent_parent_unavailable"]
    assert second.agents[0].parent is None
    compactions = [c for c in second.calls() if c.purpose == "compaction"]
    assert len(compactions) == 5  # lines 47, 69, 81, 89, 111 (line 26 is the first thread's)
    forest = build_forest(second)
    after = {c.seq + 1 for c in compactions}
    for call in forest.calls:  # a call right after a compaction starts a new tree
        if call.seq in after and call.purpose == "turn":
            assert forest.parent_of(call) is None
    assert report.diagnostics.problems == []
    assert_every_line_accounted(report)
    for episode in episodes:
        assert_prefix_stable(episode)


def _rollout(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def _item(payload: dict) -> dict:
    return {"timestamp": "2026-01-01T00:00:01Z", "type": "response_item", "payload": payload}


@pytest.mark.parametrize("linked_by", ["tool output", "spawn event"])
def test_subagent_thread_joined_to_its_parent_rollout(tmp_path, linked_by):
    parent_id, child_id = "thread-parent-0001", "thread-child-0002"
    output = f"spawned {child_id}" if linked_by == "tool output" else "spawned"
    event = {
        "type": "event_msg",
        "payload": {"type": "collab_agent_spawn_end", "call_id": "c1", "new_thread_id": child_id},
    }
    _rollout(
        tmp_path / "rollout-a.jsonl",
        [
            {"type": "session_meta", "payload": {"id": parent_id, "source": "cli"}},
            _item(
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "go"}],
                }
            ),
            _item(
                {
                    "type": "function_call",
                    "call_id": "c1",
                    "name": "spawn_agent",
                    "arguments": '{"task": "look"}',
                }
            ),
            *([event] if linked_by == "spawn event" else []),
            _item({"type": "function_call_output", "call_id": "c1", "output": output}),
            _item(
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "done"}],
                }
            ),
        ],
    )
    _rollout(
        tmp_path / "rollout-b.jsonl",
        [
            {
                "type": "session_meta",
                "payload": {
                    "id": child_id,
                    "agent_role": "explorer",
                    "source": {"subagent": {"thread_spawn": {"parent_thread_id": parent_id}}},
                },
            },
            _item(
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "look"}],
                }
            ),
            _item(
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": "seen"}],
                }
            ),
        ],
    )
    (episode,), report = imported(tmp_path)
    leader, child = episode.agents
    assert (leader.id, leader.parent, leader.start) == (parent_id, None, "root")
    assert (child.id, child.name, child.parent, child.start) == (
        child_id,
        "explorer",
        parent_id,
        "fresh",
    )
    spawner = episode.call(child.spawn.call)
    assert [t["id"] for t in spawner.content["response"]["tool_calls"]] == ["c1"]
    assert len(leader.calls) == 2 and len(child.calls) == 1
    assert_every_line_accounted(report)
    assert_prefix_stable(episode)


def _thread(path: Path, thread_id: str, parent: str, answer: str) -> None:
    meta = {"id": thread_id, "source": {"subagent": {"thread_spawn": {"parent_thread_id": parent}}}}
    user = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]}
    reply = {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": answer}],
    }
    _rollout(path, [{"type": "session_meta", "payload": meta}, _item(user), _item(reply)])


def test_threads_whose_parents_form_a_cycle_are_reported_not_dropped(tmp_path):
    for name, parent in [("a", "c"), ("b", "a"), ("c", "b"), ("d", "c")]:
        _thread(tmp_path / f"rollout-{name}.jsonl", f"thread-{name}", f"thread-{parent}", name)
    (episode,), report = imported(tmp_path)
    assert [a.id for a in episode.agents] == ["thread-a", "thread-b", "thread-c", "thread-d"]
    assert [a.parent for a in episode.agents] == [None, "thread-a", "thread-b", "thread-c"]
    assert len(list(episode.calls())) == 4
    (gap,) = episode.gaps
    assert gap.kind == "subagent_parent_cycle" and gap.agent == "thread-a"
    assert "thread-a -> thread-c -> thread-b -> thread-a" in gap.reason
    (problem,) = report.diagnostics.problems
    assert problem.severity == "warning" and "cycle" in problem.message
    assert_every_line_accounted(report)


def test_each_rollout_line_is_decoded_once_into_its_record_kind():
    from callgrove.transcripts.codex_records import (
        Compacted,
        EventMsg,
        FunctionCall,
        OtherItem,
        ResponseItem,
        SessionMeta,
        Unreadable,
        decode_record,
    )

    spawn = {"subagent": {"thread_spawn": {"parent_thread_id": "p"}}}
    meta = decode_record({"type": "session_meta", "payload": {"id": "t", "source": spawn}})
    assert isinstance(meta, SessionMeta) and meta.payload.parent() == "p"
    assert meta.payload.thread_id("fallback") == "t"
    item = decode_record(
        {"type": "response_item", "payload": {"type": "function_call", "call_id": "c", "name": "x"}}
    )
    assert isinstance(item, ResponseItem) and item.payload == FunctionCall(call_id="c", name="x")
    other = decode_record({"type": "response_item", "payload": {"type": "ghost", "a": 1}})
    assert other.payload == OtherItem(kind="ghost")
    event = decode_record(
        {
            "type": "event_msg",
            "payload": {"type": "x_spawned", "call_id": "c", "new_thread_id": "t"},
        }
    )
    assert isinstance(event, EventMsg) and event.payload.spawned_thread() == "t"
    compacted = decode_record({"type": "compacted", "payload": {"message": "gist"}})
    assert isinstance(compacted, Compacted) and compacted.payload.replacement_history == []
    assert decode_record({"type": "world_state", "payload": {}}) == Unreadable(
        "world_state record is not a model message"
    )
    assert decode_record({"type": "response_item", "payload": 3}) == Unreadable(
        "response_item record without a payload object"
    )
    odd = decode_record({"type": "session_meta", "payload": {"id": 7}})
    assert isinstance(odd, Unreadable) and "unexpected shape" in odd.reason

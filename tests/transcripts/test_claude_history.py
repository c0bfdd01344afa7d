"""Claude Code lines decoded once into typed records; one agent's graph and its histories."""

from __future__ import annotations

import dataclasses

import orjson
import pytest

from callgrove.transcripts.accounting import CLAUDE_CODE, sniff
from callgrove.transcripts.claude_history import Entry, build_graph, derive_history
from callgrove.transcripts.claude_records import (
    AssistantLine,
    ForkContextRef,
    OtherBlock,
    OtherLine,
    SystemLine,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
    UserLine,
    content_text,
    decode_line,
    decode_raw,
)
from callgrove.transcripts.turns import TranscriptAgent

from .helpers import DATA


def test_each_line_kind_decodes_to_its_record():
    user = decode_line(
        {
            "type": "user",
            "uuid": "u1",
            "parentUuid": None,
            "message": {"role": "user", "content": "hello"},
            "toolUseResult": {"agentId": "a9", "status": "async_launched"},
        }
    )
    assert isinstance(user, UserLine) and user.message.content == [TextBlock("hello")]
    assert user.spawned_agent() == ("a9", "async_launched")
    answer = decode_line(
        {
            "type": "assistant",
            "uuid": "u2",
            "parentUuid": "u1",
            "requestId": "req",
            "message": {
                "id": "m1",
                "content": [
                    {"type": "tool_use", "id": "t1", "name": "Agent", "input": {"prompt": "x"}},
                    {"type": "image", "source": {}},
                ],
            },
        }
    )
    assert isinstance(answer, AssistantLine) and answer.parent_uuid == "u1"
    assert answer.message.content == [
        ToolUseBlock("t1", "Agent", {"prompt": "x"}),
        OtherBlock("image"),
    ]
    boundary = decode_line(
        {
            "type": "system",
            "subtype": "compact_boundary",
            "logicalParentUuid": "u2",
            "compactMetadata": {"trigger": "manual"},
        }
    )
    assert isinstance(boundary, SystemLine) and boundary.is_compact_boundary
    assert boundary.compact_metadata.trigger == "manual"
    ref = decode_line({"type": "fork-context-ref", "parentLastUuid": "u2", "agentId": "a1"})
    assert isinstance(ref, ForkContextRef) and ref.parent_last_uuid == "u2"


def test_other_kinds_and_bad_shapes_keep_their_place_in_the_tree():
    attachment = decode_line({"type": "attachment", "uuid": "a", "parentUuid": "u1"})
    assert attachment == OtherLine(uuid="a", parent_uuid="u1", kind="attachment")
    bad = decode_line({"type": "assistant", "uuid": "b", "parentUuid": "a", "message": "oops"})
    assert isinstance(bad, OtherLine) and (bad.uuid, bad.parent_uuid) == ("b", "a")
    assert bad.problem.startswith("assistant line of an unexpected shape")
    unreadable = decode_line({"uuid": 3})
    assert unreadable.problem.startswith("untyped line with unreadable links")
    assert decode_line({}) == OtherLine(kind="untyped")


def test_tool_result_content_reads_as_text():
    assert content_text([{"type": "text", "text": "a"}, {"type": "image"}]) == "a\n[image]"
    assert content_text("plain") == "plain" and content_text(None) == ""
    assert content_text({"odd": 1}) == '{"odd":1}'
    result = decode_line(
        {
            "type": "user",
            "message": {"content": [{"type": "tool_result", "tool_use_id": "t", "content": "ok"}]},
        }
    )
    assert result.message.content == [ToolResultBlock("t", "ok")]


def lines(*records: dict) -> list[Entry]:
    return [Entry("f.jsonl", n, decode_line(r)) for n, r in enumerate(records, start=1)]


def assistant(uuid: str, parent: str, message_id: str, *blocks: dict) -> dict:
    content = list(blocks)
    return {
        "type": "assistant",
        "uuid": uuid,
        "parentUuid": parent,
        "message": {"id": message_id, "content": content},
    }


def tool_result(uuid: str, parent: str, use_id: str) -> dict:
    content = [{"type": "tool_result", "tool_use_id": use_id, "content": f"out {use_id}"}]
    return {"type": "user", "uuid": uuid, "parentUuid": parent, "message": {"content": content}}


PARALLEL = lines(
    {"type": "user", "uuid": "u", "message": {"content": "run both"}},
    assistant("a1", "u", "m1", {"type": "tool_use", "id": "t1", "name": "Bash", "input": {}}),
    assistant("a2", "a1", "m1", {"type": "tool_use", "id": "t2", "name": "Bash", "input": {}}),
    tool_result("r1", "a1", "t1"),
    tool_result("r2", "a2", "t2"),
    {"type": "attachment", "uuid": "x", "parentUuid": "r2"},
    assistant("a3", "x", "m2", {"type": "text", "text": "both done"}),
)


def test_the_graph_groups_responses_and_chains_parallel_tool_results():
    graph = build_graph(PARALLEL, 0, {})
    assert graph.parent == (None, 0, 1, 1, 2, 4, 5)
    assert [r.lines for r in graph.responses] == [(1, 2), (6,)]
    assert graph.history_parent[4] == 3  # the second result continues the first
    with pytest.raises(dataclasses.FrozenInstanceError):
        graph.parent = ()  # type: ignore[misc]


def test_histories_are_a_pure_function_of_the_graph():
    graph = build_graph(PARALLEL, 0, {})
    first = derive_history(graph, TranscriptAgent("main", "leader"))
    again = derive_history(graph, TranscriptAgent("main", "leader"))
    assert [c.id for c in first.calls] == [c.id for c in again.calls] == ["main/m1", "main/m2"]
    assert first.outcomes == again.outcomes
    last = first.calls[1]
    assert [m.tool_call_id for m in last.context.messages_since(None) if m.role == "tool"] == [
        "t1",
        "t2",
    ]
    assert last.base_call() is first.calls[0]
    assert [o.used or o.skipped for o in first.outcomes] == [
        "message",
        "call",
        "call (further block)",
        "message",
        "message",
        "attachment record is not a model message",
        "call",
    ]


def test_a_response_an_earlier_agent_made_a_call_is_history_here():
    graph = build_graph(PARALLEL, 0, {"m1": None})
    history = derive_history(graph, TranscriptAgent("fork", "fork"))
    assert [c.id for c in history.calls] == ["fork/m2"] and history.copied_responses == 1
    assert history.calls[0].base_call() is None


def test_reading_a_line_from_its_bytes_gives_the_record_of_its_json_object():
    """`decode_raw` (the fast path) and `decode_line` agree on every line of every Claude
    Code file in the test data; lines the fast path leaves to the slow one are few."""
    files = [p for p in DATA.rglob("*.jsonl") if sniff(p) == CLAUDE_CODE]
    assert len(files) >= 20
    fast = slow = 0
    for path in files:
        for raw in path.read_bytes().splitlines():
            try:
                data = orjson.loads(raw)
            except orjson.JSONDecodeError:
                assert decode_raw(raw) is None
                continue
            record = decode_raw(raw)
            if record is None:
                slow += 1
                continue
            fast += 1
            assert record == decode_line(data), (path, raw[:200])
    assert fast > 10 * slow

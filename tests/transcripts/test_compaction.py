"""The compaction rules shared by the importers, on their own."""

from __future__ import annotations

from callgrove.chat.message import Message, ToolCall
from callgrove.transcripts.accounting import CallIds, parse_timestamp
from callgrove.transcripts.claude_records import (
    CompactMetadata,
    PreservedMessages,
    PreservedSegment,
)
from callgrove.transcripts.codex_records import decode_item
from callgrove.transcripts.compaction import (
    answered_with_summary,
    compaction_call,
    preserved_links,
    summary_in_replacement,
)
from callgrove.transcripts.turns import CallRecord, Source, TranscriptAgent, TranscriptCall, Turn

PREAMBLE = "Another language model started to solve this problem ... summary:\n"


def _call(text: str, tools: tuple[ToolCall, ...] = ()) -> TranscriptCall:
    agent = TranscriptAgent("a", "agent")
    return TranscriptCall(
        "a/r1",
        agent,
        None,
        Message("assistant", text, tool_calls=tools),
        (0,),
        content=CallRecord(source=Source("f", [3])),
    )


def test_the_response_that_wrote_the_summary_is_the_compaction_call():
    call = _call("Summary: printed hi.")
    assert answered_with_summary(call.response, PREAMBLE + "Summary: printed hi.\n")


def test_other_responses_are_not_the_compaction_call():
    summary = PREAMBLE + "Summary: printed hi."
    assert not answered_with_summary(None, summary)
    assert not answered_with_summary(_call("Done: printed hi.").response, summary)
    assert not answered_with_summary(_call("").response, summary)
    tool = ToolCall("c1", "exec_command", {"cmd": "echo"})
    assert not answered_with_summary(_call("Summary: printed hi.", (tool,)).response, summary)


def test_a_compaction_call_continues_what_it_summarised():
    agent = TranscriptAgent("a", "agent")
    history = Turn(Message("user", "long task"), None)
    record = CallRecord(source=Source("f", [9]), trigger="auto")
    call = compaction_call(agent, "a/compact-9", history, "the gist", (1.0, 0, 9), record)
    assert call.agent is agent and call.purpose == "compaction" and call.content is record
    assert call.context is history and call.response.text == "the gist"
    assert call.answer.previous is history


def test_summary_from_the_replacement_history():
    items = [
        decode_item(item)
        for item in (
            {"type": "message", "role": "user", "content": "task"},
            {"type": "message", "role": "assistant", "content": "ok"},
            {"type": "message", "role": "user", "content": "the summary"},
            {"type": "compaction", "encrypted_content": "..."},
        )
    ]
    assert summary_in_replacement(items, str) == "the summary"
    assert summary_in_replacement([], str) == ""


def test_preserved_messages_of_a_partial_compaction():
    kept = PreservedMessages(uuids=["p1", "p2", "p3"], anchor_uuid="S")
    boundary = CompactMetadata(trigger="manual", preserved_messages=kept)
    assert preserved_links(boundary) == {"p2": ("S", "p1"), "p3": ("S", "p2")}
    assert preserved_links(CompactMetadata(trigger="auto")) == preserved_links(None) == {}


def test_the_first_kept_message_is_the_segments_head_else_the_first_preserved():
    kept = PreservedMessages(anchor_uuid="S", uuids=["p1", "p2"])
    segment = PreservedSegment(head_uuid="h", tail_uuid="p2")
    assert CompactMetadata(preserved_messages=kept).first_kept() == "p1"
    assert CompactMetadata(preserved_messages=kept, preserved_segment=segment).first_kept() == "h"
    assert CompactMetadata(trigger="auto").first_kept() is None


def test_shared_helpers_timestamps_and_call_ids():
    assert parse_timestamp("2026-01-01T00:00:01Z") == 1767225601.0
    assert parse_timestamp("yesterday") is None and parse_timestamp(3) is None
    ids = CallIds("main")
    assert [ids.new("m1"), ids.new("m1"), ids.new("m2"), ids.new("m1")] == [
        "main/m1",
        "main/m1#2",
        "main/m2",
        "main/m1#3",
    ]

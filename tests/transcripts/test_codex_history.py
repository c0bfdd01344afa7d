"""Codex rollout lines placed in their threads; each thread's immutable graph and its calls."""

from __future__ import annotations

import dataclasses

import pytest

from callgrove.transcripts.accounting import running_times
from callgrove.transcripts.codex_history import (
    Compaction,
    Input,
    RolloutEntry,
    RolloutResponse,
    build_graph,
    derive_thread,
    place_lines,
)
from callgrove.transcripts.codex_records import decode_record
from callgrove.transcripts.turns import TranscriptAgent

SUMMARY = "Summary: printed hi."


def item(payload: dict, second: int = 1) -> dict:
    return {
        "timestamp": f"2026-01-01T00:00:{second:02d}Z",
        "type": "response_item",
        "payload": payload,
    }


def user(text: str) -> dict:
    return item(
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    )


def answer(text: str, second: int = 2) -> dict:
    return item(
        {"type": "message", "role": "assistant", "content": text, "id": f"m-{text}"}, second
    )


def meta(thread: str, **fields) -> dict:
    return {"type": "session_meta", "payload": {"id": thread, **fields}}


def compacted(summary: str = SUMMARY) -> dict:
    history = [{"type": "message", "role": "user", "content": summary}]
    return {"type": "compacted", "payload": {"message": summary, "replacement_history": history}}


TOKENS = {
    "type": "event_msg",
    "payload": {"type": "token_count", "info": {"last_token_usage": {"output_tokens": 5}}},
}


def read(*files: list[dict]) -> tuple[list[RolloutEntry], list[range]]:
    entries: list[RolloutEntry] = []
    spans = []
    for rank, records in enumerate(files):
        decoded = [decode_record(r) for r in records]
        times = running_times([r.timestamp for r in decoded])
        start = len(entries)
        entries += [
            RolloutEntry(f"f{rank}", n, rank, t, r)
            for n, (r, t) in enumerate(zip(decoded, times, strict=True), 1)
        ]
        spans.append(range(start, len(entries)))
    return entries, spans


def threads(*files: list[dict]):
    entries, spans = read(*files)
    placement = place_lines(entries, spans)
    out = {}
    for start in placement.threads:
        graph = build_graph(start, [r for r in placement.runs if r.thread == start.id], entries)
        agent = TranscriptAgent(start.id, "agent")
        out[start.id] = (graph, derive_thread(graph, entries, agent), entries, agent)
    return placement, out


def test_a_response_its_usage_and_the_compaction_it_wrote_are_one_step():
    _, found = threads(
        [
            meta("t"),
            user("go"),
            answer("hi"),
            TOKENS,
            user("summarise"),
            answer(SUMMARY),
            compacted(),
            user("more"),
            answer("ok"),
        ]
    )
    graph, history, _, _ = found["t"]
    kinds = [type(s) for s in graph.steps]
    assert kinds == [
        Input,
        RolloutResponse,
        Input,
        RolloutResponse,
        Compaction,
        Input,
        RolloutResponse,
    ]
    first, wrote = graph.steps[1], graph.steps[3]
    assert first.usage == 3 and first.compacted is None  # entry indices
    assert wrote.compacted == 6 and not graph.steps[4].is_call
    purposes = [c.purpose for c in history.calls]
    assert purposes == ["turn", "compaction", "turn"]
    assert history.calls[0].content.usage == {"output_tokens": 5}
    assert history.calls[1].content.source.lines == [6, 7]
    last = history.calls[2]
    assert last.base_call() is None  # the history after a compaction starts from its summary
    assert [m.text for m in last.context.messages_since(None)] == [SUMMARY, "more"]


def test_the_graph_is_frozen_and_deriving_it_twice_gives_the_same_calls():
    _, found = threads(
        [
            meta("t"),
            user("go"),
            answer("hi"),
            TOKENS,
            compacted("other"),
            user("more"),
            answer("ok"),
        ]
    )
    graph, history, entries, agent = found["t"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        graph.steps = ()  # type: ignore[misc]
    again = derive_thread(graph, entries, TranscriptAgent(agent.id, "agent"))
    assert [c.id for c in again.calls] == [c.id for c in history.calls]
    assert [c.purpose for c in again.calls] == ["turn", "compaction", "turn"]
    assert [[m.as_dict() for m in c.context.messages_since(None)] for c in again.calls] == [
        [m.as_dict() for m in c.context.messages_since(None)] for c in history.calls
    ]


def test_a_forks_copy_of_its_sources_compaction_is_history_not_a_call():
    source = [meta("src"), user("go"), answer("hi"), compacted("gist"), user("fork now")]
    fork_file = [
        meta("fork", forked_from_id="src"),
        *source,
        {"type": "turn_context", "payload": {"thread_id": "fork"}},
        user("your part"),
        answer("fork answer", 9),
    ]
    placement, found = threads(source, fork_file)
    assert [(r.thread, r.copied) for r in placement.runs] == [
        ("src", False),
        ("fork", True),
        ("fork", False),
    ]
    _, src_history, _, _ = found["src"]
    fork_graph, fork_history, _, _ = found["fork"]
    assert [c.purpose for c in src_history.calls] == ["turn", "compaction"]
    assert [c.purpose for c in fork_history.calls] == ["turn"]  # its own answer only
    (call,) = fork_history.calls
    texts = [m.text for m in call.context.messages_since(None)]
    assert texts == ["gist", "fork now", "your part"]
    repeated = [o.used for o in fork_graph.outcomes if o.used and "repeated" in o.used]
    assert repeated == [
        "message (the forked thread's response, repeated)",
        "compaction (the forked thread's, repeated)",
    ]

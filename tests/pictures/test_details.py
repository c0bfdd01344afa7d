"""What hovering a call shows: its text (content, else its own token ids) and token counts."""

from __future__ import annotations

from callgrove.episode import Agent, Call, Episode
from callgrove.pictures import call_details, layout
from callgrove.pictures.html import MAX_TEXT_CHARS
from callgrove.rows import build_rows

from .episodes import login_bug


def details_of(episode: Episode) -> dict[str, dict]:
    return {box.call.id: call_details(box) for box in layout(build_rows(episode)).boxes}


def test_the_example_keeps_its_words_so_hovering_shows_text():
    details = {box.call.id: call_details(box) for box in layout(login_bug()).boxes}
    assert details["C6"]["text_source"] == "content"
    assert details["C6"]["text"] == (
        "── response ──\n[assistant] auth.py:12\n── new prompt messages ──\n"
        "[tool] auth.py:12 compares hash to plain text"
    )


def test_token_counts_and_abbreviated_ids_without_content():
    result = login_bug()
    for call in result.episode.calls():
        call.content = None
    details = {box.call.id: call_details(box) for box in layout(result).boxes}
    c3 = details["C3"]
    assert (c3["prompt"], c3["completion"], c3["prompt_added"]) == (24, 7, 4)
    assert c3["parent"] == "C1" and c3["text_source"] == "token ids"
    # Only what C3 adds to C1's sequence, then its completion.
    assert c3["text"] == (
        "new prompt tokens (4): [25 16 26 27]\ncompletion tokens (7): [14 15 28 29 10 12 20]"
    )
    assert details["C1"]["text"].startswith("prompt tokens (13): [1 2 3 4 5 6 7 8 9 10 11 12 13]")
    assert details["C7"]["rows"] == ["context in row 2", "trains in row 3"]


def test_long_token_lists_are_abbreviated():
    call = Call.make("X", 1, list(range(100)), [7])
    [details] = details_of(Episode("e", agents=[Agent("L", "leader", calls=[call])])).values()
    assert details["text"].startswith(
        "prompt tokens (100): [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 … 94 95 96 97 98 99]"
    )


def test_chat_message_content_reads_as_a_transcript_response_first():
    content = {
        "model": "m-1",
        "prompt": [{"role": "tool", "content": "3 files", "tool_call_id": "t1"}],
        "response": {
            "role": "assistant",
            "content": "Reading them.",
            "reasoning_content": "check the config",
            "tool_calls": [{"id": "t2", "function": {"name": "Read", "arguments": {"p": "a"}}}],
        },
    }
    call = Call.make("X", 1, [1, 2], [3], content=content)
    [details] = details_of(Episode("e", agents=[Agent("L", "leader", calls=[call])])).values()
    assert details["text_source"] == "content"
    assert details["text"] == "\n".join(
        [
            "── response ──",
            "[assistant] Reading them.",
            "  thinking: check the config",
            '  → Read {"p":"a"}',
            "── new prompt messages ──",
            "[tool ← t1] 3 files",
            "── details ──",
            '{\n  "model": "m-1"\n}',
        ]
    )


def test_long_text_is_cut_with_a_count_of_what_was_left():
    call = Call.make("X", 1, [1], [2], content="a" * (MAX_TEXT_CHARS + 5))
    [details] = details_of(Episode("e", agents=[Agent("L", "leader", calls=[call])])).values()
    assert details["text"] == "a" * MAX_TEXT_CHARS + "\n… (5 more characters)"

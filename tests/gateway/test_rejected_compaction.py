"""A compaction the harness sampled and then discarded: Claude Code's compaction request (its
wording, its headers) answered with a tool call where text was asked, which the harness then
either asks again (a retry) or drops, going on with the history it meant to summarise.

Both cases are recorded here through the gateway with a scripted model, not by the CLI itself:
what Claude Code does after a rejected summary is not in the recorded sessions of
tests/data/claude_code, whose one compaction was answered with text."""

from __future__ import annotations

import asyncio

import pytest

from callgrove.episode import Episode, read_episodes
from callgrove.forest import build_forest
from callgrove.gateway.ledger import EPISODES_FILE
from callgrove.rows import build_rows

from .helpers import gateway_client, scripted, write_script
from .test_gateway import CLAUDE

# Claude Code 2.1.332's compaction instruction, as it opens (tests/data/claude_code).
COMPACT = (
    "CRITICAL: Respond with TEXT ONLY. Do NOT call any tools.\n\nYour task is to create a "
    "detailed summary of the conversation so far."
)
READ = {"name": "Read", "arguments": {"file_path": "login.py"}}
RULES = [
    {"when": "TEXT ONLY", "reply": {"text": "", "tool_calls": [READ]}},  # not a summary
    {"when": "START", "reply": "One."},
    {"when": "go on", "reply": "Two."},
]
HISTORY = [
    {"role": "user", "content": "START count"},
    {"role": "assistant", "content": "One."},
]


def record(tmp_path, after_rejection: list[list[dict]]) -> Episode:
    """The closed episode of: a turn, a compaction answered with a tool call, then each of
    `after_rejection`'s requests (their messages)."""

    async def go():
        _, client = gateway_client(
            scripted(write_script(tmp_path / "s.json", RULES)), tmp_path / "ledger"
        )
        async with client:
            requests = [
                HISTORY[:1],
                [*HISTORY, {"role": "user", "content": COMPACT}],
                *after_rejection,
            ]
            for messages in requests:
                body = {"model": "m", "max_tokens": 50, "messages": messages}
                answered = await client.post("/e/ep/v1/messages", json=body, headers=CLAUDE)
                assert answered.status_code == 200, answered.text
            return await client.post("/e/ep/close", json={"rewards": {"score": 1.0}})

    closed = asyncio.run(go())
    assert closed.status_code == 200, closed.text
    (episode,) = read_episodes(tmp_path / "ledger" / EPISODES_FILE)
    return episode


def trained_purposes(episode) -> list[tuple[str, bool]]:
    """Each kept call's purpose and whether a row trains it, in `seq` order."""
    forest = build_forest(episode)
    trained = {call.id for row in build_rows(episode).rows for call in row.trains}
    return [(call.purpose, call.id in trained) for call in forest.calls]


# What the harness sends after the rejected compaction; then each of the leader's calls (purpose,
# kept) and each kept call's (purpose, trained by a row).
CASES = {
    # asked again with the same prompt: only the last attempt is kept
    "retried": (
        [*HISTORY, {"role": "user", "content": COMPACT}],
        [("turn", True), ("compaction", False), ("compaction", True)],
        [("turn", True), ("compaction", True)],
    ),
    # dropped, and the history sent on without it: an abandoned attempt, out of training
    "went on without it": (
        [*HISTORY, {"role": "user", "content": "go on"}],
        [("turn", True), ("compaction", False), ("turn", True)],
        [("turn", True), ("turn", True)],
    ),
    # the ordinary case: the next call starts from the summary, not the old history
    "started from its summary": (
        [{"role": "user", "content": "Summary: counted to one. go on"}],
        [("turn", True), ("compaction", True), ("turn", True)],
        [("turn", True), ("compaction", True), ("turn", True)],
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_a_rejected_compaction_trains_only_if_its_agent_went_on_from_it(tmp_path, case):
    after, calls, trained = CASES[case]
    episode = record(tmp_path, [after])
    (leader,) = episode.agents
    assert [(c.purpose, c.kept) for c in leader.calls] == calls
    assert trained_purposes(episode) == trained

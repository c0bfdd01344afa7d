"""Sessions written by Claude Code 2.1.332 itself, checked against the scripted server's log.

`tests/data/claude_code/generate.py` ran the real CLI offline against a scripted Messages
server; each scenario folder holds the session files the CLI wrote and the log of every request
the server answered (with the agent headers the CLI sent). The log is the truth: the imported
agents, their parents and starts, and each agent's calls must be exactly what it shows.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from callgrove.transcripts import ImportReport, TranscriptRenderer, import_claude_code

from .helpers import Generated, assert_every_line_accounted, assert_prefix_stable

GENERATED = Generated("claude_code", import_claude_code)
FORK_SESSION = "fork_session"  # two sessions: tested on its own below
SCENARIOS = [s for s in GENERATED.scenarios if s != FORK_SESSION]
requests = GENERATED.requests
imported = GENERATED.imported


def agent_of(request: dict) -> str:
    """The imported agent id of the agent that sent a request (no agent header: the leader)."""
    return "main" if request["agent_id"] is None else f"agent-{request['agent_id']}"


def expected_agents(log: list[dict]) -> dict[str, tuple[str | None, str, str | None]]:
    """Each agent in the log -> (parent, start, spawning call id), from the spawn calls the
    server answered with and the task each subagent's first request carried."""
    spawns = {  # the marker of a spawned task -> (spawning agent, its call, the tool input)
        tool["input"]["prompt"].split(":")[0]: (
            agent_of(r),
            f"{agent_of(r)}/{r['message_id']}",
            tool["input"],
        )
        for r in log
        for tool in r["tool_calls"]
        if tool["name"] == "Agent"
    }
    agents: dict[str, tuple[str | None, str, str | None]] = {"main": (None, "root", None)}
    for request in log:
        agent = agent_of(request)
        if agent in agents:
            continue
        parent, call, tool = spawns[request["rule"].split(":")[0]]
        if request["parent_agent_id"] is not None:  # a nested subagent names its parent
            assert parent == f"agent-{request['parent_agent_id']}"
        start = "fork" if tool["subagent_type"] == "fork" else "fresh"
        agents[agent] = (parent, "background" if tool["run_in_background"] else start, call)
    return agents


def api_messages(call) -> int:
    """How many Messages API messages a call's history is: tool results and user text that
    follow each other travel as one user message."""
    roles = ["user" if m.role == "tool" else m.role for m in call.context.messages_since(None)]
    return sum(1 for i, role in enumerate(roles) if i == 0 or role != roles[i - 1])


def test_the_generated_scenarios_are_all_there():
    assert GENERATED.scenarios == [
        "background_subagent",
        "fork_session",
        "fork_subagent",
        "fresh_subagent",
        "leader_compaction",
        "nested_subagent",
        "subagent_fork",
    ]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_agents_starts_and_parents_are_those_of_the_request_log(scenario):
    transcript, report = imported(scenario)
    found = {
        a.id: (a.parent, a.start, a.spawn.call if a.spawn else None) for a in transcript.agents
    }
    assert found == expected_agents(requests(scenario))
    assert transcript.agents[0].id == "main" and transcript.gaps == []
    assert report.diagnostics.problems == []
    assert_every_line_accounted(report)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_each_request_is_one_call_of_the_agent_that_sent_it(scenario):
    transcript, _ = imported(scenario)
    log = requests(scenario)
    expected = Counter((agent_of(r), "compaction" if r["compaction"] else "turn") for r in log)
    found = Counter((a.id, c.purpose) for a in transcript.agents for c in a.calls)
    assert found == expected
    # An answered turn keeps the message id the server gave it; in each agent, the calls in
    # ledger order are the agent's requests in the order the server answered them.
    for agent in transcript.agents:
        sent = [r for r in log if agent_of(r) == agent.id]
        calls = sorted(agent.calls, key=lambda c: c.order)
        assert [c.purpose for c in calls] == [
            "compaction" if r["compaction"] else "turn" for r in sent
        ]
        for call, request in zip(calls, sent, strict=True):
            if call.purpose == "turn":
                assert call.id == f"{agent.id}/{request['message_id']}"
                assert call.response.text == request["reply"]
                assert api_messages(call) == request["messages"]
            else:  # the CLI records the summary inside its own continuation text
                summary = request["reply"].removeprefix("<summary>").removesuffix("</summary>")
                assert summary in call.response.text


def test_the_compaction_call_summarises_the_history_and_the_next_call_starts_from_it():
    transcript, _ = imported("leader_compaction")
    (leader,) = transcript.agents
    first, compaction, last = sorted(leader.calls, key=lambda c: c.order)
    assert compaction.purpose == "compaction"
    assert compaction.base_call() is first  # it continues the history it summarised
    assert last.base_call() is None  # the history after it starts from the summary
    texts = [m.text for m in last.context.messages_since(None)]
    assert any("The user asked for a number" in text for text in texts)
    assert not any(text == "One." for text in texts)


def test_a_fork_starts_from_the_leaders_history_and_a_fresh_subagent_from_its_task():
    fork = imported("fork_subagent")[0].agents[1]
    fresh = imported("fresh_subagent")[0].agents[1]
    fork_prompt = " ".join(m.text for m in fork.calls[0].context.messages_since(None))
    fresh_prompt = " ".join(m.text for m in fresh.calls[0].context.messages_since(None))
    assert "START: fork a helper." in fork_prompt and "FORK-1: report" in fork_prompt
    assert "START: ask one helper." not in fresh_prompt and "FRESH-1: report" in fresh_prompt


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_generated_sessions_render_to_clean_rows(scenario):
    transcript, _ = imported(scenario)
    assert_prefix_stable(TranscriptRenderer().episode(transcript))


# A subagent that compacts: captured through the capture gateway (tests/data/claude_code/
# subagent_compaction/README.md). The gateway's calls are the truth: each agent's calls, their
# purposes, which earlier call each prompt extends, and the tool calls in every prompt.

CAPTURED = GENERATED.folder / "subagent_compaction"


def gateway_calls() -> list[dict]:
    lines = (CAPTURED / "gateway_calls.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def gateway_history(call: dict, by_seq: dict[int, dict]) -> list[tuple[str, tuple[str, ...]]]:
    """The tool-call trail of everything a gateway call was sent: its base call's history and
    answer, then its own new messages; system messages and text-only user messages (reminders
    the CLI adds from outside the transcript) left out."""
    base = by_seq.get(call["prompt_from"])
    trail = [*gateway_history(base, by_seq), _trail(base["response"])] if base else []
    return trail + [_trail(m) for m in call["prompt"] if m["role"] in ("assistant", "tool")]


def _trail(message: dict) -> tuple[str, tuple[str, ...]]:
    ids = message["tool_calls"] or [message["tool_call_id"]]
    return message["role"], tuple(i for i in ids if i)


def imported_history(call) -> list[tuple[str, tuple[str, ...]]]:
    return [
        (m.role, tuple(t.id for t in m.tool_calls) or ((m.tool_call_id,) if m.tool_call_id else ()))
        for m in call.context.messages_since(None)
        if m.role in ("assistant", "tool")
    ]


def test_a_captured_subagent_compaction_is_what_the_gateway_saw():
    report = ImportReport()
    (transcript,) = import_claude_code(CAPTURED / "sessions", report)
    sent = gateway_calls()
    by_seq = {c["seq"]: c for c in sent}
    leader, sub = transcript.agents
    gateway_sub = next(c for c in sent if c["parent"] is not None)
    assert sub.id == f"agent-{gateway_sub['agent']}"
    assert (sub.parent, sub.start, sub.name) == ("main", gateway_sub["start"], "general-purpose")
    spawned = next(c for c in sent if c["response"]["tool_calls"] and c["parent"] is None)
    assert sub.spawn.tool_call_id == spawned["response"]["tool_calls"][0]
    for agent, truth_agent in ((leader, None), (sub, gateway_sub["agent"])):
        truth = [c for c in sent if (c["parent"] is None) == (truth_agent is None)]
        calls = sorted(agent.calls, key=lambda c: c.order)
        assert [c.purpose for c in calls] == [c["purpose"] for c in truth]
        place = {c["seq"]: k for k, c in enumerate(truth)}
        for call, expected in zip(calls, truth, strict=True):
            base = call.base_call()
            assert (calls.index(base) if base else None) == place.get(expected["prompt_from"])
            assert imported_history(call) == gateway_history(expected, by_seq)
            text = expected["response"]["text"]
            if call.purpose == "compaction":  # recorded inside the CLI's continuation text
                assert (
                    text.removeprefix("<summary>").removesuffix("</summary>") in call.response.text
                )
            else:
                assert call.response.text == text
    after = sorted(sub.calls, key=lambda c: c.order)[-1]
    assert "SUB SUMMARY" in after.context.messages_since(None)[0].text
    assert report.diagnostics.problems == []
    assert_every_line_accounted(report)
    assert_prefix_stable(TranscriptRenderer().episode(transcript))


# `claude --continue --fork-session` (the `fork_session` scenario): the second run's session
# file begins with the first session's lines (uuids and message ids unchanged; 2.1.332 adds
# `requestSessionId` naming the first session to the copied responses, 2.1.197 copies them as
# they were), then its own turn. Each response the server answered must be one call, of the
# session that sent it.


def fork_session_folder(tmp_path: Path, as_written: bool) -> tuple[Path, str, str]:
    """The scenario's two session files in a folder: (folder, first session, forked session).
    Not `as_written`: the copies without `requestSessionId`, as 2.1.197 writes them, and the
    forked session's file named to be read first."""
    log = requests(FORK_SESSION)
    first, forked = log[0]["session_id"], log[-1]["session_id"]
    folder = tmp_path / "sessions"
    folder.mkdir()
    for path in (GENERATED.folder / FORK_SESSION / "sessions").glob("*.jsonl"):
        lines = path.read_text().splitlines()
        if not as_written:
            lines = [
                json.dumps({k: v for k, v in json.loads(line).items() if k != "requestSessionId"})
                for line in lines
            ]
        name = path.name if as_written or path.stem != forked else f"0-{path.name}"
        (folder / name).write_text("\n".join(lines) + "\n")
    return folder, first, forked


@pytest.mark.parametrize("as_written", [True, False], ids=["2.1.332", "copied-unchanged"])
def test_a_fork_session_trains_each_response_once_in_the_session_that_made_it(tmp_path, as_written):
    folder, first, forked = fork_session_folder(tmp_path, as_written)

    def response_uuids(path: Path) -> set[str]:
        lines = [json.loads(line) for line in path.read_text().splitlines()]
        return {line["uuid"] for line in lines if line.get("type") == "assistant"}

    forked_file = next(folder.glob(f"*{forked}.jsonl"))
    assert response_uuids(folder / f"{first}.jsonl") < response_uuids(forked_file)
    report = ImportReport()
    transcripts = {t.id: t for t in import_claude_code(folder, report)}
    log = requests(FORK_SESSION)
    expected = {
        session: [f"main/{r['message_id']}" for r in log if r["session_id"] == session]
        for session in (first, forked)
    }
    found = {
        session: [c.id for c in sorted(t.agents[0].calls, key=lambda c: c.order)]
        for session, t in transcripts.items()
    }
    assert found == expected
    # The forked session's call continues the copied history: its context holds the first
    # session's answers, as messages.
    (own,) = transcripts[forked].agents[0].calls
    history = [m.text for m in own.context.messages_since(None)]
    assert "Printed word-one." in history and "I will print it." in history
    copies = len(expected[first])
    assert [p.message.split(" (")[0] for p in report.diagnostics.problems] == [
        f"{copies} response(s) repeat those of session {first}"
    ]
    assert report.diagnostics.problems[0].file.endswith(f"{forked}.jsonl")
    assert_every_line_accounted(report)
    for transcript in transcripts.values():
        assert_prefix_stable(TranscriptRenderer().episode(transcript))


def test_a_forked_session_read_alone_keeps_the_calls_it_copied(tmp_path):
    """Without the session that made them, the copies are the only record of those responses:
    they are calls of the forked session."""
    folder, first, forked = fork_session_folder(tmp_path, True)
    (folder / f"{first}.jsonl").unlink()
    report = ImportReport()
    (transcript,) = import_claude_code(folder, report)
    assert transcript.id == forked
    log = requests(FORK_SESSION)
    assert [c.id for c in transcript.agents[0].calls] == [f"main/{r['message_id']}" for r in log]
    # The copies name the session that made them: each is reported, kept as a call here.
    named = [p.message.split(" (")[0] for p in report.diagnostics.problems]
    copies = sum(r["session_id"] == first for r in log)
    assert named == [f"this response names session {first} as the one that made it"] * copies

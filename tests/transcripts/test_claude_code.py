"""Every real Claude Code transcript imports with the structure the file states."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from callgrove.episode import Episode, load, save
from callgrove.forest import build_forest
from callgrove.transcripts import ImportReport, TranscriptRenderer, import_claude_code

from .helpers import (
    DAG,
    FLAT,
    FLAT_DIR,
    KIMUSON,
    NESTED,
    PROJECTS,
    STAGE0_SMALL,
    STAGE0_SUBAGENT,
    assert_every_line_accounted,
    assert_prefix_stable,
)


def imported(path: Path) -> tuple[list[Episode], ImportReport]:
    report = ImportReport()
    transcripts = import_claude_code(path, report)
    return [TranscriptRenderer().episode(t) for t in transcripts], report


def response_keys(path: Path) -> set[str]:
    """Distinct API responses a file records: assistant lines by message.id (all have one)."""
    keys = set()
    for raw in path.read_text().splitlines():
        line = json.loads(raw)
        if line.get("type") == "assistant":
            keys.add(line["message"]["id"])
    return keys


def tool_use(path: Path, use_id: str) -> dict:
    for raw in path.read_text().splitlines():
        content = json.loads(raw).get("message", {}).get("content")
        for block in content if isinstance(content, list) else []:
            if block.get("type") == "tool_use" and block.get("id") == use_id:
                return block
    raise AssertionError(use_id)


def spawning_tool_ids(episode: Episode, agent_id: str) -> list[str]:
    """Tool call ids in the answer of the call an agent names as its spawner."""
    spawner = episode.call(episode.agent(agent_id).spawn.call)
    return [t["id"] for t in spawner.content["response"]["tool_calls"]]


def test_inline_sidechains_linked_by_task_prompt():
    (episode,), report = imported(KIMUSON)
    assert [(a.id, a.parent, a.start, a.meta and a.meta["layout"]) for a in episode.agents] == [
        ("main", None, "root", None),
        ("sidechain-1", "main", "fresh", "inline"),
        ("sidechain-2", "main", "fresh", "inline"),
    ]
    assert [len(a.calls) for a in episode.agents] == [10, 3, 7]
    assert len(list(episode.calls())) == len(response_keys(KIMUSON))
    # The Task call without a prompt failed and started nobody; the other two each started one.
    for agent, use_id in (
        ("sidechain-1", "toolu_014YF9TXhDRR7BnpasNJ7gjC"),
        ("sidechain-2", "toolu_01LKfUwrsnof18CpWZQcJH44"),
    ):
        assert use_id in spawning_tool_ids(episode, agent)
        first = episode.agent(agent).calls[0].content["prompt"][-1]["content"]
        assert first == tool_use(KIMUSON, use_id)["input"]["prompt"]
    assert episode.gaps is None and episode.objective == "supervised"
    assert all(c.logprobs is None for c in episode.calls())
    assert_every_line_accounted(report)
    assert_prefix_stable(episode)


def test_flat_layout_linked_by_tool_use_result_agent_id():
    (episode,), report = imported(FLAT)
    leader, sub = episode.agents
    assert (sub.id, sub.name, sub.parent, sub.start) == ("agent-ea02459f", "Plan", "main", "fresh")
    assert sub.meta["layout"] == "flat" and sub.spawn.link == "toolUseResult.agentId"
    assert "toolu_01HD7PpSCWhP2gP8dXvJiyZN" in spawning_tool_ids(episode, sub.id)
    assert len(leader.calls) == len(response_keys(FLAT))
    assert len(sub.calls) == len(response_keys(FLAT_DIR / "agent-ea02459f.jsonl"))
    skipped = report.skipped_reasons()
    assert skipped == {"queue-operation record is not a model message": 10}
    assert_every_line_accounted(report)
    assert_prefix_stable(episode)


def test_nested_layout_and_a_project_folder():
    (episode,), report = imported(NESTED)
    leader, sub = episode.agents
    assert (sub.id, sub.name, sub.parent, sub.meta["layout"]) == (
        "agent-a2271d1",
        "Explore",
        "main",
        "nested",
    )
    assert "toolu_01SXaWzD5YZ73zGwchbcxeWi" in spawning_tool_ids(episode, sub.id)
    sub_file = NESTED.with_suffix("") / "subagents/agent-a2271d1.jsonl"
    assert (len(leader.calls), len(sub.calls)) == (
        len(response_keys(NESTED)),
        len(response_keys(sub_file)),
    )
    assert_every_line_accounted(report)
    assert_prefix_stable(episode)
    # A project folder finds both sessions and both subagent layouts.
    episodes, report = imported(PROJECTS)
    assert sorted((e.id, len(e.agents)) for e in episodes) == [
        ("29ccd257-68b1-427f-ae5f-6524b7cb6f20", 2),
        ("cb2e607c-c758-415a-8b45-c49e4631906a", 2),
    ]
    assert_every_line_accounted(report)


def test_parallel_tool_results_all_reach_the_next_call():
    """2.1.x writes each tool result under its own tool_use line; none may fall out."""
    (episode,), _ = imported(NESTED)
    second = episode.agent("agent-a2271d1").calls[1]
    results = [m["tool_call_id"] for m in second.content["prompt"] if m["role"] == "tool"]
    assert sorted(results) == sorted(
        t["id"] for t in episode.agent("agent-a2271d1").calls[0].content["response"]["tool_calls"]
    )
    assert len(results) == 2


@pytest.mark.parametrize("name", ["dag_compact_after_rewind", "dag_compact_after_rewind_preserved"])
def test_compaction_after_a_rewind(name):
    (episode,), report = imported(DAG / f"{name}.jsonl")
    calls = {c.content.get("message_id") or c.purpose: c for c in episode.calls()}
    assert sorted(calls) == ["compaction", "msg_a1", "msg_b1a", "msg_b2a", "msg_b2a2", "msg_p1a"]
    forest = build_forest(episode)
    parent = {c.content.get("message_id") or c.purpose: forest.parent_of(c) for c in forest.calls}
    named = {k: v and (v.content.get("message_id") or v.purpose) for k, v in parent.items()}
    assert named == {
        "msg_a1": None,
        "msg_b1a": "msg_a1",  # the rewound branch
        "msg_b2a": "msg_a1",
        "msg_b2a2": "msg_b2a",
        # the summary call continues the history it summarises; messages a compaction keeps
        # after its summary were not summarised (Claude Code 2.1.332 sends the summary request
        # without them: tests/data/claude_code/subagent_compaction)
        "compaction": "msg_a1" if name.endswith("preserved") else "msg_b2a2",
        "msg_p1a": None,  # the next call starts from the summary: a new root
    }
    compaction = calls["compaction"]
    assert episode.agent_of(compaction).id == "main"
    assert "Summary: the user asked for a plan." in compaction.content["response"]["content"]
    after = calls["msg_p1a"].content["prompt"]
    assert after[0]["content"].startswith("This session is being continued")
    if name.endswith("preserved"):  # the kept messages follow the summary
        assert [m["content"] for m in after[1:]] == [
            "Second answer",
            "Keep going",
            "Kept going",
            "After compaction",
        ]
    else:
        assert [m["content"] for m in after[1:]] == ["After compaction"]
    assert_every_line_accounted(report)
    assert_prefix_stable(episode)


def test_stitched_fixture_of_many_record_types():
    (episode,), report = imported(STAGE0_SMALL)
    calls = sorted(episode.calls(), key=lambda c: c.seq)
    # a1 and a2 share requestId "req_stage0" but a2 answers a1's tool result: two responses;
    # a3 has no ids; the trimmed lines all share message.id "[trimmed for fixture]".
    assert [c.id for c in calls] == [
        "main/req_stage0",
        "main/req_stage0#2",
        "main/line19",
        "main/compact-21",
        "main/msg_stage0_1",
        "main/[trimmed for fixture]",
    ]
    not_kept = {c.id for c in calls if not c.kept}
    # a2 is superseded by a3, a3 retracted by the refusal, the trimmed one's uuid retracted too
    assert not_kept == {"main/req_stage0#2", "main/line19", "main/[trimmed for fixture]"}
    assert [c.purpose for c in calls].count("compaction") == 1
    warnings = {(p.line, p.message.split(";")[0]) for p in report.diagnostics.warnings}
    assert (51, "compact boundary without a summary line") in warnings
    assert report.diagnostics.errors == []
    assert report.skipped_reasons()["attachment record is not a model message"] == 38
    assert_every_line_accounted(report)
    assert_prefix_stable(episode)


def test_unlinkable_subagent_is_a_gap_and_keeps_its_calls():
    (episode,), report = imported(STAGE0_SUBAGENT)
    leader, sub = episode.agents
    assert (sub.id, sub.parent, sub.name) == ("agent-a0ad4f44468bdf20d", None, "general-purpose")
    assert sub.meta["meta_json"] == {"agentType": "general-purpose", "spawnDepth": 1}
    assert len(sub.calls) == 1 and len(leader.calls) == 1
    assert [g.agent for g in episode.gaps] == [sub.id]
    assert episode.gaps[0].kind == "subagent_parent_unavailable"
    assert_every_line_accounted(report)


def test_episodes_round_trip_through_the_file_format(tmp_path):
    episodes, _ = imported(KIMUSON)
    path = tmp_path / "out.jsonl"
    save(path, episodes)
    (back,) = load(path)
    assert back.objective == "supervised" and back.meta["source"] == "claude-code"
    assert [(a.id, a.parent, a.start) for a in back.agents] == [
        (a.id, a.parent, a.start) for a in episodes[0].agents
    ]
    for before, after in zip(
        sorted(episodes[0].calls(), key=lambda c: c.seq),
        sorted(back.calls(), key=lambda c: c.seq),
        strict=True,
    ):
        assert (before.id, before.seq, before.purpose) == (after.id, after.seq, after.purpose)
        assert episodes[0].full_ids(before).tolist() == back.full_ids(after).tolist()
        assert after.logprobs is None
        assert after.content["response"] == before.content["response"]


def _nested_copy(tmp_path: Path) -> tuple[Path, list[dict]]:
    shutil.copytree(NESTED.parent, tmp_path / "project")
    session = tmp_path / "project" / NESTED.name
    return session, [json.loads(x) for x in session.read_text().splitlines()]


def _write(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_background_agent(tmp_path):
    session, records = _nested_copy(tmp_path)
    records[3]["message"]["content"][0]["input"]["run_in_background"] = True
    records[4]["toolUseResult"]["status"] = "async_launched"
    _write(session, records)
    (episode,), _ = imported(session)
    assert episode.agent("agent-a2271d1").start == "background"
    assert_prefix_stable(episode)


def test_fork_agent_repeats_the_parent_conversation(tmp_path):
    """A fork's file starts with the parent's messages (same response ids): those are history,
    not calls, and its first call continues the parent's tokens."""
    session, records = _nested_copy(tmp_path)
    user, task_call = records[2], records[3]
    directive = {
        "type": "user",
        "uuid": "fork-u1",
        "parentUuid": task_call["uuid"],
        "isSidechain": True,
        "message": {"role": "user", "content": "You are a fork: look at the tests only."},
    }
    answer = {
        "type": "assistant",
        "uuid": "fork-a1",
        "parentUuid": "fork-u1",
        "isSidechain": True,
        "requestId": "req_fork",
        "message": {
            "id": "msg_fork",
            "role": "assistant",
            "content": [{"type": "text", "text": "Tests: 50 files."}],
        },
    }
    fork_file = session.with_suffix("") / "subagents/agent-a2271d1.jsonl"
    _write(fork_file, [user, task_call, directive, answer])
    (episode,), report = imported(session)
    fork = episode.agent("agent-a2271d1")
    assert (fork.start, fork.parent, [c.id for c in fork.calls]) == (
        "fork",
        "main",
        ["agent-a2271d1/msg_fork"],
    )
    assert build_forest(episode).parent_of(fork.calls[0]).id == "main/msg_01Gh1K3VvEL4VYfME3vMebbR"
    assert report.used[str(fork_file)][2] == "message (an earlier agent's response, repeated)"
    assert_every_line_accounted(report)
    assert_prefix_stable(episode)


def test_seq_follows_the_ledger_across_agents():
    """Leader and sidechain calls interleave in time; seq follows their first lines' times."""
    (episode,), _ = imported(KIMUSON)
    stamps = [json.loads(x)["timestamp"] for x in KIMUSON.read_text().splitlines()]
    calls = sorted(episode.calls(), key=lambda c: c.seq)
    times = [stamps[c.content["source"]["lines"][0] - 1] for c in calls]
    assert times == sorted(times)
    assert [c.seq for c in calls] == list(range(1, len(calls) + 1))
    agents = [episode.agent_of(c).id for c in calls]
    assert agents.index("sidechain-2") < max(i for i, a in enumerate(agents) if a == "main")

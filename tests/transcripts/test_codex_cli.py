"""Sessions written by Codex 0.169 itself, checked against the scripted server's request log.

`tests/data/codex/generate.py` ran the real CLI offline against a scripted Responses server;
each scenario folder holds the rollouts Codex wrote and the log of every request the server
answered. Every request must be exactly one imported call, of the agent (thread) that sent it,
with the purpose the request had, and nothing else may be a call.
"""

from __future__ import annotations

from collections import Counter

import pytest

from callgrove.transcripts import TranscriptRenderer, import_codex

from .helpers import Generated, assert_every_line_accounted, assert_prefix_stable

GENERATED = Generated("codex", import_codex)
SCENARIOS = GENERATED.scenarios
requests = GENERATED.requests
imported = GENERATED.imported


def test_the_generated_scenarios_are_all_there():
    assert SCENARIOS == ["auto_compaction", "spawn_fork", "spawn_fresh", "tool_call"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_each_request_is_one_call_of_the_agent_that_sent_it(scenario):
    transcript, report = imported(scenario)
    log = requests(scenario)
    answered = {  # the first output item id of each request's answer -> (thread, purpose)
        r["output"][0]["id"]: (
            r["thread_id"],
            "compaction" if r["metadata"]["request_kind"] == "compaction" else "turn",
        )
        for r in log
    }
    found = Counter()
    for agent in transcript.agents:
        for call in agent.calls:
            item = call.id.removeprefix(f"{agent.id}/")
            assert answered.get(item) == (agent.id, call.purpose), call.id
            found[item] += 1
    assert found == Counter(set(answered))
    assert report.diagnostics.problems == []
    assert_every_line_accounted(report)


def test_a_forked_subagent_has_its_own_call_and_the_leaders_history():
    transcript, _ = imported("spawn_fork")
    leader, fork = transcript.agents
    (request,) = [r for r in requests("spawn_fork") if r["parent_thread_id"]]
    assert request["metadata"]["history_initialization"] == "warm_fork"
    assert (fork.id, fork.parent, fork.start) == (request["thread_id"], leader.id, "fork")
    assert len(leader.calls) == 3 and len(fork.calls) == 1
    spawner = next(c for c in leader.calls if c.response.tool_calls[0].name == "spawn_agent")
    assert fork.spawn is not None and fork.spawn.call == spawner.id
    # the fork's prompt holds the leader's task, repeated from the thread it was forked from
    prompt = [m.text for m in fork.calls[0].context.messages_since(None)]
    assert "Fork a helper to check the plan." in prompt
    assert prompt[-1] == "Count to three and report."


def test_a_fresh_subagent_starts_from_its_task():
    transcript, _ = imported("spawn_fresh")
    leader, helper = transcript.agents
    assert (helper.parent, helper.start) == (leader.id, "fresh")
    prompt = [m.text for m in helper.calls[0].context.messages_since(None)]
    assert "Ask a helper to count to three." not in prompt


def test_auto_compaction_summary_is_read_once_as_the_compaction_call():
    transcript, report = imported("auto_compaction")
    (agent,) = transcript.agents
    purposes = [c.purpose for c in agent.calls]
    assert purposes == ["turn", "compaction", "turn"]
    compaction = agent.calls[1]
    assert compaction.response.text.startswith("Summary: printed hi")
    assert "compaction (its summary is the response before it)" in report.used_kinds()
    # the call after it starts from the summary, not from the compacted history
    after = [m.text for m in agent.calls[2].context.messages_since(None)]
    assert any("Summary: printed hi" in text for text in after)
    assert not any(m.tool_calls for m in agent.calls[2].context.messages_since(None))


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_generated_sessions_render_to_clean_rows(scenario):
    transcript, _ = imported(scenario)
    assert_prefix_stable(TranscriptRenderer().episode(transcript))

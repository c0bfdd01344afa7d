"""Attribution rules that real harness runs showed wrong: one start rule for the gateway and the
importer, the CLI release's default for an omitted `run_in_background`, two subagents with the
same prompt, and a user prompt that merely mentions a summary of the conversation."""

from __future__ import annotations

import asyncio
import json

import pytest

from callgrove.chat import Message, ToolCall
from callgrove.gateway.attribution import identify, spawns_in
from callgrove.transcripts.claude_records import SpawnArguments, background_by_default
from callgrove.transcripts.codex_records import agent_name

from .helpers import gateway_client, scripted, write_script


@pytest.mark.parametrize(
    ("arguments", "options", "start"),
    [
        ({"subagent_type": "fork", "run_in_background": True}, {}, "background"),
        ({"subagent_type": "fork"}, {"ran_in_background": True}, "background"),
        ({"subagent_type": "fork"}, {}, "fork"),
        ({}, {"forked": True}, "fork"),
        ({}, {}, "fresh"),
        ({}, {"version": "2.1.197"}, "fresh"),
        ({}, {"version": "2.1.198"}, "background"),
        ({}, {"version": "2.1.332"}, "background"),
        ({"run_in_background": False}, {"version": "2.1.332"}, "fresh"),
        ({"run_in_background": True}, {"ran_in_background": False}, "fresh"),
    ],
)
def test_one_start_rule(arguments, options, start):
    assert SpawnArguments.of({"prompt": "p", **arguments}).start(**options) == start


def spawn_message(*arguments: dict) -> Message:
    calls = tuple(
        ToolCall(f"t{k}", "Agent", {"prompt": "look", **a}) for k, a in enumerate(arguments)
    )
    return Message("assistant", tool_calls=calls)


@pytest.mark.parametrize(
    ("version", "start"), [(None, "fresh"), ("2.1.197", "fresh"), ("2.1.332", "background")]
)
def test_the_gateway_reads_an_omitted_run_in_background_as_the_release_did(version, start):
    (spawn,) = spawns_in("lead", spawn_message({}), version)
    assert spawn.start == start


def test_a_background_fork_is_background_to_the_gateway_as_to_the_importer():
    (spawn,) = spawns_in(
        "lead", spawn_message({"subagent_type": "fork", "run_in_background": True})
    )
    assert spawn.start == "background"


def test_the_release_comes_from_claude_codes_user_agent():
    headers = {"x-claude-code-session-id": "s", "user-agent": "claude-cli/2.1.197 (external, cli)"}
    assert identify(headers, [Message("user", "hi")]).version == "2.1.197"
    assert not background_by_default("2.1.197") and background_by_default("2.1.332")
    assert not background_by_default("dev")


INSTRUCTION = (
    "CRITICAL: Respond with TEXT ONLY. Do NOT call any tools.\n\n"
    "Your task is to create a detailed summary of the conversation so far."
)


@pytest.mark.parametrize(
    ("text", "purpose"),
    [
        ("Write me a summary of the conversation we had yesterday.", "turn"),
        ("SUMMARY OF THE CONVERSATION, please", "turn"),
        ("fix the bug\n\n" + INSTRUCTION, "compaction"),
    ],
)
def test_only_the_compaction_instruction_makes_a_compaction(text, purpose):
    headers = {"x-claude-code-session-id": "s"}
    assert identify(headers, [Message("user", text)]).purpose == purpose


SAME = "SUBTASK look at the logs"
CLAUDE = {"x-claude-code-session-id": "lead", "user-agent": "claude-cli/2.1.332 (external, cli)"}


@pytest.mark.parametrize("order", [("fg-agent", "bg-agent"), ("bg-agent", "fg-agent")])
def test_two_subagents_with_one_prompt_get_their_own_starts(tmp_path, order):
    """One foreground and one background subagent with the same prompt, in one response: a
    match by prompt cannot tell them apart (whichever calls first takes the first spawn); the
    tool results the leader reads next name each one's agent id, and the record follows them."""
    rules = [
        {"when": "SUBTASK", "reply": "looked"},
        {"when": "agentId", "reply": "all done"},
        {
            "when": "start",
            "reply": {
                "tool_calls": [
                    {"name": "Agent", "arguments": {"prompt": SAME, "run_in_background": False}},
                    {"name": "Agent", "arguments": {"prompt": SAME, "run_in_background": True}},
                ]
            },
        },
    ]

    async def go():
        _, client = gateway_client(scripted(write_script(tmp_path / "s.json", rules)), tmp_path)
        async with client:
            first_messages = [{"role": "user", "content": "start"}]
            first = await client.post(
                "/e/ep/v1/messages",
                json={"model": "m", "max_tokens": 500, "messages": first_messages},
                headers=CLAUDE,
            )
            uses = [b for b in first.json()["content"] if b["type"] == "tool_use"]
            for agent in order:
                sub = {
                    "model": "m",
                    "max_tokens": 50,
                    "messages": [{"role": "user", "content": SAME}],
                }
                answered = await client.post(
                    "/e/ep/v1/messages",
                    json=sub,
                    headers={**CLAUDE, "x-claude-code-agent-id": agent},
                )
                assert answered.status_code == 200, answered.text
            results = [
                {
                    "type": "tool_result",
                    "tool_use_id": uses[0]["id"],
                    "content": "looked\nagentId: fg-agent (use SendMessage)",
                },
                {
                    "type": "tool_result",
                    "tool_use_id": uses[1]["id"],
                    "content": "Async agent launched successfully.\nagentId: bg-agent (internal ID)",
                },
            ]
            messages = [
                *first_messages,
                {"role": "assistant", "content": first.json()["content"]},
                {"role": "user", "content": results},
            ]
            second = await client.post(
                "/e/ep/v1/messages",
                json={"model": "m", "max_tokens": 50, "messages": messages},
                headers=CLAUDE,
            )
            assert second.status_code == 200, second.text
            return (await client.post("/e/ep/close", json={})).json()

    record = asyncio.run(go())
    starts = {a["id"]: (a["parent"], a["start"]) for a in record["agents"]}
    assert starts == {
        "lead": (None, "root"),
        "bg-agent": ("lead", "background"),
        "fg-agent": ("lead", "fresh"),
    }


CODEX_SPAWNS = [
    {"name": "spawn_agent", "arguments": {"message": "CHILD-TASK one", "task_name": "alpha"}},
    {
        "name": "spawn_agent",
        "arguments": {"message": "CHILD-TASK two", "task_name": "beta", "agent_type": "explorer"},
    },
]


def codex_headers(thread: str, path: str, parent: str | None = None) -> dict[str, str]:
    meta = {"request_kind": "turn", "history_initialization": "new", "agent_name": path}
    headers = {"session-id": "lead-t", "thread-id": thread}
    if parent:
        headers["x-codex-parent-thread-id"] = parent
        meta["parent_thread_id"] = parent
    return {**headers, "x-codex-turn-metadata": json.dumps(meta)}


@pytest.mark.parametrize("version", ["v1", "v2"])
@pytest.mark.parametrize("children_first", [True, False], ids=["children-first", "leader-first"])
@pytest.mark.parametrize("restart", [False, True], ids=["live", "restarted"])
def test_codex_subagents_are_named_as_the_importer_names_them(
    tmp_path, version, children_first, restart
):
    """Codex sends `agent_name: /root` for every thread of a v1 run, leader and subagents: the
    gateway names each subagent by the importer's rule (`codex_records.agent_name`): the role
    its `spawn_agent` call asked for, else the nickname (v1) or the task path (v2) the call's
    output gives, whichever of the leader's next request and the subagent's first call comes
    first, and again when a gateway reads the ledger back."""
    rules = [
        {"when": "CHILD-TASK", "reply": "child done"},
        {"when": "agent", "reply": "leader done"},
        {"when": "start", "reply": {"tool_calls": CODEX_SPAWNS}},
    ]
    script = write_script(tmp_path / "s.json", rules)
    paths = {"kid-1": "/root/alpha", "kid-2": "/root/beta"}
    outputs = {
        "v1": [
            {"agent_id": "kid-1", "nickname": "Banach"},
            {"agent_id": "kid-2", "nickname": "Cicero"},
        ],
        "v2": [{"task_name": "/root/alpha"}, {"task_name": "/root/beta"}],
    }[version]

    async def children(client):
        for kid, task in (("kid-1", "CHILD-TASK one"), ("kid-2", "CHILD-TASK two")):
            path = paths[kid] if version == "v2" else "/root"
            body = {"model": "m", "input": [{"role": "user", "content": task}]}
            answered = await client.post(
                "/e/ep/v1/responses", json=body, headers=codex_headers(kid, path, "lead-t")
            )
            assert answered.status_code == 200, answered.text

    async def go():
        _, client = gateway_client(scripted(script), tmp_path / "ledger")
        async with client:
            start = {"model": "m", "input": [{"role": "user", "content": "start"}]}
            first = await client.post(
                "/e/ep/v1/responses", json=start, headers=codex_headers("lead-t", "/root")
            )
            calls = [i for i in first.json()["output"] if i["type"] == "function_call"]
            assert [c["name"] for c in calls] == ["spawn_agent"] * 2
            if children_first:
                await children(client)
            answers = [
                {"type": "function_call_output", "call_id": c["call_id"], "output": json.dumps(o)}
                for c, o in zip(calls, outputs, strict=True)
            ]
            second = {**start, "input": [*start["input"], *calls, *answers]}
            answered = await client.post(
                "/e/ep/v1/responses", json=second, headers=codex_headers("lead-t", "/root")
            )
            assert answered.status_code == 200, answered.text
            if not children_first:
                await children(client)
            if not restart:
                return (await client.post("/e/ep/close", json={})).json()
        _, again = gateway_client(scripted(script), tmp_path / "ledger")
        async with again:
            return (await again.post("/e/ep/close", json={})).json()

    record = asyncio.run(go())
    names = {a["id"]: (a["name"], a["parent"]) for a in record["agents"]}
    nickname = "Banach" if version == "v1" else "/root/alpha"
    assert names == {
        "lead-t": ("leader", None),
        "kid-1": (nickname, "lead-t"),
        "kid-2": ("explorer", "lead-t"),  # the role the spawn asked for comes first
    }
    assert agent_name(None, "Banach", subagent=True) == "Banach"
    assert agent_name("explorer", "Cicero", "/root/beta", subagent=True) == "explorer"

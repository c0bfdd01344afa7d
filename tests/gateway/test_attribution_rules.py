"""Attribution rules that real harness runs showed wrong: one start rule for the gateway and the
importer, the CLI release's default for an omitted `run_in_background`, two subagents with the
same prompt, and a user prompt that merely mentions a summary of the conversation."""

from __future__ import annotations

import asyncio

import pytest

from callgrove.gateway.attribution import identify, spawns_in
from callgrove.transcripts import Message, ToolCall
from callgrove.transcripts.claude_records import SpawnArguments, background_by_default

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

"""The gateway: three client APIs, token-exact continuation, attribution, the ledger and closing."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from callgrove.chat import BuiltinFormat
from callgrove.episode import read_episodes
from callgrove.gateway.ledger import CALLS_SUFFIX, EPISODES_FILE
from callgrove.policy import Completion
from callgrove.rows import build_rows, check_rows

from .helpers import gateway_client, scripted, server_process, sse_events, write_script

SPAWN = {
    "name": "Agent",
    "arguments": {
        "description": "find",
        "prompt": "SUBTASK find the bug",
        "subagent_type": "Explore",
    },
}
RULES = [
    {"when": "SUBTASK", "reply": "found it in login.py"},
    {"when": "found it in login.py", "reply": "Fixed."},
    {"when": "start", "reply": {"text": "Delegating.", "tool_calls": [SPAWN]}},
    {
        "when": "weather",
        "reply": {
            "thinking": "need a tool",
            "tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}],
        },
    },
]
CLAUDE = {
    "x-claude-code-session-id": "sess-1",
    "anthropic-version": "2023-06-01",
    "user-agent": "claude-cli/2.1.332 (external, cli)",  # leaving out run_in_background: background
}


def run(coroutine):
    return asyncio.run(coroutine)


def system_blocks(marker: bool) -> list[dict]:
    block = {"type": "text", "text": "You are a coding agent."}
    if marker:
        block["cache_control"] = {"type": "ephemeral"}
    return [block]


def ledger_lines(ledger, episode="ep1"):
    return [
        json.loads(line) for line in (ledger / f"{episode}{CALLS_SUFFIX}").read_text().splitlines()
    ]


def claude_leader_and_subagent(tmp_path):
    """Claude Code's shape: a leader spawns a subagent (no parent header), then finishes."""

    async def go():
        _, client = gateway_client(
            scripted(write_script(tmp_path / "s.json", RULES)), tmp_path / "ledger"
        )
        async with client:
            tools = [{"name": "Agent", "input_schema": {"type": "object"}}]
            first_body = {
                "model": "m",
                "max_tokens": 2000,
                "stream": True,
                "system": system_blocks(True),
                "tools": tools,
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "text",
                                "text": "start the work",
                                "cache_control": {"type": "ephemeral"},
                            }
                        ],
                    }
                ],
            }
            first = await client.post(
                "/e/ep1/v1/messages?beta=true", json=first_body, headers=CLAUDE
            )
            events = sse_events(first.text)
            tool_use = next(
                d["content_block"]
                for n, d in events
                if n == "content_block_start" and d["content_block"]["type"] == "tool_use"
            )
            partial = "".join(
                d["delta"]["partial_json"]
                for n, d in events
                if n == "content_block_delta" and d["delta"]["type"] == "input_json_delta"
            )
            sub_body = {
                "model": "m",
                "max_tokens": 2000,
                "stream": True,
                "system": "You are a subagent.",
                "messages": [{"role": "user", "content": json.loads(partial)["prompt"]}],
            }
            sub = await client.post(
                "/e/ep1/v1/messages",
                json=sub_body,
                headers={**CLAUDE, "x-claude-code-agent-id": "agent-7"},
            )
            sub_text = "".join(
                d["delta"]["text"] for n, d in sse_events(sub.text) if n == "content_block_delta"
            )
            # The harness resends the history: the system prompt now as blocks without markers.
            second_body = {
                **first_body,
                "system": system_blocks(False),
                "messages": [
                    {"role": "user", "content": "start the work"},
                    {
                        "role": "assistant",
                        "content": [
                            {"type": "text", "text": "Delegating."},
                            {
                                "type": "tool_use",
                                "id": tool_use["id"],
                                "name": "Agent",
                                "input": json.loads(partial),
                            },
                        ],
                    },
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "tool_result",
                                "tool_use_id": tool_use["id"],
                                "content": [{"type": "text", "text": sub_text}],
                            }
                        ],
                    },
                ],
            }
            second = await client.post(
                "/e/ep1/v1/messages", json={**second_body, "stream": False}, headers=CLAUDE
            )
            closed = await client.post(
                "/e/ep1/close", json={"rewards": {"fixed": 1.0}, "task": "fix"}
            )
            return events, second.json(), closed

    return go()


def test_claude_code_shape_is_continued_attributed_and_closed(tmp_path):
    events, second, closed = run(claude_leader_and_subagent(tmp_path))
    names = [n for n, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert next(d for n, d in events if n == "message_delta")["delta"]["stop_reason"] == "tool_use"
    assert second["content"][0]["text"] == "Fixed." and second["stop_reason"] == "end_turn"
    assert closed.status_code == 200
    record = closed.json()
    leader, sub = record["agents"]
    assert (leader["id"], leader["start"], leader["parent"]) == ("sess-1", "root", None)
    assert (sub["id"], sub["name"], sub["parent"], sub["start"]) == (
        "agent-7",
        "Explore",
        "sess-1",
        "background",
    )
    assert [len(a["calls"]) for a in record["agents"]] == [2, 1]
    episode = next(read_episodes(tmp_path / "ledger" / EPISODES_FILE))
    first, last = episode.agent("sess-1").calls
    prompt = episode.prompt_ids(last)
    assert prompt[: first.full_len].tolist() == episode.full_ids(first).tolist()  # token-exact
    assert all(
        c.logprobs is not None and len(c.logprobs) == len(c.completion_ids) for c in episode.calls()
    )
    rows = build_rows(episode)
    assert check_rows(rows).ok
    assert len(rows.rows) == 2  # the leader's chain, the subagent's own tree
    assert episode.rewards == {"fixed": 1.0}


def test_closed_episode_refuses_calls_and_a_second_close(tmp_path):
    run(claude_leader_and_subagent(tmp_path))

    async def go():
        _, client = gateway_client(scripted(tmp_path / "s.json"), tmp_path / "ledger")
        async with client:
            late = await client.post(
                "/e/ep1/v1/messages",
                headers=CLAUDE,
                json={
                    "model": "m",
                    "max_tokens": 10,
                    "messages": [{"role": "user", "content": "x"}],
                },
            )
            other = await client.post("/e/ep1/close", json={})
            same = await client.post(
                "/e/ep1/close", json={"rewards": {"fixed": 1.0}, "task": "fix"}
            )
            return late, other, same

    late, other, same = run(go())
    # a closed episode's late call: refused so that the harness stops at once (not retried)
    assert late.status_code == 400 and late.json()["type"] == "error"
    assert late.headers["x-should-retry"] == "false" and "closed" in late.text
    assert other.status_code == 409 and "another body" in other.text
    stored = (tmp_path / "ledger" / EPISODES_FILE).read_bytes().splitlines()
    assert same.status_code == 200 and same.content.rstrip() == stored[0].rstrip()
    assert len(stored) == 1  # closing again stored nothing


async def first_call(path, ledger, episode: str) -> dict:
    """A gateway's first call of `episode`, its answer; the gateway is gone after it."""
    _, client = gateway_client(scripted(path), ledger)
    async with client:
        body = {"messages": [{"role": "user", "content": "weather in Oslo"}]}
        return (await client.post(f"/e/{episode}/v1/chat/completions", json=body)).json()


def test_restart_recovers_the_ledger_and_keeps_continuing(tmp_path):
    ledger = tmp_path / "ledger"
    path = write_script(tmp_path / "s.json", RULES)
    answer = run(first_call(path, ledger, "ep2"))
    with open(ledger / f"ep2{CALLS_SUFFIX}", "ab") as stream:
        stream.write(b'{"id": "c9", "seq"')  # a line cut by a crash

    async def after_restart():
        gateway, client = gateway_client(scripted(path), ledger)
        assert gateway.episodes.recover() == 1
        async with client:
            message = answer["choices"][0]["message"]
            body = {
                "messages": [
                    {"role": "user", "content": "weather in Oslo"},
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": message["tool_calls"],
                        "reasoning_content": "need a tool",
                    },
                    {
                        "role": "tool",
                        "tool_call_id": message["tool_calls"][0]["id"],
                        "content": "sunny",
                    },
                ]
            }
            await client.post("/e/ep2/v1/chat/completions", json=body)
            return (await client.post("/e/ep2/close", json={"rewards": {"r": 0.5}})).json()

    with pytest.warns(UserWarning, match="cut off mid-write"):
        record = run(after_restart())
    calls = record["agents"][0]["calls"]
    assert [c["seq"] for c in calls] == [1, 2]
    assert calls[1]["prompt_from"] == "c1"  # continued after the restart
    assert calls[0]["content"]["response"]["reasoning_content"] == "need a tool"


def test_responses_api_with_codex_headers_and_forks(tmp_path):
    async def go():
        _, client = gateway_client(
            scripted(write_script(tmp_path / "s.json", RULES)), tmp_path / "ledger"
        )
        async with client:
            leader_headers = {
                "session-id": "root-t",
                "thread-id": "root-t",
                "x-codex-turn-metadata": json.dumps(
                    {"request_kind": "turn", "history_initialization": "new"}
                ),
            }
            body = {
                "model": "m",
                "instructions": "You are Codex.",
                "stream": True,
                "input": [
                    {
                        "type": "message",
                        "role": "user",
                        "content": [{"type": "input_text", "text": "weather in Oslo?"}],
                    }
                ],
                "tools": [{"type": "function", "name": "get_weather", "parameters": {}}],
            }
            first = sse_events(
                (await client.post("/e/ep3/v1/responses", json=body, headers=leader_headers)).text
            )
            done = [d["item"] for n, d in first if n == "response.output_item.done"]
            fork_headers = {
                "session-id": "root-t",
                "thread-id": "child-t",
                "x-codex-parent-thread-id": "root-t",
                "x-codex-turn-metadata": json.dumps(
                    {"history_initialization": "warm_fork", "agent_name": "worker"}
                ),
            }
            fork_body = {
                **body,
                "input": body["input"]
                + done
                + [
                    {
                        "type": "function_call_output",
                        "call_id": done[1]["call_id"],
                        "output": "sunny",
                    }
                ],
            }
            await client.post("/e/ep3/v1/responses", json=fork_body, headers=fork_headers)
            compact_headers = {
                **leader_headers,
                "x-codex-turn-metadata": json.dumps({"request_kind": "compaction"}),
            }
            await client.post(
                "/e/ep3/v1/responses", json={**fork_body, "tools": []}, headers=compact_headers
            )
            closed = (await client.post("/e/ep3/close", json={})).json()
            return first, done, closed

    first, done, record = run(go())
    assert [n for n, _ in first][:2] == ["response.created", "response.in_progress"]
    assert (
        first[-1][0] == "response.completed"
        and first[-1][1]["response"]["usage"]["output_tokens"] > 0
    )
    assert [i["type"] for i in done] == ["reasoning", "function_call"]
    leader, worker = record["agents"]
    # `agent_name` "worker" names no task path (`/root/NAME`), and no spawn_agent call started it
    assert (worker["parent"], worker["start"], worker["name"]) == ("root-t", "fork", "subagent")
    assert worker["calls"][0]["prompt_from"] == leader["calls"][0]["id"]  # the fork extends exactly
    compaction = leader["calls"][1]
    assert (
        compaction["purpose"] == "compaction"
        and compaction["prompt_from"] == leader["calls"][0]["id"]
    )


def test_own_headers_untagged_calls_and_key_episodes(tmp_path):
    async def go():
        _, client = gateway_client(
            scripted(write_script(tmp_path / "s.json", RULES)), tmp_path / "ledger"
        )
        async with client:
            body = {"messages": [{"role": "user", "content": "hi"}]}
            await client.post("/v1/chat/completions", json=body)
            lead = {"x-api-key": "cg:ep4", "x-callgrove-agent": "lead"}
            await client.post("/v1/chat/completions", json=body, headers=lead)
            headers = {
                "x-api-key": "cg:ep4",
                "x-callgrove-agent": "solver-1",
                "x-callgrove-parent": "lead",
                "x-callgrove-start": "fork",
                "x-callgrove-name": "solver",
            }
            await client.post("/v1/chat/completions", json=body, headers=headers)
            bad_start = await client.post(
                "/e/ep4/v1/chat/completions",
                json=body,
                headers={"x-callgrove-agent": "a", "x-callgrove-start": "sideways"},
            )
            untagged = (await client.post("/e/untagged/close", json={})).json()
            keyed = (await client.post("/e/ep4/close", json={})).json()
            return untagged, keyed, bad_start

    untagged, keyed, bad_start = run(go())
    assert untagged["id"] == "untagged" and len(untagged["agents"][0]["calls"]) == 1
    agent = keyed["agents"][1]
    assert (agent["id"], agent["name"], agent["parent"], agent["start"]) == (
        "solver-1",
        "solver",
        "lead",
        "fork",
    )
    assert bad_start.status_code == 400


def test_security_ids_tokens_and_body_limit(tmp_path):
    async def go():
        policy = scripted(write_script(tmp_path / "s.json", RULES))
        _, client = gateway_client(policy, tmp_path / "ledger", tokens=["tok"], body_limit=2000)
        async with client:
            body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
            no_key = await client.post("/e/ep5/v1/messages", json=body)
            ok_key = await client.post(
                "/e/ep5/v1/messages", json=body, headers={"x-api-key": "tok"}
            )
            key_episode = await client.post(
                "/v1/messages", json=body, headers={"x-api-key": "cg:ep6:tok"}
            )
            traversal = await client.post(
                "/e/..%2Fetc/v1/messages", json=body, headers={"x-api-key": "tok"}
            )
            dotted = await client.post(
                "/v1/messages", json=body, headers={"x-api-key": "cg:..:tok"}
            )
            big = await client.post(
                "/e/ep5/v1/messages",
                json={**body, "system": "x" * 5000},
                headers={"x-api-key": "tok"},
            )
            bad_agent = await client.post(
                "/e/ep5/v1/messages",
                json=body,
                headers={"x-api-key": "tok", "x-callgrove-agent": "../a"},
            )
            return no_key, ok_key, key_episode, traversal, dotted, big, bad_agent

    no_key, ok_key, key_episode, traversal, dotted, big, bad_agent = run(go())
    assert no_key.status_code == 401 and no_key.json()["error"]["type"] == "authentication_error"
    assert ok_key.status_code == 200 and key_episode.status_code == 200
    assert (tmp_path / "ledger" / f"ep6{CALLS_SUFFIX}").exists()
    assert traversal.status_code in (400, 404) and dotted.status_code == 400
    assert big.status_code == 413 and big.json()["error"]["type"] == "request_too_large"
    assert bad_agent.status_code == 400
    assert sorted(p.name for p in (tmp_path / "ledger").glob("*.jsonl")) == [
        f"ep5{CALLS_SUFFIX}",
        f"ep6{CALLS_SUFFIX}",
    ]


class FailingOnce:
    """A policy whose first call fails, as an unreachable or overloaded upstream does."""

    def __init__(self, inner):
        self.inner = inner
        self.failed = False

    @property
    def version(self):
        return 3

    async def sample(self, prompt_ids, params) -> Completion:
        if not self.failed:
            self.failed = True
            from callgrove.policy.http import UpstreamError

            raise UpstreamError("upstream answered 503: overloaded", 503)
        sample = await self.inner.sample(prompt_ids, params)
        return Completion(sample.completion_ids, sample.logprobs, 3, sample.finish_reason)


def test_upstream_errors_reach_the_client_in_its_shape_and_retries_are_not_kept(tmp_path):
    async def go():
        policy = FailingOnce(scripted(write_script(tmp_path / "s.json", RULES)))
        _, client = gateway_client(policy, tmp_path / "ledger")
        async with client:
            body = {"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}
            failed = await client.post("/e/ep7/v1/messages", json=body)
            await client.post("/e/ep7/v1/messages", json=body)
            await client.post(
                "/e/ep7/v1/messages", json=body
            )  # the harness retried the same prompt
            return failed, (await client.post("/e/ep7/close", json={})).json()

    failed, record = run(go())
    assert failed.status_code == 503
    assert failed.json()["type"] == "error" and "overloaded" in failed.json()["error"]["message"]
    calls = record["agents"][0]["calls"]
    assert [c["kept"] for c in calls] == [False, True]
    assert record["meta"]["gateway"]["failed_calls"][0]["error"].endswith("overloaded")
    assert record["run"]["policy"] == {"start": 3, "end": 3}


def test_count_tokens_matches_the_rendered_prompt(tmp_path):
    async def go():
        _, client = gateway_client(
            scripted(write_script(tmp_path / "s.json", RULES)), tmp_path / "ledger"
        )
        async with client:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "system": "sys"}
            counted = (await client.post("/e/ep8/v1/messages/count_tokens", json=body)).json()
            answered = (
                await client.post("/e/ep8/v1/messages", json={**body, "max_tokens": 3})
            ).json()
            return counted, answered

    counted, answered = run(go())
    assert counted["input_tokens"] == answered["usage"]["input_tokens"]
    assert answered["stop_reason"] == "max_tokens" and answered["usage"]["output_tokens"] == 3
    assert np.isfinite(counted["input_tokens"])


def test_passthrough_records_the_token_ids_the_upstream_reports(tmp_path):
    from callgrove.policy.http import HttpPolicyClient

    script = write_script(tmp_path / "s.json", RULES)

    async def go(upstream):
        _, client = gateway_client(upstream, tmp_path / "ledger", passthrough=True)
        async with client:
            body = {
                "model": "m",
                "max_tokens": 500,
                "messages": [{"role": "user", "content": "start now"}],
            }
            first = (await client.post("/e/pt/v1/messages", json=body)).json()
            history = [
                *body["messages"],
                {"role": "assistant", "content": first["content"]},
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": first["content"][1]["id"],
                            "content": "found it in login.py",
                        }
                    ],
                },
            ]
            second = (
                await client.post("/e/pt/v1/messages", json={**body, "messages": history})
            ).json()
            record = (await client.post("/e/pt/close", json={})).json()
        await upstream.aclose()
        return first, second, record

    with server_process("serve-policy", "--script", str(script)) as (_, url):
        first, second, record = run(go(HttpPolicyClient(url)))
    assert first["stop_reason"] == "tool_use" and first["content"][1]["name"] == "Agent"
    assert second["content"][0]["text"] == "Fixed."
    one, two = record["agents"][0]["calls"]
    assert two["prompt_from"] == one["id"]  # the upstream's prompt really extends the first call
    assert one["logprobs"] == [-0.25] * len(one["completion_ids"])
    assert (
        BuiltinFormat().decode(np.asarray(one["prompt_ids"])).startswith("<|start|>user\nstart now")
    )


def test_a_greedy_call_through_a_scripted_upstream_records_its_distribution(tmp_path):
    """serve-policy --script names the distribution it answers under, so a gateway in front of
    it captures a call at temperature 0 (an unnamed one there would be refused)."""
    from callgrove.policy.http import HttpPolicyClient

    script = write_script(tmp_path / "s.json", RULES)

    async def go(upstream):
        _, client = gateway_client(upstream, tmp_path / "ledger")
        async with client:
            body = {"messages": [{"role": "user", "content": "hello"}], "temperature": 0.0}
            answer = await client.post("/e/greedy/v1/chat/completions", json=body)
            record = (await client.post("/e/greedy/close", json={})).json()
        await upstream.aclose()
        return answer, record

    with server_process("serve-policy", "--script", str(script)) as (_, url):
        answer, record = run(go(HttpPolicyClient(url)))
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] == "done"
    (call,) = record["agents"][0]["calls"]
    assert call["sampling"] == {"temperature": 0.0, "top_p": 1.0, "top_k": None}


def test_a_call_records_what_was_sampled_and_what_the_client_asked():
    from callgrove.gateway.core import recorded_sampling
    from callgrove.serving.dialects.dialect import ChatRequest

    sent = {"temperature": 0.7, "top_p": 1.0, "top_k": None}

    def request(**settings):
        return ChatRequest([], [], "m", False, 8, **settings)

    asked = request(temperature=0.7)
    assert recorded_sampling(sent, asked) == sent
    replaced = request(temperature=0.2, top_p=0.5)
    assert recorded_sampling(sent, replaced) == {
        **sent,
        "requested": {"temperature": 0.2, "top_p": 0.5, "top_k": None},
    }
    assert recorded_sampling(None, asked) is None

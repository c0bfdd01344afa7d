"""What a client or an operator can hand the gateway and serve-policy, bounded and checked:
request bodies in each API's shape (a misfit is the client's 400 in its API's error shape,
naming the field, and writes nothing), header sizes, a prompt past the model's context, and
every option at start (one line, exit 2, nothing served)."""

from __future__ import annotations

import asyncio
import socket

import pytest
from typer.testing import CliRunner

from callgrove.cli.app import app
from callgrove.gateway.ledger import EPISODES_FILE
from callgrove.serving import web
from gateway.helpers import gateway_client, scripted, write_script

USER = [{"role": "user", "content": "hi"}]
CHAT = {"model": "m", "max_tokens": 8, "messages": USER}
MESSAGES = {"model": "m", "max_tokens": 8, "messages": USER}
RESPONSES = {"model": "m", "input": "hi"}
PATHS = {
    "chat": "/v1/chat/completions",
    "messages": "/v1/messages",
    "responses": "/v1/responses",
    "count": "/v1/messages/count_tokens",
}
ASSISTANT_CALL = {
    "role": "assistant",
    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
}

# (api, body, what the error names)
MALFORMED = [
    ("chat", {**CHAT, "messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ("chat", {**CHAT, "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ("chat", {**CHAT, "messages": [{"role": "user", "content": [5]}]}, "messages[0].content[0]"),
    ("chat", {**CHAT, "messages": [{"role": "user", "content": [{"type": "text"}]}]}, "text"),
    ("chat", {**CHAT, "messages": [{**ASSISTANT_CALL, "tool_calls": [5]}, *USER]}, "tool_calls[0]"),
    (
        "chat",
        {**CHAT, "messages": [{**ASSISTANT_CALL, "tool_calls": [{"function": 5}]}, *USER]},
        "tool_calls[0].function",
    ),
    (
        "chat",
        {**CHAT, "messages": [{**ASSISTANT_CALL, "tool_calls": [{"function": {}}]}, *USER]},
        "name",
    ),
    ("chat", {**CHAT, "messages": [{**ASSISTANT_CALL, "tool_calls": "x"}, *USER]}, "tool_calls"),
    ("chat", {**CHAT, "messages": [{"role": "tool", "content": "x", "tool_call_id": 5}]}, "id"),
    ("chat", {**CHAT, "tools": [{"type": "function", "function": 5}]}, "tools[0].function"),
    ("chat", {**CHAT, "tools": {"f": 1}}, "tools"),
    ("chat", {**CHAT, "stream": "yes"}, "stream"),
    ("chat", {**CHAT, "n": 3}, "n 3"),
    ("chat", {**CHAT, "max_tokens": -1}, "max_tokens"),
    ("chat", {**CHAT, "max_tokens": 2.5}, "max_tokens"),
    ("chat", {**CHAT, "temperature": 9}, "temperature"),
    ("chat", {**CHAT, "stop": [1]}, "stop[0]"),
    ("chat", {**CHAT, "model": 5}, "model"),
    ("chat", {"model": "m"}, "messages"),
    ("messages", {**MESSAGES, "messages": [{"role": "user", "content": 5}]}, "content"),
    ("messages", {**MESSAGES, "messages": [{"role": "wizard", "content": "hi"}]}, "role"),
    ("messages", {**MESSAGES, "messages": [{"role": "user"}]}, "content"),
    ("messages", {k: v for k, v in MESSAGES.items() if k != "max_tokens"}, "max_tokens"),
    ("messages", {**MESSAGES, "system": 5}, "system"),
    ("messages", {**MESSAGES, "system": [{"type": "text", "text": 5}]}, "system[0].text"),
    (
        "messages",
        {
            **MESSAGES,
            "messages": [{"role": "assistant", "content": [{"type": "tool_use", "name": "f"}]}],
        },
        "messages[0].content[0]",
    ),
    (
        "messages",
        {
            **MESSAGES,
            "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": 5}]}],
        },
        "tool_use_id",
    ),
    (
        "messages",
        {
            **MESSAGES,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text"}]}
                    ],
                }
            ],
        },
        "messages[0].content[0].content[0]",
    ),
    ("messages", {**MESSAGES, "tools": [{"name": 5}]}, "tools[0].name"),
    ("messages", {**MESSAGES, "stop_sequences": "x"}, "stop_sequences"),
    ("count", {"messages": [{"role": "user", "content": 5}]}, "content"),
    ("responses", {**RESPONSES, "input": 5}, "input"),
    ("responses", {**RESPONSES, "input": [5]}, "input[0]"),
    ("responses", {**RESPONSES, "input": [{"role": "wizard", "content": "hi"}]}, "input[0].role"),
    ("responses", {**RESPONSES, "input": [{"role": "user", "content": 5}]}, "input[0].content"),
    (
        "responses",
        {**RESPONSES, "input": [{"role": "user", "content": [{"type": "input_text"}]}]},
        "input[0].content[0]",
    ),
    (
        "responses",
        {**RESPONSES, "input": [{"type": "function_call", "name": 5, "call_id": "c"}]},
        "input[0]",
    ),
    (
        "responses",
        {**RESPONSES, "input": [{"type": "function_call_output", "call_id": 5, "output": "x"}]},
        "input[0].call_id",
    ),
    ("responses", {**RESPONSES, "instructions": 5}, "instructions"),
    ("responses", {**RESPONSES, "tools": [{"type": "function", "name": 5}]}, "tools[0].name"),
    ("responses", {**RESPONSES, "max_output_tokens": "8"}, "max_output_tokens"),
]

# What the harnesses send, with the fields callgrove does not read: still served.
CLAUDE_LIKE = {
    "model": "claude-sonnet",
    "max_tokens": 32000,
    "stream": False,
    "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "x"}}],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "fix it"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "look", "signature": "sig"},
                {"type": "redacted_thinking", "data": "xx"},
                {"type": "tool_use", "id": "t1", "name": "Read", "input": {"path": "a"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "content": [{"type": "text", "text": "ok"}, {"type": "image", "source": {}}],
                    "is_error": False,
                },
                {"type": "image", "source": {"type": "base64", "data": ""}},
            ],
        },
    ],
    "tools": [
        {"name": "Read", "description": "read", "input_schema": {"type": "object"}},
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
    ],
    "metadata": {"user_id": "u"},
    "thinking": {"type": "enabled", "budget_tokens": 1024},
    "tool_choice": {"type": "auto"},
    "temperature": 1,
}
CODEX_LIKE = {
    "model": "gpt-5",
    "instructions": "You are Codex.",
    "input": [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "d"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "t"}], "content": None},
        {"type": "function_call", "name": "shell", "arguments": "{}", "call_id": "c1"},
        {"type": "function_call_output", "call_id": "c1", "output": "done"},
        {"type": "custom_tool_call", "name": "apply_patch", "input": "*** x", "call_id": "c2"},
        {"type": "custom_tool_call_output", "call_id": "c2", "output": "ok"},
        {"role": "user", "content": "and now?"},
    ],
    "tools": [
        {"type": "function", "name": "shell", "parameters": {"type": "object"}, "strict": False},
        {"type": "custom", "name": "apply_patch", "format": {"type": "grammar"}},
        {"type": "local_shell"},
        {"type": "namespace", "name": "mcp", "tools": [{"name": "x"}]},
    ],
    "tool_choice": "auto",
    "parallel_tool_calls": False,
    "reasoning": {"effort": "low", "summary": "auto"},
    "store": False,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "k",
}
CHAT_LIKE = {
    "model": "m",
    "messages": [
        {"role": "system", "content": "s"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url"}]},
        {**ASSISTANT_CALL, "content": None, "reasoning_content": "r"},
        {"role": "tool", "tool_call_id": "c1", "content": "out"},
    ],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
    "n": 1,
    "max_completion_tokens": 8,
    "stream_options": {"include_usage": True},
    "tool_choice": "auto",
}


def call(tmp_path, api: str, body, headers=None):
    """(status, JSON answer, files in the ledger folder) of one request to a fresh gateway."""

    async def go():
        _, client = gateway_client(scripted(write_script(tmp_path / "s.json", [])), tmp_path / "l")
        async with client:
            answered = await client.post(f"/e/ep{PATHS[api]}", json=body, headers=headers or {})
            return answered.status_code, answered.json()

    status, answer = asyncio.run(go())
    return status, answer, sorted(p.name for p in (tmp_path / "l").iterdir())


def error_message(api: str, answer: dict) -> str:
    if api in ("messages", "count"):
        assert answer["type"] == "error"
        assert answer["error"]["type"] == "invalid_request_error"
    else:
        assert answer["error"]["type"] == "invalid_request_error"
    return answer["error"]["message"]


@pytest.mark.parametrize(("api", "body", "named"), MALFORMED, ids=lambda v: str(v)[:60])
def test_a_malformed_body_is_the_clients_400_naming_the_field(tmp_path, api, body, named):
    status, answer, files = call(tmp_path, api, body)
    assert status == 400, answer
    assert named in error_message(api, answer)
    assert files == [".gateway.lock"]  # nothing written


@pytest.mark.parametrize(
    ("api", "body"), [("messages", CLAUDE_LIKE), ("responses", CODEX_LIKE), ("chat", CHAT_LIKE)]
)
def test_what_the_harnesses_send_is_still_served(tmp_path, api, body):
    status, answer, files = call(tmp_path, api, body)
    assert status == 200, answer
    assert "ep.calls.jsonl" in files


@pytest.mark.parametrize("api", ["chat", "messages", "responses"])
def test_headers_past_the_limit_are_a_431(tmp_path, api):
    body = {"chat": CHAT, "messages": MESSAGES, "responses": RESPONSES}[api]
    status, answer, files = call(tmp_path, api, body, {"x-padding": "a" * 200_000})
    assert status == 431
    assert "65536-byte limit" in (answer.get("error") or {}).get("message", "")
    assert files == [".gateway.lock"]


def test_a_long_agent_name_is_refused_and_not_stored(tmp_path):
    headers = {"x-callgrove-agent": "a1", "x-callgrove-name": "n" * 1000}
    status, answer, files = call(tmp_path, "chat", CHAT, headers)
    assert status == 400 and "X-Callgrove-Name" in answer["error"]["message"]
    assert files == [".gateway.lock"]


def test_a_refused_call_leaves_no_episode_behind(tmp_path):
    async def go():
        _, client = gateway_client(scripted(write_script(tmp_path / "s.json", [])), tmp_path / "l")
        async with client:
            headers = {"x-callgrove-agent": "a1", "x-callgrove-parent": "nobody"}
            refused = await client.post("/e/ep/v1/chat/completions", json=CHAT, headers=headers)
            closed = await client.post("/e/ep/close", json={})
            health = (await client.get("/health")).json()
            return refused.status_code, closed.status_code, health

    refused, closed, health = asyncio.run(go())
    assert (refused, closed, health["episodes"]) == (400, 404, 0)
    assert not (tmp_path / "l" / "ep.calls.jsonl").exists()
    assert not (tmp_path / "l" / EPISODES_FILE).exists()


@pytest.mark.parametrize(
    ("method", "path", "status", "shape"),
    [
        ("POST", "/v2/nothing", 404, "chat"),
        ("GET", "/e/ep/v1/chat/completions", 405, "chat"),
        ("GET", "/e/ep/v1/messages", 405, "messages"),
    ],
)
def test_unrouted_requests_are_answered_in_the_apis_shape(tmp_path, method, path, status, shape):
    async def go():
        _, client = gateway_client(scripted(write_script(tmp_path / "s.json", [])), tmp_path / "l")
        async with client:
            return await client.request(method, path)

    answered = asyncio.run(go())
    assert answered.status_code == status
    if shape == "messages":
        assert answered.json()["type"] == "error"
    else:
        assert answered.json()["error"]["code"] == status


# serve-policy: the prompt against the model's context, through the command's own wiring


def served_app(monkeypatch, *options: str):
    """The app `callgrove serve-policy OPTIONS` would serve (served here in process)."""
    served = []
    monkeypatch.setattr(web, "serve", lambda app, host, port, ready: served.append(app))
    result = CliRunner().invoke(app, ["serve-policy", *options])
    assert result.exit_code == 0, result.output
    return served[0]


def test_a_prompt_past_the_tiny_models_context_is_a_400_before_sampling(monkeypatch):
    import httpx

    server = served_app(monkeypatch, "--model", "tiny")

    async def go(prompt_tokens: int):
        transport = httpx.ASGITransport(app=server)
        async with httpx.AsyncClient(transport=transport, base_url="http://policy") as client:
            body = {"prompt": [65] * prompt_tokens, "max_tokens": 1}
            return await client.post("/v1/completions", json=body)

    refused = asyncio.run(go(9000))  # past the context: the old server sampled it for seconds
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert "8192" in error["message"] and "9000 in the prompt" in error["message"]
    huge = asyncio.run(go(300_000))  # 90 GB of attention mask, were it sampled
    assert huge.status_code == 400 and "300000 in the prompt" in huge.json()["error"]["message"]


# Options: checked at start, one line, exit 2


def start(monkeypatch, command: str, *options: str):
    served = []
    monkeypatch.setattr(web, "serve", lambda app, host, port, ready: served.append(app))
    monkeypatch.delenv("CALLGROVE_TOKEN", raising=False)
    return CliRunner().invoke(app, [command, *options]), served


GATEWAY = ("--upstream", "http://127.0.0.1:1")


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (("--upstream", "not a url"), "--upstream"),
        (("--upstream", "ftp://host:1"), "--upstream"),
        (("--upstream", "http://:1"), "--upstream"),
        (("--upstream", "http://host:99999"), "--upstream"),
        ((*GATEWAY, "--max-tokens", "0"), "--max-tokens"),
        ((*GATEWAY, "--timeout", "-1"), "--timeout"),
        ((*GATEWAY, "--timeout", "nan"), "--timeout"),
        ((*GATEWAY, "--tool-parser", "nope"), "--tool-parser"),
        ((*GATEWAY, "--upstream-model", ""), "--upstream-model"),
        ((*GATEWAY, "--upstream-model", " policy"), "--upstream-model"),
        ((*GATEWAY, "--upstream-token", ""), "--upstream-token"),
        ((*GATEWAY, "--port", "70000"), "--port"),
        ((*GATEWAY, "--port", "-1"), "--port"),
        ((*GATEWAY, "--host", ""), "--host"),
        ((*GATEWAY, "--token", ""), "--token"),
        ((*GATEWAY, "--tokenizer", "t.json"), "--tokenizer"),
    ],
)
def test_a_bad_gateway_option_is_one_line_and_exit_2(tmp_path, monkeypatch, options, named):
    result, served = start(monkeypatch, "gateway", "--ledger", str(tmp_path / "l"), *options)
    assert result.exit_code == 2 and served == []
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], lines


def test_a_ledger_that_is_a_file_is_refused(tmp_path, monkeypatch):
    (tmp_path / "l").write_text("")
    result, served = start(monkeypatch, "gateway", "--ledger", str(tmp_path / "l"), *GATEWAY)
    assert result.exit_code == 2 and served == [] and "--ledger" in result.output


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (("--max-tokens", "0"), "--max-tokens"),
        (("--tool-parser", "nope"), "--tool-parser"),
        (("--port", "65536"), "--port"),
        (("--token", " "), "--token"),
        (("--weights", "w.pt"), "--weights"),
        (("--template", "t.jinja"), "--tokenizer"),
    ],
)
def test_a_bad_serve_policy_option_is_one_line_and_exit_2(tmp_path, monkeypatch, options, named):
    script = write_script(tmp_path / "s.json", [])
    result, served = start(monkeypatch, "serve-policy", "--script", str(script), *options)
    assert result.exit_code == 2 and served == []
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and named in lines[0], lines


def test_a_negative_seed_is_refused(monkeypatch):
    result, served = start(monkeypatch, "serve-policy", "--model", "tiny", "--seed", "-1")
    assert result.exit_code == 2 and served == [] and "--seed" in result.output


@pytest.mark.parametrize("command", ["gateway", "serve-policy"])
def test_a_port_in_use_is_one_line_and_exit_2(tmp_path, command):
    script = write_script(tmp_path / "s.json", [])
    options = (
        ("--ledger", str(tmp_path / "l"), *GATEWAY)
        if command == "gateway"
        else ("--script", str(script))
    )
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        result = CliRunner().invoke(app, [command, *options, "--port", port])
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1].startswith("error: cannot listen on")
    assert "Traceback" not in result.output


def test_a_key_of_any_bytes_is_a_401_and_a_utf8_token_is_matched(tmp_path):
    async def go():
        policy = scripted(write_script(tmp_path / "s.json", []))
        _, client = gateway_client(policy, tmp_path / "l", tokens=["sekrit", "clé"])
        async with client:

            async def ask(key: bytes):
                headers = {"authorization": b"Bearer " + key}
                answered = await client.post(
                    "/e/ep/v1/chat/completions", json=CHAT, headers=headers
                )
                health = await client.get("/health", headers=headers)
                return answered.status_code, health.status_code, health.json()

            return await ask("\xe9\xff".encode("latin-1")), await ask("clé".encode())

    (refused, health, said), (accepted, _, counted) = asyncio.run(go())
    assert (refused, health, said) == (401, 200, {"ok": True})
    assert accepted == 200 and counted["episodes"] == 1


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"prompt": [1, 2], "stream": "yes"}, "stream"),
        ({"prompt": [1, 2], "model": 5}, "model"),
        ({"prompt": [1, 2], "return_token_ids": "no"}, "return_token_ids"),
        ({"prompt": {"a": 1}}, "prompt"),
        ({"prompt": "hi", "stop": [5]}, "stop[0]"),
        ({"prompt": [1, 2], "stop_token_ids": [1.5]}, "stop_token_ids[0]"),
    ],
)
def test_a_malformed_completions_body_is_a_400_naming_the_field(tmp_path, body, named):
    from gateway.helpers import policy_client

    async def go():
        async with policy_client(scripted(write_script(tmp_path / "s.json", []))) as client:
            return await client.post("/v1/completions", json=body)

    answered = asyncio.run(go())
    assert answered.status_code == 400 and named in answered.json()["error"]["message"]

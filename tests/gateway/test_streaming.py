"""Replies streamed as the upstream samples them: events in each API's shape, the same reply as
whole, the ledger line durable before the terminal event, failures recorded."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from callgrove.chat import BuiltinFormat, ChatFormat
from callgrove.gateway.core import Gateway
from callgrove.gateway.routes import Routes
from callgrove.policy.http import Piece
from callgrove.serving.streaming import PlainText

from .helpers import server_process, sse_events, write_script

LONG = "Streaming " + "word " * 60 + "end."
RULES = [
    {"when": "tell", "reply": LONG},
    {
        "when": "weather",
        "reply": {
            "text": "Checking the weather now.",
            "tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}],
        },
    },
]
ASK = {
    "chat": ("/v1/chat/completions", {}),
    "messages": ("/v1/messages", {"anthropic-version": "2023-06-01"}),
    "responses": ("/v1/responses", {}),
}
TERMINAL = {"chat": "[DONE]", "messages": "message_stop", "responses": "response.completed"}


def body_for(api: str, text: str, stream: bool) -> dict:
    if api == "responses":
        return {"model": "m", "input": text, "stream": stream}
    return {
        "model": "m",
        "max_tokens": 400,
        "messages": [{"role": "user", "content": text}],
        "stream": stream,
    }


def ledger_lines(ledger: Path, episode: str) -> list[dict]:
    path = ledger / f"{episode}.calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def streamed(client: httpx.Client, api: str, episode: str, text: str, ledger: Path):
    """The SSE events of a streamed call, and the ledger lines present when its terminal event
    arrived (read before the rest of the response)."""
    path, headers = ASK[api]
    blocks, at_terminal = [], None
    with client.stream(
        "POST", f"/e/{episode}{path}", json=body_for(api, text, True), headers=headers
    ) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        for block in response.iter_text():
            blocks.append(block)
            joined = "".join(blocks)
            if at_terminal is None and TERMINAL[api] in joined:
                at_terminal = ledger_lines(ledger, episode)
    return sse_events("".join(blocks)), at_terminal


def text_of(api: str, events) -> tuple[str, list]:
    """The reply's text and tool calls put together from its events."""
    text, tools = "", []
    for name, data in events:
        if data == "[DONE]":
            continue
        if api == "chat":
            delta = data["choices"][0]["delta"]
            text += delta.get("content") or ""
            tools += [c["function"]["name"] for c in delta.get("tool_calls") or []]
        elif api == "messages":
            if name == "content_block_delta" and data["delta"]["type"] == "text_delta":
                text += data["delta"]["text"]
            if name == "content_block_start" and data["content_block"]["type"] == "tool_use":
                tools.append(data["content_block"]["name"])
        else:
            if name == "response.output_text.delta":
                text += data["delta"]
            if name == "response.output_item.done" and data["item"]["type"] == "function_call":
                tools.append(data["item"]["name"])
    return text, tools


def text_events(api: str, events) -> int:
    kinds = {"messages": "content_block_delta", "responses": "response.output_text.delta"}
    if api == "chat":
        return sum(
            1 for _, d in events if d != "[DONE]" and d["choices"][0]["delta"].get("content")
        )
    return sum(1 for name, _ in events if name == kinds[api])


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    folder = tmp_path_factory.mktemp("streaming")
    script = write_script(folder / "script.json", RULES, "ok")
    ledger = folder / "ledger"
    with (
        server_process("serve-policy", "--script", str(script)) as (_, upstream),
        server_process("gateway", "--upstream", upstream, "--ledger", str(ledger)) as (_, url),
    ):
        yield url, ledger


@pytest.mark.parametrize("api", ["chat", "messages", "responses"])
def test_a_streamed_reply_is_the_whole_reply_and_durable_before_its_end(servers, api):
    url, ledger = servers
    path, headers = ASK[api]
    with httpx.Client(base_url=url, timeout=60) as client:
        events, at_terminal = streamed(client, api, f"st-{api}", "please tell", ledger)
        whole = client.post(
            f"/e/st-{api}-whole{path}", json=body_for(api, "please tell", False), headers=headers
        ).json()
        tool_events, _ = streamed(client, api, f"st-{api}-tool", "weather?", ledger)
    text, tools = text_of(api, events)
    assert text == LONG and tools == []
    # The text came in many events as the upstream's chunks arrived, not in one piece.
    assert text_events(api, events) > 5
    # The call's ledger line was written before the terminal event reached the client.
    (line,) = at_terminal
    assert line["content"]["response"]["content"] == LONG
    (whole_line,) = ledger_lines(ledger, f"st-{api}-whole")
    assert line["completion_ids"] == whole_line["completion_ids"]
    assert line["logprobs"] == whole_line["logprobs"]
    assert line["prompt_ids"] == whole_line["prompt_ids"]
    if api == "chat":
        assert whole["choices"][0]["message"]["content"] == LONG
    tool_text, tool_calls = text_of(api, tool_events)
    assert (tool_text, tool_calls) == ("Checking the weather now.", ["get_weather"])


def test_a_failing_upstream_is_an_error_and_a_failed_ledger_line(tmp_path):
    with (
        server_process(
            "gateway", "--upstream", "http://127.0.0.1:9", "--ledger", str(tmp_path)
        ) as (_, url),
        httpx.Client(base_url=url, timeout=60) as client,
    ):
        answer = client.post("/e/down/v1/messages", json=body_for("messages", "hi", True))
    assert answer.status_code == 502 and answer.json()["type"] == "error"
    (line,) = ledger_lines(tmp_path, "down")
    assert "unreachable" in line["failed"]["error"]


def test_plain_text_goes_out_up_to_markup_and_never_whitespace_the_parse_strips():
    chat = BuiltinFormat()
    plain = PlainText(chat)
    sent = [
        plain.add(chat.encode(piece)) for piece in ["  Hello", " wor", "ld ", "<tool", "_call> x"]
    ]
    assert sent == ["Hello", " wor", "ld", "", ""]
    assert "".join(sent) == "Hello world"


class StalledUpstream:
    """An upstream that streams one piece of text and then keeps the call open (a long
    sampling run); it notes whether the gateway closed its stream."""

    def __init__(self, chat: ChatFormat):
        self.first = chat.encode("Thinking")
        self.closed = asyncio.Event()

    async def sample(self, prompt_ids, params):
        raise AssertionError("a streamed request is sampled by stream()")

    async def stream(self, prompt_ids, params):
        try:
            yield Piece(self.first, np.zeros(len(self.first)), None, 0)
            await asyncio.Event().wait()
        finally:
            self.closed.set()


def test_a_client_that_leaves_mid_stream_leaves_a_failed_line_and_stops_the_upstream(tmp_path):
    chat = BuiltinFormat()
    upstream = StalledUpstream(chat)
    gateway = Gateway(upstream, chat, tmp_path)
    body = json.dumps(body_for("messages", "hi", True)).encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/e/gone/v1/messages",
        "raw_path": b"/e/gone/v1/messages",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"anthropic-version", b"x")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
    }
    asked, text_sent = False, asyncio.Event()

    async def receive():
        nonlocal asked
        if not asked:
            asked = True
            return {"type": "http.request", "body": body, "more_body": False}
        await text_sent.wait()  # the client reads the first text, then hangs up
        return {"type": "http.disconnect"}

    async def send(message):
        if message["type"] == "http.response.body" and b"Thinking" in message.get("body", b""):
            text_sent.set()

    async def exchange():
        await asyncio.wait_for(Routes(gateway).app()(scope, receive, send), 30)
        await asyncio.wait_for(upstream.closed.wait(), 30)

    asyncio.run(exchange())
    (line,) = ledger_lines(tmp_path, "gone")
    assert line["failed"]["error"] == "client disconnected before the reply ended"
    episode = gateway.episodes.close_now("gone")
    assert not [call for agent in episode.agents for call in agent.calls if call.kept]

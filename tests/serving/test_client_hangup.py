"""A client that hangs up while sending its request body: the request ends quietly, with one
log line and no traceback, nothing is recorded, and the server goes on answering."""

from __future__ import annotations

import asyncio
import logging
import socket
import subprocess
from urllib.parse import urlsplit

import httpx
import pytest

from callgrove.chat import BuiltinFormat
from callgrove.gateway.routes import Routes
from callgrove.serving.policy_server import PolicyServer
from gateway.helpers import gateway_client, scripted, server_process, write_script

CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
SAID = "hung up while sending its request body"
GATEWAY_PATHS = [
    "/e/gone/v1/chat/completions",
    "/e/gone/v1/responses",
    "/e/gone/v1/messages",
    "/e/gone/v1/messages/count_tokens",
    "/e/gone/close",
]
POLICY_PATHS = ["/v1/completions", "/v1/chat/completions"]


async def hang_up(app, path: str) -> list[dict]:
    """What `app` sends for a POST to `path` whose client sends half its body, then hangs up
    (the ASGI messages a server gets then: a part of the body, then `http.disconnect`)."""
    messages = [
        {"type": "http.request", "body": b'{"messages": [{"role": "us', "more_body": True},
        {"type": "http.disconnect"},
    ]
    sent: list[dict] = []

    async def receive() -> dict:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"content-length", b"400")],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }
    await app(scope, receive, send)
    return sent


def assert_one_quiet_line(caplog) -> None:
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    said = [r for r in caplog.records if SAID in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    assert "POST /" in said[0].getMessage() and "127.0.0.1:50000" in said[0].getMessage()


def statuses(sent: list[dict]) -> list[int]:
    return [m["status"] for m in sent if m["type"] == "http.response.start"]


@pytest.mark.parametrize("path", GATEWAY_PATHS)
def test_a_gateway_client_hanging_up_mid_body_ends_the_request_quietly(tmp_path, caplog, path):
    caplog.set_level(logging.DEBUG)

    async def go():
        gateway, client = gateway_client(
            scripted(write_script(tmp_path / "s.json", [])), tmp_path / "l"
        )
        async with client:
            sent = await hang_up(Routes(gateway).app(), path)
            after = await client.post("/e/next/v1/chat/completions", json=CHAT)
            return sent, after

    sent, after = asyncio.run(go())
    assert_one_quiet_line(caplog)
    assert 500 not in statuses(sent)
    assert after.status_code == 200, after.text
    assert sorted(p.name for p in (tmp_path / "l").iterdir()) == [
        ".gateway.lock",
        "next.calls.jsonl",
    ]  # nothing of the request that was hung up on


@pytest.mark.parametrize("path", POLICY_PATHS)
def test_a_policy_client_hanging_up_mid_body_ends_the_request_quietly(tmp_path, caplog, path):
    caplog.set_level(logging.DEBUG)
    server = PolicyServer(scripted(write_script(tmp_path / "s.json", [])), BuiltinFormat())

    async def go():
        sent = await hang_up(server.app(), path)
        transport = httpx.ASGITransport(app=server.app())
        async with httpx.AsyncClient(transport=transport, base_url="http://policy") as client:
            return sent, await client.post("/v1/chat/completions", json=CHAT)

    sent, after = asyncio.run(go())
    assert_one_quiet_line(caplog)
    assert 500 not in statuses(sent)
    assert after.status_code == 200, after.text


def send_half_and_close(url: str, path: str) -> None:
    """A raw HTTP client: the headers with a Content-Length, half the body, then it hangs up."""
    parts = urlsplit(url)
    body = b'{"model": "m", "messages": [{"role": "user", "content": "' + b"x" * 500
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {2 * len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall(head + body)


def through_gateway(upstream: str, ledger) -> tuple[subprocess.Popen, httpx.Response]:
    """A gateway in front of `upstream`: a client hangs up on it, then the next call."""
    with server_process("gateway", "--upstream", upstream, "--ledger", str(ledger)) as (
        gateway,
        url,
    ):
        send_half_and_close(upstream, "/v1/chat/completions")
        send_half_and_close(url, "/e/gone/v1/chat/completions")
        # The next call goes through both: the gateway, and serve-policy behind it.
        return gateway, httpx.post(f"{url}/e/next/v1/chat/completions", json=CHAT, timeout=30)


@pytest.mark.processes
def test_real_servers_log_one_line_for_a_hang_up_and_answer_the_next_request(tmp_path):
    script = write_script(tmp_path / "s.json", [{"when": "hello", "reply": "Hi!"}])
    ledger = tmp_path / "ledger"
    with server_process("serve-policy", "--script", str(script)) as (policy, upstream):
        gateway, after = through_gateway(upstream, ledger)
    assert after.status_code == 200, after.text
    assert after.json()["choices"][0]["message"]["content"] == "Hi!"
    for process in (policy, gateway):
        logged = process.stderr.read().decode()
        assert "Traceback" not in logged and "ClientDisconnect" not in logged, logged
        assert logged.count(SAID) == 1, logged
    assert sorted(p.name for p in ledger.iterdir()) == [".gateway.lock", "next.calls.jsonl"]

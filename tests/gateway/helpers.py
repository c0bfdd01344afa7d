"""Servers for the gateway tests: in process over ASGI, or as real processes on loopback."""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import re
import resource
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx

from callgrove.chat import BuiltinFormat
from callgrove.gateway.core import Gateway
from callgrove.gateway.routes import Routes
from callgrove.policy.script import Script, ScriptedPolicy
from callgrove.serving.policy_server import PolicyServer

SRC = str(Path(__file__).resolve().parents[2] / "src")
PR_SET_PDEATHSIG = 1  # prctl(2)


def die_with_parent() -> None:
    """Run in a server's process before it starts: the kernel sends it SIGTERM when the test
    process dies, so a test run that is killed leaves no server behind."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def write_script(path: Path, rules: list[dict], default: object = "done") -> Path:
    path.write_text(json.dumps({"rules": rules, "default": default}))
    return path


def scripted(path: Path) -> ScriptedPolicy:
    return ScriptedPolicy(Script.load(path), BuiltinFormat())


class GatewayClient(httpx.AsyncClient):
    """A client of an in-process gateway that releases the gateway (its files and the ledger
    folder's lock) when it is closed, as a stopped gateway process would."""

    def __init__(self, gateway: Gateway):
        super().__init__(
            transport=httpx.ASGITransport(app=Routes(gateway).app()), base_url="http://gateway"
        )
        self.gateway = gateway

    async def __aexit__(self, *exc) -> None:
        await super().__aexit__(*exc)
        self.gateway.episodes.release()


def gateway_client(policy, ledger: Path, **options) -> tuple[Gateway, httpx.AsyncClient]:
    gateway = Gateway(policy, BuiltinFormat(), ledger, **options)
    return gateway, GatewayClient(gateway)


def policy_client(policy, **options) -> httpx.AsyncClient:
    server = PolicyServer(policy, BuiltinFormat(), **options)
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=server.app()), base_url="http://policy"
    )


def sse_events(text: str) -> list[tuple[str | None, dict | str]]:
    """(event name, data) of each SSE event."""
    events = []
    for block in text.strip().split("\n\n"):
        name = None
        data = None
        for line in block.splitlines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = line[6:]
        if data is not None:
            events.append((name, data if data == "[DONE]" else json.loads(data)))
    return events


@contextmanager
def server_process(
    *args: str, env: dict | None = None, timeout: float = 30.0, open_files: int | None = None
):
    """`callgrove ARGS --port 0` as a process; yields (process, base URL); killed afterwards.
    `timeout`: how long it may take to start listening; `open_files`: its descriptor limit."""

    def prepare() -> None:
        die_with_parent()
        if open_files is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))

    process = subprocess.Popen(
        [sys.executable, "-c", "from callgrove.cli import main; main()", *args, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": SRC, **(env or {})},
        start_new_session=True,
        preexec_fn=prepare,
    )
    try:
        url = wait_for_url(process, timeout)
        yield process, url
    finally:
        stop_group(process)


def stop_group(process: subprocess.Popen) -> None:
    """End a process started in its own session, and its children: politely, then not."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def wait_for_url(process: subprocess.Popen, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline().decode()
        match = re.search(r"listening on (http://\S+)", line)
        if match:
            return match.group(1)
        if not line and process.poll() is not None:
            raise RuntimeError(f"server exited: {process.stderr.read().decode()[-2000:]}")
    raise TimeoutError("server did not report its address")


class CannedUpstream:
    """A loopback upstream written by hand: every request is answered `answer(path, body)`,
    a (status line, content type, bytes) triple, on a connection closed after it. For answers
    no real server would give (malformed ones, lines of any length)."""

    def __init__(self, answer):
        self.answer = answer
        self.url = ""

    async def __aenter__(self) -> CannedUpstream:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.close()

    async def _serve(self, reader, writer) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        path = head.split()[1]
        length = next(
            (
                int(line.partition(":")[2])
                for line in head.lower().splitlines()
                if line.startswith("content-length:")
            ),
            0,
        )
        body = json.loads(await reader.readexactly(length)) if length else None
        status, kind, raw = self.answer(path, body)
        writer.write(
            f"HTTP/1.1 {status}\r\ncontent-type: {kind}\r\ncontent-length: {len(raw)}\r\n"
            "connection: close\r\n\r\n".encode()
            + raw
        )
        await writer.drain()
        writer.close()

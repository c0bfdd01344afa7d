"""HTTP plumbing both servers share: bearer tokens, limits on a request's headers and body,
errors, SSE, uvicorn."""

from __future__ import annotations

import hmac
import ipaddress
import logging
import socket
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse

from callgrove.errors import CallgroveError
from callgrove.formats.text import printable

DEFAULT_BODY_LIMIT = 32 * 1024 * 1024
HEADER_LIMIT = 64 * 1024
"""The most bytes a request's headers may hold together (harnesses send a few KiB): more is a
431, before anything is read from them."""

log = logging.getLogger(__name__)


class HttpError(CallgroveError):
    """An error answered to the client (in its API's error shape) with an HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        *,
        no_retry: bool = False,
        code: str | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.code = code  # OpenAI's error code, where it names one (`context_length_exceeded`)
        # The OpenAI and Anthropic clients (and the harnesses built on them) honour this header:
        # an error that asking again cannot mend is not retried.
        self.headers = {"x-should-retry": "false"} if no_retry else None


def json_response(
    payload: Any, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    return Response(
        orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


def check_headers(request: Request) -> None:
    """A 431 when the request's headers are over `HEADER_LIMIT` bytes together."""
    size = sum(len(name) + len(value) for name, value in request.scope["headers"])
    if size > HEADER_LIMIT:
        raise HttpError(431, f"request headers of {size} bytes, over the {HEADER_LIMIT}-byte limit")


def request_key(request: Request) -> str | None:
    """The client's key: `Authorization: Bearer KEY` or `x-api-key: KEY`."""
    header = request.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip()
    return request.headers.get("x-api-key")


def check_token(key: str | None, tokens: Iterable[str]) -> None:
    """Raise 401 unless `key` is one of `tokens` (no tokens configured: anyone may call)."""
    tokens = list(tokens)
    if not tokens:
        return
    # Compared as bytes: a header's bytes arrive as latin-1 text, and a key of any bytes must
    # be a 401 (hmac refuses to compare text that is not ASCII).
    given = None if key is None else key.encode("latin-1", "replace")
    if given is None or not any(hmac.compare_digest(given, t.encode()) for t in tokens):
        raise HttpError(401, "missing or wrong API key", "authentication_error")


class ClientGone(HttpError):
    """The client hung up before its request body was whole: nothing is done with the request.
    Its answer (nginx's 499, "client closed request") goes nowhere: the server drops what is
    sent on a closed connection."""

    def __init__(self) -> None:
        super().__init__(499, "the client closed the connection before its request was whole")


async def read_json(request: Request, limit: int, empty_ok: bool = False) -> dict[str, Any]:
    """The request body as a JSON object, refused past `limit` bytes (413) or when not JSON (400);
    `ClientGone` when the client hangs up while sending it."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HttpError(413, f"request body over the {limit}-byte limit")
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise HttpError(413, f"request body over the {limit}-byte limit")
    except ClientDisconnect:
        # The client's doing, not a fault of the server: one line, no traceback. The path is
        # the client's text: its control characters are written as escapes.
        client = request.client
        log.warning(
            "%s hung up while sending its request body (%s %s, after %d bytes): nothing done",
            f"{client.host}:{client.port}" if client else "a client",
            request.method,
            printable(request.url.path),
            len(body),
        )
        raise ClientGone() from None
    if empty_ok and not body.strip():
        return {}
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise HttpError(400, f"request body is not valid JSON: {error}") from None
    if not isinstance(data, dict):
        raise HttpError(400, "request body must be a JSON object")
    return data


def sse_event(data: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n\n"


def sse_response(events: Iterable[bytes] | AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(
        events,
        media_type="text/event-stream",
        headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
    )


def open_bind_warning(host: str, tokens: Iterable[str]) -> str | None:
    """What to warn of when a server that takes calls without a key binds beyond loopback
    (every prompt, tool output and ledger line is then anyone's on the network), or None."""
    if any(True for _ in tokens) or host == "localhost":
        return None
    try:
        if ipaddress.ip_address(host).is_loopback:
            return None
    except ValueError:
        pass  # a host name: it may resolve to any interface
    return (
        f"binding {host}, beyond loopback, with no --token: anyone who can reach this port can "
        "call it without a key (give --token or CALLGROVE_TOKEN)"
    )


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on HOST:PORT (0 picks a free port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    return sock


def server(app: Any) -> Any:
    """A uvicorn server for `app` (run it on a bound socket)."""
    import uvicorn

    # uvloop and httptools when installed (the `serve` extra): most of a call's cost is HTTP.
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, timeout_keep_alive=30, backlog=2048
    )
    return uvicorn.Server(config)


def serve(app: Any, host: str, port: int, on_ready: Callable[[int], None] | None = None) -> None:
    """Run `app` on uvicorn until interrupted; `on_ready` gets the bound port (0 picks one)."""
    sock = bind(host, port)
    if on_ready is not None:
        on_ready(sock.getsockname()[1])
    server(app).run(sockets=[sock])

"""The one interface every client API speaks through, and the request form they share.

A `Dialect` turns its API's request body into one `ChatRequest` of renderer messages and sends
one `Reply` (the parsed assistant message and its token counts) back in its API's shape: whole
(`reply`), as its event sequence (`reply_events`), streamed while the completion is sampled
(`stream`), or as an error (`error`, `error_events`). A server picks the dialect once, by the
route a request came in on, and asks it everything after.
"""

from __future__ import annotations

import time
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import orjson
from starlette.responses import Response

from callgrove.chat import Message
from callgrove.policy.client import DEFAULT_MAX_TOKENS
from callgrove.serving.web import HttpError, json_response


@dataclass
class ChatRequest:
    """One chat request in renderer terms, whichever API it came in."""

    messages: list[Message]
    tools: list[dict[str, Any]]
    model: str
    stream: bool
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class Reply:
    """What the policy answered, parsed, with the counts and token extras the APIs report."""

    message: Message
    finish_reason: str  # "stop" or "length"
    prompt_tokens: int
    completion_tokens: int
    policy_version: int
    extras: dict[str, Any] = field(default_factory=dict)  # vLLM token fields, when asked for
    call_id: str | None = None  # the ledger's id of the call, when the gateway recorded it


def number_of(data: dict[str, Any], key: str, default: float, low: float, high: float) -> float:
    value = data.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise HttpError(400, f"{key} must be a number in [{low}, {high}]")
    return float(value)


def max_tokens_of(data: dict[str, Any], *keys: str) -> int:
    for key in keys:
        value = data.get(key)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise HttpError(400, f"{key} must be a positive integer")
            return value
    return DEFAULT_MAX_TOKENS


def stops_of(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise HttpError(400, "stop must be a string or a list of strings")


def request_of(data: dict[str, Any], messages: list[Message], *max_keys: str) -> ChatRequest:
    """The request of a body its API's shape has checked (`serving.bodies`); `max_keys`: the
    fields that may hold its `max_tokens`, first found first."""
    return ChatRequest(
        messages=messages,
        tools=data.get("tools") or [],
        model=data.get("model") or "policy",
        stream=bool(data.get("stream")),
        max_tokens=max_tokens_of(data, *max_keys),
        temperature=number_of(data, "temperature", 1.0, 0.0, 2.0),
        top_p=number_of(data, "top_p", 1.0, 1e-9, 1.0),
        stop=stops_of(data.get("stop", data.get("stop_sequences"))),
        metadata=data.get("metadata") or {},
    )


def parts_text(content: str | list[dict[str, Any]] | None) -> str:
    """Text of a checked content value: a string, or parts whose text is joined (other parts
    named in brackets: `[image]`)."""
    if isinstance(content, list):
        return "\n".join(
            p["text"] if isinstance(p.get("text"), str) else f"[{p['type']}]" for p in content
        )
    return content or ""


def need_list(value: Any, name: str) -> list[Any]:
    if not isinstance(value, list) or not value:
        raise HttpError(400, f"{name} must be a non-empty list")
    return value


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def arguments_text(arguments: Any) -> str:
    """A tool call's arguments as the JSON text the OpenAI APIs carry."""
    return arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode()


class ReplyStream(ABC):
    """A reply's events in the client's API shape, sent while the completion is being sampled:
    the opening at once, plain text as it arrives (`text`), and the rest (the remaining text,
    reasoning, tool calls, the terminal events) once the whole reply is known (`closing`).

    Only text the final parse keeps as it is may go out early: the caller streams text up to
    anything that could start markup (`<`), so a streamed prefix is always a prefix of the
    reply's text."""

    def __init__(self, request: ChatRequest, prompt_tokens: int, policy_version: int):
        self.request = request
        self.prompt_tokens = prompt_tokens
        self.policy_version = policy_version
        self.streamed = ""
        self._created = int(time.time())

    def _nothing_yet(self) -> Reply:
        """The reply as far as the opening knows it: no text, no tokens sampled."""
        return Reply(Message("assistant", ""), "stop", self.prompt_tokens, 0, self.policy_version)

    @abstractmethod
    def opening(self) -> list[bytes]: ...

    def text(self, delta: str) -> list[bytes]:
        """Events carrying `delta`, the next piece of the reply's text."""
        if not delta:
            return []
        first = not self.streamed
        self.streamed += delta
        return self._text(delta, first)

    @abstractmethod
    def _text(self, delta: str, first: bool) -> list[bytes]:
        """`delta`'s events; `first`: no text has gone out before it."""

    def closing(self, reply: Reply) -> list[bytes]:
        """The rest of the reply and the terminal events."""
        if not reply.message.text.startswith(self.streamed):
            raise ValueError("streamed text is not a prefix of the reply's text")
        return self._closing(reply, reply.message.text[len(self.streamed) :])

    @abstractmethod
    def _closing(self, reply: Reply, rest: str) -> list[bytes]:
        """The closing events; `rest`: the reply's text not streamed yet."""


class Dialect(ABC):
    """One client API: its requests read into a `ChatRequest`, replies and errors written in
    its shape."""

    name: ClassVar[str]
    """The API's name, as a ledger line's `api` records it."""
    path: ClassVar[str]
    """The route its requests come in on (below any prefix a server adds)."""

    @abstractmethod
    def request(self, data: dict[str, Any]) -> ChatRequest:
        """The request of a body in this API's shape; a 400 naming what does not fit."""

    @abstractmethod
    def reply(self, request: ChatRequest, reply: Reply) -> dict[str, Any]:
        """A whole reply."""

    @abstractmethod
    def stream(self, request: ChatRequest, prompt_tokens: int, policy_version: int) -> ReplyStream:
        """The events of a reply yet to be sampled."""

    def reply_events(self, request: ChatRequest, reply: Reply) -> list[bytes]:
        """A whole reply as the API's event sequence (nothing streamed before it)."""
        stream = self.stream(request, reply.prompt_tokens, reply.policy_version)
        return stream.opening() + stream.closing(reply)

    @abstractmethod
    def error(self, error: HttpError) -> dict[str, Any]:
        """An error in the API's own shape."""

    @abstractmethod
    def error_events(self, error: HttpError) -> list[bytes]:
        """An error after a stream has begun: the API's error event."""

    def error_response(self, error: HttpError) -> Response:
        """An error answered in the API's own shape, with its status and headers."""
        return json_response(self.error(error), error.status, error.headers)

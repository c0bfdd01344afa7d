"""OpenAI Responses (what Codex speaks): `instructions` and `input` items in; a `response` of
output items, or its numbered event sequence, out."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

from callgrove.chat import Message
from callgrove.serving.bodies import check_responses
from callgrove.serving.dialects.dialect import (
    ChatRequest,
    Dialect,
    Reply,
    ReplyStream,
    arguments_text,
    need_list,
    new_id,
    parts_text,
    request_of,
)
from callgrove.serving.dialects.openai_chat import openai_error
from callgrove.serving.web import HttpError, sse_event
from callgrove.transcripts.codex import input_messages, response_message

_ASSISTANT_ITEMS = frozenset({"reasoning", "function_call", "custom_tool_call", "local_shell_call"})


def _messages(data: dict[str, Any]) -> list[Message]:
    """`instructions` and the `input` items; consecutive assistant-side items (reasoning, a
    message, tool calls) are one assistant message."""
    messages: list[Message] = []
    if data.get("instructions"):
        messages.append(Message("system", parts_text(data["instructions"])))
    items = data.get("input")
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    pending: list[dict[str, Any]] = []
    for index, item in enumerate(need_list(items, "input")):
        kind = item.get("type", "message")
        if kind in _ASSISTANT_ITEMS or (kind == "message" and item.get("role") == "assistant"):
            pending.append({**item, "type": kind})
            continue
        if pending:
            messages.append(response_message(pending))
            pending = []
        added = input_messages({**item, "type": kind})
        if added is None:
            raise HttpError(400, f"input[{index}]: unsupported item type {kind!r}")
        messages.extend(added)
    if pending:
        messages.append(response_message(pending))
    return messages


def _namespaces(tools: list[dict[str, Any]]) -> dict[str, str]:
    """Tool name -> its namespace, for the tools a Responses request offers inside namespaces."""
    found = {}
    for tool in tools:
        if tool.get("type") == "namespace":
            for inner in tool.get("tools") or []:
                if isinstance(inner, dict) and isinstance(inner.get("name"), str):
                    found[inner["name"]] = str(tool.get("name"))
    return found


def _items(request: ChatRequest, message: Message) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    namespaces = _namespaces(request.tools)
    if message.thinking:
        items.append(
            {
                "type": "reasoning",
                "id": new_id("rs"),
                "summary": [{"type": "summary_text", "text": message.thinking}],
            }
        )
    if message.text or not message.tool_calls:
        items.append(
            {
                "type": "message",
                "id": new_id("msg"),
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": message.text, "annotations": []}],
            }
        )
    for call in message.tool_calls:
        items.append(
            {
                "type": "function_call",
                "id": new_id("fc"),
                "call_id": call.id,
                "name": call.name,
                "arguments": arguments_text(call.arguments),
                "status": "completed",
            }
        )
        if call.name in namespaces:  # the client dispatches namespaced tools by both names
            items[-1]["namespace"] = namespaces[call.name]
    return items


def _response(
    request: ChatRequest, reply: Reply, items: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    return {
        "id": new_id("resp"),
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed" if reply.finish_reason == "stop" else "incomplete",
        "model": request.model,
        "output": _items(request, reply.message) if items is None else items,
        "usage": {
            "input_tokens": reply.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": reply.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": reply.prompt_tokens + reply.completion_tokens,
        },
        "policy_version": reply.policy_version,
    }


class OpenAIResponses(Dialect):
    name = "responses"
    path = "/v1/responses"

    def request(self, data: dict[str, Any]) -> ChatRequest:
        check_responses(data)
        return request_of(data, _messages(data), "max_output_tokens")

    def reply(self, request: ChatRequest, reply: Reply) -> dict[str, Any]:
        return _response(request, reply)

    def stream(self, request: ChatRequest, prompt_tokens: int, policy_version: int) -> ReplyStream:
        return _ResponseStream(request, prompt_tokens, policy_version)

    def error(self, error: HttpError) -> dict[str, Any]:
        return openai_error(error)

    def error_events(self, error: HttpError) -> list[bytes]:
        failed = {"code": error.code or error.kind, "message": error.message}
        return [
            sse_event(
                {"type": "response.failed", "response": {"status": "failed", "error": failed}}
            )
        ]


def _text_delta(item_id: str, index: int, text: str) -> dict[str, Any]:
    return {
        "type": "response.output_text.delta",
        "item_id": item_id,
        "output_index": index,
        "content_index": 0,
        "delta": text,
    }


def _item_done(
    event: Callable[[dict[str, Any]], bytes], index: int, item: dict[str, Any]
) -> list[bytes]:
    """A finished item's closing events (a message's text first)."""
    events = []
    if item["type"] == "message":
        events.append(
            event(
                {
                    "type": "response.output_text.done",
                    "item_id": item["id"],
                    "output_index": index,
                    "content_index": 0,
                    "text": item["content"][0]["text"],
                }
            )
        )
    events.append(event({"type": "response.output_item.done", "output_index": index, "item": item}))
    return events


class _ResponseStream(ReplyStream):
    """A reply as numbered Responses events: a message item open at output index 0 while text
    streams, the other items and `response.completed` once the reply is known."""

    def __init__(self, request: ChatRequest, prompt_tokens: int, policy_version: int):
        super().__init__(request, prompt_tokens, policy_version)
        self._id = new_id("resp")
        self._text_id = new_id("msg")
        self._sequence = itertools.count()

    def _event(self, payload: dict[str, Any]) -> bytes:
        return sse_event({**payload, "sequence_number": next(self._sequence)}, payload["type"])

    def opening(self) -> list[bytes]:
        opening = {
            **_response(self.request, self._nothing_yet(), []),
            "id": self._id,
            "created_at": self._created,
            "status": "in_progress",
            "usage": None,
        }
        return [
            self._event({"type": "response.created", "response": opening}),
            self._event({"type": "response.in_progress", "response": opening}),
        ]

    def _text(self, delta: str, first: bool) -> list[bytes]:
        opening = []
        if first:
            item = {
                "type": "message",
                "id": self._text_id,
                "role": "assistant",
                "status": "in_progress",
                "content": [],
            }
            opening.append(
                self._event({"type": "response.output_item.added", "output_index": 0, "item": item})
            )
        return [*opening, self._event(_text_delta(self._text_id, 0, delta))]

    def _closing(self, reply: Reply, rest: str) -> list[bytes]:
        items = _items(self.request, reply.message)
        events = []
        if self.streamed:  # the message item is open at index 0: it stays first
            (text_item,) = [i for i in items if i["type"] == "message"]
            text_item["id"] = self._text_id
            items = [text_item] + [i for i in items if i is not text_item]
            if rest:
                events.append(self._event(_text_delta(self._text_id, 0, rest)))
            events += _item_done(self._event, 0, text_item)
        first = 1 if self.streamed else 0
        for index, item in enumerate(items[first:], first):
            events.append(
                self._event(
                    {"type": "response.output_item.added", "output_index": index, "item": item}
                )
            )
            if item["type"] == "message":
                events.append(
                    self._event(_text_delta(item["id"], index, item["content"][0]["text"]))
                )
            events += _item_done(self._event, index, item)
        final = {
            **_response(self.request, reply, items),
            "id": self._id,
            "created_at": self._created,
        }
        events.append(self._event({"type": "response.completed", "response": final}))
        return events


OPENAI_RESPONSES = OpenAIResponses()

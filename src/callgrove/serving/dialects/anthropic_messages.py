"""Anthropic Messages (what Claude Code speaks): `system` and `messages` in; a `message` of
content blocks, or its event sequence, out."""

from __future__ import annotations

from typing import Any

import orjson

from callgrove.chat import Message, ToolCall
from callgrove.serving.bodies import check_messages
from callgrove.serving.dialects.dialect import (
    ChatRequest,
    Dialect,
    Reply,
    ReplyStream,
    need_list,
    new_id,
    parts_text,
    request_of,
)
from callgrove.serving.web import HttpError, sse_event
from callgrove.transcripts.claude_code import user_messages

_ERROR_TYPES = {
    401: "authentication_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


def anthropic_messages(data: dict[str, Any], call: bool = True) -> list[Message]:
    """`system` (a string or blocks) and `messages` (system entries, tool use and results);
    `call`: the body of a call, not of a token count (`check_messages`)."""
    check_messages(data, call)
    messages: list[Message] = []
    system = data.get("system")
    if system:
        messages.append(Message("system", parts_text(system)))
    for raw in need_list(data.get("messages"), "messages"):
        content = raw["content"]
        if raw["role"] == "system":
            messages.append(Message("system", parts_text(content)))
        elif raw["role"] == "user":
            messages.extend(user_messages(content))
        else:
            messages.append(_assistant(content))
    return messages


def _assistant(content: str | list[dict[str, Any]]) -> Message:
    """An assistant turn's content (checked: a string or typed blocks) as one message."""
    if isinstance(content, str):
        return Message("assistant", content)
    texts, thinking, calls = [], [], []
    for block in content:
        kind = block["type"]
        if kind == "text":
            texts.append(block["text"])
        elif kind == "thinking":
            thinking.append(block["thinking"])
        elif kind in ("tool_use", "server_tool_use"):
            calls.append(ToolCall(block["id"], block["name"], block["input"]))
    return Message("assistant", "\n".join(texts), "\n".join(thinking), tuple(calls))


def _blocks(message: Message) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if message.thinking:
        blocks.append({"type": "thinking", "thinking": message.thinking, "signature": ""})
    if message.text or not message.tool_calls:
        blocks.append({"type": "text", "text": message.text})
    for call in message.tool_calls:
        arguments = (
            call.arguments if isinstance(call.arguments, dict) else {"input": call.arguments}
        )
        blocks.append({"type": "tool_use", "id": call.id, "name": call.name, "input": arguments})
    return blocks


def _stop(reply: Reply) -> str:
    if reply.message.tool_calls:
        return "tool_use"
    return "max_tokens" if reply.finish_reason == "length" else "end_turn"


def _usage(reply: Reply) -> dict[str, int]:
    return {
        "input_tokens": reply.prompt_tokens,
        "output_tokens": reply.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


class AnthropicMessages(Dialect):
    name = "messages"
    path = "/v1/messages"

    def request(self, data: dict[str, Any]) -> ChatRequest:
        return request_of(data, anthropic_messages(data), "max_tokens")

    def reply(self, request: ChatRequest, reply: Reply) -> dict[str, Any]:
        return {
            "id": new_id("msg"),
            "type": "message",
            "role": "assistant",
            "model": request.model,
            "content": _blocks(reply.message),
            "stop_reason": _stop(reply),
            "stop_sequence": None,
            "usage": _usage(reply),
            "policy_version": reply.policy_version,
        }

    def stream(self, request: ChatRequest, prompt_tokens: int, policy_version: int) -> ReplyStream:
        return _MessageStream(request, prompt_tokens, policy_version)

    def error(self, error: HttpError) -> dict[str, Any]:
        status = error.status
        name = _ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
        return {"type": "error", "error": {"type": name, "message": error.message}}

    def error_events(self, error: HttpError) -> list[bytes]:
        return [sse_event(self.error(error), "error")]


def _block_events(index: int, block: dict[str, Any]) -> list[bytes]:
    """A content block's start, deltas and stop."""
    kind = block["type"]
    if kind == "thinking":
        opening = {"type": "thinking", "thinking": "", "signature": ""}
        deltas = [
            {"type": "thinking_delta", "thinking": block["thinking"]},
            {"type": "signature_delta", "signature": ""},
        ]
    elif kind == "text":
        opening = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": block["text"]}] if block["text"] else []
    else:
        opening = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
        deltas = [
            {"type": "input_json_delta", "partial_json": orjson.dumps(block["input"]).decode()}
        ]
    events = [_block_start(index, opening)]
    events += [_delta(index, delta) for delta in deltas]
    events.append(_block_stop(index))
    return events


def _block_start(index: int, block: dict[str, Any]) -> bytes:
    return sse_event(
        {"type": "content_block_start", "index": index, "content_block": block},
        "content_block_start",
    )


def _delta(index: int, delta: dict[str, Any]) -> bytes:
    return sse_event(
        {"type": "content_block_delta", "index": index, "delta": delta}, "content_block_delta"
    )


def _block_stop(index: int) -> bytes:
    return sse_event({"type": "content_block_stop", "index": index}, "content_block_stop")


class _MessageStream(ReplyStream):
    """A reply as Messages events: a text block open at index 0 while text streams, the other
    blocks and the message's end once the reply is known."""

    def __init__(self, request: ChatRequest, prompt_tokens: int, policy_version: int):
        super().__init__(request, prompt_tokens, policy_version)
        self._id = new_id("msg")

    def opening(self) -> list[bytes]:
        start = {
            **ANTHROPIC_MESSAGES.reply(self.request, self._nothing_yet()),
            "id": self._id,
            "content": [],
            "stop_reason": None,
        }
        return [sse_event({"type": "message_start", "message": start}, "message_start")]

    def _text(self, delta: str, first: bool) -> list[bytes]:
        opening = [_block_start(0, {"type": "text", "text": ""})] if first else []
        return [*opening, _delta(0, {"type": "text_delta", "text": delta})]

    def _closing(self, reply: Reply, rest: str) -> list[bytes]:
        blocks = _blocks(reply.message)
        events = []
        if self.streamed:  # the text block is open at index 0: finish it
            if rest:
                events.append(_delta(0, {"type": "text_delta", "text": rest}))
            events.append(_block_stop(0))
            blocks = [b for b in blocks if b["type"] != "text"]
        first = 1 if self.streamed else 0
        for index, block in enumerate(blocks, first):
            events += _block_events(index, block)
        ending = {
            "type": "message_delta",
            "delta": {"stop_reason": _stop(reply), "stop_sequence": None},
            "usage": {"output_tokens": reply.completion_tokens},
        }
        return [
            *events,
            sse_event(ending, "message_delta"),
            sse_event({"type": "message_stop"}, "message_stop"),
        ]


ANTHROPIC_MESSAGES = AnthropicMessages()

"""OpenAI chat completions: `messages` in; a `chat.completion` or its chunks out.

Also the OpenAI shapes other parts speak: an OpenAI error (the Responses API's too), and the
history and tools a pass-through upstream is sent and the message it answers.
"""

from __future__ import annotations

import time
from typing import Any

from callgrove.chat import Message, ToolCall
from callgrove.serving.bodies import check_chat
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
from callgrove.serving.web import HttpError, sse_event
from callgrove.transcripts.codex_history import tool_arguments

DONE = b"data: [DONE]\n\n"


def openai_message(raw: dict[str, Any]) -> Message:
    """One OpenAI chat message (request history or a response's `message`, of the shape
    `serving.bodies` checks) as a renderer message."""
    role = raw["role"]
    if role == "assistant":
        calls = tuple(
            ToolCall(
                c.get("id") or "",
                c["function"]["name"],
                tool_arguments(c["function"].get("arguments")),
            )
            for c in raw.get("tool_calls") or []
        )
        thinking = raw.get("reasoning_content") or raw.get("reasoning") or ""
        return Message("assistant", parts_text(raw.get("content")), thinking, calls)
    if role == "tool":
        return Message(
            "tool", parts_text(raw.get("content")), tool_call_id=raw.get("tool_call_id") or ""
        )
    return Message(role, parts_text(raw.get("content")))


def openai_history(messages: list[Message]) -> list[dict[str, Any]]:
    """Renderer messages as an OpenAI chat history (what a pass-through upstream renders)."""
    out = []
    for message in messages:
        entry = message.as_dict()
        entry.pop("is_error", None)
        for call in entry.get("tool_calls", []):
            call["function"]["arguments"] = arguments_text(call["function"]["arguments"])
        out.append(entry)
    return out


def openai_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tools of any of the three APIs as OpenAI chat function tools (others are left out)."""
    out = []
    for tool in tools:
        if tool.get("type") == "function" and isinstance(tool.get("function"), dict):
            out.append(tool)
        elif isinstance(tool.get("name"), str) and tool.get("type") in (None, "function", "custom"):
            parameters = tool.get("parameters") or tool.get("input_schema") or {"type": "object"}
            function = {
                "name": tool["name"],
                "description": tool.get("description", ""),
                "parameters": parameters,
            }
            out.append({"type": "function", "function": function})
    return out


def openai_error(error: HttpError) -> dict[str, Any]:
    """An error in the OpenAI APIs' shape."""
    return {
        "error": {
            "message": error.message,
            "type": error.kind,
            "param": None,
            "code": error.code or error.status,
        }
    }


def _finish(reply: Reply) -> str:
    if reply.message.tool_calls:
        return "tool_calls"
    return "length" if reply.finish_reason == "length" else "stop"


def _tool_calls(message: Message) -> list[dict[str, Any]]:
    return [
        {
            "id": c.id,
            "type": "function",
            "function": {"name": c.name, "arguments": arguments_text(c.arguments)},
        }
        for c in message.tool_calls
    ]


def _indexed_tool_calls(message: Message) -> list[dict[str, Any]]:
    """The tool calls as a chunk's delta carries them."""
    return [{"index": i, **c} for i, c in enumerate(_tool_calls(message))]


def _usage(reply: Reply) -> dict[str, int]:
    return {
        "prompt_tokens": reply.prompt_tokens,
        "completion_tokens": reply.completion_tokens,
        "total_tokens": reply.prompt_tokens + reply.completion_tokens,
    }


class OpenAIChat(Dialect):
    name = "chat"
    path = "/v1/chat/completions"

    def request(self, data: dict[str, Any]) -> ChatRequest:
        check_chat(data)
        messages = [openai_message(raw) for raw in need_list(data.get("messages"), "messages")]
        return request_of(data, messages, "max_completion_tokens", "max_tokens")

    def reply(self, request: ChatRequest, reply: Reply) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply.message.text or None}
        if reply.message.thinking:
            message["reasoning_content"] = reply.message.thinking
        if reply.message.tool_calls:
            message["tool_calls"] = _tool_calls(reply.message)
        choice: dict[str, Any] = {
            "index": 0,
            "message": message,
            "finish_reason": _finish(reply),
            "logprobs": None,
        }
        choice.update(reply.extras.get("choice", {}))
        return {
            "id": new_id("chatcmpl"),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": request.model,
            "choices": [choice],
            "usage": _usage(reply),
            "policy_version": reply.policy_version,
            **reply.extras.get("top", {}),
        }

    def reply_events(self, request: ChatRequest, reply: Reply) -> list[bytes]:
        """The whole reply in one chunk (with its token extras), then the finish."""
        base = {
            "id": new_id("chatcmpl"),
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": request.model,
            "policy_version": reply.policy_version,
        }
        delta: dict[str, Any] = {"role": "assistant", "content": reply.message.text or ""}
        if reply.message.thinking:
            delta["reasoning_content"] = reply.message.thinking
        if reply.message.tool_calls:
            delta["tool_calls"] = _indexed_tool_calls(reply.message)
        first = {
            **base,
            "choices": [
                {
                    "index": 0,
                    "delta": delta,
                    "finish_reason": None,
                    **reply.extras.get("choice", {}),
                }
            ],
            **reply.extras.get("top", {}),
        }
        last = {
            **base,
            "choices": [{"index": 0, "delta": {}, "finish_reason": _finish(reply)}],
            "usage": _usage(reply),
        }
        return [sse_event(first), sse_event(last), DONE]

    def stream(self, request: ChatRequest, prompt_tokens: int, policy_version: int) -> ReplyStream:
        return _ChunkStream(request, prompt_tokens, policy_version)

    def error(self, error: HttpError) -> dict[str, Any]:
        return openai_error(error)

    def error_events(self, error: HttpError) -> list[bytes]:
        return [sse_event(self.error(error)), DONE]


class _ChunkStream(ReplyStream):
    """A reply as `chat.completion.chunk`s: text deltas, then the rest and the finish."""

    def __init__(self, request: ChatRequest, prompt_tokens: int, policy_version: int):
        super().__init__(request, prompt_tokens, policy_version)
        self._id = new_id("chatcmpl")

    def _chunk(self, delta: dict[str, Any], finish: str | None = None, **more: Any) -> bytes:
        return sse_event(
            {
                "id": self._id,
                "object": "chat.completion.chunk",
                "created": self._created,
                "model": self.request.model,
                "policy_version": self.policy_version,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                **more,
            }
        )

    def opening(self) -> list[bytes]:
        return [self._chunk({"role": "assistant", "content": ""})]

    def _text(self, delta: str, first: bool) -> list[bytes]:
        return [self._chunk({"content": delta})]

    def _closing(self, reply: Reply, rest: str) -> list[bytes]:
        message = reply.message
        delta: dict[str, Any] = {"content": rest} if rest else {}
        if message.thinking:
            delta["reasoning_content"] = message.thinking
        if message.tool_calls:
            delta["tool_calls"] = _indexed_tool_calls(message)
        events = [self._chunk(delta)] if delta else []
        events.append(self._chunk({}, _finish(reply), usage=_usage(reply)))
        return [*events, DONE]


OPENAI_CHAT = OpenAIChat()

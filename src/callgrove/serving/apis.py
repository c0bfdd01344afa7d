"""The three client APIs: requests into messages, replies out in each API's shape.

OpenAI chat completions, OpenAI Responses (what Codex speaks) and Anthropic Messages (what
Claude Code speaks) all become one `ChatRequest` of renderer messages, and one `Reply` (the
parsed assistant message and its token counts) goes back out in the shape the client asked in,
streamed as that API's event sequence or whole.
"""

from __future__ import annotations

import itertools
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from callgrove.chat import Message, ToolCall
from callgrove.serving.bodies import check_chat, check_messages, check_responses
from callgrove.serving.web import HttpError, json_response, sse_event
from callgrove.transcripts.claude_code import user_messages
from callgrove.transcripts.codex import input_messages, response_message

DEFAULT_MAX_TOKENS = 4096


@dataclass
class ChatRequest:
    """One chat request in renderer terms, whichever API it came in."""

    api: str
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


def _common(api: str, data: dict[str, Any], messages: list[Message], *keys: str) -> ChatRequest:
    """The request of a body its API's shape has checked (`serving.bodies`)."""
    return ChatRequest(
        api=api,
        messages=messages,
        tools=data.get("tools") or [],
        model=data.get("model") or "policy",
        stream=bool(data.get("stream")),
        max_tokens=max_tokens_of(data, *keys),
        temperature=number_of(data, "temperature", 1.0, 0.0, 2.0),
        top_p=number_of(data, "top_p", 1.0, 1e-9, 1.0),
        stop=stops_of(data.get("stop", data.get("stop_sequences"))),
        metadata=data.get("metadata") or {},
    )


def _text(content: str | list[dict[str, Any]] | None) -> str:
    """Text of a checked content value: a string, or parts whose text is joined (other parts
    named in brackets: `[image]`)."""
    if isinstance(content, list):
        return "\n".join(
            p["text"] if isinstance(p.get("text"), str) else f"[{p['type']}]" for p in content
        )
    return content or ""


def _arguments(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            return raw
    return raw


def _need_list(value: Any, name: str) -> list[Any]:
    if not isinstance(value, list) or not value:
        raise HttpError(400, f"{name} must be a non-empty list")
    return value


# ---------------------------------------------------------------------------------------------
# Requests


def openai_message(raw: dict[str, Any]) -> Message:
    """One OpenAI chat message (request history or a response's `message`, of the shape
    `serving.bodies` checks) as a renderer message."""
    role = raw["role"]
    if role == "assistant":
        calls = tuple(
            ToolCall(
                c.get("id") or "",
                c["function"]["name"],
                _arguments(c["function"].get("arguments")),
            )
            for c in raw.get("tool_calls") or []
        )
        thinking = raw.get("reasoning_content") or raw.get("reasoning") or ""
        return Message("assistant", _text(raw.get("content")), thinking, calls)
    if role == "tool":
        return Message(
            "tool", _text(raw.get("content")), tool_call_id=raw.get("tool_call_id") or ""
        )
    return Message(role, _text(raw.get("content")))


def openai_chat_request(data: dict[str, Any]) -> ChatRequest:
    check_chat(data)
    messages = [openai_message(raw) for raw in _need_list(data.get("messages"), "messages")]
    return _common("chat", data, messages, "max_completion_tokens", "max_tokens")


def openai_history(messages: list[Message]) -> list[dict[str, Any]]:
    """Renderer messages as an OpenAI chat history (what a pass-through upstream renders)."""
    out = []
    for message in messages:
        entry = message.as_dict()
        entry.pop("is_error", None)
        for call in entry.get("tool_calls", []):
            call["function"]["arguments"] = _arguments_text(call["function"]["arguments"])
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


def anthropic_messages(data: dict[str, Any], call: bool = True) -> list[Message]:
    """`system` (a string or blocks) and `messages` (system entries, tool use and results);
    `call`: the body of a call, not of a token count (`check_messages`)."""
    check_messages(data, call)
    messages: list[Message] = []
    system = data.get("system")
    if system:
        messages.append(Message("system", _text(system)))
    for raw in _need_list(data.get("messages"), "messages"):
        content = raw["content"]
        if raw["role"] == "system":
            messages.append(Message("system", _text(content)))
        elif raw["role"] == "user":
            messages.extend(user_messages(content))
        else:
            messages.append(_anthropic_assistant(content))
    return messages


def _anthropic_assistant(content: str | list[dict[str, Any]]) -> Message:
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


def anthropic_request(data: dict[str, Any]) -> ChatRequest:
    return _common("messages", data, anthropic_messages(data), "max_tokens")


_ASSISTANT_ITEMS = frozenset({"reasoning", "function_call", "custom_tool_call", "local_shell_call"})


def responses_request(data: dict[str, Any]) -> ChatRequest:
    check_responses(data)
    messages: list[Message] = []
    if data.get("instructions"):
        messages.append(Message("system", _text(data["instructions"])))
    items = data.get("input")
    if isinstance(items, str):
        items = [{"type": "message", "role": "user", "content": items}]
    pending: list[dict[str, Any]] = []  # consecutive assistant-side items: one assistant message
    for index, item in enumerate(_need_list(items, "input")):
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
    return _common("responses", data, messages, "max_output_tokens")


# ---------------------------------------------------------------------------------------------
# Replies


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def _arguments_text(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode()


def reply_json(request: ChatRequest, reply: Reply) -> dict[str, Any]:
    return {"chat": _chat_json, "messages": _anthropic_json, "responses": _responses_json}[
        request.api
    ](request, reply)


def reply_events(request: ChatRequest, reply: Reply) -> list[bytes]:
    return {"chat": _chat_events, "messages": _whole_events, "responses": _whole_events}[
        request.api
    ](request, reply)


def error_json(api: str, error: HttpError) -> dict[str, Any]:
    """An error in the API's own shape."""
    status, message = error.status, error.message
    if api == "messages":
        anthropic = {
            401: "authentication_error",
            404: "not_found_error",
            413: "request_too_large",
            429: "rate_limit_error",
            529: "overloaded_error",
        }
        name = anthropic.get(status, "invalid_request_error" if status < 500 else "api_error")
        return {"type": "error", "error": {"type": name, "message": message}}
    return {
        "error": {
            "message": message,
            "type": error.kind,
            "param": None,
            "code": error.code or status,
        }
    }


def error_response(api: str, error: HttpError) -> Response:
    """An error answered in the API's own shape, with its status and headers."""
    return json_response(error_json(api, error), error.status, error.headers)


def api_of_path(path: str) -> str:
    """The API a request path speaks, for errors no route answers (an unknown path)."""
    if "/v1/messages" in path:
        return "messages"
    return "responses" if path.endswith("/v1/responses") else "chat"


async def _unrouted(request: Request, error: Exception) -> Response:
    """No route's answer (an unknown path or method, a server fault) in the path's API shape;
    a fault's traceback still reaches the log, as a server bug's should."""
    if isinstance(error, HTTPException):
        kind = "not_found" if error.status_code == 404 else "invalid_request_error"
        where = f"{request.method} {request.url.path}"
        answer = HttpError(error.status_code, f"{where}: {error.detail}", kind)
    else:
        answer = HttpError(500, f"internal error: {type(error).__name__}: {error}", "server_error")
    return error_response(api_of_path(request.url.path), answer)


ERROR_HANDLERS = {HTTPException: _unrouted, Exception: _unrouted}
"""Starlette's exception handlers for both servers: every answer in the client's API shape."""


def error_events(api: str, error: HttpError) -> list[bytes]:
    """An error after a stream has begun: the API's error event."""
    payload = error_json(api, error)
    if api == "messages":
        return [sse_event(payload, "error")]
    if api == "responses":
        failed = {"code": error.code or error.kind, "message": error.message}
        return [
            sse_event(
                {"type": "response.failed", "response": {"status": "failed", "error": failed}}
            )
        ]
    return [sse_event(payload), b"data: [DONE]\n\n"]


# OpenAI chat completions


def _chat_finish(reply: Reply) -> str:
    if reply.message.tool_calls:
        return "tool_calls"
    return "length" if reply.finish_reason == "length" else "stop"


def _chat_tool_calls(message: Message) -> list[dict[str, Any]]:
    return [
        {
            "id": c.id,
            "type": "function",
            "function": {"name": c.name, "arguments": _arguments_text(c.arguments)},
        }
        for c in message.tool_calls
    ]


def _usage_chat(reply: Reply) -> dict[str, int]:
    return {
        "prompt_tokens": reply.prompt_tokens,
        "completion_tokens": reply.completion_tokens,
        "total_tokens": reply.prompt_tokens + reply.completion_tokens,
    }


def _chat_json(request: ChatRequest, reply: Reply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.message.text or None}
    if reply.message.thinking:
        message["reasoning_content"] = reply.message.thinking
    if reply.message.tool_calls:
        message["tool_calls"] = _chat_tool_calls(reply.message)
    choice: dict[str, Any] = {
        "index": 0,
        "message": message,
        "finish_reason": _chat_finish(reply),
        "logprobs": None,
    }
    choice.update(reply.extras.get("choice", {}))
    return {
        "id": _id("chatcmpl"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": request.model,
        "choices": [choice],
        "usage": _usage_chat(reply),
        "policy_version": reply.policy_version,
        **reply.extras.get("top", {}),
    }


def _chat_events(request: ChatRequest, reply: Reply) -> list[bytes]:
    base = {
        "id": _id("chatcmpl"),
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": request.model,
        "policy_version": reply.policy_version,
    }
    delta: dict[str, Any] = {"role": "assistant", "content": reply.message.text or ""}
    if reply.message.thinking:
        delta["reasoning_content"] = reply.message.thinking
    if reply.message.tool_calls:
        delta["tool_calls"] = [
            {"index": i, **c} for i, c in enumerate(_chat_tool_calls(reply.message))
        ]
    first = {
        **base,
        "choices": [
            {"index": 0, "delta": delta, "finish_reason": None, **reply.extras.get("choice", {})}
        ],
        **reply.extras.get("top", {}),
    }
    last = {
        **base,
        "choices": [{"index": 0, "delta": {}, "finish_reason": _chat_finish(reply)}],
        "usage": _usage_chat(reply),
    }
    return [sse_event(first), sse_event(last), b"data: [DONE]\n\n"]


# Anthropic Messages


def _anthropic_blocks(message: Message) -> list[dict[str, Any]]:
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


def _anthropic_stop(reply: Reply) -> str:
    if reply.message.tool_calls:
        return "tool_use"
    return "max_tokens" if reply.finish_reason == "length" else "end_turn"


def _anthropic_usage(reply: Reply) -> dict[str, int]:
    return {
        "input_tokens": reply.prompt_tokens,
        "output_tokens": reply.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def _anthropic_json(request: ChatRequest, reply: Reply) -> dict[str, Any]:
    return {
        "id": _id("msg"),
        "type": "message",
        "role": "assistant",
        "model": request.model,
        "content": _anthropic_blocks(reply.message),
        "stop_reason": _anthropic_stop(reply),
        "stop_sequence": None,
        "usage": _anthropic_usage(reply),
        "policy_version": reply.policy_version,
    }


def _whole_events(request: ChatRequest, reply: Reply) -> list[bytes]:
    """A whole reply as its API's event sequence (nothing streamed before it)."""
    stream = ReplyStream(request, reply.prompt_tokens, reply.policy_version)
    return stream.opening() + stream.closing(reply)


def _anthropic_block_events(index: int, block: dict[str, Any]) -> list[bytes]:
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
    events = [
        sse_event(
            {"type": "content_block_start", "index": index, "content_block": opening},
            "content_block_start",
        )
    ]
    events += [_anthropic_delta(index, delta) for delta in deltas]
    events.append(sse_event({"type": "content_block_stop", "index": index}, "content_block_stop"))
    return events


def _anthropic_delta(index: int, delta: dict[str, Any]) -> bytes:
    return sse_event(
        {"type": "content_block_delta", "index": index, "delta": delta}, "content_block_delta"
    )


def _anthropic_ending(reply: Reply) -> list[bytes]:
    return [
        sse_event(
            {
                "type": "message_delta",
                "delta": {"stop_reason": _anthropic_stop(reply), "stop_sequence": None},
                "usage": {"output_tokens": reply.completion_tokens},
            },
            "message_delta",
        ),
        sse_event({"type": "message_stop"}, "message_stop"),
    ]


# OpenAI Responses


def _namespaces(tools: list[dict[str, Any]]) -> dict[str, str]:
    """Tool name -> its namespace, for the tools a Responses request offers inside namespaces."""
    found = {}
    for tool in tools:
        if tool.get("type") == "namespace":
            for inner in tool.get("tools") or []:
                if isinstance(inner, dict) and isinstance(inner.get("name"), str):
                    found[inner["name"]] = str(tool.get("name"))
    return found


def _responses_items(request: ChatRequest, message: Message) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    namespaces = _namespaces(request.tools)
    if message.thinking:
        items.append(
            {
                "type": "reasoning",
                "id": _id("rs"),
                "summary": [{"type": "summary_text", "text": message.thinking}],
            }
        )
    if message.text or not message.tool_calls:
        items.append(
            {
                "type": "message",
                "id": _id("msg"),
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": message.text, "annotations": []}],
            }
        )
    for call in message.tool_calls:
        items.append(
            {
                "type": "function_call",
                "id": _id("fc"),
                "call_id": call.id,
                "name": call.name,
                "arguments": _arguments_text(call.arguments),
                "status": "completed",
            }
        )
        if call.name in namespaces:  # the client dispatches namespaced tools by both names
            items[-1]["namespace"] = namespaces[call.name]
    return items


def _responses_json(
    request: ChatRequest, reply: Reply, items: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    return {
        "id": _id("resp"),
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed" if reply.finish_reason == "stop" else "incomplete",
        "model": request.model,
        "output": _responses_items(request, reply.message) if items is None else items,
        "usage": {
            "input_tokens": reply.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": reply.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": reply.prompt_tokens + reply.completion_tokens,
        },
        "policy_version": reply.policy_version,
    }


def _responses_text_delta(item_id: str, index: int, text: str) -> dict[str, Any]:
    return {
        "type": "response.output_text.delta",
        "item_id": item_id,
        "output_index": index,
        "content_index": 0,
        "delta": text,
    }


def _responses_item_done(
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


class ReplyStream:
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
        self._id = _id({"chat": "chatcmpl", "messages": "msg", "responses": "resp"}[request.api])
        self._text_id = _id("msg")
        self._sequence = itertools.count()
        self._created = int(time.time())

    def _event(self, payload: dict[str, Any]) -> bytes:
        """A Responses event, numbered."""
        return sse_event({**payload, "sequence_number": next(self._sequence)}, payload["type"])

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

    def _reply(self, reply: Reply | None = None) -> Reply:
        if reply is not None:
            return reply
        return Reply(Message("assistant", ""), "stop", self.prompt_tokens, 0, self.policy_version)

    def opening(self) -> list[bytes]:
        api = self.request.api
        if api == "chat":
            return [self._chunk({"role": "assistant", "content": ""})]
        if api == "messages":
            start = {
                **_anthropic_json(self.request, self._reply()),
                "id": self._id,
                "content": [],
                "stop_reason": None,
            }
            return [sse_event({"type": "message_start", "message": start}, "message_start")]
        opening = {
            **_responses_json(self.request, self._reply(), []),
            "id": self._id,
            "created_at": self._created,
            "status": "in_progress",
            "usage": None,
        }
        return [
            self._event({"type": "response.created", "response": opening}),
            self._event({"type": "response.in_progress", "response": opening}),
        ]

    def text(self, delta: str) -> list[bytes]:
        """Events carrying `delta`, the next piece of the reply's text."""
        if not delta:
            return []
        first = not self.streamed
        self.streamed += delta
        api = self.request.api
        if api == "chat":
            return [self._chunk({"content": delta})]
        if api == "messages":
            opening = []
            if first:
                block = {"type": "text", "text": ""}
                opening.append(
                    sse_event(
                        {"type": "content_block_start", "index": 0, "content_block": block},
                        "content_block_start",
                    )
                )
            return [*opening, _anthropic_delta(0, {"type": "text_delta", "text": delta})]
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
        return [*opening, self._event(_responses_text_delta(self._text_id, 0, delta))]

    def closing(self, reply: Reply) -> list[bytes]:
        """The rest of the reply and the terminal events."""
        message = reply.message
        if not message.text.startswith(self.streamed):
            raise ValueError("streamed text is not a prefix of the reply's text")
        rest = message.text[len(self.streamed) :]
        api = self.request.api
        if api == "chat":
            delta: dict[str, Any] = {"content": rest} if rest else {}
            if message.thinking:
                delta["reasoning_content"] = message.thinking
            if message.tool_calls:
                delta["tool_calls"] = [
                    {"index": i, **c} for i, c in enumerate(_chat_tool_calls(message))
                ]
            events = [self._chunk(delta)] if delta else []
            events.append(self._chunk({}, _chat_finish(reply), usage=_usage_chat(reply)))
            return [*events, b"data: [DONE]\n\n"]
        if api == "messages":
            blocks = _anthropic_blocks(message)
            events = []
            if self.streamed:  # the text block is open at index 0: finish it
                if rest:
                    events.append(_anthropic_delta(0, {"type": "text_delta", "text": rest}))
                events.append(
                    sse_event({"type": "content_block_stop", "index": 0}, "content_block_stop")
                )
                blocks = [b for b in blocks if b["type"] != "text"]
            first = 1 if self.streamed else 0
            for index, block in enumerate(blocks, first):
                events += _anthropic_block_events(index, block)
            return events + _anthropic_ending(reply)
        items = _responses_items(self.request, message)
        events = []
        if self.streamed:  # the message item is open at index 0: it stays first
            (text_item,) = [i for i in items if i["type"] == "message"]
            text_item["id"] = self._text_id
            items = [text_item] + [i for i in items if i is not text_item]
            if rest:
                events.append(self._event(_responses_text_delta(self._text_id, 0, rest)))
            events += _responses_item_done(self._event, 0, text_item)
        for index, item in enumerate(items[1 if self.streamed else 0 :], 1 if self.streamed else 0):
            events.append(
                self._event(
                    {"type": "response.output_item.added", "output_index": index, "item": item}
                )
            )
            if item["type"] == "message":
                events.append(
                    self._event(
                        _responses_text_delta(item["id"], index, item["content"][0]["text"])
                    )
                )
            events += _responses_item_done(self._event, index, item)
        final = {
            **_responses_json(self.request, reply, items),
            "id": self._id,
            "created_at": self._created,
        }
        events.append(self._event({"type": "response.completed", "response": final}))
        return events

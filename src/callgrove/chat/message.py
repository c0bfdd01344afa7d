"""A chat message in the project's normal form, and what a rendering of one must contain.

One form serves every source of messages (harness transcripts, the gateway's client APIs, the
RL environments), so one renderer (`callgrove.chat`) turns all of them into tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool invocation the model wrote: `arguments` is the parsed JSON input (or raw text)."""

    id: str
    name: str
    arguments: Any


@dataclass(slots=True, eq=False)
class Message:
    """One chat message in the renderer's normal form (close to the OpenAI chat shape)."""

    role: str
    text: str = ""
    thinking: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    is_error: bool = False

    def as_dict(self) -> dict[str, Any]:
        """The message for display (`call.content`) and for Jinja chat templates."""
        out: dict[str, Any] = {"role": self.role, "content": self.text}
        if self.thinking:
            out["reasoning_content"] = self.thinking
        if self.tool_calls:
            out["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for c in self.tool_calls
            ]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.is_error:
            out["is_error"] = True
        return out

    def key(self) -> tuple[Any, ...]:
        """What the message's tokens depend on: messages with equal keys render alike, so
        renderings are cached by it (never by where the message lives in memory)."""
        calls = tuple(
            (c.id, c.name, orjson.dumps(c.arguments, default=repr)) for c in self.tool_calls
        )
        return (self.role, self.text, self.thinking, calls, self.tool_call_id, self.is_error)


def normal_text(text: str) -> str:
    """Text with its whitespace collapsed: how pieces of content are compared."""
    return " ".join(text.split())


def strings_in(value: Any) -> list[str]:
    """Every string inside a JSON value (tool arguments), depth first."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in strings_in(v)]
    if isinstance(value, list):
        return [s for v in value for s in strings_in(v)]
    return []


def text_forms(text: str) -> tuple[str, str]:
    """A piece of text as written and JSON-escaped (as tool arguments are usually rendered),
    whitespace collapsed."""
    return normal_text(text), normal_text(orjson.dumps(text).decode()[1:-1])


def content_pieces(message: Message) -> list[tuple[str, tuple[str, str]]]:
    """What a rendering of `message` must contain, each as (what it is, its forms)."""
    pieces: list[tuple[str, str]] = []
    if message.text.strip():
        pieces.append(("tool result" if message.role == "tool" else "text", message.text))
    if message.thinking.strip():
        pieces.append(("reasoning", message.thinking))
    for call in message.tool_calls:
        pieces.append((f"tool call {call.name!r}", call.name))
        pieces += [(f"arguments of tool call {call.name!r}", s) for s in strings_in(call.arguments)]
    return [(what, text_forms(text)) for what, text in pieces if text.strip()]

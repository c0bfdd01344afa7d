"""A completion's text back into an assistant message, and tools offered as a system message.

The built-in format and Hermes-style templates (Qwen, Hermes, many others) both write
`<think>...</think>` reasoning and `<tool_call>{json}</tool_call>` calls, so one parser serves
both; `PARSERS` names it per template family.
"""

from __future__ import annotations

import contextlib
import itertools
import re
from collections.abc import Sequence
from typing import Any

import orjson

from callgrove.chat.message import Message, ToolCall

_THINK = re.compile(r"<think>\s*(.*?)\s*</think>", re.S)
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
_call_ids = itertools.count(1)


def parse_hermes(text: str) -> Message:
    """`<think>` reasoning, `<tool_call>{"name", "arguments"[, "id"]}</tool_call>` calls, the rest text."""
    thinking = "\n".join(m.group(1) for m in _THINK.finditer(text))
    calls: list[ToolCall] = []
    for match in _TOOL_CALL.finditer(text):
        try:
            payload = orjson.loads(match.group(1))
        except orjson.JSONDecodeError:
            continue  # not a call: it stays in the text, where the harness can see it
        if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
            continue
        arguments = payload.get("arguments", payload.get("parameters", {}))
        if isinstance(arguments, str):
            with contextlib.suppress(orjson.JSONDecodeError):
                arguments = orjson.loads(arguments)
        call_id = payload.get("id")
        if not isinstance(call_id, str) or not call_id:
            call_id = f"call_{next(_call_ids):08d}"
        calls.append(ToolCall(call_id, payload["name"], arguments))
        text = text.replace(match.group(0), "", 1)
    text = _THINK.sub("", text)
    return Message("assistant", text.strip(), thinking.strip(), tuple(calls))


PARSERS = {"builtin": parse_hermes, "hermes": parse_hermes}


def tools_message(tools: Sequence[dict[str, Any]]) -> Message | None:
    """The tools a request offers, as a system message the model reads (None without tools)."""
    if not tools:
        return None
    lines = "\n".join(orjson.dumps(tool, option=orjson.OPT_SORT_KEYS).decode() for tool in tools)
    return Message(
        "system",
        "# Tools\nCall a tool by writing <tool_call>"
        '{"name": NAME, "arguments": {...}}</tool_call>.\n' + lines,
    )

"""The request bodies of the client APIs, checked before anything is read from them.

Each API's body has a shape of the fields callgrove reads, typed as the API defines them; the
fields it does not read pass unchecked (clients send many: `metadata`, `reasoning`, `store`,
cache markers...). A body that does not fit is the client's 400 naming the field and what is
wrong with it ("messages[0].content: Expected `str | array | null`, got `int`"), never a reply
rendered from a guess. Content blocks, input items and tools are checked by their `type`: the
kinds callgrove reads have shapes, any other kind needs only its `type` (an image is rendered
as `[image]`, a server tool is left to the upstream).

The same shapes check what a pass-through upstream answers (`assistant_message`): there a
misfit is the upstream's fault, and the caller says so.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from callgrove.serving.web import HttpError

Object = dict[str, Any]
Blocks = list[Object]


class _Shape(msgspec.Struct):
    """A body part's fields callgrove reads (others are allowed and left alone)."""


def _located(error: msgspec.ValidationError, where: str) -> str:
    """msgspec's message with its path (`$.a[0]`) written from `where` ("a[0]: Expected...")."""
    message, _, path = str(error).partition(" - at `$")
    located = f"{where}{path.rstrip('`')}".lstrip(".")
    return f"{located}: {message}" if located else message


def _fit(value: Any, shape: Any, where: str = "", index: int | None = None) -> Any:
    """`value` (at `where`, item `index`) converted to `shape`; a 400 naming the field that
    does not fit (the location is written only then: bodies are checked on every call)."""
    try:
        return msgspec.convert(value, shape)
    except msgspec.ValidationError as error:
        at = where if index is None else f"{where}[{index}]"
        raise HttpError(400, _located(error, at)) from None


def _fit_kinds(values: list[Object], kinds: dict[str, Any], where: str) -> None:
    """Each object's fields as its `type`'s shape in `kinds` says (any other type passes)."""
    for index, value in enumerate(values):
        kind = value.get("type")
        shape = kinds.get(kind) if isinstance(kind, str) else _Kind
        if shape is not None:
            _fit(value, shape, where, index)


class _Kind(_Shape):
    type: str


class _Text(_Shape):
    text: str


# OpenAI chat completions


class _Function(_Shape):
    name: str
    arguments: str | Object = "{}"  # JSON text (an object is taken as already read)


class _ChatToolCall(_Shape):
    function: _Function
    id: str | None = None
    type: Literal["function"] = "function"


class _ChatMessage(_Shape):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | Blocks | None = None
    tool_calls: list[_ChatToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None


class _FunctionSpec(_Shape):
    name: str
    description: str | None = None
    parameters: Object | None = None


class _ChatFunctionTool(_Shape):
    function: _FunctionSpec


class _Sampling(_Shape):
    """What every API's body may say about sampling (ranges are checked where it is read)."""

    model: str | None = None
    stream: bool | None = None
    temperature: float | None = None
    top_p: float | None = None
    metadata: Object | None = None
    tools: Blocks | None = None


class _TokenExtras(_Sampling):
    """vLLM's token fields a request may ask for (serve-policy answers them)."""

    return_token_ids: bool | None = None
    return_tokens_as_token_ids: bool | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    # a mixture of experts' routes are returned from this prompt token on
    routed_experts_prompt_start: Annotated[int, msgspec.Meta(ge=0)] | None = None


class _ChatBody(_TokenExtras):
    messages: list[_ChatMessage] = []
    n: int | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    stop: str | list[str] | None = None
    logprobs: bool | None = None


CHAT_PARTS = {"text": _Text}
CHAT_TOOLS = {"function": _ChatFunctionTool}


def check_chat(data: Object) -> None:
    """An OpenAI chat completions body (`messages`, `tools`, sampling)."""
    body = _fit(data, _ChatBody)
    for index, message in enumerate(data.get("messages") or []):
        if isinstance(message.get("content"), list):
            _fit_kinds(message["content"], CHAT_PARTS, f"messages[{index}].content")
    _fit_kinds(data.get("tools") or [], CHAT_TOOLS, "tools")
    if body.n not in (None, 1):
        raise HttpError(400, f"n {body.n}: this server answers one choice per request (n 1)")


def assistant_message(raw: Any, where: str) -> None:
    """An OpenAI chat response's `message` (what a pass-through upstream answered) at
    `where`: an assistant message of the chat shape."""
    _fit(raw, _ChatMessage, where)
    if raw["role"] != "assistant":
        raise HttpError(400, f"{where}.role: {raw['role']!r}, not 'assistant'")
    if isinstance(raw.get("content"), list):
        _fit_kinds(raw["content"], CHAT_PARTS, f"{where}.content")


class _CompletionsBody(_TokenExtras):
    prompt: str | list[Any] | None = None  # text, token ids or a batch of one (checked where read)
    max_tokens: int | None = None
    stop: str | list[str] | None = None
    logprobs: int | bool | None = None


def check_completions(data: Object) -> None:
    """An OpenAI completions body (serve-policy's `/v1/completions`)."""
    _fit(data, _CompletionsBody)


# Anthropic Messages


class _AnthropicMessage(_Shape):
    role: Literal["user", "assistant", "system"]
    content: str | Blocks


class _ToolUse(_Shape):
    id: str
    name: str
    input: Object


class _ToolResult(_Shape):
    tool_use_id: str
    content: str | Blocks | None = None
    is_error: bool | None = None


class _Thinking(_Shape):
    thinking: str


class _AnthropicTool(_Shape):
    name: str
    input_schema: Object | None = None
    description: str | None = None


class _MessagesBody(_Sampling):
    messages: list[_AnthropicMessage] = []
    system: str | Blocks | None = None
    stop_sequences: list[str] | None = None
    tools: list[_AnthropicTool] | None = None


class _MessagesCall(_MessagesBody, kw_only=True):
    max_tokens: int


ANTHROPIC_BLOCKS = {
    "text": _Text,
    "thinking": _Thinking,
    "tool_use": _ToolUse,
    "server_tool_use": _ToolUse,
    "tool_result": _ToolResult,
}


def check_messages(data: Object, call: bool = True) -> None:
    """An Anthropic Messages body; `call`: one that samples (`max_tokens` required), not a
    token count."""
    _fit(data, _MessagesCall if call else _MessagesBody)
    if isinstance(data.get("system"), list):
        _fit_kinds(data["system"], {"text": _Text}, "system")
    for index, message in enumerate(data.get("messages") or []):
        content = message["content"]
        if isinstance(content, list):
            where = f"messages[{index}].content"
            _fit_kinds(content, ANTHROPIC_BLOCKS, where)
            for number, block in enumerate(content):
                if block["type"] == "tool_result" and isinstance(block.get("content"), list):
                    _fit_kinds(block["content"], ANTHROPIC_BLOCKS, f"{where}[{number}].content")


# OpenAI Responses


class _ResponsesMessage(_Shape):
    role: Literal["user", "assistant", "system", "developer"]
    content: str | Blocks


class _FunctionCallItem(_Shape):
    call_id: str
    name: str
    arguments: str


class _CustomCallItem(_Shape):
    call_id: str
    name: str
    input: str


class _OutputItem(_Shape):
    call_id: str
    output: str | Blocks


class _ReasoningItem(_Shape):
    summary: list[_Text] = []
    content: Blocks | None = None


class _NamedTool(_Shape):
    name: str
    description: str | None = None
    parameters: Object | None = None


class _Namespace(_Shape):
    name: str
    tools: Blocks


class _ResponsesBody(_Sampling):
    input: str | Blocks = []
    instructions: str | None = None
    max_output_tokens: int | None = None


RESPONSES_ITEMS = {
    "message": _ResponsesMessage,
    "function_call": _FunctionCallItem,
    "custom_tool_call": _CustomCallItem,
    "function_call_output": _OutputItem,
    "custom_tool_call_output": _OutputItem,
    "reasoning": _ReasoningItem,
}
RESPONSES_PARTS = {"input_text": _Text, "output_text": _Text, "text": _Text}
RESPONSES_TOOLS = {"function": _NamedTool, "custom": _NamedTool, "namespace": _Namespace}


def check_responses(data: Object) -> None:
    """An OpenAI Responses body (`input` items, `instructions`, `tools`, sampling). An item
    without a `type` is a message."""
    _fit(data, _ResponsesBody)
    items = data.get("input")
    if isinstance(items, list):
        typed = [{"type": "message", **i} if "type" not in i else i for i in items]
        _fit_kinds(typed, RESPONSES_ITEMS, "input")
        for index, item in enumerate(typed):
            content = item.get("content")
            if item["type"] == "message" and isinstance(content, list):
                _fit_kinds(content, RESPONSES_PARTS, f"input[{index}].content")
    _fit_kinds(data.get("tools") or [], RESPONSES_TOOLS, "tools")

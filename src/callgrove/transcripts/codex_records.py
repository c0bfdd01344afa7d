"""Codex rollout lines as typed records, decoded once where a line is read.

Every rollout line is `{"timestamp", "type", "payload"}`; `type` tags the record kind. The
kinds the importer reads are Structs of a tagged union; any other kind, or a line whose
payload is not an object, is an `Unreadable` record carrying the reason it is skipped.
"""

from __future__ import annotations

from typing import Any, Union

import msgspec


class SessionMetaPayload(msgspec.Struct, kw_only=True):
    """Which thread the following records belong to, and where it came from."""

    id: str | None = None
    session_id: str | None = None
    forked_from_id: str | None = None  # set on a forked subagent: its history repeats this thread
    parent_thread_id: str | None = None
    source: Any = None  # "exec", "cli", or {"subagent": {"thread_spawn": {"parent_thread_id"}}}
    agent_role: str | None = None
    agent_nickname: str | None = None
    agent_path: str | None = None  # multi-agent v2: `/root/NAME`
    base_instructions: Any = None  # the system message (a string or {"text": ...})
    instructions: Any = None  # its name in older releases
    cli_version: str | None = None

    def thread_id(self, fallback: str) -> str:
        return self.id or self.session_id or fallback

    def parent(self) -> str | None:
        """The thread that spawned this one, from `source.subagent.thread_spawn` or the field."""
        spawn = self.source.get("subagent") if isinstance(self.source, dict) else None
        spawn = spawn.get("thread_spawn") if isinstance(spawn, dict) else None
        parent = spawn.get("parent_thread_id") if isinstance(spawn, dict) else None
        parent = parent or self.parent_thread_id
        return parent if isinstance(parent, str) else None


def agent_name(
    role: str | None, nickname: str | None, path: str | None = None, *, subagent: bool
) -> str:
    """A Codex agent's name, one rule for the gateway and the importer: the role it was spawned
    as (`agent_type`), else the nickname Codex gave it, else its task path (multi-agent v2:
    `/root/NAME`), else `subagent` (or `leader`). Never the bare `/root` that Codex sends as
    the `agent_name` of every thread of a v1 run."""
    return role or nickname or path or ("subagent" if subagent else "leader")


class CompactedPayload(msgspec.Struct, kw_only=True):
    message: Any = None  # the summary (with Codex's preamble)
    replacement_history: list[ResponseItemPayload] = []  # the items the thread goes on from


# ---------------------------------------------------------------------------------------------
# Response items: what was sent to or came from the model, tagged by their own `type`


class Item(msgspec.Struct, tag_field="type", kw_only=True):
    id: str | None = None


class MessageItem(Item, tag="message"):
    role: str | None = None
    content: Any = None  # a string or a list of content parts


class ReasoningItem(Item, tag="reasoning"):
    summary: list[Any] = []  # parts with `text`
    content: Any = None


class FunctionCall(Item, tag="function_call"):
    call_id: str | None = None
    name: str | None = None
    arguments: Any = None  # JSON text, as the model wrote it


class CustomToolCall(Item, tag="custom_tool_call"):
    call_id: str | None = None
    name: str | None = None
    input: Any = None


class BuiltinCall(Item, kw_only=True):
    """A call of a tool built into the API (shell, web search...): named by its kind."""

    call_id: str | None = None
    action: Any = None
    arguments: Any = None
    revised_prompt: Any = None


class ToolOutput(Item, kw_only=True):
    call_id: str | None = None
    output: Any = None


def _kinds(base: type[Item], *tags: str) -> tuple[type[Item], ...]:
    """One tagged record kind per tag, each a `base` with no fields of its own."""
    return tuple(msgspec.defstruct(tag, [], bases=(base,), tag=tag) for tag in tags)


BUILTIN_CALLS = _kinds(
    BuiltinCall, "local_shell_call", "web_search_call", "tool_search_call", "image_generation_call"
)
TOOL_OUTPUTS = _kinds(
    ToolOutput,
    "function_call_output",
    "custom_tool_call_output",
    "local_shell_call_output",
    "tool_search_output",
)


class AgentMessageItem(Item, tag="agent_message"):
    """A message from another agent, read as input."""

    content: Any = None


class CompactionItem(Item, tag="compaction"):
    """An encrypted compaction summary in a replacement history."""


class OtherItem(Item, tag="other"):
    """An item of a kind not sent to the model as the importer knows it."""

    kind: str


ResponseItemPayload = Union[
    (
        MessageItem,
        ReasoningItem,
        FunctionCall,
        CustomToolCall,
        *BUILTIN_CALLS,
        *TOOL_OUTPUTS,
        AgentMessageItem,
        CompactionItem,
        OtherItem,
    )
]
OUTPUT_ITEMS = (
    ReasoningItem,
    FunctionCall,
    CustomToolCall,
    BuiltinCall,
)  # with assistant messages: what a response is made of
_ITEM_KINDS = frozenset(
    cls.__struct_config__.tag
    for cls in ResponseItemPayload.__args__  # type: ignore[attr-defined]
    if cls is not OtherItem
)


def decode_item(value: Any) -> ResponseItemPayload:
    """A response item as its typed record; one of another kind or shape names its kind."""
    kind = value.get("type") if isinstance(value, dict) else None
    label = kind if isinstance(kind, str) and kind else "untyped"
    if kind in _ITEM_KINDS:
        try:
            return msgspec.convert(value, ResponseItemPayload)  # type: ignore[arg-type]
        except msgspec.ValidationError:
            pass
    return OtherItem(kind=label)


class TokenInfo(msgspec.Struct, kw_only=True):
    last_token_usage: dict[str, Any] | None = None


class Event(msgspec.Struct, kw_only=True):
    """An event the CLI recorded; the importer reads its kind, the token counts after a
    response, and which thread a spawn started."""

    type: str | None = None
    info: TokenInfo | None = None
    call_id: Any = None
    new_thread_id: Any = None
    receiver_thread_id: Any = None
    thread_id: Any = None

    def spawned_thread(self) -> str | None:
        """The thread a spawn event started, when it names one."""
        for found in (self.new_thread_id, self.receiver_thread_id, self.thread_id):
            if isinstance(found, str):
                return found
        return None


# ---------------------------------------------------------------------------------------------
# Rollout records


class Record(msgspec.Struct, tag_field="type", kw_only=True):
    timestamp: Any = None


class SessionMeta(Record, tag="session_meta"):
    payload: SessionMetaPayload


class ResponseItem(Record, tag="response_item"):
    payload: ResponseItemPayload


class EventMsg(Record, tag="event_msg"):
    payload: Event


class TurnContext(Record, tag="turn_context"):
    payload: dict[str, Any]  # the turn's settings: nothing the importer reads


class Compacted(Record, tag="compacted"):
    payload: CompactedPayload


class Unreadable(msgspec.Struct):
    """A line of a kind the importer does not read, with the reason it is skipped."""

    reason: str
    timestamp: Any = None


RolloutRecord = SessionMeta | ResponseItem | EventMsg | TurnContext | Compacted
KINDS = frozenset({"session_meta", "response_item", "event_msg", "turn_context", "compacted"})


def decode_record(data: dict[str, Any]) -> RolloutRecord | Unreadable:
    """The typed record of one rollout line."""
    kind = data.get("type")
    label = kind if isinstance(kind, str) and kind else "untyped"
    time = data.get("timestamp")
    if not isinstance(data.get("payload"), dict):
        return Unreadable(f"{label} record without a payload object", time)
    if kind not in KINDS:
        return Unreadable(f"{label} record is not a model message", time)
    payload = data["payload"]
    if kind == "response_item":
        data = {**data, "payload": decode_item(payload)}
    elif kind == "compacted" and isinstance(payload.get("replacement_history"), list):
        items = [decode_item(i) for i in payload["replacement_history"] if isinstance(i, dict)]
        data = {**data, "payload": {**payload, "replacement_history": items}}
    try:
        return msgspec.convert(data, RolloutRecord)  # type: ignore[arg-type]
    except msgspec.ValidationError as error:
        return Unreadable(f"{label} record of an unexpected shape ({error})", time)

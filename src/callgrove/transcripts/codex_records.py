"""Codex rollout lines as typed records, decoded once where a line is read.

Every rollout line is `{"timestamp", "type", "payload"}`; `type` tags the record kind. The
kinds the importer reads are Structs of a tagged union; any other kind, or a line whose
payload is not an object, is an `Unreadable` record carrying the reason it is skipped.
"""

from __future__ import annotations

from typing import Any

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


class CompactedPayload(msgspec.Struct, kw_only=True):
    message: Any = None  # the summary (with Codex's preamble)
    replacement_history: list[Any] = []  # the items the thread goes on from


class Record(msgspec.Struct, tag_field="type", kw_only=True):
    timestamp: Any = None


class SessionMeta(Record, tag="session_meta"):
    payload: SessionMetaPayload


class ResponseItem(Record, tag="response_item"):
    payload: dict[str, Any]  # a Responses API item, tagged by its own `type`


class EventMsg(Record, tag="event_msg"):
    payload: dict[str, Any]


class TurnContext(Record, tag="turn_context"):
    payload: dict[str, Any]


class Compacted(Record, tag="compacted"):
    payload: CompactedPayload


class Unreadable(msgspec.Struct):
    """A line of a kind the importer does not read, with the reason it is skipped."""

    reason: str


RolloutRecord = SessionMeta | ResponseItem | EventMsg | TurnContext | Compacted
KINDS = frozenset({"session_meta", "response_item", "event_msg", "turn_context", "compacted"})


def decode_record(data: dict[str, Any]) -> RolloutRecord | Unreadable:
    """The typed record of one rollout line."""
    kind = data.get("type")
    label = kind if isinstance(kind, str) and kind else "untyped"
    if not isinstance(data.get("payload"), dict):
        return Unreadable(f"{label} record without a payload object")
    if kind not in KINDS:
        return Unreadable(f"{label} record is not a model message")
    try:
        return msgspec.convert(data, RolloutRecord)  # type: ignore[arg-type]
    except msgspec.ValidationError as error:
        return Unreadable(f"{label} record of an unexpected shape ({error})")

"""What importers build before any token exists: messages, histories, calls and agents.

A history is a chain of `Turn`s, newest last, each pointing at the one before it. Histories
that share a beginning share the same `Turn` objects, so a session of N messages holds N turns
however many calls and branches (rewinds, forks) read them. A call's prompt is the history it
was given (`context`); its answer becomes a `Turn` that later histories continue from.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec

from callgrove.chat.message import Message
from callgrove.episode import Gap, Spawn


@dataclass(slots=True, eq=False)
class Turn:
    """One message of a history, linked to the message before it (None: the history starts)."""

    message: Message
    previous: Turn | None
    call: TranscriptCall | None = None  # set when this turn is a call's answer

    def messages_since(self, stop: Turn | None) -> list[Message]:
        """Messages from just after `stop` up to this turn, oldest first."""
        out: list[Message] = []
        turn: Turn | None = self
        while turn is not None and turn is not stop:
            out.append(turn.message)
            turn = turn.previous
        out.reverse()
        return out


def extend(turn: Turn | None, messages: list[Message]) -> Turn | None:
    """The history `turn` followed by `messages`."""
    for message in messages:
        turn = Turn(message, turn)
    return turn


class Source(msgspec.Struct):
    """The file and line numbers a call was read from."""

    file: str
    lines: list[int]


class CallRecord(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What the transcript recorded about a call besides its messages; it becomes the
    episode call's `content` (with the rendered prompt and response)."""

    source: Source
    message_id: str | None = None  # the API response's id (Claude Code `message.id`)
    request_id: str | None = None
    model: str | None = None
    stop_reason: str | None = None
    usage: dict[str, Any] | None = None  # token counts as the harness recorded them
    trigger: str | None = None  # a compaction's: `auto` or `manual`

    def as_dict(self) -> dict[str, Any]:
        return msgspec.to_builtins(self)


@dataclass(slots=True, eq=False)
class TranscriptCall:
    """One model call (one API response) with the history it was given."""

    id: str
    agent: TranscriptAgent
    context: Turn | None
    response: Message
    order: tuple[Any, ...]  # ledger sort key: (time, file rank, line)
    content: CallRecord
    purpose: str = "turn"
    kept: bool = True
    answer: Turn = field(init=False)

    def __post_init__(self) -> None:
        self.answer = Turn(self.response, self.context, self)

    def base_call(self) -> TranscriptCall | None:
        """The latest earlier call whose answer this call's history continues from."""
        turn = self.context
        while turn is not None:
            if turn.call is not None:
                return turn.call
            turn = turn.previous
        return None


def parent_unavailable(agent: TranscriptAgent, reason: str) -> Gap:
    """The gap of a subagent whose parent is not among the files read: it is kept as a root."""
    return Gap(
        kind="subagent_parent_unavailable",
        agent=agent.id,
        file=agent.meta.get("file"),
        reason=reason,
    )


@dataclass(slots=True, eq=False)
class TranscriptAgent:
    id: str
    name: str
    parent: str | None = None
    start: str = "root"
    calls: list[TranscriptCall] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    spawn: Spawn | None = None


@dataclass(slots=True, eq=False)
class Transcript:
    """One session with its subagents: becomes one episode."""

    id: str
    agents: list[TranscriptAgent]
    gaps: list[Gap] = field(default_factory=list)
    task: Any = None
    meta: dict[str, Any] = field(default_factory=dict)

    def calls(self) -> Iterator[TranscriptCall]:
        for agent in self.agents:
            yield from agent.calls

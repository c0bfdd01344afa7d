"""Compaction in harness transcripts: one model call that summarises a history, after which the
agent goes on from the summary.

Both harnesses record it in two parts, and both parts must become one call, never two and
never none:

* Claude Code writes a `compact_boundary` system record (with `compactMetadata`: the trigger,
  and for a partial compaction the `preservedMessages` kept after the summary) and then an
  `isCompactSummary` user line holding the summary. The call's prompt is the history it
  summarised, which ends before the first preserved message (those are kept verbatim, not
  summarised); the history after it starts from the summary, then the preserved messages.
* Codex writes a `compacted` record (the summary `message` and the `replacement_history` the
  thread goes on from). Codex 0.169 first records the compaction request's answer as an
  ordinary assistant message: that response is the compaction call (its lines and the
  `compacted` record's are its source), and the `compacted` record only closes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from typing import Any

from callgrove.chat.message import Message
from callgrove.transcripts.claude_records import CompactMetadata
from callgrove.transcripts.codex_records import MessageItem
from callgrove.transcripts.turns import CallRecord, TranscriptAgent, TranscriptCall, Turn


def compaction_call(
    agent: TranscriptAgent,
    call_id: str,
    summarised: Turn | None,
    summary: str,
    order: tuple[Any, ...],
    content: CallRecord,
) -> TranscriptCall:
    """The call of `agent` that wrote `summary` from the history `summarised`."""
    return TranscriptCall(
        id=call_id,
        agent=agent,
        context=summarised,
        response=Message("assistant", summary),
        order=order,
        purpose="compaction",
        content=content,
    )


def answered_with_summary(response: Message | None, summary: str) -> bool:
    """Whether `response` is the one that wrote the summary: a text answer (no tool calls)
    that the summary ends with (Codex puts its own preamble before the model's words)."""
    if response is None or response.tool_calls:
        return False
    text = response.text.strip()
    return bool(text) and summary.rstrip().endswith(text)


def summary_in_replacement(replacement: Sequence[object], text_of: Any) -> str:
    """With no summary `message`, Codex's summary is the last user message it goes on from."""
    for item in reversed(replacement):
        if isinstance(item, MessageItem) and item.role == "user":
            return str(text_of(item.content))
    return ""


def preserved_links(meta: CompactMetadata | None) -> dict[str, tuple[str, str]]:
    """A partial compaction's kept messages: each kept uuid -> (the anchor the file links it
    to, the kept message it follows after the summary)."""
    preserved = meta.preserved_messages if meta is not None else None
    if preserved is None or preserved.anchor_uuid is None:
        return {}
    anchor = preserved.anchor_uuid
    return {uuid: (anchor, before) for before, uuid in pairwise(preserved.uuids)}

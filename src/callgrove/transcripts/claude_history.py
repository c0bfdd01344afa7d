"""One Claude Code agent's lines as an immutable graph, and the histories derived from it.

`build_graph` reads the decoded lines of one agent (a subagent file, or one tree of the session
file) once and fixes everything that depends only on the file: each line's parent (the latest
earlier line with its `parentUuid`: the log is append-only, a rewind writes a line again), the
API responses (the lines sharing one `message.id`), and the line each history continues
(`history_parent`: parallel tool results hang off different blocks of one response and are
chained; a partial compaction's kept messages follow each other after the summary).

`derive_history` is a pure function of the graph: a single pass in file order builds each
line's history (`Turn`s shared between histories), one call per response, one compaction call
per summary, and says for every line what it became. Nothing in the graph changes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from callgrove.chat.message import Message, ToolCall
from callgrove.transcripts.accounting import CallIds, Outcome, running_times
from callgrove.transcripts.claude_records import (
    SPAWN_TOOLS,
    AssistantLine,
    Block,
    ForkContextRef,
    OtherLine,
    RedactedThinkingBlock,
    SessionLine,
    SystemLine,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    UserLine,
    block_text,
    content_text,
)
from callgrove.transcripts.compaction import compaction_call, preserved_links
from callgrove.transcripts.turns import (
    CallRecord,
    Source,
    TranscriptAgent,
    TranscriptCall,
    Turn,
    extend,
)


class Entry(msgspec.Struct, frozen=True):
    """One decoded line and where it was read (a Struct: one is made per line, quickly)."""

    file: str
    number: int
    record: SessionLine | OtherLine


# ---------------------------------------------------------------------------------------------
# Messages


def user_messages(blocks: Sequence[Block]) -> list[Message]:
    """A user line's messages: one `tool` message per tool result, then the user's own text."""
    results: list[Message] = []
    texts: list[str] = []
    for block in blocks:
        if isinstance(block, ToolResultBlock):
            results.append(
                Message(
                    "tool",
                    content_text(block.content),
                    tool_call_id=block.tool_use_id or "",
                    is_error=bool(block.is_error),
                )
            )
        else:
            texts.append(block_text(block))
    return results + ([Message("user", "\n".join(texts))] if texts else [])


def assistant_message(records: Sequence[AssistantLine]) -> Message:
    """One API response from its lines, blocks in file order."""
    thinking: list[str] = []
    texts: list[str] = []
    calls: list[ToolCall] = []
    for record in records:
        for block in record.message.content if record.message else ():
            if isinstance(block, ThinkingBlock):
                thinking.append(block.thinking)
            elif isinstance(block, RedactedThinkingBlock):
                thinking.append("[redacted thinking]")
            elif isinstance(block, TextBlock):
                texts.append(block.text)
            elif isinstance(block, ToolUseBlock):
                calls.append(ToolCall(block.id or "", block.name, block.input))
            else:
                texts.append(block_text(block))
    return Message("assistant", "\n".join(texts), "\n".join(thinking), tuple(calls))


def _is_tool_results(record: SessionLine | OtherLine) -> bool:
    if not isinstance(record, UserLine) or record.message is None:
        return False
    blocks = record.message.content
    return bool(blocks) and all(isinstance(b, ToolResultBlock) for b in blocks)


def _is_response(record: SessionLine | OtherLine) -> bool:
    return (
        isinstance(record, AssistantLine)
        and record.message is not None
        and not record.is_synthetic()
    )


# ---------------------------------------------------------------------------------------------
# The graph


# Responses made before the lines being read, by key -> where: None for an earlier agent of
# this session (a fork repeats its parent's responses), else the id of another session
# (`claude --continue --fork-session` copies the earlier session's lines into its own file).
Earlier = Mapping[str, str | None]


@dataclass(frozen=True, slots=True)
class Response:
    """The lines of one API response (one per content block), and whether it was made
    elsewhere (`copied`: history here, not a call; `made_in`: the other session it was made
    in, None for an earlier agent of this session)."""

    lines: tuple[int, ...]
    key: str | None  # `message.id`, else `requestId`
    copied: bool
    made_in: str | None = None


@dataclass(frozen=True, slots=True)
class LineGraph:
    entries: tuple[Entry, ...]
    parent: tuple[int | None, ...]
    dangling: tuple[int, ...]  # lines whose `parentUuid` names no earlier line
    order: tuple[tuple[Any, ...], ...]  # ledger sort key of each line: (time, file rank, line)
    not_kept: frozenset[str]  # uuids a later line supersedes or retracts
    responses: tuple[Response, ...]
    response_of: tuple[int | None, ...]  # each line's response (an index into `responses`)
    history_parent: tuple[int | None, ...]  # the line whose history each line continues
    preserved: tuple[bool, ...]  # a message a partial compaction kept after its summary
    latest: dict[str, int]  # uuid -> its last line


def build_graph(entries: Sequence[Entry], rank: int, earlier_responses: Earlier) -> LineGraph:
    entries = tuple(entries)
    parent, dangling = _parents(entries)
    responses, response_of = _responses(entries, parent, earlier_responses)
    history_parent, preserved = _history_parents(entries, parent, response_of)
    times = running_times([e.record.timestamp for e in entries])
    return LineGraph(
        entries=entries,
        parent=parent,
        dangling=dangling,
        order=tuple((t, rank, e.number) for t, e in zip(times, entries, strict=True)),
        not_kept=frozenset(
            uuid
            for e in entries
            for uuid in (*e.record.supersedes_uuids, *e.record.retracted_message_uuids)
        ),
        responses=responses,
        response_of=response_of,
        history_parent=history_parent,
        preserved=preserved,
        latest={e.record.uuid: i for i, e in enumerate(entries) if e.record.uuid},
    )


def _parents(entries: tuple[Entry, ...]) -> tuple[tuple[int | None, ...], tuple[int, ...]]:
    """Each line's parent: the latest earlier line with its `parentUuid`."""
    latest: dict[str, int] = {}
    parents: list[int | None] = []
    dangling: list[int] = []
    for i, entry in enumerate(entries):
        wanted = entry.record.parent_uuid
        found = latest.get(wanted) if wanted is not None else None
        if wanted is not None and found is None:
            dangling.append(i)
        parents.append(found)
        if entry.record.uuid is not None:
            latest[entry.record.uuid] = i
    return tuple(parents), tuple(dangling)


def _responses(
    entries: tuple[Entry, ...], parent: tuple[int | None, ...], earlier: Earlier
) -> tuple[tuple[Response, ...], tuple[int | None, ...]]:
    """Assistant lines grouped into API responses: lines sharing `message.id` are one response;
    lines with only a `requestId` are one when each continues the previous."""
    groups: list[list[int]] = []
    keys: list[str | None] = []
    response_of: list[int | None] = [None] * len(entries)
    open_by_key: dict[str, int] = {}
    for i, entry in enumerate(entries):
        record = entry.record
        if not _is_response(record):
            continue
        assert isinstance(record, AssistantLine) and record.message is not None
        message_id = record.message.id
        key = record.response_key()
        current = open_by_key.get(key) if key else None
        up = parent[i]
        if current is not None and (
            message_id is not None or (up is not None and response_of[up] == current)
        ):
            groups[current].append(i)
            response_of[i] = current
            continue
        response_of[i] = len(groups)
        groups.append([i])
        keys.append(key)
        if key:
            open_by_key[key] = response_of[i]  # type: ignore[assignment]
    responses = tuple(
        Response(tuple(g), k, k is not None and k in earlier, earlier.get(k) if k else None)
        for g, k in zip(groups, keys, strict=True)
    )
    return responses, tuple(response_of)


def _history_parents(
    entries: tuple[Entry, ...],
    parent: tuple[int | None, ...],
    response_of: tuple[int | None, ...],
) -> tuple[tuple[int | None, ...], tuple[bool, ...]]:
    """The line whose history each line continues, and which lines are kept messages of a
    partial compaction.

    Parallel tool results each name a different block of one response as parent; each result
    continues the one before it, so the next call sees all of them. A partial compaction's
    kept messages each point at the compaction's anchor; each continues the kept message
    before it.
    """
    tool_owner: list[int | None] = [None] * len(entries)  # the response tool results answer
    tool_tail: dict[int, int] = {}  # response -> its latest tool-result line
    preserved_before: dict[str, tuple[str, str]] = {}  # kept uuid -> (anchor, kept before it)
    seen: dict[str, int] = {}
    out: list[int | None] = []
    preserved: list[bool] = []
    for i, entry in enumerate(entries):
        record = entry.record
        up = parent[i]
        kept = record.uuid in preserved_before
        if up is not None and kept:
            anchor, before = preserved_before[record.uuid]  # type: ignore[index]
            if entries[up].record.uuid == anchor:
                up = seen.get(before, up)
        if up is not None:
            owner = tool_owner[up] if tool_owner[up] is not None else response_of[up]
            if owner is not None and owner in tool_tail:
                up = tool_tail[owner]
            if _is_tool_results(record):
                owner = tool_owner[up] if tool_owner[up] is not None else response_of[up]
                if owner is not None:
                    tool_owner[i] = owner
                    tool_tail[owner] = i
        out.append(up)
        preserved.append(kept)
        if isinstance(record, SystemLine) and record.is_compact_boundary:
            preserved_before.update(preserved_links(record.compact_metadata))
        if record.uuid is not None:
            seen[record.uuid] = i
    return tuple(out), tuple(preserved)


# ---------------------------------------------------------------------------------------------
# Histories


@dataclass(frozen=True, slots=True)
class AgentHistory:
    """Everything derived from one agent's graph."""

    calls: tuple[TranscriptCall, ...]
    turns: tuple[Turn | None, ...]  # the history at each line
    outcomes: tuple[Outcome, ...]
    spawns: tuple[tuple[TranscriptCall, ToolCall], ...]  # calls of Task/Agent tools
    results: dict[str, tuple[str, str | None]]  # subagent id -> (tool call id, status)
    failed_uses: frozenset[str]  # tool calls whose result is an error
    first_prompt: str | None
    copied_responses: int  # responses of earlier agents its history repeats (a fork)
    # responses other sessions made that its history repeats (`--fork-session`), by session
    copied_from: dict[str, int]

    def turn_at(self, graph: LineGraph) -> dict[str, Turn | None]:
        """The history at each uuid (its last line)."""
        return {uuid: self.turns[i] for uuid, i in graph.latest.items()}


def derive_history(
    graph: LineGraph, agent: TranscriptAgent, start: Turn | None = None
) -> AgentHistory:
    """Each line's history and the agent's calls; `start` is the history a root line
    continues (a fork's: its parent's history)."""
    walk = _HistoryWalk(graph, agent, start)
    for i, entry in enumerate(graph.entries):
        before = walk.history_before(i)
        response = graph.response_of[i]
        if response is not None and graph.responses[response].copied:
            walk.copied_response(i, response, before)
        elif response is not None:
            walk.response(i, response, before)
        else:
            walk.turns[i] = before
            walk.other_line(i, entry.record, before)
    return walk.finish()


class _HistoryWalk:
    """What `derive_history`'s pass over the lines has built so far."""

    def __init__(self, graph: LineGraph, agent: TranscriptAgent, start: Turn | None):
        self.graph = graph
        self.agent = agent
        self.start = start
        self.turns: list[Turn | None] = [None] * len(graph.entries)
        self.response_turns: dict[int, Turn] = {}  # copied responses: history, not calls
        self.response_calls: dict[int, TranscriptCall] = {}
        self.call_ids = CallIds(agent.id)
        self.calls: list[TranscriptCall] = []
        self.outcomes: list[Outcome] = []
        self.spawns: list[tuple[TranscriptCall, ToolCall]] = []
        self.results: dict[str, tuple[str, str | None]] = {}
        self.failed: set[str] = set()
        self.first_prompt: str | None = None
        self.open_boundaries: list[int] = []  # compact boundaries still waiting for a summary
        self.summaries: list[tuple[int, int | None]] = []  # (summary line, its boundary)
        self.preserved_turns: dict[str, Turn] = {}  # kept uuid -> its history after a summary

    def history_before(self, i: int) -> Turn | None:
        """The history line `i` continues: a kept message's successor continues it after the
        summary, not where it stood before the compaction."""
        graph = self.graph
        up = graph.history_parent[i]
        before = self.turns[up] if up is not None else self.start
        up_uuid = graph.entries[up].record.uuid if up is not None else None
        if up_uuid in self.preserved_turns and not graph.preserved[i]:
            before = self.preserved_turns[up_uuid]  # type: ignore[index]
        return before

    def copied_response(self, i: int, response: int, before: Turn | None) -> None:
        """A response made elsewhere: one shared message in the history, no call."""
        made = self.graph.responses[response]
        if response not in self.response_turns:
            message = assistant_message(_records(self.graph, made))
            self.response_turns[response] = Turn(message, before)
        self.turns[i] = self.response_turns[response]
        self.outcomes.append(Outcome(i, used=_copy_used(made)))

    def response(self, i: int, response: int, before: Turn | None) -> None:
        """A line of a response made here: the first makes its call, the rest join it."""
        call = self.response_calls.get(response)
        if call is None:
            call = _call(
                self.graph, self.graph.responses[response], self.agent, self.call_ids, before
            )
            self.response_calls[response] = call
            self.calls.append(call)
            self.spawns += [(call, t) for t in call.response.tool_calls if t.name in SPAWN_TOOLS]
            self.outcomes.append(Outcome(i, used="call"))
        else:
            self.outcomes.append(Outcome(i, used="call (further block)"))
        self.turns[i] = call.answer

    def other_line(self, i: int, record: SessionLine | OtherLine, before: Turn | None) -> None:
        """A line that is no response: a user message, a compaction's summary or boundary, or
        a line that adds nothing to the history."""
        if isinstance(record, UserLine) and record.message is not None:
            if record.is_compact_summary:
                self.summary(i, record)
            else:
                self.user_line(i, record, before)
            return
        if isinstance(record, SystemLine) and record.is_compact_boundary:
            self.open_boundaries.append(i)
        self.outcomes.append(_line_outcome(i, record, self.start))

    def summary(self, i: int, record: UserLine) -> None:
        """A compaction summary starts a new history, followed by the messages it kept."""
        boundary = self.open_boundaries.pop() if self.open_boundaries else None
        self.summaries.append((i, boundary))
        turn = Turn(Message("user", _summary_text(record)), None)
        self.turns[i] = self.with_kept_messages(turn, boundary)
        self.outcomes.append(Outcome(i, used="compaction summary"))

    def with_kept_messages(self, turn: Turn, boundary: int | None) -> Turn:
        """`turn` extended by the messages the compaction at `boundary` kept, recording each
        kept uuid's history."""
        graph = self.graph
        meta = _boundary(graph, boundary)
        kept = meta.compact_metadata if meta and meta.compact_metadata else None
        kept_responses: set[int] = set()  # a response's lines are one message
        for uuid in kept.preserved_messages.uuids if kept and kept.preserved_messages else ():
            index = graph.latest.get(uuid)
            if index is None:
                continue
            response = graph.response_of[index]
            if response is None or response not in kept_responses:
                turn = extend(turn, _messages_at(graph, index))  # type: ignore[assignment]
            if response is not None:
                kept_responses.add(response)
            self.preserved_turns[uuid] = turn
        return turn

    def user_line(self, i: int, record: UserLine, before: Turn | None) -> None:
        """A user line's messages (tool results, then text) extend the history."""
        assert record.message is not None
        messages = user_messages(record.message.content)
        if not messages:
            self.outcomes.append(Outcome(i, skipped="user line with no content"))
            return
        self.turns[i] = extend(before, messages)
        spawned = record.spawned_agent()
        use_id = next((m.tool_call_id for m in messages if m.role == "tool"), None)
        if spawned is not None and use_id:
            self.results[spawned[0]] = (use_id, spawned[1])
        self.failed.update(m.tool_call_id or "" for m in messages if m.is_error)
        if self.first_prompt is None and messages[-1].role == "user":
            self.first_prompt = messages[-1].text
        self.outcomes.append(Outcome(i, used="message"))

    def finish(self) -> AgentHistory:
        """The history, with a compaction call per summary (made last: it needs every turn)."""
        graph = self.graph
        for s, boundary in self.summaries:
            self.calls.append(
                _compaction(graph, self.agent, self.call_ids, self.turns, s, boundary)
            )
        unclosed = set(self.open_boundaries)
        outcomes = [
            Outcome(
                o.line,
                problem="compact boundary without a summary line; no compaction call made",
            )
            if o.line in unclosed
            else o
            for o in self.outcomes
        ]
        copied = self.response_turns
        return AgentHistory(
            calls=tuple(self.calls),
            turns=tuple(self.turns),
            outcomes=tuple(outcomes),
            spawns=tuple(self.spawns),
            results=self.results,
            failed_uses=frozenset(self.failed),
            first_prompt=self.first_prompt,
            copied_responses=sum(graph.responses[r].made_in is None for r in copied),
            copied_from=dict(Counter(made for r in copied if (made := graph.responses[r].made_in))),
        )


def _messages_at(graph: LineGraph, index: int) -> list[Message]:
    """The messages line `index` adds to a history: its response's, or a user line's."""
    response = graph.response_of[index]
    if response is not None:
        return [assistant_message(_records(graph, graph.responses[response]))]
    record = graph.entries[index].record
    if isinstance(record, UserLine) and record.message is not None:
        return user_messages(record.message.content)
    return []


def _line_outcome(i: int, record: SessionLine | OtherLine, start: Turn | None) -> Outcome:
    """What became of a line that adds nothing to the history (a compact boundary waits for
    its summary)."""
    if isinstance(record, AssistantLine):
        return Outcome(
            i,
            skipped="assistant line that is not a model response (synthetic API error message)"
            if record.message is not None
            else "assistant line without a message",
        )
    if isinstance(record, SystemLine) and record.is_compact_boundary:
        return Outcome(i, used="compaction boundary")
    if isinstance(record, SystemLine):
        return Outcome(i, skipped=f"system record ({record.subtype}) is not a model message")
    if isinstance(record, ForkContextRef):
        return _fork_context_outcome(i, record, start)
    if isinstance(record, OtherLine) and record.problem:
        return Outcome(i, skipped=record.problem)
    kind = record.kind if isinstance(record, OtherLine) else "user"
    return Outcome(i, skipped=f"{kind} record is not a model message")


def _copy_used(response: Response) -> str:
    if response.made_in is None:
        return "message (an earlier agent's response, repeated)"
    return "message (a response another session made, repeated: trained there)"


def _fork_context_outcome(i: int, record: ForkContextRef, start: Turn | None) -> Outcome:
    if start is not None:
        return Outcome(i, used="fork context (the parent's history it starts from)")
    return Outcome(
        i,
        problem=f"fork context names line {record.parent_last_uuid!r}, not found in the agents "
        "read before; the fork's history starts at its own first line",
    )


def fork_context(graph: LineGraph) -> str | None:
    """The parent's line a fork's history starts from, if the agent is a fork."""
    return next(
        (e.record.parent_last_uuid for e in graph.entries if isinstance(e.record, ForkContextRef)),
        None,
    )


def _records(graph: LineGraph, response: Response) -> list[AssistantLine]:
    return [graph.entries[j].record for j in response.lines]  # type: ignore[misc]


def _summary_text(record: UserLine) -> str:
    return "\n".join(block_text(b) for b in record.message.content) if record.message else ""


def _boundary(graph: LineGraph, index: int | None) -> SystemLine | None:
    record = graph.entries[index].record if index is not None else None
    return record if isinstance(record, SystemLine) else None


def _call(
    graph: LineGraph,
    response: Response,
    agent: TranscriptAgent,
    call_ids: CallIds,
    context: Turn | None,
) -> TranscriptCall:
    records = _records(graph, response)
    first, last = graph.entries[response.lines[0]], records[-1]
    assert first.record.__class__ is AssistantLine and last.message is not None
    head = records[0]
    return TranscriptCall(
        id=call_ids.new(response.key or f"line{first.number}"),
        agent=agent,
        context=context,
        response=assistant_message(records),
        order=graph.order[response.lines[0]],
        kept=not any(r.uuid in graph.not_kept or r.is_aborted_mid_stream for r in records),
        content=CallRecord(
            source=Source(first.file, [graph.entries[j].number for j in response.lines]),
            message_id=head.message.id if head.message else None,
            request_id=head.request_id,
            model=last.message.model,
            stop_reason=last.message.stop_reason,
            usage=last.message.usage,
        ),
    )


def _compaction(
    graph: LineGraph,
    agent: TranscriptAgent,
    call_ids: CallIds,
    turns: list[Turn | None],
    s: int,
    boundary: int | None,
) -> TranscriptCall:
    """The compaction call: what it summarised (up to the boundary's `logicalParentUuid`, else
    the summary's parent) and the summary it answered with."""
    summary = graph.entries[s]
    anchor = graph.entries[boundary if boundary is not None else s]
    meta = _boundary(graph, boundary)
    summarised: Turn | None = None
    logical = _find(graph, meta.logical_parent_uuid, boundary) if meta else None
    head = _kept_head(graph, meta, boundary)
    if head is not None:  # the messages kept after the summary were not summarised
        up = graph.history_parent[head]
        summarised = turns[up] if up is not None else None
    elif logical is not None:
        summarised = turns[logical]
    elif graph.parent[s] is not None and graph.parent[s] != boundary:
        summarised = turns[graph.parent[s]]  # type: ignore[index]
    assert isinstance(summary.record, UserLine)
    return compaction_call(
        agent,
        call_ids.new(f"compact-{anchor.number}"),
        summarised,
        _summary_text(summary.record),
        graph.order[boundary if boundary is not None else s],
        CallRecord(
            source=Source(summary.file, sorted({anchor.number, summary.number})),
            trigger=meta.compact_metadata.trigger if meta and meta.compact_metadata else None,
        ),
    )


def _kept_head(graph: LineGraph, meta: SystemLine | None, boundary: int | None) -> int | None:
    """The line of the first message a compaction kept after its summary, when the file has
    it before the boundary (Claude Code 2.1.332 leaves kept messages in place)."""
    first = meta.compact_metadata.first_kept() if meta and meta.compact_metadata else None
    index = graph.latest.get(first) if first is not None else None
    return index if index is not None and boundary is not None and index < boundary else None


def _find(graph: LineGraph, uuid: str | None, before: int | None) -> int | None:
    """The latest line with `uuid` before `before`, else the first one after it."""
    if uuid is None:
        return None
    entries = graph.entries
    limit = len(entries) if before is None else before
    for i in range(limit - 1, -1, -1):
        if entries[i].record.uuid == uuid:
            return i
    return next((i for i in range(limit, len(entries)) if entries[i].record.uuid == uuid), None)

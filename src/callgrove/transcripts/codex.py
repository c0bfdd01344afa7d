"""Codex CLI rollouts (`~/.codex/sessions/**/rollout-*.jsonl`) as transcripts.

A rollout is one thread: a `session_meta` record, then `response_item`s (the model's inputs
and outputs in the order they were recorded), `turn_context`, `event_msg` and `compacted`
records. Model outputs that follow each other (reasoning, assistant messages, tool calls) are
one API response, closed by the next input message, a turn boundary or the `token_count` event
Codex writes after each response; tool outputs recorded while a response is open follow it in
the history. A `compacted` record is a `compaction` call answering with its summary, after which
the history is the record's `replacement_history`. Subagent threads name their parent thread
in `session_meta.source.subagent.thread_spawn`; each root thread with its subagents (from any
of the files read) is one transcript.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from callgrove.episode import Gap, Spawn
from callgrove.transcripts.codex_records import (
    OUTPUT_ITEMS,
    AgentMessageItem,
    BuiltinCall,
    CompactedPayload,
    CompactionItem,
    CustomToolCall,
    Event,
    EventMsg,
    FunctionCall,
    MessageItem,
    OtherItem,
    ReasoningItem,
    ResponseItem,
    ResponseItemPayload,
    RolloutRecord,
    SessionMeta,
    SessionMetaPayload,
    ToolOutput,
    TurnContext,
    Unreadable,
    decode_item,
    decode_record,
)
from callgrove.transcripts.compaction import (
    adopt_as_compaction,
    answered_with_summary,
    compaction_call,
    summary_in_replacement,
)
from callgrove.transcripts.ledger import (
    CODEX,
    CallIds,
    ImportReport,
    Line,
    collector_paused,
    read_json_lines,
    refuse_file,
    running_times,
    sniff,
)
from callgrove.transcripts.model import (
    CallRecord,
    Message,
    Source,
    ToolCall,
    Transcript,
    TranscriptAgent,
    TranscriptCall,
    Turn,
    extend,
    parent_unavailable,
)

TURN_EVENTS = frozenset({"task_started", "task_complete", "turn_aborted"})
DUPLICATE_EVENTS = frozenset({"user_message", "agent_message", "agent_reasoning"})


def _text(value: Any) -> str:
    """Readable text of a content value: strings, `{text}` objects, lists of content items."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(t for t in (_text(v) for v in value) if t)
    if isinstance(value, dict):
        kind = value.get("type")
        if kind in ("input_image", "image"):
            return "[image]"
        for key in ("text", "content", "output"):
            if key in value:
                return _text(value[key])
        return orjson.dumps(value).decode()
    return str(value)


def _arguments(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            return raw
    return raw


def _typed(item: dict[str, Any] | ResponseItemPayload) -> ResponseItemPayload:
    """An item as its typed record (the capture gateway passes Responses API JSON)."""
    return decode_item(item) if isinstance(item, dict) else item


def input_messages(item: dict[str, Any] | ResponseItemPayload) -> list[Message] | None:
    """The messages an input item adds to the history; None when it is not an input."""
    item = _typed(item)
    if isinstance(item, MessageItem) and item.role in ("user", "developer", "system"):
        return [Message(item.role, _text(item.content))]  # type: ignore[arg-type]
    if isinstance(item, ToolOutput):
        return [Message("tool", _text(item.output), tool_call_id=item.call_id or "")]
    if isinstance(item, AgentMessageItem):
        return [Message("user", _text(item.content))]
    return None


def is_output(item: ResponseItemPayload) -> bool:
    """Whether the item is part of a model response."""
    return isinstance(item, OUTPUT_ITEMS) or (
        isinstance(item, MessageItem) and item.role == "assistant"
    )


def response_message(items: list[dict[str, Any]] | list[ResponseItemPayload]) -> Message:
    """One API response from its output items."""
    thinking: list[str] = []
    texts: list[str] = []
    calls: list[ToolCall] = []
    for item in map(_typed, items):
        if isinstance(item, ReasoningItem):
            summary = _text([s.get("text", "") for s in item.summary if isinstance(s, dict)])
            thinking.append(summary or _text(item.content))
        elif isinstance(item, MessageItem):
            parts = item.content if isinstance(item.content, list) else [item.content]
            for part in parts:
                if isinstance(part, dict) and part.get("type") == "reasoning":
                    thinking.append(_text(part.get("text")))
                else:
                    texts.append(_text(part))
        elif isinstance(item, FunctionCall):
            calls.append(ToolCall(item.call_id or "", item.name or "", _arguments(item.arguments)))
        elif isinstance(item, CustomToolCall):
            calls.append(ToolCall(item.call_id or "", item.name or "", item.input))
        elif isinstance(item, BuiltinCall):
            arguments = item.action or item.arguments or item.revised_prompt
            kind = item.__struct_config__.tag
            calls.append(ToolCall(item.call_id or item.id or "", str(kind), arguments))
    return Message("assistant", "\n".join(texts), "\n".join(t for t in thinking if t), tuple(calls))


@dataclass(eq=False)
class Thread:
    id: str
    meta: SessionMetaPayload
    agent: TranscriptAgent
    history: Turn | None = None
    system: Message | None = None
    spawned: dict[str, str] = field(default_factory=dict)  # child thread id -> tool call id
    outputs: dict[str, str] = field(default_factory=dict)  # tool call id -> its output text
    tool_calls: dict[str, TranscriptCall] = field(default_factory=dict)  # tool call id -> call
    call_ids: CallIds = field(init=False)
    first_prompt: str | None = None
    latest_answer: TranscriptCall | None = None  # the last call, while no input followed it

    def __post_init__(self) -> None:
        self.call_ids = CallIds(self.id)

    @property
    def parent_id(self) -> str | None:
        return self.meta.parent()


class RolloutReader:
    """Reads rollout files into threads, one pending response at a time."""

    def __init__(self, report: ImportReport):
        self.report = report
        self.threads: dict[str, Thread] = {}
        self.thread: Thread | None = None
        self.pending: list[tuple[Line, ResponseItemPayload]] = []
        self.queued: list[Message] = []
        self.last_call: TranscriptCall | None = None
        self.closes_on_count = False
        self.rank = 0
        self.time: float = 0.0
        # A forked thread's file first repeats the history it was forked from, under the
        # source thread's own `session_meta`: that part is the fork's history, not its calls.
        self.copying_from: str | None = None
        self.copied = False  # the pending response is a repeated one (history, not a call)

    def read(self, path: Path, rank: int) -> None:
        found = sniff(path)
        if found != CODEX:
            refuse_file(path, CODEX, found, self.report)
            return
        lines = list(read_json_lines(path, self.report))
        records = [decode_record(line.data) for line in lines]
        self.rank, self.thread, self.time, self.last_call = rank, None, 0.0, None
        self.copying_from = None
        if lines and not any(isinstance(r, SessionMeta) for r in records):
            self.report.problem(
                "no session_meta record: not a Codex rollout; its lines are skipped",
                str(path),
                severity="warning",
            )
            for line in lines:
                self.report.skip(line, "not in a Codex rollout (the file has no session_meta)")
            return
        self.closes_on_count = any(
            isinstance(r, EventMsg) and r.payload.type == "token_count" for r in records
        )
        times = running_times([r.timestamp for r in records])
        for line, record, time in zip(lines, records, times, strict=True):
            self.time = time
            self._line(line, record)
        self._close()

    def _order(self, line: Line) -> tuple[Any, ...]:
        return (self.time, self.rank, line.number)

    def _line(self, line: Line, record: RolloutRecord | Unreadable) -> None:
        if isinstance(record, Unreadable):
            self.report.skip(line, record.reason)
            return
        if isinstance(record, SessionMeta):
            self._close()
            meta = record.payload
            if self._repeats_fork_source(meta, line):
                self.copying_from = meta.thread_id(_where(line))
                self.report.use(line, "session meta of the forked thread (its history follows)")
            else:
                self._session(line, meta)
            return
        if self.copying_from is not None and _thread_named(record) == getattr(
            self.thread, "id", None
        ):
            self._close()
            self.copying_from = None  # the fork's own records begin
        if self.thread is None:
            kind = record.__struct_config__.tag
            self.report.problem(
                f"{kind} record before any session_meta; ignored", line.file, line.number
            )
            return
        if isinstance(record, ResponseItem):
            self._item(line, record.payload)
        elif isinstance(record, EventMsg):
            self._event(line, record.payload)
        elif isinstance(record, TurnContext):
            self._close()
            self.report.use(line, "turn settings")
        else:
            self._close()
            self._compaction(line, record.payload)

    def _repeats_fork_source(self, meta: SessionMetaPayload, line: Line) -> bool:
        """A forked thread's file, before the fork's own records, repeats its source's."""
        thread = self.thread
        if thread is None or not thread.meta.forked_from_id or thread.agent.calls:
            return False
        return self.copying_from is not None or meta.thread_id(_where(line)) != thread.id

    def _session(self, line: Line, meta: SessionMetaPayload) -> None:
        thread_id = meta.thread_id(_where(line))
        thread = self.threads.get(thread_id)
        if thread is None:
            name = meta.agent_role or meta.agent_nickname
            agent = TranscriptAgent(thread_id, str(name or "leader"), meta={"file": line.file})
            thread = self.threads[thread_id] = Thread(thread_id, meta, agent)
            text = _text(meta.base_instructions or meta.instructions)
            if text:
                thread.system = Message("system", text)
                thread.history = Turn(thread.system, None)
        self.thread, self.last_call = thread, None
        self.report.use(line, "session meta")

    def _item(self, line: Line, item: ResponseItemPayload) -> None:
        if is_output(item):
            self.pending.append((line, item))
            if self.copying_from is not None:
                self.report.use(line, "message (the forked thread's response, repeated)")
            else:
                self.report.use(line, "call")
            return
        messages = input_messages(item)
        if messages is None:
            kind = item.kind if isinstance(item, OtherItem) else item.__struct_config__.tag
            self.report.skip(line, f"response item {kind} is not sent to the model")
            return
        thread = self.thread
        assert thread is not None
        if self.pending and (isinstance(item, MessageItem) or not self.closes_on_count):
            self._close()
        if self.pending:
            self.queued.extend(messages)
        else:
            thread.history = extend(thread.history, messages)
            thread.latest_answer = None
        for message in messages:
            if message.tool_call_id:
                thread.outputs[message.tool_call_id] = message.text
        if thread.first_prompt is None and messages[0].role == "user":
            thread.first_prompt = messages[0].text
        self.report.use(line, "message")

    def _event(self, line: Line, event: Event) -> None:
        kind = event.type
        if kind == "token_count":  # written after each response, sometimes after its turn ends
            self._close()
            if self.last_call is not None:
                self.last_call.content.usage = event.info.last_token_usage if event.info else None
                self.last_call = None
                self.report.use(line, "usage")
            else:
                self.report.skip(line, "token_count event with no response before it")
        elif kind in TURN_EVENTS:
            self._close()
            self.report.use(line, "turn boundary")
        elif kind in DUPLICATE_EVENTS:
            self.report.skip(line, f"{kind} event repeats a response item")
        elif "spawn" in str(kind) and isinstance(event.call_id, str):
            child = event.spawned_thread()
            if child is None:
                self.report.skip(line, f"{kind} event names no thread")
                return
            self.thread.spawned[child] = event.call_id  # type: ignore[union-attr]
            self.report.use(line, "subagent link")
        else:
            self.report.skip(line, f"{kind} event is not a model message")

    def _close(self) -> None:
        """End the open response: one call, then the tool outputs recorded meanwhile."""
        if not self.pending or self.thread is None:
            self.pending, self.queued = [], []
            return
        thread = self.thread
        first_line, first_item = self.pending[0]
        if self.copying_from is not None:
            response = response_message([item for _, item in self.pending])
            thread.history = extend(Turn(response, thread.history), self.queued)
            self.pending, self.queued = [], []
            return
        call = TranscriptCall(
            id=thread.call_ids.new(first_item.id or f"line{first_line.number}"),
            agent=thread.agent,
            context=thread.history,
            response=response_message([item for _, item in self.pending]),
            order=self._order(first_line),
            content=CallRecord(
                source=Source(first_line.file, [ln.number for ln, _ in self.pending])
            ),
        )
        thread.agent.calls.append(call)
        thread.tool_calls.update((tool.id, call) for tool in call.response.tool_calls if tool.id)
        thread.history = extend(call.answer, self.queued)
        thread.latest_answer = None if self.queued else call
        self.last_call = call
        self.pending, self.queued = [], []

    def _compaction(self, line: Line, payload: CompactedPayload) -> None:
        thread = self.thread
        assert thread is not None
        replacement = payload.replacement_history
        summary = _text(payload.message) or summary_in_replacement(replacement, _text)
        if answered_with_summary(thread.latest_answer, summary):
            adopt_as_compaction(thread.latest_answer, line.number)  # type: ignore[arg-type]
            self.report.use(line, "compaction (its summary is the response before it)")
        else:
            call = compaction_call(
                thread.agent,
                thread.call_ids.new(f"compact-{line.number}"),
                thread.history,
                summary,
                self._order(line),
                CallRecord(source=Source(line.file, [line.number])),
            )
            thread.agent.calls.append(call)
            self.report.use(line, "compaction")
        thread.latest_answer = None
        history = Turn(thread.system, None) if thread.system else None
        for item in replacement:
            if isinstance(item, MessageItem) and item.role == "assistant":
                history = Turn(response_message([item]), history)
            elif isinstance(item, CompactionItem):
                history = Turn(Message("user", "[compaction summary, encrypted]"), history)
            else:
                history = extend(history, input_messages(item) or [])
        thread.history = history


def _thread_named(record: RolloutRecord) -> str | None:
    """The thread a record says it belongs to (a forked thread's own records name it)."""
    if isinstance(record, EventMsg):
        found = record.payload.thread_id
    elif isinstance(record, TurnContext):
        found = record.payload.get("thread_id")
    else:
        return None
    return found if isinstance(found, str) else None


def _where(line: Line) -> str:
    """The id of a thread whose `session_meta` names none: where it was read."""
    return f"{line.file}:{line.number}"


def import_codex(
    path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    report: ImportReport | None = None,
) -> list[Transcript]:
    """Every thread under `path` (a rollout file, a folder, or a list of rollout files read
    together), subagents joined to their parents."""
    report = report if report is not None else ImportReport()
    if isinstance(path, list | tuple):
        return _read_threads([Path(p) for p in path], report)
    root = Path(path)
    if root.is_dir():
        files = sorted(root.rglob("*.jsonl"))
    elif root.is_file():
        files = [root]
    else:
        report.problem("no such file or folder", str(root))
        return []
    return _read_threads(files, report)


def _read_threads(files: list[Path], report: ImportReport) -> list[Transcript]:
    reader = RolloutReader(report)
    with collector_paused():
        for rank, file in enumerate(files):
            reader.read(file, rank)
        return _episodes(list(reader.threads.values()), report)


def _episodes(threads: list[Thread], report: ImportReport) -> list[Transcript]:
    by_id = {t.id: t for t in threads}
    children: dict[str, list[Thread]] = {}
    roots: list[Thread] = []
    gaps_of: dict[str, list[Gap]] = {}
    for thread in threads:
        parent = thread.parent_id
        if parent is not None and parent in by_id and parent != thread.id:
            children.setdefault(parent, []).append(thread)
            continue
        roots.append(thread)
        if parent is not None:
            thread.agent.start = "fresh"
            where = "this thread itself" if parent == thread.id else "not among the files read"
            gaps_of[thread.id] = [
                parent_unavailable(thread.agent, f"parent thread {parent!r} is {where}")
            ]
    transcripts = []
    reached: set[str] = set()
    for root in [*roots, *threads]:  # then threads no root reaches: their parents form a cycle
        if root.id in reached:
            continue
        if root not in roots:
            _break_cycle(root, by_id, gaps_of, report)
        members = [root]
        reached.add(root.id)
        for member in members:  # grows while walking: breadth-first over descendants
            for child in children.get(member.id, []):
                if child.id not in reached:
                    _link(member, child)
                    members.append(child)
                    reached.add(child.id)
        transcripts.append(
            Transcript(
                id=root.id,
                agents=[m.agent for m in members],
                gaps=gaps_of.get(root.id, []),
                task={"prompt": root.first_prompt} if root.first_prompt else None,
                meta={
                    "source": "codex",
                    "files": sorted({m.agent.meta["file"] for m in members}),
                    "cli_version": root.meta.cli_version,
                },
            )
        )
    return transcripts


def _break_cycle(
    thread: Thread, by_id: dict[str, Thread], gaps_of: dict[str, list[Gap]], report: ImportReport
) -> None:
    """A thread whose parents lead back to it becomes a root, and the cycle is reported."""
    cycle, current = [thread.id], by_id[thread.parent_id]  # type: ignore[index]
    while current.id != thread.id and current.id not in cycle and current.parent_id in by_id:
        cycle.append(current.id)
        current = by_id[current.parent_id]  # type: ignore[index]
    path = " -> ".join([*cycle, current.id])
    reason = f"parent threads form a cycle ({path}); this thread is imported as a root"
    thread.agent.start = "fresh"
    file = thread.agent.meta.get("file")
    gaps_of[thread.id] = [
        Gap(kind="subagent_parent_cycle", agent=thread.id, file=file, reason=reason)
    ]
    report.problem(reason, file, severity="warning")


def _link(parent: Thread, child: Thread) -> None:
    """The child's parent agent, start, and the parent call that spawned it (when recorded)."""
    agent = child.agent
    agent.parent = parent.id
    agent.start = "fork" if child.meta.forked_from_id else "fresh"
    if agent.name == "leader":
        agent.name = "subagent"
    use_id, link = parent.spawned.get(child.id), "spawn event"
    if use_id is None:  # else a spawn tool's output names the new thread
        use_id = next((k for k, text in parent.outputs.items() if child.id in text), None)
        link = "tool output"
    call = parent.tool_calls.get(use_id) if use_id else None
    if call is not None:
        agent.spawn = Spawn(call=call.id, tool_call_id=use_id, link=link)

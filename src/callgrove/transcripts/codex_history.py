"""Codex rollout lines as an immutable graph per thread, and the histories derived from it.

Three pure functions, each reading what the one before made:

* `place_lines` reads the decoded lines of every file, in read order, and says which thread
  each belongs to: each `session_meta` starts a run of lines of its thread. A forked thread's
  file first repeats the records of the thread it was forked from, under that thread's own
  `session_meta`, until a record names the fork: those lines are a copied run (the fork's
  history, not its calls).
* `build_graph` groups one thread's runs into steps: an input added to the history; an API
  response (output items that follow each other, closed by the next input message, a turn
  boundary, the `token_count` event Codex writes after each response, or the end of the run;
  tool outputs recorded while it is open follow its answer); a compaction. The `token_count`
  after a response gives its usage; a `compacted` record right after the response that wrote
  its summary makes that response the compaction call (`compaction.py`).
* `derive_thread` builds the thread's histories (`Turn`s) and calls in one pass over the steps.

Every line's fate is an `Outcome` (used, skipped or a problem); nothing in a graph changes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import msgspec
import orjson

from callgrove.chat.message import Message, ToolCall
from callgrove.transcripts.accounting import CallIds, Outcome
from callgrove.transcripts.codex_records import (
    OUTPUT_ITEMS,
    AgentMessageItem,
    BuiltinCall,
    Compacted,
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
)
from callgrove.transcripts.compaction import (
    answered_with_summary,
    compaction_call,
    summary_in_replacement,
)
from callgrove.transcripts.turns import (
    CallRecord,
    Source,
    TranscriptAgent,
    TranscriptCall,
    Turn,
    extend,
)

TURN_EVENTS = frozenset({"task_started", "task_complete", "turn_aborted"})
DUPLICATE_EVENTS = frozenset({"user_message", "agent_message", "agent_reasoning"})


# ---------------------------------------------------------------------------------------------
# Messages (also read by the capture gateway, which passes Responses API JSON)


def content_text(value: Any) -> str:
    """Readable text of a content value: strings, `{text}` objects, lists of content items."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(t for t in (content_text(v) for v in value) if t)
    if isinstance(value, dict):
        kind = value.get("type")
        if kind in ("input_image", "image"):
            return "[image]"
        for key in ("text", "content", "output"):
            if key in value:
                return content_text(value[key])
        return orjson.dumps(value).decode()
    return str(value)


def tool_arguments(raw: Any) -> Any:
    """A tool call's arguments as an OpenAI API carries them: JSON text read into its value
    (text that is not JSON kept as it is)."""
    if isinstance(raw, str):
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            return raw
    return raw


def _typed(item: dict[str, Any] | ResponseItemPayload) -> ResponseItemPayload:
    return decode_item(item) if isinstance(item, dict) else item


def input_messages(item: dict[str, Any] | ResponseItemPayload) -> list[Message] | None:
    """The messages an input item adds to the history; None when it is not an input."""
    item = _typed(item)
    if isinstance(item, MessageItem) and item.role in ("user", "developer", "system"):
        return [Message(item.role, content_text(item.content))]  # type: ignore[arg-type]
    if isinstance(item, ToolOutput):
        return [Message("tool", content_text(item.output), tool_call_id=item.call_id or "")]
    if isinstance(item, AgentMessageItem):
        return [Message("user", content_text(item.content))]
    return None


def is_output(item: ResponseItemPayload) -> bool:
    """Whether the item is part of a model response."""
    return isinstance(item, OUTPUT_ITEMS) or (
        isinstance(item, MessageItem) and item.role == "assistant"
    )


def response_message(items: Sequence[dict[str, Any]] | Sequence[ResponseItemPayload]) -> Message:
    """One API response from its output items."""
    thinking: list[str] = []
    texts: list[str] = []
    calls: list[ToolCall] = []
    for item in map(_typed, items):
        if isinstance(item, ReasoningItem):
            summary = content_text([s.get("text", "") for s in item.summary if isinstance(s, dict)])
            thinking.append(summary or content_text(item.content))
        elif isinstance(item, MessageItem):
            parts = item.content if isinstance(item.content, list) else [item.content]
            for part in parts:
                if isinstance(part, dict) and part.get("type") == "reasoning":
                    thinking.append(content_text(part.get("text")))
                else:
                    texts.append(content_text(part))
        elif isinstance(item, FunctionCall):
            calls.append(
                ToolCall(item.call_id or "", item.name or "", tool_arguments(item.arguments))
            )
        elif isinstance(item, CustomToolCall):
            calls.append(ToolCall(item.call_id or "", item.name or "", item.input))
        elif isinstance(item, BuiltinCall):
            arguments = item.action or item.arguments or item.revised_prompt
            kind = item.__struct_config__.tag
            calls.append(ToolCall(item.call_id or item.id or "", str(kind), arguments))
    return Message("assistant", "\n".join(texts), "\n".join(t for t in thinking if t), tuple(calls))


def replacement_history(
    system: Message | None, items: Sequence[ResponseItemPayload]
) -> Turn | None:
    """The history a thread goes on from after a compaction."""
    history = Turn(system, None) if system else None
    for item in items:
        if isinstance(item, MessageItem) and item.role == "assistant":
            history = Turn(response_message([item]), history)
        elif isinstance(item, CompactionItem):
            history = Turn(Message("user", "[compaction summary, encrypted]"), history)
        else:
            history = extend(history, input_messages(item) or [])
    return history


def compaction_summary(record: Compacted) -> str:
    payload = record.payload
    return content_text(payload.message) or summary_in_replacement(
        payload.replacement_history, content_text
    )


# ---------------------------------------------------------------------------------------------
# Lines and the runs of each thread


class RolloutEntry(msgspec.Struct, frozen=True):
    """One decoded line, where it was read, and its ledger time (its timestamp, else the
    latest one before it in its file). A Struct: one is made per line, quickly."""

    file: str
    number: int
    rank: int  # the file's place among the files read
    time: float
    record: RolloutRecord | Unreadable


@dataclass(frozen=True, slots=True)
class Run:
    """Consecutive lines of one thread in one file (indices into the entries)."""

    thread: str
    copied: bool  # the forked thread's source, repeated: history, not calls
    lines: tuple[int, ...]
    end_time: float  # the time of the line that ended it (what closes its last response)
    counts_close: bool  # its file writes `token_count` after responses: that closes them


@dataclass(frozen=True, slots=True)
class ThreadStart:
    """A thread as its first `session_meta` describes it."""

    id: str
    meta: SessionMetaPayload
    file: str


@dataclass(frozen=True, slots=True)
class Placement:
    threads: tuple[ThreadStart, ...]  # in the order they were first met
    runs: tuple[Run, ...]  # in read order
    outcomes: tuple[Outcome, ...]  # of the lines no run holds (and of every session_meta)


def place_lines(entries: Sequence[RolloutEntry], files: Sequence[range]) -> Placement:
    """Which thread each line belongs to, file by file (`files`: each file's entries)."""
    starts: dict[str, ThreadStart] = {}
    with_calls: set[str] = set()  # threads with a response or compaction of their own
    runs: list[Run] = []
    outcomes: list[Outcome] = []
    for span in files:
        counts_close = any(_is_token_count(entries[i].record) for i in span)
        thread: str | None = None
        copied = False
        lines: list[int] = []
        for i in span:
            entry = entries[i]
            record = entry.record
            if isinstance(record, Unreadable):
                outcomes.append(Outcome(i, skipped=record.reason))
                continue
            ended = isinstance(record, SessionMeta) or (
                copied and _thread_named(record) == thread  # the fork's own records begin
            )
            if ended and thread is not None and lines:
                runs.append(Run(thread, copied, tuple(lines), entry.time, counts_close))
                lines = []
            if isinstance(record, SessionMeta):
                named = record.payload.thread_id(f"{entry.file}:{entry.number}")
                if _repeats_fork_source(starts, with_calls, thread, copied, named):
                    copied = True
                    what = "session meta of the forked thread (its history follows)"
                else:
                    thread, copied, what = named, False, "session meta"
                    starts.setdefault(named, ThreadStart(named, record.payload, entry.file))
                outcomes.append(Outcome(i, used=what))
                continue
            copied = copied and not ended
            if thread is None:
                kind = record.__struct_config__.tag
                problem = f"{kind} record before any session_meta; ignored"
                outcomes.append(Outcome(i, problem=problem))
                continue
            lines.append(i)
            if not copied and _makes_a_call(record):
                with_calls.add(thread)
        if thread is not None and lines:
            runs.append(Run(thread, copied, tuple(lines), entries[span[-1]].time, counts_close))
    return Placement(tuple(starts.values()), tuple(runs), tuple(outcomes))


def _repeats_fork_source(
    starts: dict[str, ThreadStart],
    with_calls: set[str],
    thread: str | None,
    copied: bool,
    named: str,
) -> bool:
    """Whether a `session_meta` naming `named`, read while `thread` is open, starts a copy of
    the source of `thread`: a fork with no call of its own yet."""
    fork = starts.get(thread) if thread is not None else None
    if fork is None or not fork.meta.forked_from_id or thread in with_calls:
        return False
    return copied or named != thread


def _is_token_count(record: RolloutRecord | Unreadable) -> bool:
    return isinstance(record, EventMsg) and record.payload.type == "token_count"


def _makes_a_call(record: RolloutRecord) -> bool:
    return isinstance(record, Compacted) or (
        isinstance(record, ResponseItem) and is_output(record.payload)
    )


def _thread_named(record: RolloutRecord) -> str | None:
    """The thread a record says it belongs to (a forked thread's own records name it)."""
    if isinstance(record, EventMsg):
        found = record.payload.thread_id
    elif isinstance(record, TurnContext):
        found = record.payload.get("thread_id")
    else:
        return None
    return found if isinstance(found, str) else None


# ---------------------------------------------------------------------------------------------
# The graph of one thread


@dataclass(frozen=True, slots=True)
class Input:
    line: int


@dataclass(frozen=True, slots=True)
class RolloutResponse:
    items: tuple[int, ...]
    queued: tuple[int, ...]  # inputs recorded while it was open: they follow its answer
    time: float  # when it was closed
    copied: bool
    usage: int | None = None  # the token_count event written after it
    compacted: int | None = None  # the compacted record whose summary it wrote


@dataclass(frozen=True, slots=True)
class Compaction:
    """A `compacted` record: the history goes on from its replacement history. It is a call of
    its own unless the response before it wrote the summary, or it is a copied one."""

    line: int
    summary: str
    is_call: bool


Step = Input | RolloutResponse | Compaction


@dataclass(frozen=True, slots=True)
class ThreadGraph:
    start: ThreadStart
    steps: tuple[Step, ...]
    outcomes: tuple[Outcome, ...]
    spawned: dict[str, str]  # child thread id -> the tool call id that started it
    outputs: dict[str, str]  # tool call id -> its output text
    first_prompt: str | None

    @property
    def id(self) -> str:
        return self.start.id


def build_graph(
    start: ThreadStart, runs: Sequence[Run], entries: Sequence[RolloutEntry]
) -> ThreadGraph:
    """One thread's runs (in read order) as steps; each of their lines' outcome."""
    grouping = _Grouping(entries)
    for run in runs:
        grouping.run(run)
    return ThreadGraph(
        start,
        grouping.finished_steps(),
        tuple(grouping.outcomes),
        grouping.spawned,
        grouping.outputs,
        grouping.first_prompt,
    )


class _Grouping:
    """The working state of `build_graph`, local to one call of it."""

    def __init__(self, entries: Sequence[RolloutEntry]):
        self.entries = entries
        self.steps: list[Step] = []
        self.outcomes: list[Outcome] = []
        self.spawned: dict[str, str] = {}
        self.outputs: dict[str, str] = {}
        self.first_prompt: str | None = None
        self.usage: dict[int, int] = {}  # response step -> its token_count line
        self.compacted: dict[int, int] = {}  # response step -> the compacted line it answered
        self.answer: int | None = None  # the last response, while no input followed it
        self.last: int | None = None  # the last response of the run, until its usage is read
        self.pending: list[int] = []
        self.queued: list[int] = []
        self.copied = False

    def run(self, run: Run) -> None:
        self.copied, self.last = run.copied, None
        for i in run.lines:
            record = self.entries[i].record
            if isinstance(record, ResponseItem):
                self.item(i, record.payload, run.counts_close)
            elif isinstance(record, EventMsg):
                self.event(i, record.payload)
            elif isinstance(record, TurnContext):
                self.close(i)
                self.outcomes.append(Outcome(i, used="turn settings"))
            elif isinstance(record, Compacted):
                self.close(i)
                self.compaction(i, record)
        self.close(None, run.end_time)

    def close(self, line: int | None, time: float | None = None) -> None:
        """End the open response (at `line`, or at `time` when its run ends)."""
        if not self.pending:
            return
        at = self.entries[line].time if line is not None else time
        self.steps.append(RolloutResponse(tuple(self.pending), tuple(self.queued), at, self.copied))
        if not self.copied:
            self.answer = None if self.queued else len(self.steps) - 1
            self.last = len(self.steps) - 1
        self.pending, self.queued = [], []

    def item(self, i: int, item: ResponseItemPayload, counts_close: bool) -> None:
        if is_output(item):
            self.pending.append(i)
            repeated = "message (the forked thread's response, repeated)"
            self.outcomes.append(Outcome(i, used=repeated if self.copied else "call"))
            return
        messages = input_messages(item)
        if messages is None:
            kind = item.kind if isinstance(item, OtherItem) else item.__struct_config__.tag
            reason = f"response item {kind} is not sent to the model"
            self.outcomes.append(Outcome(i, skipped=reason))
            return
        if self.pending and (isinstance(item, MessageItem) or not counts_close):
            self.close(i)
        if self.pending:
            self.queued.append(i)
        else:
            self.steps.append(Input(i))
            self.answer = None
        self.outputs.update((m.tool_call_id, m.text) for m in messages if m.tool_call_id)
        if self.first_prompt is None and messages[0].role == "user":
            self.first_prompt = messages[0].text
        self.outcomes.append(Outcome(i, used="message"))

    def event(self, i: int, event: Event) -> None:
        kind = event.type
        if kind == "token_count":  # written after each response, sometimes after its turn
            self.close(i)
            if self.last is not None:
                self.usage[self.last] = i
                self.last = None
                self.outcomes.append(Outcome(i, used="usage"))
            else:
                reason = "token_count event with no response before it"
                self.outcomes.append(Outcome(i, skipped=reason))
        elif kind in TURN_EVENTS:
            self.close(i)
            self.outcomes.append(Outcome(i, used="turn boundary"))
        elif kind in DUPLICATE_EVENTS:
            self.outcomes.append(Outcome(i, skipped=f"{kind} event repeats a response item"))
        elif "spawn" in str(kind) and isinstance(event.call_id, str):
            child = event.spawned_thread()
            if child is None:
                self.outcomes.append(Outcome(i, skipped=f"{kind} event names no thread"))
            else:
                self.spawned[child] = event.call_id
                self.outcomes.append(Outcome(i, used="subagent link"))
        else:
            self.outcomes.append(Outcome(i, skipped=f"{kind} event is not a model message"))

    def compaction(self, i: int, record: Compacted) -> None:
        summary = compaction_summary(record)
        wrote = self.steps[self.answer] if self.answer is not None else None
        if (
            isinstance(wrote, RolloutResponse)
            and not self.copied
            and answered_with_summary(response_message(_items(wrote, self.entries)), summary)
        ):
            self.compacted[self.answer] = i  # type: ignore[index]
            used = "compaction (its summary is the response before it)"
        elif self.copied:
            used = "compaction (the forked thread's, repeated)"
        else:
            used = "compaction"
        self.steps.append(Compaction(i, summary, is_call=used == "compaction"))
        self.outcomes.append(Outcome(i, used=used))
        self.answer = None

    def finished_steps(self) -> tuple[Step, ...]:
        steps = list(self.steps)
        for k, line in self.usage.items():
            steps[k] = replace(steps[k], usage=line)  # type: ignore[type-var]
        for k, line in self.compacted.items():
            steps[k] = replace(steps[k], compacted=line)  # type: ignore[type-var]
        return tuple(steps)


def _items(response: RolloutResponse, entries: Sequence[RolloutEntry]) -> list[ResponseItemPayload]:
    return [entries[i].record.payload for i in response.items]  # type: ignore[union-attr]


def _inputs(lines: Sequence[int], entries: Sequence[RolloutEntry]) -> list[Message]:
    return [
        message
        for i in lines
        for message in input_messages(entries[i].record.payload) or []  # type: ignore[union-attr]
    ]


# ---------------------------------------------------------------------------------------------
# The histories and calls of one thread


@dataclass(frozen=True, slots=True)
class ThreadHistory:
    calls: tuple[TranscriptCall, ...]
    tool_calls: dict[str, TranscriptCall]  # tool call id -> the call that made it


def system_message(meta: SessionMetaPayload) -> Message | None:
    text = content_text(meta.base_instructions or meta.instructions)
    return Message("system", text) if text else None


def derive_thread(
    graph: ThreadGraph, entries: Sequence[RolloutEntry], agent: TranscriptAgent
) -> ThreadHistory:
    """The thread's calls, each with the history it was given."""
    system = system_message(graph.start.meta)
    history = Turn(system, None) if system else None
    call_ids = CallIds(graph.id)
    calls: list[TranscriptCall] = []
    tool_calls: dict[str, TranscriptCall] = {}
    for step in graph.steps:
        if isinstance(step, Input):
            history = extend(history, _inputs([step.line], entries))
        elif isinstance(step, RolloutResponse):
            response = response_message(_items(step, entries))
            after = _inputs(step.queued, entries)
            if step.copied:
                history = extend(Turn(response, history), after)
                continue
            call = _call(step, entries, agent, call_ids, history, response)
            calls.append(call)
            tool_calls.update((tool.id, call) for tool in response.tool_calls if tool.id)
            history = extend(call.answer, after)
        else:
            entry = entries[step.line]
            record = entry.record
            assert isinstance(record, Compacted)
            if step.is_call:
                calls.append(
                    compaction_call(
                        agent,
                        call_ids.new(f"compact-{entry.number}"),
                        history,
                        step.summary,
                        (entry.time, entry.rank, entry.number),
                        CallRecord(source=Source(entry.file, [entry.number])),
                    )
                )
            history = replacement_history(system, record.payload.replacement_history)
    return ThreadHistory(tuple(calls), tool_calls)


def _call(
    step: RolloutResponse,
    entries: Sequence[RolloutEntry],
    agent: TranscriptAgent,
    call_ids: CallIds,
    context: Turn | None,
    response: Message,
) -> TranscriptCall:
    first = entries[step.items[0]]
    lines = [entries[i].number for i in step.items]
    if step.compacted is not None:
        lines.append(entries[step.compacted].number)
    usage = None
    if step.usage is not None:
        event = entries[step.usage].record.payload  # type: ignore[union-attr]
        usage = event.info.last_token_usage if event.info else None
    key = first.record.payload.id  # type: ignore[union-attr]
    return TranscriptCall(
        id=call_ids.new(key or f"line{first.number}"),
        agent=agent,
        context=context,
        response=response,
        order=(step.time, first.rank, first.number),
        purpose="compaction" if step.compacted is not None else "turn",
        content=CallRecord(source=Source(first.file, lines), usage=usage),
    )

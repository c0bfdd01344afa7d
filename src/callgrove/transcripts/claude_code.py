"""Claude Code sessions (`~/.claude/projects/<project>/*.jsonl`) as transcripts.

A session file holds one JSON record per line, linked into a tree by `uuid`/`parentUuid`
(rewinds make branches). Subagents come in three layouts, told apart by where their lines are:

* inline: sidechain lines (`isSidechain`, no `agentId`) in the session file itself, each
  sidechain a separate tree whose first prompt is the spawning Task call's `input.prompt`;
* flat: `agent-<id>.jsonl` beside the session file, with the session's `sessionId`;
* nested: `<session>/subagents/agent-<id>.jsonl`, optionally with `agent-<id>.meta.json`.

A subagent is linked to the Task/Agent `tool_use` that started it through the parent's
`toolUseResult.agentId`, or else through its first prompt; one that cannot be linked keeps its
calls, has no parent, and is recorded in `Transcript.gaps`.

One API response is written as several assistant lines (one per content block) sharing
`message.id` and `requestId`; they become one call, with the last line's `usage`. A compaction
(`compact_boundary` record, then the `isCompactSummary` user line) becomes a `compaction` call
of the agent that compacted: it continues the history it summarises and answers with the
summary; the history after it starts from the summary, so the next call is a new root.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from callgrove.episode import Gap, Spawn
from callgrove.transcripts.compaction import compaction_call, preserved_links
from callgrove.transcripts.ledger import (
    CLAUDE_CODE,
    CallIds,
    ImportReport,
    Line,
    collector_paused,
    parse_timestamp,
    read_json_lines,
    refuse_file,
    sniff,
)
from callgrove.transcripts.model import (
    Message,
    ToolCall,
    Transcript,
    TranscriptAgent,
    TranscriptCall,
    Turn,
    extend,
)

SPAWN_TOOLS = frozenset({"Task", "Agent"})
BACKGROUND_STATUSES = frozenset({"async_launched", "running_in_background", "backgrounded"})
LEADER_ID = "main"


# ---------------------------------------------------------------------------------------------
# Finding the files of each session


@dataclass
class SessionFiles:
    main: Path
    subagents: list[tuple[Path, str]] = field(default_factory=list)  # (file, "flat"/"nested")


def find_sessions(path: str | os.PathLike[str], report: ImportReport) -> list[SessionFiles]:
    """The sessions under `path` (a session file or a folder), each with its subagent files."""
    root = Path(path)
    if root.is_file():
        return [_with_subagents(root, _flat_agent_files(root.parent))]
    if not root.is_dir():
        report.problem("no such file or folder", str(root))
        return []
    sessions: list[SessionFiles] = []
    claimed: set[Path] = set()
    by_folder: dict[Path, dict[str, list[Path]]] = {}
    mains = sorted(
        p
        for p in root.rglob("*.jsonl")
        if not p.name.startswith("agent-") and p.parent.name != "subagents"
    )
    for main in mains:
        flat = by_folder.setdefault(main.parent, _flat_agent_files(main.parent))
        files = _with_subagents(main, flat)
        claimed.update(p for p, _ in files.subagents)
        sessions.append(files)
    for flat in by_folder.values() or [_flat_agent_files(root)]:
        for orphan in sorted(p for paths in flat.values() for p in paths if p not in claimed):
            report.problem(
                "subagent file names no session found beside it; imported as its own episode",
                str(orphan),
                severity="warning",
            )
            sessions.append(SessionFiles(orphan))
    return sessions


def _with_subagents(main: Path, flat: dict[str, list[Path]]) -> SessionFiles:
    nested_dir = main.with_suffix("") / "subagents"
    nested = sorted(nested_dir.glob("agent-*.jsonl")) if nested_dir.is_dir() else []
    session_id = _peek_session_id(main) or main.stem
    subagents = [(p, "flat") for p in flat.get(session_id, []) if p != main]
    subagents += [(p, "nested") for p in nested]
    return SessionFiles(main, subagents)


def _flat_agent_files(folder: Path) -> dict[str, list[Path]]:
    """`agent-*.jsonl` files of a folder, by the session id their lines carry."""
    out: dict[str, list[Path]] = {}
    for path in sorted(folder.glob("agent-*.jsonl")):
        out.setdefault(_peek_session_id(path) or "", []).append(path)
    return out


def _peek_session_id(path: Path, limit: int = 20) -> str | None:
    try:
        with open(path, "rb") as stream:
            for _, raw in zip(range(limit), stream, strict=False):
                try:
                    data = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    continue
                if isinstance(data, dict) and isinstance(data.get("sessionId"), str):
                    return data["sessionId"]
    except OSError:
        return None
    return None


# ---------------------------------------------------------------------------------------------
# Message content


def _text_of(content: Any) -> str:
    """Plain text of a tool result's or a message's content (string or list of blocks)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_block_text(block) for block in content)
    return orjson.dumps(content).decode()


def _block_text(block: Any) -> str:
    if not isinstance(block, dict):
        return str(block)
    kind = block.get("type")
    if kind == "text":
        return str(block.get("text", ""))
    if kind in ("image", "document"):
        return f"[{kind}]"
    return f"[{kind}]"


def user_messages(content: Any) -> list[Message]:
    """A user line's messages: one `tool` message per tool result, then the user's own text."""
    if isinstance(content, str):
        return [Message("user", content)] if content else []
    if not isinstance(content, list):
        return []
    results: list[Message] = []
    texts: list[str] = []
    for block in content:
        if isinstance(block, dict) and block.get("type") == "tool_result":
            results.append(
                Message(
                    "tool",
                    _text_of(block.get("content")),
                    tool_call_id=str(block.get("tool_use_id") or ""),
                    is_error=bool(block.get("is_error")),
                )
            )
        else:
            texts.append(_block_text(block))
    return results + ([Message("user", "\n".join(texts))] if texts else [])


def assistant_message(lines: list[Line]) -> Message:
    """One API response from its lines, blocks in file order."""
    thinking: list[str] = []
    texts: list[str] = []
    calls: list[ToolCall] = []
    for line in lines:
        content = line.data["message"].get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        for block in blocks if isinstance(blocks, list) else []:
            if not isinstance(block, dict):
                texts.append(str(block))
                continue
            kind = block.get("type")
            if kind == "thinking":
                thinking.append(str(block.get("thinking", "")))
            elif kind == "redacted_thinking":
                thinking.append("[redacted thinking]")
            elif kind == "text":
                texts.append(str(block.get("text", "")))
            elif kind in ("tool_use", "server_tool_use"):
                name = str(block.get("name", ""))
                calls.append(ToolCall(str(block.get("id") or ""), name, block.get("input")))
            else:
                texts.append(f"[{kind}]")
    return Message("assistant", "\n".join(texts), "\n".join(thinking), tuple(calls))


# ---------------------------------------------------------------------------------------------
# One agent's lines (a file, or one tree of the session file) into calls


def _is_tool_results(data: dict[str, Any]) -> bool:
    content = (
        data.get("message", {}).get("content") if isinstance(data.get("message"), dict) else None
    )
    return (
        isinstance(content, list)
        and bool(content)
        and all(isinstance(b, dict) and b.get("type") == "tool_result" for b in content)
    )


def _is_synthetic(data: dict[str, Any]) -> bool:
    message = data["message"]
    return bool(data.get("isApiErrorMessage")) or message.get("model") == "<synthetic>"


@dataclass(eq=False)
class _Response:
    lines: list[int]
    key: str | None
    call: TranscriptCall | None = None
    tool_tail: int | None = None  # latest tool-result line answering this response
    copied: bool = False  # an earlier agent's response, repeated in this agent's history
    turn: Turn | None = None  # the history ending with a copied response


@dataclass(eq=False)
class Unit:
    """The lines of one agent, with what is needed to link it to its parent."""

    agent: TranscriptAgent
    lines: list[Line]
    file_rank: int
    layout: str
    claude_agent_id: str | None = None
    first_prompt: str | None = None
    spawns: list[tuple[TranscriptCall, ToolCall]] = field(default_factory=list)
    results: dict[str, tuple[str, str | None]] = field(default_factory=dict)  # agentId -> use
    failed_uses: set[str] = field(default_factory=set)  # tool calls whose result is an error
    copied_responses: int = 0  # responses of earlier agents its history repeats (a fork)


class UnitBuilder:
    """Turns one agent's lines into calls with their histories, accounting for each line."""

    def __init__(self, unit: Unit, report: ImportReport, earlier_responses: set[str]):
        self.unit = unit
        self.report = report
        self.earlier_responses = earlier_responses  # message ids already made into calls
        self.lines = unit.lines
        count = len(self.lines)
        self.parent: list[int | None] = [None] * count
        self.response_of: list[_Response | None] = [None] * count
        self.tool_owner: list[_Response | None] = [None] * count
        self.turns: list[Turn | None] = [None] * count
        self.order: list[tuple[Any, ...]] = []
        self.not_kept: set[str] = set()
        self.call_ids = CallIds(unit.agent.id)
        self.seen: dict[str, int] = {}  # uuid -> latest line so far, during the history pass
        self.open_boundaries: list[int] = []
        self.summaries: list[tuple[int, int | None]] = []
        # Partial compaction: preserved message uuid -> (anchor uuid, uuid before it), and the
        # post-compaction history at each preserved message.
        self.preserved_before: dict[str, tuple[str, str]] = {}
        self.preserved_turns: dict[str, Turn] = {}

    # -- passes --------------------------------------------------------------------------------

    def build(self) -> None:
        self._resolve_parents()
        self._group_responses()
        for i, line in enumerate(self.lines):
            self._history(i, line)
            uuid = line.data.get("uuid")
            if isinstance(uuid, str):
                self.seen[uuid] = i
        for s, boundary in self.summaries:
            self._compaction_call(s, boundary)
        for b in self.open_boundaries:
            line = self.lines[b]
            self.report.used[line.file].pop(line.number, None)
            self.report.problem(
                "compact boundary without a summary line; no compaction call made",
                line.file,
                line.number,
                severity="warning",
            )

    def _resolve_parents(self) -> None:
        """Each line's parent: the latest earlier line with that uuid (append-only log)."""
        latest: dict[str, int] = {}
        last_time: float | None = None
        for i, line in enumerate(self.lines):
            data = line.data
            time = parse_timestamp(data.get("timestamp"))
            last_time = time if time is not None else last_time
            self.order.append((last_time or 0.0, self.unit.file_rank, line.number))
            for uuid in data.get("supersedesUuids") or ():
                self.not_kept.add(str(uuid))
            for uuid in data.get("retractedMessageUuids") or ():
                self.not_kept.add(str(uuid))
            parent = data.get("parentUuid")
            if isinstance(parent, str):
                found = latest.get(parent)
                if found is None:
                    self.report.problem(
                        f"parentUuid {parent!r} names no earlier line of this agent; "
                        "its history starts here",
                        line.file,
                        line.number,
                        severity="warning",
                    )
                self.parent[i] = found
            uuid = data.get("uuid")
            if isinstance(uuid, str):
                latest[uuid] = i

    def _group_responses(self) -> None:
        open_by_key: dict[str, _Response] = {}
        for i, line in enumerate(self.lines):
            data = line.data
            if data.get("type") != "assistant" or not isinstance(data.get("message"), dict):
                continue
            if _is_synthetic(data):
                continue
            message_id = data["message"].get("id")
            key = message_id or data.get("requestId")
            key = key if isinstance(key, str) else None
            current = open_by_key.get(key) if key else None
            parent = self.parent[i]
            joins = current is not None and (
                isinstance(message_id, str)
                or (parent is not None and self.response_of[parent] is current)
            )
            if joins:
                current.lines.append(i)  # type: ignore[union-attr]
                self.response_of[i] = current
                continue
            response = _Response([i], key, copied=message_id in self.earlier_responses)
            self.response_of[i] = response
            if key:
                open_by_key[key] = response

    def _effective_parent(self, i: int) -> int | None:
        """Parallel tool results hang off different lines of one response; chain them."""
        parent = self.parent[i]
        uuid = self.lines[i].data.get("uuid")
        if parent is not None and uuid in self.preserved_before:
            anchor, before = self.preserved_before[uuid]  # relinked to the summary on compaction
            if self.lines[parent].data.get("uuid") == anchor:
                parent = self.seen.get(before, parent)
        if parent is None:
            return None
        owner = self.tool_owner[parent] or self.response_of[parent]
        if owner is not None and owner.tool_tail is not None:
            parent = owner.tool_tail
        if _is_tool_results(self.lines[i].data):
            owner = self.tool_owner[parent] or self.response_of[parent]
            if owner is not None:
                self.tool_owner[i] = owner
                owner.tool_tail = i
        return parent

    def _history(self, i: int, line: Line) -> None:
        data = line.data
        parent = self._effective_parent(i)
        before = self.turns[parent] if parent is not None else None
        parent_uuid = self.lines[parent].data.get("uuid") if parent is not None else None
        if parent_uuid in self.preserved_turns and data.get("uuid") not in self.preserved_before:
            before = self.preserved_turns[parent_uuid]
        kind = data.get("type")
        response = self.response_of[i]
        if response is not None and response.copied:
            if response.turn is None:
                lines = [self.lines[j] for j in response.lines]
                response.turn = Turn(assistant_message(lines), before)
                self.unit.copied_responses += 1
            self.turns[i] = response.turn
            self.report.use(line, "message (an earlier agent's response, repeated)")
            return
        if response is not None:
            if response.call is None:
                response.call = self._make_call(response, before)
                self.report.use(line, "call")
            else:
                self.report.use(line, "call (further block)")
            self.turns[i] = response.call.answer
            return
        self.turns[i] = before
        if kind == "user" and isinstance(data.get("message"), dict):
            if data.get("isCompactSummary"):
                self._summary(i, line)
                return
            messages = user_messages(data["message"].get("content"))
            if not messages:
                self.report.skip(line, "user line with no content")
                return
            self.turns[i] = extend(before, messages)
            self._note_result(data)
            self.unit.failed_uses.update(m.tool_call_id or "" for m in messages if m.is_error)
            if self.unit.first_prompt is None and messages[-1].role == "user":
                self.unit.first_prompt = messages[-1].text
            self.report.use(line, "message")
        elif kind == "assistant":
            self.report.skip(
                line,
                "assistant line that is not a model response (synthetic API error message)"
                if isinstance(data.get("message"), dict)
                else "assistant line without a message",
            )
        elif kind == "system" and data.get("subtype") == "compact_boundary":
            self.open_boundaries.append(i)
            self.preserved_before.update(preserved_links(data))
            self.report.use(line, "compaction boundary")
        elif kind == "system":
            self.report.skip(line, f"system record ({data.get('subtype')}) is not a model message")
        else:
            self.report.skip(line, f"{kind or 'untyped'} record is not a model message")

    def _note_result(self, data: dict[str, Any]) -> None:
        """A Task/Agent result names the subagent it ran (`toolUseResult.agentId`)."""
        result = data.get("toolUseResult")
        if not isinstance(result, dict) or not isinstance(result.get("agentId"), str):
            return
        content = data["message"].get("content")
        use_id = (
            next(
                (
                    b.get("tool_use_id")
                    for b in content
                    if isinstance(b, dict) and b.get("type") == "tool_result"
                ),
                None,
            )
            if isinstance(content, list)
            else None
        )
        status = result.get("status") if isinstance(result.get("status"), str) else None
        if isinstance(use_id, str):
            self.unit.results[result["agentId"]] = (use_id, status)

    def _make_call(self, response: _Response, context: Turn | None) -> TranscriptCall:
        lines = [self.lines[j] for j in response.lines]
        first, last = lines[0].data, lines[-1].data
        message = assistant_message(lines)
        agent = self.unit.agent
        call = TranscriptCall(
            id=self.call_ids.new(response.key or f"line{lines[0].number}"),
            agent=agent,
            context=context,
            response=message,
            order=self.order[response.lines[0]],
            kept=not any(
                self.lines[j].data.get("uuid") in self.not_kept
                or self.lines[j].data.get("isAbortedMidStream")
                for j in response.lines
            ),
            content=_call_content(lines, first, last),
        )
        agent.calls.append(call)
        for tool in message.tool_calls:
            if tool.name in SPAWN_TOOLS:
                self.unit.spawns.append((call, tool))
        return call

    # -- compaction ----------------------------------------------------------------------------

    def _summary(self, i: int, line: Line) -> None:
        """The summary restarts the history (then any messages a partial compaction kept)."""
        boundary = self.open_boundaries.pop() if self.open_boundaries else None
        self.summaries.append((i, boundary))
        text = _text_of(line.data["message"].get("content"))
        turn = Turn(Message("user", text), None)
        meta = (
            (self.lines[boundary].data.get("compactMetadata") or {}) if boundary is not None else {}
        )
        for uuid in (meta.get("preservedMessages") or {}).get("uuids") or ():
            index = self._find(str(uuid))
            if index is not None:
                turn = extend(turn, self._messages_at(index))  # type: ignore[assignment]
                self.preserved_turns[str(uuid)] = turn
        self.turns[i] = turn
        self.report.use(line, "compaction summary")

    def _compaction_call(self, s: int, boundary: int | None) -> None:
        summary_line = self.lines[s]
        anchor = boundary if boundary is not None else s
        compaction_call(
            self.unit.agent,
            self.call_ids.new(f"compact-{self.lines[anchor].number}"),
            self._compacted_history(s, boundary),
            _text_of(summary_line.data["message"].get("content")),
            self.order[anchor],
            {
                "source": {
                    "file": summary_line.file,
                    "lines": sorted({self.lines[anchor].number, summary_line.number}),
                },
                "trigger": (self.lines[anchor].data.get("compactMetadata") or {}).get("trigger"),
            },
        )

    def _compacted_history(self, s: int, boundary: int | None) -> Turn | None:
        """What the compaction summarised: up to `logicalParentUuid`, else the summary's parent."""
        if boundary is not None:
            logical = self.lines[boundary].data.get("logicalParentUuid")
            index = self._find(logical, boundary) if isinstance(logical, str) else None
            if index is not None:
                return self.turns[index]
        parent = self.parent[s]
        if parent is not None and parent != boundary:
            return self.turns[parent]
        return None

    def _find(self, uuid: str, before: int | None = None) -> int | None:
        """The latest line with `uuid` before `before`, else the first one after it."""
        limit = len(self.lines) if before is None else before
        for i in range(limit - 1, -1, -1):
            if self.lines[i].data.get("uuid") == uuid:
                return i
        for i in range(limit, len(self.lines)):
            if self.lines[i].data.get("uuid") == uuid:
                return i
        return None

    def _messages_at(self, index: int) -> list[Message]:
        response = self.response_of[index]
        if response is not None:
            return [assistant_message([self.lines[j] for j in response.lines])]
        message = self.lines[index].data.get("message")
        return user_messages(message.get("content")) if isinstance(message, dict) else []


def _call_content(lines: list[Line], first: dict[str, Any], last: dict[str, Any]) -> dict[str, Any]:
    message = last["message"]
    return {
        "source": {"file": lines[0].file, "lines": [line.number for line in lines]},
        "message_id": first["message"].get("id"),
        "request_id": first.get("requestId"),
        "model": message.get("model"),
        "stop_reason": message.get("stop_reason"),
        "usage": message.get("usage"),
    }


# ---------------------------------------------------------------------------------------------
# A session: its units, built and linked


def import_claude_code(
    path: str | os.PathLike[str], report: ImportReport | None = None
) -> list[Transcript]:
    """Every session under `path` (a session file or a project folder), with its subagents."""
    report = report if report is not None else ImportReport()
    with collector_paused():
        sessions = [_session(files, report) for files in find_sessions(path, report)]
    return [s for s in sessions if s is not None]


def _is_session_file(path: Path, report: ImportReport) -> bool:
    found = sniff(path)
    if found != CLAUDE_CODE:
        refuse_file(path, CLAUDE_CODE, found, report)
    return found == CLAUDE_CODE


def _session(files: SessionFiles, report: ImportReport) -> Transcript | None:
    if not _is_session_file(files.main, report):
        return None
    files.subagents = [(p, how) for p, how in files.subagents if _is_session_file(p, report)]
    main_lines = list(read_json_lines(files.main, report))
    session_id = next(
        (ln.data["sessionId"] for ln in main_lines if isinstance(ln.data.get("sessionId"), str)),
        files.main.stem,
    )
    units = _split_main(main_lines)
    for rank, (path, layout) in enumerate(files.subagents, start=1):
        units.append(_file_unit(path, layout, rank, report))
    responses: set[str] = set()
    for unit in units:
        UnitBuilder(unit, report, responses).build()
        responses.update(
            c.content["message_id"] for c in unit.agent.calls if c.content.get("message_id")
        )
    if not any(unit.agent.calls for unit in units):
        report.problem(
            "no model response in this session: nothing to train on, no episode written",
            str(files.main),
            severity="warning",
        )
        return None
    gaps = _link(units, report)
    leader = units[0].agent
    others = sorted(
        (u.agent for u in units[1:]), key=lambda a: a.calls[0].order if a.calls else (1e300,)
    )
    return Transcript(
        id=session_id,
        agents=[leader, *others],
        gaps=gaps,
        task={"prompt": units[0].first_prompt} if units[0].first_prompt else None,
        meta={
            "source": "claude-code",
            "files": [str(files.main)] + [str(p) for p, _ in files.subagents],
            "version": next(
                (
                    ln.data["version"]
                    for ln in main_lines
                    if isinstance(ln.data.get("version"), str)
                ),
                None,
            ),
        },
    )


def _split_main(lines: list[Line]) -> list[Unit]:
    """The leader's lines and each inline sidechain's, by the tree each line belongs to."""
    root_of: list[int] = []
    latest: dict[str, int] = {}
    last_of_side: dict[bool, int] = {}  # a dangling parent (a lost line) keeps its side's tree
    for i, line in enumerate(lines):
        parent = line.data.get("parentUuid")
        side = line.data.get("isSidechain") is True
        found = latest.get(parent) if isinstance(parent, str) else None
        if found is None and line.data.get("subtype") == "compact_boundary":
            logical = line.data.get("logicalParentUuid")
            found = latest.get(logical) if isinstance(logical, str) else None
        elif found is None and isinstance(parent, str):
            found = last_of_side.get(side)
        root_of.append(root_of[found] if found is not None else i)
        if isinstance(line.data.get("uuid"), str):
            latest[line.data["uuid"]] = i
            last_of_side[side] = i
    has_main_messages = any(
        ln.data.get("type") in ("user", "assistant") and not ln.data.get("isSidechain")
        for ln in lines
    )
    leader = Unit(TranscriptAgent(LEADER_ID, "leader"), [], 0, "main")
    sidechains: dict[int, Unit] = {}
    for i, line in enumerate(lines):
        root = lines[root_of[i]].data
        inline = (
            has_main_messages
            and root.get("isSidechain") is True
            and root.get("type") == "user"
            and root.get("parentUuid") is None
            and not root.get("agentId")
        )
        if not inline:
            leader.lines.append(line)
            continue
        unit = sidechains.get(root_of[i])
        if unit is None:
            agent = TranscriptAgent(f"sidechain-{len(sidechains) + 1}", "subagent", start="fresh")
            unit = sidechains[root_of[i]] = Unit(agent, [], 0, "inline")
            agent.meta = {"layout": "inline", "file": line.file}
        unit.lines.append(line)
    return [leader, *sidechains.values()]


def _file_unit(path: Path, layout: str, rank: int, report: ImportReport) -> Unit:
    lines = list(read_json_lines(path, report))
    claude_id = next(
        (ln.data["agentId"] for ln in lines if isinstance(ln.data.get("agentId"), str)),
        path.stem.removeprefix("agent-"),
    )
    meta: dict[str, Any] = {"layout": layout, "file": str(path), "claude_agent_id": claude_id}
    meta_path = path.with_suffix(".meta.json")
    if meta_path.is_file():
        try:
            extra = orjson.loads(meta_path.read_bytes())
        except orjson.JSONDecodeError as error:
            report.problem(f"not valid JSON: {error}", str(meta_path))
        else:
            if isinstance(extra, dict):
                meta["meta_json"] = extra
            else:
                report.problem(
                    f"not a JSON object (a {type(extra).__name__}); ignored", str(meta_path)
                )
    agent_type = (meta.get("meta_json") or {}).get("agentType")
    agent = TranscriptAgent(
        f"agent-{claude_id}", str(agent_type or "subagent"), start="fresh", meta=meta
    )
    return Unit(agent, lines, rank, layout, claude_agent_id=claude_id)


def _link(units: list[Unit], report: ImportReport) -> list[Gap]:
    """Each subagent's parent agent and spawning call; unlinkable ones become gaps."""
    spawns = [(call, tool) for unit in units for call, tool in unit.spawns]
    by_use_id = {tool.id: (call, tool) for call, tool in spawns if tool.id}
    results = {key: value for unit in units for key, value in unit.results.items()}
    claimed: set[int] = set()
    gaps: list[Gap] = []
    for unit in units[1:]:
        found, how, status = None, None, None
        if unit.claude_agent_id and unit.claude_agent_id in results:
            use_id, status = results[unit.claude_agent_id]
            found, how = by_use_id.get(use_id), "toolUseResult.agentId"
        if found is None and unit.first_prompt is not None:
            found = next(
                (
                    (call, tool)
                    for call, tool in spawns
                    if id(tool) not in claimed
                    and isinstance(tool.arguments, dict)
                    and tool.arguments.get("prompt") == unit.first_prompt
                ),
                None,
            )
            how = "prompt"
        agent = unit.agent
        if found is None:
            agent.parent = None
            gaps.append(
                Gap(
                    kind="subagent_parent_unavailable",
                    agent=agent.id,
                    file=agent.meta.get("file"),
                    reason="no Task/Agent call names this subagent (no toolUseResult.agentId "
                    "and no Task prompt equal to its first prompt)",
                )
            )
            continue
        call, tool = found
        claimed.add(id(tool))
        arguments = tool.arguments if isinstance(tool.arguments, dict) else {}
        agent.parent = call.agent.id
        agent.start = _start_of(arguments, status, agent.meta, unit.copied_responses)
        if arguments.get("subagent_type"):
            agent.name = str(arguments["subagent_type"])
        description = arguments.get("description")
        agent.spawn = Spawn(
            call=call.id,
            tool_call_id=tool.id or None,
            link=how,
            description=description if isinstance(description, str) else None,
        )
    gaps += _missing_subagents(units, spawns, claimed, report)
    return gaps


def _start_of(
    arguments: dict[str, Any], status: str | None, meta: dict[str, Any], copied: int
) -> str:
    """`background` when it ran alongside its parent; `fork` when it started from the parent's
    conversation (its history repeats the parent's responses); else `fresh`."""
    if arguments.get("run_in_background") is True or status in BACKGROUND_STATUSES:
        return "background"
    extra = meta.get("meta_json") or {}
    if copied or arguments.get("subagent_type") == "fork" or extra.get("fork") is True:
        return "fork"
    return "fresh"


def _missing_subagents(
    units: list[Unit],
    spawns: list[tuple[TranscriptCall, ToolCall]],
    claimed: set[int],
    report: ImportReport,
) -> list[Gap]:
    """Spawn calls whose subagent has no transcript among the files read: gaps and warnings."""
    present = {u.claude_agent_id for u in units if u.claude_agent_id}
    named = {use_id: agent for u in units for agent, (use_id, _) in u.results.items()}
    failed = {use_id for u in units for use_id in u.failed_uses}
    # an unlinked subagent may be the one an unnamed spawn started: its own gap says so
    unlinked = any(u.agent.spawn is None for u in units[1:])
    gaps: list[Gap] = []
    for call, tool in spawns:
        if id(tool) in claimed or tool.id in failed:  # a failed spawn started no subagent
            continue
        agent = named.get(tool.id)
        if (agent is not None and agent in present) or (agent is None and unlinked):
            continue
        if agent is not None:
            kind = "subagent_file_missing"
            reason = (
                f"the call started subagent {agent!r}, whose file agent-{agent}.jsonl was not "
                "found beside the session or under its subagents folder: its calls are lost"
            )
        else:
            kind = "subagent_transcript_missing"
            reason = "the call started a subagent whose transcript is not among the files read"
        file = call.content.get("source", {}).get("file")
        gaps.append(
            Gap(
                kind=kind,
                agent=None if agent is None else f"agent-{agent}",
                call=call.id,
                file=file,
                reason=reason,
            )
        )
        report.problem(f"{call.id}: {reason}", file, severity="warning")
    return gaps

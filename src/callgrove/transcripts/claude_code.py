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

Each line is decoded once into a typed record (`claude_records`); each agent's lines become an
immutable graph from which its histories and calls are derived (`claude_history`); this module
finds the files, splits the session file into agents, and links subagents to their spawns.
"""

from __future__ import annotations

import math
import os
from collections import ChainMap, Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import orjson

from callgrove.chat.message import Message, ToolCall
from callgrove.episode import Gap, Spawn
from callgrove.transcripts.accounting import (
    CLAUDE_CODE,
    ImportReport,
    collector_paused,
    parse_timestamp,
    read_records,
    refuse_file,
    sniff,
)
from callgrove.transcripts.claude_history import (
    AgentHistory,
    Earlier,
    Entry,
    LineGraph,
    build_graph,
    derive_history,
    fork_context,
)
from callgrove.transcripts.claude_history import user_messages as _user_messages
from callgrove.transcripts.claude_records import (
    AssistantLine,
    OtherLine,
    SpawnArguments,
    SystemLine,
    UserLine,
    decode_content,
    decode_line,
    decode_raw,
    links_of,
)
from callgrove.transcripts.turns import (
    Transcript,
    TranscriptAgent,
    TranscriptCall,
    Turn,
    parent_unavailable,
)

BACKGROUND_STATUSES = frozenset({"async_launched", "running_in_background", "backgrounded"})
LEADER_ID = "main"


# ---------------------------------------------------------------------------------------------
# Finding the files of each session


@dataclass
class SessionFiles:
    main: Path
    subagents: list[tuple[Path, str]] = field(default_factory=list)  # (file, "flat"/"nested")
    started: float = math.inf  # the time of the file's first timed line (inf: none found)


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
    session_id, started = _peek(main)
    subagents = [(p, "flat") for p in flat.get(session_id or main.stem, []) if p != main]
    subagents += [(p, "nested") for p in nested]
    return SessionFiles(main, subagents, math.inf if started is None else started)


def _flat_agent_files(folder: Path) -> dict[str, list[Path]]:
    """`agent-*.jsonl` files of a folder, by the session id their lines carry."""
    out: dict[str, list[Path]] = {}
    for path in sorted(folder.glob("agent-*.jsonl")):
        out.setdefault(_peek(path)[0] or "", []).append(path)
    return out


def _peek(path: Path, limit: int = 20) -> tuple[str | None, float | None]:
    """The first `sessionId` and the first time among a file's first `limit` lines."""
    session: str | None = None
    started: float | None = None
    try:
        with open(path, "rb") as stream:
            for _, raw in zip(range(limit), stream, strict=False):
                links = links_of(raw)
                if links is None:
                    continue
                if session is None and isinstance(links.session_id, str) and links.session_id:
                    session = links.session_id
                if started is None:
                    started = parse_timestamp(links.timestamp)
                if session is not None and started is not None:
                    break
    except OSError:
        pass
    return session, started


# ---------------------------------------------------------------------------------------------
# Messages API content (also read by the gateway)


def user_messages(content: Any) -> list[Message]:
    """A user message's content (a string or a list of blocks) as normal-form messages."""
    return _user_messages(decode_content(content))


# ---------------------------------------------------------------------------------------------
# One agent: its lines, then what they became


class SubagentMeta(msgspec.Struct, kw_only=True, rename="camel"):
    """The `agent-<id>.meta.json` beside a nested subagent's file: its type, whether it is a
    fork, the tool call that started it and the subagent that did (none: the leader)."""

    agent_type: str | None = None
    is_fork: bool = False
    fork: bool = False  # its name in earlier releases
    tool_use_id: str | None = None
    parent_agent_id: str | None = None
    request_shape: str | None = None  # "foreground" or "background"


@dataclass(eq=False)
class Unit:
    """The lines of one agent, with what is needed to link it to its parent."""

    agent: TranscriptAgent
    entries: list[Entry]
    file_rank: int
    layout: str
    claude_agent_id: str | None = None
    meta: SubagentMeta | None = None


@dataclass(frozen=True, eq=False)
class Built:
    unit: Unit
    graph: LineGraph
    history: AgentHistory


def _build(unit: Unit, report: ImportReport, responses: Earlier, turns: dict) -> Built:
    """The unit's graph and history; every line accounted for in `report`."""
    graph = build_graph(unit.entries, unit.file_rank, responses)
    context = fork_context(graph)
    history = derive_history(graph, unit.agent, turns.get(context) if context else None)
    unit.agent.calls = list(history.calls)
    for i in graph.dangling:
        entry = graph.entries[i]
        report.problem(
            f"parentUuid {entry.record.parent_uuid!r} names no earlier line of this agent; "
            "its history starts here",
            entry.file,
            entry.number,
            severity="warning",
        )
    for outcome in history.outcomes:
        report.account(graph.entries[outcome.line], outcome)
    return Built(unit, graph, history)


# ---------------------------------------------------------------------------------------------
# A session: its units, built and linked


def import_claude_code(
    path: str | os.PathLike[str], report: ImportReport | None = None
) -> list[Transcript]:
    """Every session under `path` (a session file or a project folder), with its subagents.

    `claude --continue --fork-session` starts a session whose file begins with the earlier
    session's lines, uuids and message ids unchanged. Sessions are built in the order they
    started (a forked session's file starts when it forks, after the responses it copies), and
    a response an earlier session made a call is history in a later one: each trains once."""
    report = report if report is not None else ImportReport()
    sessions = find_sessions(path, report)
    made: dict[str, str] = {}  # response key -> the session it is a call of
    built: dict[int, Transcript] = {}
    with collector_paused():
        for k in sorted(range(len(sessions)), key=lambda k: (sessions[k].started, k)):
            transcript = _session(sessions[k], made, report)
            if transcript is not None:
                built[k] = transcript
    return [built[k] for k in sorted(built)]


def _is_session_file(path: Path, report: ImportReport) -> bool:
    found = sniff(path)
    if found != CLAUDE_CODE:
        refuse_file(path, CLAUDE_CODE, found, report)
    return found == CLAUDE_CODE


def _entries(path: Path, report: ImportReport) -> list[Entry]:
    file = str(path)
    return [
        Entry(file, number, record)
        for number, record in read_records(path, report, decode_raw, decode_line)
    ]


def _session(files: SessionFiles, made: dict[str, str], report: ImportReport) -> Transcript | None:
    """One session's transcript; `made`: the responses sessions built before it made calls,
    which this one's lines repeat as history (updated with this session's own calls)."""
    if not _is_session_file(files.main, report):
        return None
    files.subagents = [(p, how) for p, how in files.subagents if _is_session_file(p, report)]
    main = _entries(files.main, report)
    session_id = next((e.record.session_id for e in main if e.record.session_id), files.main.stem)
    units = _split_main(main)
    files_units = [
        _file_unit(path, layout, rank, report)
        for rank, (path, layout) in enumerate(files.subagents, start=1)
    ]
    units += _parents_first(files_units)
    own: dict[str, str | None] = {}  # this session's calls (None: made by an agent here)
    responses = ChainMap(own, made)
    turns: dict[str, Turn | None] = {}  # uuid -> history there, of the agents built so far
    built: list[Built] = []
    for unit in units:
        done = _build(unit, report, responses, turns)
        built.append(done)
        for call in done.history.calls:
            key = call.content.message_id or call.content.request_id
            if key:
                own[key] = None
        turns.update(done.history.turn_at(done.graph))
    made.update(dict.fromkeys(own, session_id))
    _report_copies(built, session_id, files, report)
    if not any(unit.agent.calls for unit in units):
        report.problem(
            "no model response in this session: nothing to train on, no episode written",
            str(files.main),
            severity="warning",
        )
        return None
    gaps = _link(built, report)
    leader = units[0].agent
    others = sorted(
        (u.agent for u in units[1:]), key=lambda a: a.calls[0].order if a.calls else (1e300,)
    )
    first_prompt = built[0].history.first_prompt
    return Transcript(
        id=session_id,
        agents=[leader, *others],
        gaps=gaps,
        task={"prompt": first_prompt} if first_prompt else None,
        meta={
            "source": "claude-code",
            "files": [str(files.main)] + [str(p) for p, _ in files.subagents],
            "version": next((e.record.version for e in main if e.record.version), None),
        },
    )


def _report_copies(
    built: list[Built], session_id: str, files: SessionFiles, report: ImportReport
) -> None:
    """How many responses the session repeats from each earlier session (a warning each);
    and each response that says another session made it (`requestSessionId`, 2.1.332) but no
    earlier session read here did: it stays a call here, so nothing is lost."""
    copied: Counter[str] = Counter()
    for b in built:
        copied.update(b.history.copied_from)
        for response in b.graph.responses:
            first = b.graph.entries[response.lines[0]]
            record = first.record
            maker = record.request_session_id if isinstance(record, AssistantLine) else None
            if not response.copied and maker and maker != session_id:
                report.problem(
                    f"this response names session {maker} as the one that made it "
                    "(requestSessionId), and no session read before this one holds it: "
                    "kept as a call here",
                    first.file,
                    first.number,
                    severity="warning",
                )
    for maker, count in sorted(copied.items()):
        report.problem(
            f"{count} response(s) repeat those of session {maker} (`claude --continue "
            "--fork-session` copies the earlier session's lines): history here, trained once, "
            f"as calls of {maker}",
            str(files.main),
            severity="warning",
        )


def _split_main(entries: list[Entry]) -> list[Unit]:
    """The leader's lines and each inline sidechain's, by the tree each line belongs to."""
    root_of: list[int] = []
    latest: dict[str, int] = {}
    last_of_side: dict[bool, int] = {}  # a dangling parent (a lost line) keeps its side's tree
    for i, entry in enumerate(entries):
        record = entry.record
        parent = record.parent_uuid
        found = latest.get(parent) if parent is not None else None
        if found is None and isinstance(record, SystemLine) and record.is_compact_boundary:
            logical = record.logical_parent_uuid
            found = latest.get(logical) if logical is not None else None
        elif found is None and parent is not None:
            found = last_of_side.get(record.is_sidechain)
        root_of.append(root_of[found] if found is not None else i)
        if record.uuid is not None:
            latest[record.uuid] = i
            last_of_side[record.is_sidechain] = i
    has_main_messages = any(_is_message(e.record) and not e.record.is_sidechain for e in entries)
    leader = Unit(TranscriptAgent(LEADER_ID, "leader"), [], 0, "main")
    sidechains: dict[int, Unit] = {}
    for i, entry in enumerate(entries):
        root = entries[root_of[i]].record
        inline = (
            has_main_messages
            and root.is_sidechain
            and isinstance(root, UserLine)
            and root.parent_uuid is None
            and not root.agent_id
        )
        if not inline:
            leader.entries.append(entry)
            continue
        unit = sidechains.get(root_of[i])
        if unit is None:
            agent = TranscriptAgent(f"sidechain-{len(sidechains) + 1}", "subagent", start="fresh")
            unit = sidechains[root_of[i]] = Unit(agent, [], 0, "inline")
            agent.meta = {"layout": "inline", "file": entry.file}
        unit.entries.append(entry)
    return [leader, *sidechains.values()]


def _is_message(record: Any) -> bool:
    """A user or assistant line, readable or not."""
    return isinstance(record, UserLine | AssistantLine) or (
        isinstance(record, OtherLine) and record.kind in ("user", "assistant")
    )


def _file_unit(path: Path, layout: str, rank: int, report: ImportReport) -> Unit:
    entries = _entries(path, report)
    claude_id = next(
        (e.record.agent_id for e in entries if e.record.agent_id),
        path.stem.removeprefix("agent-"),
    )
    meta: dict[str, Any] = {"layout": layout, "file": str(path), "claude_agent_id": claude_id}
    found: SubagentMeta | None = None
    meta_path = path.with_suffix(".meta.json")
    if meta_path.is_file():
        try:
            extra = orjson.loads(meta_path.read_bytes())
        except orjson.JSONDecodeError as error:
            report.problem(f"not valid JSON: {error}", str(meta_path))
        else:
            if isinstance(extra, dict):
                meta["meta_json"] = extra
                try:
                    found = msgspec.convert(extra, SubagentMeta)
                except msgspec.ValidationError as error:
                    report.problem(f"not a subagent description ({error})", str(meta_path))
            else:
                report.problem(
                    f"not a JSON object (a {type(extra).__name__}); ignored", str(meta_path)
                )
    agent_type = found.agent_type if found else None
    agent = TranscriptAgent(
        f"agent-{claude_id}", str(agent_type or "subagent"), start="fresh", meta=meta
    )
    return Unit(agent, entries, rank, layout, claude_agent_id=claude_id, meta=found)


def _parents_first(units: list[Unit]) -> list[Unit]:
    """Subagent files in an order where each comes after the subagent that started it
    (`parentAgentId` in its meta.json): a fork's file repeats its parent's responses, and a
    response is the call of the first agent built that holds it, so the parent must come
    first, whatever the files' names."""
    by_id = {unit.claude_agent_id: unit for unit in units if unit.claude_agent_id}
    placed: set[int] = set()
    ordered: list[Unit] = []

    def place(unit: Unit, path: frozenset[int]) -> None:
        if id(unit) in placed:
            return
        parent = by_id.get(unit.meta.parent_agent_id) if unit.meta else None
        if parent is not None and id(parent) not in path:  # a cycle is no order: keep the file's
            place(parent, path | {id(unit)})
        placed.add(id(unit))
        ordered.append(unit)

    for unit in units:
        place(unit, frozenset())
    return ordered


def _link(built: list[Built], report: ImportReport) -> list[Gap]:
    """Each subagent's parent agent and spawning call; unlinkable ones become gaps."""
    spawns = [spawn for b in built for spawn in b.history.spawns]
    by_use_id = {tool.id: k for k, (_, tool) in enumerate(spawns) if tool.id}
    results = {key: value for b in built for key, value in b.history.results.items()}
    claimed: set[int] = set()  # spawning tool calls linked so far (places in `spawns`)
    gaps: list[Gap] = []
    for b in built[1:]:
        unit, first_prompt = b.unit, b.history.first_prompt
        found: int | None = None
        how, status = None, None
        if unit.claude_agent_id and unit.claude_agent_id in results:
            use_id, status = results[unit.claude_agent_id]
            found, how = by_use_id.get(use_id), "toolUseResult.agentId"
        if found is None and unit.meta and unit.meta.tool_use_id in by_use_id:
            # a subagent's own spawns get no toolUseResult naming the agent (2.1.332)
            found, how = by_use_id[unit.meta.tool_use_id], "meta.json toolUseId"
        if found is None and first_prompt is not None:
            found = next(
                (
                    k
                    for k, (_, tool) in enumerate(spawns)
                    if k not in claimed and SpawnArguments.of(tool.arguments).prompt == first_prompt
                ),
                None,
            )
            how = "prompt"
        agent = unit.agent
        if found is None:
            agent.parent = None
            gaps.append(
                parent_unavailable(
                    agent,
                    "no Task/Agent call names this subagent (no toolUseResult.agentId "
                    "and no Task prompt equal to its first prompt)",
                )
            )
            continue
        call, tool = spawns[found]
        claimed.add(found)
        arguments = SpawnArguments.of(tool.arguments)
        agent.parent = call.agent.id
        agent.start = _start_of(arguments, status, unit.meta, b.history.copied_responses)
        agent.name = arguments.subagent_type or agent.name
        agent.spawn = Spawn(
            call=call.id, tool_call_id=tool.id or None, link=how, description=arguments.description
        )
    gaps += _missing_subagents(built, spawns, claimed, report)
    return gaps


def _start_of(
    arguments: SpawnArguments, status: str | None, meta: SubagentMeta | None, copied: int
) -> str:
    """`SpawnArguments.start`: the launch status tells whether it ran in the background (an
    async launch) or not (any other status); a fork's history repeats its parent's responses."""
    said_fork = meta is not None and (meta.is_fork or meta.fork)
    if status is not None:
        ran_in_background: bool | None = status in BACKGROUND_STATUSES
    elif meta is not None and meta.request_shape in ("foreground", "background"):
        ran_in_background = meta.request_shape == "background"
    else:
        ran_in_background = None
    return arguments.start(ran_in_background=ran_in_background, forked=bool(copied) or said_fork)


def _missing_subagents(
    built: list[Built],
    spawns: list[tuple[TranscriptCall, ToolCall]],
    claimed: set[int],
    report: ImportReport,
) -> list[Gap]:
    """Spawn calls whose subagent has no transcript among the files read: gaps and warnings."""
    present = {b.unit.claude_agent_id for b in built if b.unit.claude_agent_id}
    named = {use_id: agent for b in built for agent, (use_id, _) in b.history.results.items()}
    failed = {use_id for b in built for use_id in b.history.failed_uses}
    # an unlinked subagent may be the one an unnamed spawn started: its own gap says so
    unlinked = any(b.unit.agent.spawn is None for b in built[1:])
    gaps: list[Gap] = []
    for k, (call, tool) in enumerate(spawns):
        if k in claimed or tool.id in failed:  # a failed spawn started no subagent
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
        file = call.content.source.file
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

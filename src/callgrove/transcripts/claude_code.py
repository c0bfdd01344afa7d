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

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import orjson

from callgrove.episode import Gap, Spawn
from callgrove.transcripts.claude_history import (
    AgentHistory,
    Earlier,
    Entry,
    LineGraph,
    build_graph,
    derive_history,
    fork_context,
    is_response,
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
    session_of,
)
from callgrove.transcripts.ledger import (
    CLAUDE_CODE,
    ImportReport,
    collector_paused,
    parse_timestamp,
    read_records,
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
                if found := session_of(raw):
                    return found
    except OSError:
        return None
    return None


# ---------------------------------------------------------------------------------------------
# Messages API content (also read by the gateway)


def user_messages(content: Any) -> list[Message]:
    """A user message's content (a string or a list of blocks) as normal-form messages."""
    return _user_messages(decode_content(content))


# ---------------------------------------------------------------------------------------------
# One agent: its lines, then what they became


class SubagentMeta(msgspec.Struct, kw_only=True, rename="camel"):
    """The `agent-<id>.meta.json` beside a nested subagent's file."""

    agent_type: str | None = None
    is_fork: bool = False
    fork: bool = False  # its name in earlier releases


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


@dataclass(eq=False)
class SessionLines:
    """One session's files, read: its agents' lines, not yet built."""

    files: SessionFiles
    id: str
    main: list[Entry]
    units: list[Unit]
    started: float  # the time of its file's first timed line (a fork-session's copies are older)


def import_claude_code(
    path: str | os.PathLike[str], report: ImportReport | None = None
) -> list[Transcript]:
    """Every session under `path` (a session file or a project folder), with its subagents;
    a response several sessions' files hold becomes a call of the session that made it only
    (`made_elsewhere`)."""
    report = report if report is not None else ImportReport()
    with collector_paused():
        read = [_read(files, report) for files in find_sessions(path, report)]
        lines = [s for s in read if s is not None]
        sessions = [
            _session(s, elsewhere, report)
            for s, elsewhere in zip(lines, made_elsewhere(lines), strict=True)
        ]
    return [s for s in sessions if s is not None]


def made_elsewhere(sessions: list[SessionLines]) -> list[dict[str, str]]:
    """For each session, the responses its files repeat that another session read here made:
    response key -> that session's id.

    `claude --continue --fork-session` starts a session whose file begins with the earlier
    session's lines, uuids and message ids unchanged. The session that made a response is the
    one its lines name in `requestSessionId` (2.1.332 writes it on the copies), else (earlier
    releases copy the lines as they were) the one that started first: a fork-session's file
    starts when it forks, after the responses it copies."""
    holders: dict[str, list[int]] = {}
    named: dict[str, str] = {}
    for k, session in enumerate(sessions):
        for unit in session.units:
            for entry in unit.entries:
                record = entry.record
                key = record.response_key() if isinstance(record, AssistantLine) else None
                if key is None or not is_response(record):
                    continue
                places = holders.setdefault(key, [])
                if not places or places[-1] != k:
                    places.append(k)
                maker = record.request_session_id
                if maker and maker != session.id:
                    named[key] = maker
    place_of = {session.id: k for k, session in enumerate(sessions)}
    out: list[dict[str, str]] = [{} for _ in sessions]
    for key, places in holders.items():
        if len(places) < 2:
            continue
        maker = place_of.get(named.get(key, ""))
        if maker not in places:
            maker = min(places, key=lambda k: (sessions[k].started, k))
        for k in places:
            if k != maker:
                out[k][key] = sessions[maker].id
    return out


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


def _read(files: SessionFiles, report: ImportReport) -> SessionLines | None:
    if not _is_session_file(files.main, report):
        return None
    files.subagents = [(p, how) for p, how in files.subagents if _is_session_file(p, report)]
    main = _entries(files.main, report)
    units = _split_main(main)
    for rank, (path, layout) in enumerate(files.subagents, start=1):
        units.append(_file_unit(path, layout, rank, report))
    times = (parse_timestamp(e.record.timestamp) for e in main)
    return SessionLines(
        files,
        next((e.record.session_id for e in main if e.record.session_id), files.main.stem),
        main,
        units,
        next((t for t in times if t is not None), float("inf")),
    )


def _session(
    lines: SessionLines, elsewhere: dict[str, str], report: ImportReport
) -> Transcript | None:
    files, main, units = lines.files, lines.main, lines.units
    responses: Earlier = dict(elsewhere)
    turns: dict[str, Turn | None] = {}  # uuid -> history there, of the agents built so far
    built: list[Built] = []
    for unit in units:
        done = _build(unit, report, responses, turns)
        built.append(done)
        for call in done.history.calls:
            key = call.content.message_id or call.content.request_id
            if key:
                responses.setdefault(key, None)
        turns.update(done.history.turn_at(done.graph))
    copied: Counter[str] = Counter()
    for b in built:
        copied.update(b.history.copied_from)
    for maker, count in sorted(copied.items()):
        report.problem(
            f"{count} response(s) repeat those of session {maker} (`claude --continue "
            "--fork-session` copies the earlier session's lines): history here, trained once, "
            f"as calls of {maker}",
            str(files.main),
            severity="warning",
        )
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
        id=lines.id,
        agents=[leader, *others],
        gaps=gaps,
        task={"prompt": first_prompt} if first_prompt else None,
        meta={
            "source": "claude-code",
            "files": [str(files.main)] + [str(p) for p, _ in files.subagents],
            "version": next((e.record.version for e in main if e.record.version), None),
        },
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
    return arguments.start(
        ran_in_background=None if status is None else status in BACKGROUND_STATUSES,
        forked=bool(copied) or said_fork,
    )


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

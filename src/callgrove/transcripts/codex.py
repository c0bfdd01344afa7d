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

Each line is decoded once into a typed record (`codex_records`); the lines are placed in their
threads, each thread's become an immutable graph of steps, and its calls are derived from that
(`codex_history`); this module reads the files and joins subagent threads to their parents.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from callgrove.episode import Gap, Spawn
from callgrove.transcripts.accounting import (
    CODEX,
    ImportReport,
    Outcome,
    collector_paused,
    read_json_lines,
    refuse_file,
    running_times,
    sniff,
)
from callgrove.transcripts.codex_history import (
    RolloutEntry,
    ThreadGraph,
    ThreadHistory,
    build_graph,
    derive_thread,
    input_messages,
    place_lines,
    response_message,
)
from callgrove.transcripts.codex_records import SessionMeta, agent_name, decode_record
from callgrove.transcripts.turns import Transcript, TranscriptAgent, parent_unavailable

__all__ = ["import_codex", "input_messages", "response_message"]


@dataclass(frozen=True, eq=False)
class Thread:
    """A thread's graph, what was derived from it, and the agent it becomes."""

    graph: ThreadGraph
    history: ThreadHistory
    agent: TranscriptAgent

    @property
    def id(self) -> str:
        return self.graph.id

    @property
    def parent_id(self) -> str | None:
        return self.graph.start.meta.parent()


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
    with collector_paused():
        entries: list[RolloutEntry] = []
        spans: list[range] = []
        for rank, file in enumerate(files):
            start = len(entries)
            entries += _entries(file, rank, report)
            spans.append(range(start, len(entries)))
        placement = place_lines(entries, spans)
        threads = []
        outcomes = list(placement.outcomes)
        for start in placement.threads:
            runs = [run for run in placement.runs if run.thread == start.id]
            graph = build_graph(start, runs, entries)
            meta = start.meta
            name = agent_name(meta.agent_role, meta.agent_nickname, meta.agent_path, subagent=False)
            agent = TranscriptAgent(start.id, name, meta={"file": start.file})
            history = derive_thread(graph, entries, agent)
            agent.calls = list(history.calls)
            threads.append(Thread(graph, history, agent))
            outcomes += graph.outcomes
        for outcome in sorted(outcomes, key=_line_of):
            report.account(entries[outcome.line], outcome)
        return _episodes(threads, report)


def _line_of(outcome: Outcome) -> int:
    return outcome.line


def _entries(path: Path, rank: int, report: ImportReport) -> list[RolloutEntry]:
    """The file's lines, decoded; none for a file that is not a Codex rollout (reported)."""
    found = sniff(path)
    if found != CODEX:
        refuse_file(path, CODEX, found, report)
        return []
    lines = list(read_json_lines(path, report))
    records = [decode_record(line.data) for line in lines]
    if lines and not any(isinstance(r, SessionMeta) for r in records):
        report.problem(
            "no session_meta record: not a Codex rollout; its lines are skipped",
            str(path),
            severity="warning",
        )
        for line in lines:
            report.skip(line, "not in a Codex rollout (the file has no session_meta)")
        return []
    times = running_times([r.timestamp for r in records])
    return [
        RolloutEntry(line.file, line.number, rank, time, record)
        for line, record, time in zip(lines, records, times, strict=True)
    ]


def _episodes(threads: list[Thread], report: ImportReport) -> list[Transcript]:
    by_id = {t.id: t for t in threads}
    children: dict[str, list[Thread]] = {}
    roots: list[Thread] = []
    root_ids: set[str] = set()
    gaps_of: dict[str, list[Gap]] = {}
    for thread in threads:
        parent = thread.parent_id
        if parent is not None and parent in by_id and parent != thread.id:
            children.setdefault(parent, []).append(thread)
            continue
        roots.append(thread)
        root_ids.add(thread.id)
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
        if root.id not in root_ids:
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
                task={"prompt": root.graph.first_prompt} if root.graph.first_prompt else None,
                meta={
                    "source": "codex",
                    "files": sorted({m.agent.meta["file"] for m in members}),
                    "cli_version": root.graph.start.meta.cli_version,
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
    meta = child.graph.start.meta
    agent.start = "fork" if meta.forked_from_id else "fresh"
    agent.name = agent_name(meta.agent_role, meta.agent_nickname, meta.agent_path, subagent=True)
    use_id, link = parent.graph.spawned.get(child.id), "spawn event"
    if use_id is None:  # else a spawn tool's output names the new thread
        outputs = parent.graph.outputs.items()
        use_id = next((k for k, text in outputs if child.id in text), None)
        link = "tool output"
    call = parent.history.tool_calls.get(use_id) if use_id else None
    if call is not None:
        agent.spawn = Spawn(call=call.id, tool_call_id=use_id, link=link)

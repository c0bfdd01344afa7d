"""NeMo Gym rollouts as callgrove episodes: every subagent's and every compaction's calls kept.

Gym (0.7.0) records a rollout twice over:
- its token capture store holds one `TokenEntry` per model call, one rollout per file
  (`<rollout_id>.tokens.jsonl`): the exact prompt ids (or, with `prompt_is_delta`, only what
  follows the parent call's full sequence), generation ids and log-probs, `parent_call_id`;
  lost calls are listed in `<rollout_id>.tokens.incomplete` and dangling `.tokens.intents`;
- its rollout records hold one `AgentInvocation` per agent (`invocation_id`,
  `parent_invocation_id`, `status`, `model_calls` as references), in the rollout row's
  `ng_trajectory` (a `TrajectoryRecord`) and `ng_agent_observations` (whose
  `context_compaction` records name the calls that wrote summaries), beside Gym's gaps.

Gym's own builder delivers one chain per rollout; here each invocation is an agent holding the
calls it references, and the forest decides the rest. Captured calls no invocation references
(retries the harness dropped, or calls of unknown owner) are kept for accounting only
(`kept: false`) and listed in the episode's gaps. Without invocation records every call is filed
under one agent, and a gap says so. The records are decoded here from their JSON shape, so
reading needs no Gym install.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from msgspec import UNSET

from callgrove.episode import Episode, episode_from_wire
from callgrove.formats.jsonl import read_rows, report
from callgrove.formats.problems import Diagnostics, InputError, Problem
from callgrove.formats.wire import FORMAT, WireAgent, WireCall, WireEpisode, WireError
from callgrove.interop.foreign import gap

TOKENS_SUFFIX = ".tokens.jsonl"
SCHEMA_VERSION = 1  # the newest TokenEntry schema this reader understands
LONE_AGENT = "agent"  # the one agent of a rollout without invocation records


class TokenEntry(msgspec.Struct, kw_only=True):
    schema_version: int = 1
    rollout_id: str
    model_call_id: str
    prompt_token_ids: list[int]
    generation_token_ids: list[int]
    generation_log_probs: list[float]
    response_id: str | None = None
    created_at: float = 0.0
    parent_call_id: str | None = None
    prompt_is_delta: bool = False


class CallRef(msgspec.Struct, kw_only=True):
    model_call_id: str | None = None
    response_id: str | None = None


class Observation(msgspec.Struct, kw_only=True):
    """An `AgentInvocation` or `ContextCompactionObservation` (other kinds are not read)."""

    kind: str = "agent_invocation"
    invocation_id: str | None = None
    parent_invocation_id: str | None = None
    spawned_by_tool_call_id: str | None = None
    status: str = "unknown"
    error_type: str | None = None
    model_calls: list[CallRef] = []


class ObservationGap(msgspec.Struct, kw_only=True):
    code: str
    invocation_id: str | None = None
    detail: str | None = None


class Bundle(msgspec.Struct, kw_only=True):
    records: list[Observation] = []
    gaps: list[ObservationGap] = []


class Trajectory(msgspec.Struct, kw_only=True):
    task_id: str | None = None
    rollout_id: str
    invocations: list[Observation] = []
    gaps: list[ObservationGap] = []


class RolloutRecord(msgspec.Struct, kw_only=True):
    """One line of an invocations file: a Gym rollout row (`ng_trajectory`,
    `ng_agent_observations`, `reward`), a bare `TrajectoryRecord`, or an observation bundle
    with its `rollout_id`."""

    rollout_id: str | None = None
    task_id: str | None = None
    reward: float | None = None
    ng_trajectory: Trajectory | None = None
    ng_agent_observations: Bundle | None = None
    invocations: list[Observation] = []
    records: list[Observation] = []
    gaps: list[ObservationGap] = []

    def identity(self) -> str:
        rollout = self.ng_trajectory.rollout_id if self.ng_trajectory else self.rollout_id
        if not rollout:
            raise InputError(Problem("no rollout_id (nor ng_trajectory.rollout_id)"))
        return rollout

    def observations(self) -> tuple[list[Observation], list[Observation], list[ObservationGap]]:
        """Invocations (the trajectory's first, then any only the bundle has), compactions, gaps."""
        trajectory = self.ng_trajectory
        bundle = self.ng_agent_observations
        invocations = list(trajectory.invocations if trajectory else self.invocations)
        records = [*self.records, *(bundle.records if bundle else [])]
        known = {i.invocation_id for i in invocations}
        invocations += [
            r for r in records if r.kind == "agent_invocation" and r.invocation_id not in known
        ]
        compactions = [r for r in records if r.kind == "context_compaction"]
        found = [
            *self.gaps,
            *(trajectory.gaps if trajectory else []),
            *(bundle.gaps if bundle else []),
        ]
        # the trajectory repeats the bundle's gaps; Gym itself keeps one of each
        gaps = list({(g.code, g.invocation_id, g.detail): g for g in found}.values())
        return invocations, compactions, gaps


_entry_decoder = msgspec.json.Decoder(TokenEntry)
_record_decoder = msgspec.json.Decoder(RolloutRecord)


@dataclass
class Capture:
    """One rollout's captured calls, in ledger order, and what the store says was lost."""

    rollout_id: str
    file: str
    entries: list[TokenEntry] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)


# --- reading ----------------------------------------------------------------------------------


def read_gym(
    tokens: str | os.PathLike[str],
    invocations: str | os.PathLike[str] | None = None,
    diagnostics: Diagnostics | None = None,
) -> Iterator[Episode]:
    """Stream Gym rollouts as episodes.

    `tokens` is a token capture store folder (one `<rollout_id>.tokens.jsonl` per rollout) or one
    capture file (several rollouts in one file are told apart by `rollout_id`). `invocations` is
    a JSON Lines file of rollout records; each is joined with its rollout's capture, and captures
    no record names follow as single-agent episodes. Without `diagnostics` the first bad line or
    rollout raises `InputError` naming file, line, episode and call; with it, each is recorded
    and the rest are still read.
    """
    source = CaptureSource(Path(tokens), diagnostics)
    if invocations is not None:
        file = str(invocations)
        for number, record in read_rows(invocations, _record_decoder.decode, diagnostics):
            try:
                yield episode_from_gym(source.take(record.identity()), record)
            except InputError as error:
                report(error.located(file=file, line=number), diagnostics)
    for capture in source.rest():
        try:
            yield episode_from_gym(capture, None)
        except InputError as error:
            report(error.located(file=capture.file), diagnostics)


class CaptureSource:
    """The captures of a store folder, read one rollout file at a time, or of one file."""

    def __init__(self, tokens: Path, diagnostics: Diagnostics | None):
        self.diagnostics = diagnostics
        self.taken: set[str] = set()
        if tokens.is_dir():
            self.files = {
                path.name[: -len(TOKENS_SUFFIX)]: path
                for path in sorted(tokens.glob(f"*{TOKENS_SUFFIX}"))
            }
            self.loaded: dict[str, Capture] | None = None
        else:
            self.files = {}
            self.loaded = {c.rollout_id: c for c in read_captures(tokens, diagnostics)}

    def take(self, rollout: str) -> Capture:
        self.taken.add(rollout)
        if self.loaded is not None:
            capture = self.loaded.get(rollout)
        else:
            path = self.files.get(rollout)
            found = [] if path is None else read_captures(path, self.diagnostics)
            capture = next((c for c in found if c.rollout_id == rollout), None)
        if capture is None:
            raise InputError(Problem("no token capture for this rollout", episode=rollout))
        return capture

    def rest(self) -> Iterator[Capture]:
        """Every capture not taken yet."""
        if self.loaded is not None:
            yield from (c for r, c in self.loaded.items() if r not in self.taken)
            return
        for rollout, path in self.files.items():
            if rollout not in self.taken:
                yield from read_captures(path, self.diagnostics)


def read_captures(
    path: str | os.PathLike[str], diagnostics: Diagnostics | None = None
) -> list[Capture]:
    """The rollouts of one capture file, each with its lost calls (from the store's sidecars)."""
    file = str(path)
    by_rollout: dict[str, Capture] = {}
    for number, entry in read_rows(path, _entry_decoder.decode, diagnostics):
        if entry.schema_version > SCHEMA_VERSION:
            message = (
                f"token record is schema_version {entry.schema_version}; "
                f"this reader understands up to {SCHEMA_VERSION}"
            )
            where = {"file": file, "line": number, "episode": entry.rollout_id}
            report(InputError(Problem(message, call=entry.model_call_id, **where)), diagnostics)
            continue
        capture = by_rollout.setdefault(entry.rollout_id, Capture(entry.rollout_id, file))
        capture.entries.append(entry)
    for capture in by_rollout.values():
        capture.lost = _lost_calls(Path(path).parent, capture)
        # Ledger order: when each call was captured; the file order breaks ties (a stable sort).
        capture.entries.sort(key=lambda e: e.created_at)
    return list(by_rollout.values())


def _lost_calls(folder: Path, capture: Capture) -> list[str]:
    """Calls the store recorded as lost: the `.incomplete` sentinel, and intents with no entry."""
    rollout = capture.rollout_id
    lost: list[str] = []
    sentinel = folder / f"{rollout}.tokens.incomplete"
    if sentinel.exists():
        lost += [line.strip() or "(unnamed)" for line in sentinel.read_text().splitlines()]
        lost = lost or ["(unnamed)"]
    intents = folder / f"{rollout}.tokens.intents"
    if intents.exists():
        recorded = {e.model_call_id for e in capture.entries}
        lost += [i for i in intents.read_text().split() if i not in recorded]
    return lost


# --- one rollout -------------------------------------------------------------------------------


def episode_from_gym(capture: Capture, record: RolloutRecord | None) -> Episode:
    """The episode of one rollout: its captured calls, owned by the invocations that name them."""
    rollout = capture.rollout_id
    gaps: list[dict[str, Any]] = []
    entries = _unique_entries(capture.entries, rollout)
    calls = _calls(entries, gaps)
    invocations, compactions, gym_gaps = record.observations() if record else ([], [], [])
    gaps += [_gym_gap(g) for g in gym_gaps]
    if record is None or not invocations:
        gaps.append(
            {
                "kind": "agent_invocations_unavailable",
                "agent": LONE_AGENT,
                "reason": "no agent invocation record: every call is filed under one agent",
            }
        )
        agents = [WireAgent(id=LONE_AGENT, name=LONE_AGENT, calls=list(calls.values()))]
    else:
        agents = _agents(invocations, compactions, calls, entries, gaps)
    errors = [
        WireError(
            type=f"invocation_{i.status}" if not i.error_type else i.error_type,
            message=f"agent invocation {i.status}",
            agent=i.invocation_id,
        )
        for i in invocations
        if i.status in ("failed", "incomplete") and i.invocation_id
    ]
    if capture.lost:
        errors.append(
            WireError(type="capture_incomplete", message="calls lost: " + ", ".join(capture.lost))
        )
    task_id = (record.ng_trajectory.task_id if record and record.ng_trajectory else None) or (
        record.task_id if record else None
    )
    wire = WireEpisode(
        format=FORMAT,
        id=rollout,
        group=task_id,
        task={"task_id": task_id} if task_id else None,
        ok=not errors,
        errors=errors,
        rewards={"reward": record.reward} if record and record.reward is not None else {},
        agents=agents,
        gaps=gaps or UNSET,
    )
    try:
        return episode_from_wire(wire)
    except InputError as error:
        raise error.located(file=capture.file, episode=rollout) from None


def _unique_entries(entries: list[TokenEntry], rollout: str) -> list[TokenEntry]:
    """At-least-once delivery can repeat an entry; a repeat with other tokens is corrupt."""
    seen: dict[str, TokenEntry] = {}
    for entry in entries:
        first = seen.setdefault(entry.model_call_id, entry)
        if first is not entry and (first.prompt_token_ids, first.generation_token_ids) != (
            entry.prompt_token_ids,
            entry.generation_token_ids,
        ):
            raise InputError(
                Problem(
                    "model call id recorded twice with different tokens",
                    episode=rollout,
                    call=entry.model_call_id,
                )
            )
    return list(seen.values())


def _calls(entries: list[TokenEntry], gaps: list[dict[str, Any]]) -> dict[str, WireCall]:
    """One call per entry that generated tokens, numbered in ledger order.

    A delta prompt references its parent call's full sequence. When the parent generated
    nothing (it is no call) the prompt is rebuilt in full through it; when the chain cannot be
    rebuilt (the parent is missing) the entry is a gap.
    """
    by_id = {e.model_call_id: e for e in entries}
    calls: dict[str, WireCall] = {}
    for seq, entry in enumerate(entries, start=1):
        call_id = entry.model_call_id
        if not entry.generation_token_ids:
            gaps.append(gap("empty_generation", call_id, "the call generated no tokens"))
            continue
        call = WireCall(
            id=call_id,
            seq=seq,
            completion_ids=entry.generation_token_ids,
            logprobs=entry.generation_log_probs,
        )
        parent = calls.get(entry.parent_call_id or "")
        if not entry.prompt_is_delta:
            call.prompt_ids = entry.prompt_token_ids
        elif parent is not None:
            call.prompt_from = parent.id
            call.prompt_from_len = _full_len(parent, calls)
            call.prompt_suffix_ids = entry.prompt_token_ids
        else:
            full = _rebuilt_prompt(entry, by_id)
            if full is None:
                gaps.append(
                    gap(
                        "delta_chain_unreconstructable",
                        call_id,
                        f"delta prompt over parent {entry.parent_call_id!r}, which was not captured",
                    )
                )
                continue
            call.prompt_ids = full
        calls[call_id] = call
    return calls


def _full_len(call: WireCall, calls: dict[str, WireCall]) -> int:
    if call.prompt_ids is not UNSET:
        prompt = len(call.prompt_ids)
    else:
        prompt = call.prompt_from_len + len(call.prompt_suffix_ids)  # type: ignore[operator,arg-type]
    return prompt + len(call.completion_ids)


def _rebuilt_prompt(entry: TokenEntry, by_id: dict[str, TokenEntry]) -> list[int] | None:
    """The full prompt of a delta entry, walking its parents to one stored in full."""
    chain: list[TokenEntry] = []
    current: TokenEntry | None = entry
    while current is not None and current.prompt_is_delta:
        if len(chain) > len(by_id):
            return None  # a cycle
        chain.append(current)
        current = by_id.get(current.parent_call_id or "")
    if current is None:
        return None
    tokens = [*current.prompt_token_ids, *current.generation_token_ids]
    for link in reversed(chain[1:]):
        tokens += [*link.prompt_token_ids, *link.generation_token_ids]
    return tokens + entry.prompt_token_ids


def _agents(
    invocations: list[Observation],
    compactions: list[Observation],
    calls: dict[str, WireCall],
    entries: list[TokenEntry],
    gaps: list[dict[str, Any]],
) -> list[WireAgent]:
    by_response = {e.response_id: e.model_call_id for e in entries if e.response_id}
    summaries = {_resolve(ref, calls, by_response) for c in compactions for ref in c.model_calls}
    ids = {i.invocation_id for i in invocations}
    orphans = {g["agent"] for g in gaps if g["kind"] == "subagent_parent_unavailable"}
    owner: dict[str, WireAgent] = {}
    agents: list[WireAgent] = []
    for invocation in invocations:
        agent_id = invocation.invocation_id or f"invocation-{len(agents)}"
        parent = invocation.parent_invocation_id
        if parent is not None and parent not in ids:
            gaps.append(
                {
                    "kind": "parent_invocation_missing",
                    "agent": agent_id,
                    "reason": f"parent invocation {parent!r} has no record",
                }
            )
            parent = None
        is_root = (
            parent is None
            and invocation.spawned_by_tool_call_id is None
            and agent_id not in orphans
        )
        agent = WireAgent(
            id=agent_id,
            name="leader" if is_root else "subagent",
            parent=parent,
            start="root" if is_root else "fresh",
        )
        for ref in invocation.model_calls:
            call_id = _resolve(ref, calls, by_response)
            call = calls.get(call_id or "")
            if call is None:
                gaps.append(
                    {
                        "kind": "model_call_reference_unmatched",
                        "agent": agent_id,
                        "call": ref.model_call_id or ref.response_id,
                        "reason": "no captured call with tokens matches this reference",
                    }
                )
            elif call.id in owner:
                gaps.append(
                    {
                        "kind": "model_call_reference_ambiguous",
                        "agent": agent_id,
                        "call": call.id,
                        "reason": f"already owned by {owner[call.id].id!r}",
                    }
                )
            else:
                owner[call.id] = agent
                call.purpose = "compaction" if call.id in summaries else "turn"
                agent.calls.append(call)
        agents.append(agent)
    _mark_forks(agents, owner, entries)
    _file_unowned(calls, owner, agents, entries, gaps)
    return agents


def _resolve(ref: CallRef, calls: dict[str, WireCall], by_response: dict[str, str]) -> str | None:
    if ref.model_call_id:
        return ref.model_call_id
    return by_response.get(ref.response_id or "")


def _mark_forks(
    agents: list[WireAgent], owner: dict[str, WireAgent], entries: list[TokenEntry]
) -> None:
    """A subagent whose first call continues a call of another agent started as a fork."""
    parent_call = {e.model_call_id: e.parent_call_id for e in entries}
    for agent in agents:
        if agent.start == "root" or not agent.calls:
            continue
        first = min(agent.calls, key=lambda c: c.seq)
        before = owner.get(parent_call.get(first.id) or "")
        if before is not None and before is not agent:
            agent.start = "fork"


def _file_unowned(
    calls: dict[str, WireCall],
    owner: dict[str, WireAgent],
    agents: list[WireAgent],
    entries: list[TokenEntry],
    gaps: list[dict[str, Any]],
) -> None:
    """Captured calls no invocation names: kept for accounting, under their parent's agent."""
    parent_call = {e.model_call_id: e.parent_call_id for e in entries}
    unowned = [c for c in calls.values() if c.id not in owner]
    for call in unowned:  # ledger order, so a parent is filed before its children
        agent = owner.get(parent_call.get(call.id) or "") or agents[0]
        call.kept = False
        owner[call.id] = agent
        agent.calls.append(call)
    if unowned:
        gaps.append(
            {
                "kind": "model_call_ownership_unavailable",
                "calls": [c.id for c in unowned],
                "reason": "captured but named by no invocation (a dropped retry?): not kept",
            }
        )
    for agent in agents:
        agent.calls.sort(key=lambda c: c.seq)


def _gym_gap(found_gap: ObservationGap) -> dict[str, Any]:
    found: dict[str, Any] = {"kind": found_gap.code, "source": "gym"}
    if found_gap.invocation_id is not None:
        found["agent"] = found_gap.invocation_id
    if found_gap.detail is not None:
        found["reason"] = found_gap.detail
    return found

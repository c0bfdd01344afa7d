"""verifiers `traces.jsonl` files as callgrove episodes, and callgrove's credit back onto them.

verifiers (0.4.0) writes one `Episode` per line: the dispatch (`env`, `task`, `group`, `run`,
`ok`, `errors`) and its `traces`, one per agent. A trace is a message graph: each `MessageNode`
holds the tokens it adds to its path (`token_ids`), which of them the model sampled (`mask`),
their `logprobs` and `advantages` compactly over the sampled tokens, and its `parent`. Older
files (0.2) hold one bare trace per line, which 0.4.0 itself no longer reads; both are read here.

The mapping:
- each trace is an agent (`id` = trace id, `name` = `agent.name`, `trainable` =
  `agent.trainable`, its rewards as the agent's rewards);
- each sampled node with sampled tokens is a call (`id` = `t{trace}.n{node}`): its prompt is the
  tokens of its path up to its first sampled token, its completion the sampled tokens. The prompt
  is written as a reference to the nearest call above it plus what follows, so histories share
  memory. A compaction attempt (a `compaction_attempt` semantic link) is a `compaction` call,
  not kept when the harness never resumed from it (verifiers' own `Branch.trainable` rule);
- `run.work.step` / `run.work.policy` become `run.step` / `run.policy`, and `run.work.type` the
  run type (whether the episode trains or only measures);
- a trace's rewards (score x weight; None, never scored, is left out) are its agent's rewards,
  and a one-trace episode's are also the episode's; a trace's errors name its agent.

Rows callgrove writes carry in each trace's `info` (key `callgrove`) what verifiers has no
field for, and reading them gives the episode back field by field (docs/interop.md).

Only the fields the mapping reads are decoded (msgspec Structs mirroring verifiers' models), so
reading needs no verifiers install. Message text is not carried.
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Iterable, Iterator
from typing import Any

import msgspec
import numpy as np
import orjson
from msgspec import UNSET, UnsetType

from callgrove.episode import Agent, Call, Episode, episode_from_wire
from callgrove.episode.codec import plain_call_values
from callgrove.episode.provenance import gaps_to_json, join_spawn
from callgrove.episode.spread import spread_over_completions
from callgrove.forest import build_forest
from callgrove.formats.jsonl import JsonlWriter, iter_lines, read_rows, report
from callgrove.formats.problems import Diagnostics, InputError, Problem
from callgrove.formats.wire import (
    FORMAT,
    WireAgent,
    WireCall,
    WireEnv,
    WireEpisode,
    WireError,
    WirePolicy,
    WireRun,
)
from callgrove.interop.foreign import gap

# --- what the mapping reads of verifiers' models ------------------------------------------


class VfLink(msgspec.Struct):
    node: int
    type: str


class VfNode(msgspec.Struct, kw_only=True):
    parent: int | None = None
    sampled: bool = False
    timestamp: float = 0.0
    token_ids: list[int] = []
    mask: list[bool] = []
    logprobs: list[float] = []
    advantages: list[float] | None = None
    semantic_parents: list[VfLink] = []


class VfAgent(msgspec.Struct, kw_only=True):
    name: str = "agent"
    trainable: bool = True


class VfReward(msgspec.Struct, kw_only=True):
    score: float
    weight: float = 1.0


class VfError(msgspec.Struct, kw_only=True):
    type: str
    message: str = ""


class VfPolicy(msgspec.Struct, kw_only=True):
    start: int
    end: int


class VfWork(msgspec.Struct, kw_only=True):
    type: str = "train"
    step: int | None = None
    policy: VfPolicy | None = None


class VfRun(msgspec.Struct, kw_only=True):
    type: str = "train"
    id: str | None = None
    work: VfWork | None = None
    step: int | None = None  # bare-trace rows (0.2) stamp the step on the run itself


class VfEnv(msgspec.Struct, kw_only=True):
    id: str = ""
    name: str | None = None


class VfGroup(msgspec.Struct, kw_only=True):
    id: str


class CarriedCall(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What verifiers' node has no field for, of one call written as a node."""

    id: str
    purpose: str = "turn"
    kept: bool = True
    policy_version: int | None = None
    # a scalar credit, which the node holds spread over the call's sampled tokens
    advantages: float | None = None
    content: Any = None
    sampling: dict[str, Any] | None = None


class CarriedEpisode(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The episode fields verifiers' episode has no field for, or gives back otherwise."""

    rewards: dict[str, float] = {}
    objective: str | None = None
    gaps: list[dict[str, Any]] | None = None
    meta: dict[str, Any] | None = None
    # written only where the verifiers row would give back something else
    errors: list[WireError] | UnsetType = UNSET
    env: WireEnv | UnsetType | None = UNSET
    run: WireRun | UnsetType | None = UNSET


class CarriedAgent(msgspec.Struct, kw_only=True, omit_defaults=True):
    """What a trace cannot hold of its agent, in the trace's `info` (`CARRIED_KEY`)."""

    parent: str | None = None
    start: str = "root"
    own_rewards: bool = True  # False: the agent had none (the trace holds the episode's)
    meta: dict[str, Any] | None = None
    calls: list[CarriedCall] = []  # one per call node, in node order
    # calls a node cannot hold (not kept and no compaction: verifiers would train them), whole
    off_graph: list[WireCall] = []
    order: list[str] | None = None  # the agent's call order, where it is not by seq
    episode: CarriedEpisode | None = None  # on the first trace


class VfInfo(msgspec.Struct, kw_only=True):
    # the ledger order of the trace's calls, written by `verifiers_row` (no wall-clock to give)
    callgrove_seq: list[int] | None = None
    callgrove: CarriedAgent | None = None


class VfTrace(msgspec.Struct, kw_only=True):
    id: str = ""
    task: Any = None
    agent: VfAgent | None = None
    nodes: list[VfNode] = []
    # 0.4.0 stores {score, weight} (None: scoring did not run); 0.2 stored plain numbers.
    rewards: dict[str, VfReward | float | None] = {}
    ok: bool | None = None  # absent in 0.2 rows: derived from is_completed and errors
    is_completed: bool = False
    errors: list[VfError] = []
    run: VfRun | None = None  # 0.2 only
    info: VfInfo = msgspec.field(default_factory=VfInfo)


class VfEpisode(msgspec.Struct, kw_only=True):
    id: str = ""
    env: VfEnv | None = None
    task: Any = None
    group: VfGroup | None = None
    run: VfRun | None = None
    ok: bool = False
    is_timeout: bool = False
    errors: list[VfError] = []
    traces: list[VfTrace] | UnsetType = UNSET
    nodes: msgspec.Raw | UnsetType = UNSET  # present only on a bare-trace row


_episode_decoder = msgspec.json.Decoder(VfEpisode)
_trace_decoder = msgspec.json.Decoder(VfTrace)
CARRIED_KEY = "callgrove"  # a trace `info` key: what verifiers has no field for
TASK_TYPE = "callgrove"  # a task that is no verifiers task, written as {type, data: {task}}
_NO_TOKENS = np.zeros(0, dtype=np.int32)  # closes a concatenation that may have no pieces


def call_id(trace_index: int, node_index: int) -> str:
    """The callgrove call id of a trace's node (a call read from verifiers' own rows)."""
    return f"t{trace_index}.n{node_index}"


# --- reading --------------------------------------------------------------------------------


def decode_row(line: bytes) -> VfEpisode:
    """One `traces.jsonl` line as an episode; a bare-trace row becomes a one-trace episode."""
    row = _episode_decoder.decode(line)
    if row.traces is UNSET:
        if row.nodes is UNSET:
            raise InputError(Problem("neither an episode (no traces) nor a trace (no nodes)"))
        trace = _trace_decoder.decode(line)
        ok = trace.ok if trace.ok is not None else trace.is_completed and not trace.errors
        return VfEpisode(
            id=trace.id,
            task=trace.task,
            run=trace.run,
            ok=ok,
            errors=[],  # the trace's errors are kept on the trace, naming its agent
            traces=[trace],
        )
    return row


def read_verifiers(
    path: str | os.PathLike[str], diagnostics: Diagnostics | None = None
) -> Iterator[Episode]:
    """Stream a verifiers `traces.jsonl` (plain, .gz or .zst) as callgrove episodes.

    Without `diagnostics` the first bad row raises `InputError` naming file, line, episode and
    call; with it, each bad row is recorded and the rest are still read.
    """
    for _number, episode in read_located_verifiers(path, diagnostics):
        yield episode


def read_located_verifiers(
    path: str | os.PathLike[str], diagnostics: Diagnostics | None = None
) -> Iterator[tuple[int, Episode]]:
    """Like `read_verifiers`, with each episode's line number."""
    file = str(path)
    for number, row in read_rows(path, decode_row, diagnostics):
        try:
            yield number, episode_from_verifiers(row)
        except InputError as error:
            report(error.located(file=file, line=number, episode=row.id or None), diagnostics)


def episode_from_verifiers(row: VfEpisode) -> Episode:
    """The callgrove episode of one verifiers episode; validated like any episode read.

    A row callgrove wrote carries in its traces' `info` what verifiers has no field for
    (`verifiers_row`); that is read back, so such an episode comes back as it was written.
    """
    traces = [] if row.traces is UNSET else row.traces
    gaps: list[dict[str, Any]] = []
    built = [_trace_to_agent(i, trace, gaps) for i, trace in enumerate(traces)]
    agents = [agent for agent, _times in built]
    _check_unique_agents(agents)
    written = bool(traces) and all(trace.info.callgrove is not None for trace in traces)
    if not written:
        _number_calls(agents, [times for _agent, times in built])
    carried = traces[0].info.callgrove.episode if written else None  # type: ignore[union-attr]
    carried = carried or CarriedEpisode()
    if written:
        rewards = carried.rewards
    else:
        rewards = agents[0].rewards if len(agents) == 1 and agents[0].rewards else {}
    errors = [WireError(type=e.type, message=e.message) for e in row.errors]
    errors += [
        WireError(type=e.type, message=e.message, agent=agent.id)
        for agent, trace in zip(agents, traces, strict=True)
        for e in trace.errors
    ]
    meta = {"verifiers": {"is_timeout": True}} if row.is_timeout else None
    wire = WireEpisode(
        format=FORMAT,
        id=row.id,
        group=row.group.id if row.group else None,
        env=_env_from_verifiers(row.env) if carried.env is UNSET else carried.env,
        task=_task_from_verifiers(row.task),
        run=_run_from_verifiers(row.run) if carried.run is UNSET else carried.run,
        ok=row.ok,
        errors=errors if carried.errors is UNSET else carried.errors,
        rewards=dict(rewards or {}),
        agents=agents,
        objective=_unset_if_none(carried.objective),
        gaps=_unset_if_none((carried.gaps or []) + gaps or None),
        meta=_unset_if_none(meta if carried.meta is None else carried.meta),
    )
    return episode_from_wire(wire)


def _unset_if_none(value: Any) -> Any:
    return UNSET if value is None else value


def _env_from_verifiers(env: VfEnv | None) -> WireEnv | None:
    return None if env is None else WireEnv(id=env.id or None, name=env.name)


def _task_from_verifiers(task: Any) -> Any:
    """The task as verifiers holds it, or the value callgrove wrapped as a task."""
    if isinstance(task, dict) and task.get("type") == TASK_TYPE:
        data = task.get("data")
        if isinstance(data, dict) and data.keys() == {"task"}:
            return data["task"]
    return task


def _run_from_verifiers(run: VfRun | None) -> WireRun | None:
    if run is None:
        return None
    if run.work is None:  # a standalone eval run, or a 0.2 row with its step on the run
        return WireRun(id=run.id or None, type=run.type, step=run.step)
    policy = run.work.policy
    return WireRun(
        id=run.id or None,
        type=run.work.type,
        step=run.work.step,
        policy=None if policy is None else WirePolicy(start=policy.start, end=policy.end),
    )


def _check_unique_agents(agents: list[WireAgent]) -> None:
    seen: set[str] = set()
    for agent in agents:
        if agent.id in seen:
            raise InputError(Problem(f"trace id {agent.id!r} appears twice in the episode"))
        seen.add(agent.id)


def _trace_to_agent(
    index: int, trace: VfTrace, gaps: list[dict[str, Any]]
) -> tuple[WireAgent, list[float]]:
    """The trace's agent, and when each of its calls was made (the key of the ledger order)."""
    info = trace.agent or VfAgent()
    carried = trace.info.callgrove
    rewards: dict[str, float] = {}
    for name, reward in trace.rewards.items():
        if isinstance(reward, VfReward):
            rewards[name] = reward.score * reward.weight
        elif reward is not None:
            rewards[name] = float(reward)
    calls, times = _trace_calls(index, trace, gaps)
    agent = WireAgent(
        id=trace.id or f"trace-{index}",
        name=info.name,
        # verifiers records no link between traces: each is its own conversation
        start="root",
        trainable=info.trainable,
        calls=calls,
        rewards=rewards or UNSET,
    )
    if carried is not None:
        agent.parent, agent.start = carried.parent, carried.start
        agent.rewards = rewards if carried.own_rewards else UNSET
        agent.meta = _unset_if_none(carried.meta)
        agent.calls = _in_order(calls + carried.off_graph, carried.order, agent.id)
    return agent, times


def _in_order(calls: list[WireCall], order: list[str] | None, agent: str) -> list[WireCall]:
    """The agent's calls by seq, or in the order callgrove wrote down for them."""
    if order is None:
        return sorted(calls, key=lambda call: call.seq)
    by_id = {call.id: call for call in calls}
    if sorted(order) != sorted(by_id) or len(by_id) != len(calls):
        raise InputError(Problem(f"the call order written for agent {agent!r} names other calls"))
    return [by_id[name] for name in order]


def _trace_calls(
    index: int, trace: VfTrace, gaps: list[dict[str, Any]]
) -> tuple[list[WireCall], list[float]]:
    """One call per sampled node with sampled tokens, prompts as references to the call above.

    Walking nodes in order, each node keeps the nearest call at or above it and the tokens that
    follow that call's full sequence down to the node's end, so a prompt is never copied whole.
    """
    nodes = trace.nodes
    base: list[tuple[str, int] | None] = []  # (call id, its full length) at or above each node
    tail: list[list[int]] = []  # tokens after that call, through this node
    calls: list[WireCall] = []
    times: list[float] = []
    resumed = {link.node for n in nodes for link in n.semantic_parents if link.type == "compaction"}
    has_child = {n.parent for n in nodes if n.parent is not None}
    carried = _carried_calls(trace, index)
    for number, node in enumerate(nodes):
        where = call_id(index, number)
        parent = node.parent
        if parent is not None and not 0 <= parent < number:
            raise InputError(Problem(f"node parent {parent} is not an earlier node", call=where))
        above, before = (None, []) if parent is None else (base[parent], tail[parent])
        first = _first_sampled(node, where)
        if first is None or not node.sampled:
            base.append(above)
            tail.append(before + node.token_ids)
            if node.sampled:
                gaps.append(
                    gap("sampled_node_without_tokens", where, "relay turn: nothing to train")
                )
            elif first is not None:
                gaps.append(
                    gap("mask_on_unsampled_node", where, "kept as prompt: no model call made it")
                )
            continue
        prompt_tail = before + node.token_ids[:first]
        attempt = any(link.type == "compaction_attempt" for link in node.semantic_parents)
        call = WireCall(
            id=where,
            seq=0,  # numbered across traces by `_number_calls`
            completion_ids=node.token_ids[first:],
            logprobs=node.logprobs or None,
            purpose="compaction" if attempt else "turn",
            # verifiers' Branch.trainable: an attempt nobody resumed from never trains
            kept=not (attempt and number not in has_child and number not in resumed),
            advantages=node.advantages,
        )
        if carried is not None:
            _restore_call(call, carried[len(calls)])
        if above is None:
            call.prompt_ids = prompt_tail
        else:
            call.prompt_from, call.prompt_from_len = above
            call.prompt_suffix_ids = prompt_tail
        calls.append(call)
        times.append(node.timestamp)
        full = (above[1] if above else 0) + len(prompt_tail) + len(call.completion_ids)
        base.append((call.id, full))
        tail.append([])
    if carried is not None and len(carried) != len(calls):
        raise InputError(
            Problem(f"trace {index} carries {len(carried)} call records for {len(calls)} calls")
        )
    written = trace.info.callgrove_seq
    if written is not None and len(written) == len(calls):
        times = [float(seq) for seq in written]  # the ledger order these calls came with
        if carried is not None:
            for call, seq in zip(calls, written, strict=True):
                call.seq = seq
    return calls, times


def _carried_calls(trace: VfTrace, index: int) -> list[CarriedCall] | None:
    carried = trace.info.callgrove
    if carried is None:
        return None
    if trace.info.callgrove_seq is None or len(trace.info.callgrove_seq) != len(carried.calls):
        raise InputError(Problem(f"trace {index} carries call records without their seq"))
    return carried.calls


def _restore_call(call: WireCall, carried: CarriedCall) -> None:
    """A call node's fields as callgrove wrote them, where verifiers has no field for them."""
    call.id = carried.id
    call.purpose, call.kept = carried.purpose, carried.kept
    call.policy_version = carried.policy_version
    call.content = UNSET if carried.content is None else carried.content
    call.sampling = UNSET if carried.sampling is None else carried.sampling
    spread = call.advantages
    scalar = carried.advantages
    if scalar is not None and isinstance(spread, list) and all(v == scalar for v in spread):
        call.advantages = scalar  # unchanged since written: the scalar it was spread from


def _first_sampled(node: VfNode, where: str) -> int | None:
    """Where the node's sampled tokens start (they must run to its end), None when it has none."""
    mask = node.mask
    if not mask or True not in mask:
        if node.logprobs:
            raise InputError(
                Problem("logprobs given for a node with no sampled tokens", call=where)
            )
        return None
    if len(mask) != len(node.token_ids):
        raise InputError(
            Problem(f"mask has {len(mask)} entries for {len(node.token_ids)} tokens", call=where)
        )
    first = mask.index(True)
    if mask.count(True) != len(mask) - first:
        raise InputError(
            Problem("sampled tokens do not form one run at the end of the node", call=where)
        )
    return first


def _number_calls(agents: list[WireAgent], times: list[list[float]]) -> None:
    """Ledger order across traces: each trace's calls in node order, interleaved by timestamp
    (or by the order callgrove wrote them in)."""
    streams = [
        [(stamp, i, call) for stamp, call in zip(stamps, agent.calls, strict=True)]
        for i, (agent, stamps) in enumerate(zip(agents, times, strict=True))
    ]
    merged = heapq.merge(*streams, key=lambda item: (item[0], item[1]))
    for seq, (_stamp, _trace, call) in enumerate(merged, start=1):
        call.seq = seq


# --- credit back onto verifiers nodes ---------------------------------------------------------


def call_nodes(trace: Any, index: int) -> dict[str, int]:
    """Which node of a trace (a verifiers object or its JSON) holds each call read from it: by
    the call ids callgrove carried in the trace's `info`, else the `t<trace>.n<node>` ids."""
    nodes = _get(trace, "nodes")
    sampled = [
        number
        for number, node in enumerate(nodes)
        if _get(node, "sampled") and True in (_get(node, "mask") or [])
    ]
    info = _get(trace, "info")
    carried = info.get(CARRIED_KEY) if isinstance(info, dict) else None
    if carried is None:
        return {call_id(index, number): number for number in sampled}
    ids = [call["id"] for call in carried.get("calls", [])]
    if len(ids) != len(sampled):
        raise InputError(
            Problem(f"trace {index} carries {len(ids)} call records for {len(sampled)} calls")
        )
    return dict(zip(ids, sampled, strict=True))


def compact_advantages(call: Call) -> list[float] | None:
    """A call's credit over its sampled tokens; a scalar is spread, None stays None."""
    if call.advantages is None:
        return None
    return spread_over_completions([call], "advantages").tolist()


def set_advantages(target: Any, episode: Episode) -> int:
    """Write an episode's credit onto the verifiers episode it was read from; returns the calls
    set.

    `target` is a verifiers `Episode` (or `WireEpisode`) object, or its JSON row as a dict.
    Traces are matched by position and checked by id, so credit never lands on the wrong agent.
    A call verifiers holds in no node (carried whole in the trace's `info`) gets it there.
    """
    traces = _get(target, "traces")
    if len(traces) != len(episode.agents):
        raise InputError(
            Problem(f"{len(traces)} traces but {len(episode.agents)} agents", episode=episode.id)
        )
    count = 0
    for index, (trace, agent) in enumerate(zip(traces, episode.agents, strict=True)):
        trace_id = _get(trace, "id") or f"trace-{index}"
        if trace_id != agent.id:
            raise InputError(
                Problem(
                    f"trace {index} is {trace_id!r} but agent {index} is {agent.id!r}",
                    episode=episode.id,
                )
            )
        try:
            nodes, on_node = _get(trace, "nodes"), call_nodes(trace, index)
        except InputError as error:
            raise error.located(episode=episode.id) from None
        info = _get(trace, "info")
        carried = (info.get(CARRIED_KEY) if isinstance(info, dict) else None) or {}
        records = {record["id"]: record for record in carried.get("calls", [])}
        off_graph = {record["id"]: record for record in carried.get("off_graph", [])}
        for call in agent.calls:
            if call.id in on_node:
                _set(nodes[on_node[call.id]], "advantages", compact_advantages(call))
                if call.id in records:  # the scalar, where the node holds it spread
                    value = _plain_advantages(call)
                    records[call.id]["advantages"] = value if isinstance(value, float) else None
            elif call.id in off_graph:
                off_graph[call.id]["advantages"] = _plain_advantages(call)
            else:
                raise InputError(
                    Problem(
                        f"call is in no node of trace {index}: it was not read from it",
                        episode=episode.id,
                        call=call.id,
                    )
                )
            count += 1
    return count


def _get(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name)


def _set(obj: Any, name: str, value: Any) -> None:
    if isinstance(obj, dict):
        obj[name] = value
    else:
        setattr(obj, name, value)


def write_advantages(
    source: str | os.PathLike[str],
    episodes: Iterable[Episode],
    out: str | os.PathLike[str],
) -> int:
    """Copy a verifiers `traces.jsonl` to `out` with each episode's credit on its nodes.

    `episodes` are the callgrove episodes read from `source`, in the same order, carrying
    `advantages` (from `callgrove.credit`). Every other field of every row is kept as it was.
    Returns the number of rows written.
    """
    credited = iter(episodes)
    file = str(source)
    with JsonlWriter(out) as writer:
        for number, line, _complete in iter_lines(source):
            row = orjson.loads(line)
            episode = next(credited, None)
            row_id = row.get("id") if "traces" in row else None
            if episode is None or (row_id is not None and row_id != episode.id):
                found = "none" if episode is None else repr(episode.id)
                raise InputError(
                    Problem(
                        f"credited episode is {found}, expected {row_id!r}", file=file, line=number
                    )
                )
            target = row if "traces" in row else {"traces": [row]}
            try:
                set_advantages(target, episode)
            except InputError as error:
                raise error.located(file=file, line=number) from None
            writer.write_line(orjson.dumps(row) + b"\n")
        if next(credited, None) is not None:
            raise InputError(Problem("more credited episodes than rows", file=file))
        return writer.lines


# --- writing callgrove episodes as verifiers episodes ------------------------------------------


def verifiers_row(episode: Episode, notes: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A verifiers 0.4.0 episode row (a dict ready for JSON) holding the episode's calls.

    Each agent becomes a trace; each call a prompt node (the tokens its prompt adds to its
    parent's full sequence, when it adds any) and a sampled node (its completion). A call's
    parent node is its forest parent when that is a call of the same agent, else the call
    starts a root: verifiers' graphs do not cross traces. What verifiers has no field for is
    carried in the traces' `info` under `CARRIED_KEY` (the episode's part on the first trace):
    call ids and policy versions, agent parents and starts, meta, episode rewards, objective,
    gaps, errors' calls, and whole the calls no node can hold (not kept and no compaction), so
    `read_verifiers` gives the episode back. What cannot be carried
    (an episode's fields when it has no trace) is listed in `notes`.
    """
    notes = notes if notes is not None else []
    forest = build_forest(episode)
    parent_of: list[Call | None] = [None] * len(forest.pool.calls)  # by ledger index
    for call in forest.calls:
        parent_of[call.index] = forest.parent_of(call)
    agent_ids = {agent.id for agent in episode.agents}
    task = (
        episode.task
        if _is_task(episode.task) and episode.task["type"] != TASK_TYPE
        else {"type": TASK_TYPE, "data": {"task": episode.task}}
    )
    row: dict[str, Any] = {
        "id": episode.id,
        "env": {"id": (episode.env.id if episode.env else None) or ""},
        "task": task,
        "ok": episode.ok,
        "errors": [
            {"type": e.type, "message": e.message}
            for e in episode.errors
            if e.agent not in agent_ids
        ],
        "traces": [_agent_trace(episode, agent, task, parent_of) for agent in episode.agents],
    }
    if episode.env and episode.env.name is not None:
        row["env"]["name"] = episode.env.name
    if episode.group is not None:
        row["group"] = {"id": episode.group}
    if _timed_out(episode.meta):
        row["is_timeout"] = True
    run = _run_to_verifiers(episode.run)
    if run is not None:
        row["run"] = run
    carried = _carried_episode(episode, row)
    if carried and row["traces"]:
        row["traces"][0]["info"][CARRIED_KEY]["episode"] = carried
    notes.extend(
        {"kind": f"episode_{name}", "reason": "an episode without traces has no info to hold it"}
        for name in carried
        if not row["traces"]
    )
    return row


def _timed_out(meta: dict[str, Any] | None) -> bool:
    verifiers = (meta or {}).get("verifiers")
    return isinstance(verifiers, dict) and verifiers.get("is_timeout") is True


def _carried_episode(episode: Episode, row: dict[str, Any]) -> dict[str, Any]:
    """The episode's fields `episode_from_verifiers` would not give back from the row itself."""
    agent_ids = [agent.id for agent in episode.agents]
    held_errors = [
        WireError(type=e.type, message=e.message)
        for e in episode.errors
        if e.agent not in agent_ids
    ]
    held_errors += [
        WireError(type=e.type, message=e.message, agent=agent)
        for agent in agent_ids
        for e in episode.errors
        if e.agent == agent
    ]
    held_run = _run_from_verifiers(msgspec.convert(row["run"], VfRun) if "run" in row else None)
    held = {
        "rewards": {},
        "objective": None,
        "gaps": None,
        "meta": {"verifiers": {"is_timeout": True}} if row.get("is_timeout") else None,
        "errors": held_errors,
        "env": _env_from_verifiers(msgspec.convert(row["env"], VfEnv)),
        "run": held_run,
    }
    given = {
        "rewards": dict(episode.rewards),
        "objective": episode.objective,
        "gaps": gaps_to_json(episode.gaps),
        "meta": episode.meta,
        "errors": list(episode.errors),
        "env": episode.env,
        "run": episode.run,
    }
    return {
        name: msgspec.to_builtins(value) for name, value in given.items() if value != held[name]
    }


def _is_task(task: Any) -> bool:
    return (
        isinstance(task, dict)
        and isinstance(task.get("type"), str)
        and isinstance(task.get("data"), dict)
    )


def _run_to_verifiers(run: WireRun | None) -> dict[str, Any] | None:
    """verifiers' run, where it can hold it (the episode's part carries the rest)."""
    if run is None:
        return None
    if run.step is None:
        return {"type": "eval", "id": run.id or ""} if run.type == "eval" else None
    work: dict[str, Any] = {"type": run.type, "step": run.step}
    if run.policy is not None:
        work["policy"] = {"start": run.policy.start, "end": run.policy.end}
    return {"type": "train", "id": run.id or "", "work": work}


def _on_graph(call: Call) -> bool:
    """Whether a node can hold the call: verifiers trains every sampled node but a compaction
    attempt nobody resumed from."""
    return call.kept or call.purpose == "compaction"


def _agent_trace(
    episode: Episode, agent: Agent, task: dict[str, Any], parent_of: list[Call | None]
) -> dict[str, Any]:
    nodes: list[dict[str, Any]] = []
    seqs: list[int] = []
    carried = CarriedAgent(
        parent=agent.parent,
        start=agent.start,
        own_rewards=agent.rewards is not None,
        meta=join_spawn(agent.spawn, agent.meta),
    )
    node_of: dict[int, int] = {}  # call.index -> its sampled node
    accepted: list[tuple[int, int]] = []  # (compaction node, the node that resumed from it)
    open_compaction: int | None = None
    in_seq_order = sorted(agent.calls, key=lambda c: c.seq)
    if [call.id for call in in_seq_order] != [call.id for call in agent.calls]:
        carried.order = [call.id for call in agent.calls]
    for call in in_seq_order:
        if not _on_graph(call):
            carried.off_graph.append(_whole_call(call, episode))
            continue
        link, start = _parent_node(call, episode, agent, parent_of, node_of)
        added = np.concatenate(
            [*episode.segments(call, call.prompt_len, start), _NO_TOKENS]
        ).tolist()
        if added or link is None:
            nodes.append(_node(link, "user", added, sampled=False))
            link = len(nodes) - 1
        here = len(nodes)
        sampled = _node(link, "assistant", call.completion_ids.tolist(), sampled=True)
        sampled["logprobs"] = [] if call.logprobs is None else call.logprobs.tolist()
        advantages = compact_advantages(call)
        if advantages is not None:
            sampled["advantages"] = advantages
        nodes.append(sampled)
        seqs.append(call.seq)
        carried.calls.append(_carried_call(call))
        node_of[call.index] = here
        if open_compaction is not None and call.kept:
            accepted.append((open_compaction, here))
            open_compaction = None
        if call.purpose == "compaction":
            sampled["semantic_parents"] = [{"node": link, "type": "compaction_attempt"}]
            open_compaction = here if call.kept else None
    for compaction, resumed in accepted:
        nodes[resumed].setdefault("semantic_parents", []).append(
            {"node": compaction, "type": "compaction"}
        )
    if open_compaction is not None:
        # Nothing of this agent followed the kept summary: without the attempt mark verifiers
        # trains it, as callgrove does.
        del nodes[open_compaction]["semantic_parents"]
    errors = [{"type": e.type, "message": e.message} for e in episode.errors if e.agent == agent.id]
    rewards = agent.rewards if agent.rewards is not None else episode.rewards
    return {
        "id": agent.id,
        "task": task,
        "agent": {"config": {}, "name": agent.name, "trainable": agent.trainable},
        "nodes": nodes,
        "rewards": {name: {"score": value} for name, value in rewards.items()},
        "is_completed": True,
        "ok": episode.ok and not errors,
        "errors": errors,
        "info": {"callgrove_seq": seqs, CARRIED_KEY: msgspec.to_builtins(carried)},
    }


def _carried_call(call: Call) -> CarriedCall:
    scalar = call.advantages is not None and not isinstance(call.advantages, np.ndarray)
    return CarriedCall(
        id=call.id,
        purpose=call.purpose,
        kept=call.kept,
        policy_version=call.policy_version,
        advantages=float(call.advantages) if scalar else None,  # type: ignore[arg-type]
        content=call.content,
        sampling=call.sampling,
    )


def _whole_call(call: Call, episode: Episode) -> WireCall:
    """A call with its whole prompt, for a trace's `info`."""
    advantages = _plain_advantages(call)
    return WireCall(
        id=call.id,
        seq=call.seq,
        prompt_ids=episode.prompt_ids(call).tolist(),
        completion_ids=call.completion_ids.tolist(),
        logprobs=None if call.logprobs is None else call.logprobs.tolist(),
        advantages=UNSET if advantages is None else advantages,
        **plain_call_values(call),
    )


def _plain_advantages(call: Call) -> float | list[float] | None:
    value = call.advantages
    return value.tolist() if isinstance(value, np.ndarray) else value


def _parent_node(
    call: Call,
    episode: Episode,
    agent: Agent,
    parent_of: list[Call | None],
    node_of: dict[int, int],
) -> tuple[int | None, int]:
    """The sampled node the call's prompt continues, and how many prompt tokens it covers.

    A kept call continues its forest parent; a compaction attempt that was not kept, the call its
    prompt references in full. Either only when that call is of the same agent (one trace).
    """
    if call.kept:
        parent = parent_of[call.index]
    elif (base := episode.base_of(call)) is not None and call.prompt_from_len == base.full_len:
        parent = base
    else:
        parent = None
    if parent is None or parent.agent_index != agent.index or parent.index not in node_of:
        return None, 0
    return node_of[parent.index], parent.full_len


def _node(parent: int | None, role: str, tokens: list[int], sampled: bool) -> dict[str, Any]:
    return {
        "parent": parent,
        "message": {"role": role, "content": ""},
        "sampled": sampled,
        "token_ids": tokens,
        "mask": [sampled] * len(tokens),
    }


class VerifiersWriter(JsonlWriter):
    """Writes callgrove episodes as verifiers `traces.jsonl` rows: whole lines, flushed.

    `notes` collects, per episode id, what verifiers could not hold.
    """

    def __init__(self, path: str | os.PathLike[str], append: bool = False):
        super().__init__(path, append=append)
        self.notes: dict[str, list[dict[str, Any]]] = {}

    def write(self, episode: Episode) -> None:
        notes: list[dict[str, Any]] = []
        self.write_line(orjson.dumps(verifiers_row(episode, notes)) + b"\n")
        if notes:
            self.notes[episode.id] = notes


def write_verifiers(path: str | os.PathLike[str], episodes: Iterable[Episode]) -> int:
    """Write episodes as a verifiers `traces.jsonl`; returns how many were written."""
    with VerifiersWriter(path) as writer:
        for episode in episodes:
            writer.write(episode)
        return writer.lines

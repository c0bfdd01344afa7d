"""ATIF (the Agent Trajectory Interchange Format Harbor logs runs in, v1.0 to v1.8) read as
callgrove episodes, and episodes written as ATIF.

A root trajectory (one `.json` document, or one line of a `.jsonl` file) is an episode; it and
every subagent trajectory (embedded in `subagent_trajectories`, or in a file named by a
`SubagentTrajectoryRef.trajectory_path`) is an agent, linked to the agent whose observation
holds the reference. A `continued_trajectory_ref` names the file that continues the same agent.

Steps become calls:
- an agent step whose `metrics` hold `prompt_token_ids` and `completion_token_ids` is a call
  with those tokens and its `logprobs` (it trains once, as every call does);
- without token ids, the trajectory's messages are rendered through the chat layer as the
  transcript importers render harness sessions, and the episode trains supervised;
- a step marked `is_copied_context` (history copied from another trajectory) or with
  `llm_call_count: 0` (no model ran) is history, never a call;
- an agent step whose `extra.context_management.type` is `compaction` is a compaction call; a
  system step so marked (Harbor's handoff after summarising) starts the history afresh.

A call read from token ids keeps its step's message, reasoning and tool calls in its `content`
(as a rendered call's), and an agent the `version` and `model_name` of its trajectory's agent in
its `meta`; the writer writes them back from there. Rendering uses the chat format the reader is
given (`read_atif(path, chat=...)`), else callgrove's byte-level format, counted
(`atif_rendered_bytewise`): such tokens are not the model's.

Whatever the format leaves unknown or a step cannot give is counted in the episode's gaps:
a subagent's start kind when the reference does not say it (read as `fresh`), a step of
several model calls (`llm_call_count` > 1), a step without token ids in a trajectory whose
other steps have them, a subagent file that is not there, and in a token episode the history
kept only as tokens (`atif_history_text_not_kept`: system and user steps' text, observation
results' text and `source_call_id`). Episodes written here carry what ATIF has no field for
under `extra.callgrove`, so they read back field by field; `written_losses` counts what an
episode would lose all the same. A call's routes (mixtures of experts) are carried whole in its
step's `extra.callgrove.routes`, as ATIF repeats each prompt whole, and held again as its prompt
base's where they agree once read (`record.share_routes`).

Rewards: `extra.callgrove.episode.rewards` on the root trajectory (any field of callgrove's
episode record may stand there alone), else, for a trajectory in a Harbor trial's folder
(`<trial>/agent/trajectory.json`, or `<trial>/steps/<step>/agent/...`), the
`verifier_result.rewards` of the trial's `result.json`.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import msgspec
import numpy as np
import orjson
from msgspec import UNSET

from callgrove.chat import ChatFormat, Message
from callgrove.chat.message import ToolCall
from callgrove.episode import Agent, Episode, Spawn, episode_from_wire
from callgrove.episode.checks import check_routes
from callgrove.episode.codec import PLAIN_CALL_FIELDS, episode_to_wire
from callgrove.episode.provenance import gap_from_json, join_spawn
from callgrove.episode.record import ROUTE_DTYPE, Call, share_routes
from callgrove.formats.problems import Diagnostics, InputError, Problem
from callgrove.formats.wire import FORMAT, WireAgent, WireCall, WireEpisode
from callgrove.interop.foreign import gap
from callgrove.transcripts.render import TranscriptRenderer
from callgrove.transcripts.turns import (
    CallRecord,
    Source,
    Transcript,
    TranscriptAgent,
    TranscriptCall,
    Turn,
    extend,
)

ATIF_VERSIONS = tuple(f"ATIF-v1.{minor}" for minor in range(9))
# Gap kinds this reader adds (besides `subagent_file_missing`, `atif_start_unknown`, ...).
HISTORY_NOT_KEPT = "atif_history_text_not_kept"  # history held only as the prompts' tokens
RENDERED_BYTEWISE = "atif_rendered_bytewise"  # calls rendered without the model's tokenizer
WRITTEN_VERSION = ATIF_VERSIONS[-1]
CARRIED = "callgrove"  # the `extra` key holding what ATIF has no field for
STARTS = ("fresh", "fork", "background")  # what a reference's extra may say of its subagent
# What a step's `extra` carries of its call: every field but the tokens (the step's metrics),
# and its routes whole (over its full sequence but the last token: never `routes_from`).
_CARRIED_CALL_FIELDS = frozenset(
    ("id", "seq", "advantages", "routes", *(f.name for f in PLAIN_CALL_FIELDS))
)
# The episode fields `extra.callgrove.episode` lays over a rendered episode (gaps and meta are
# added to the reader's; its objective stays `supervised`: rendered calls have no logprobs).
_LAID_OVER = frozenset(("group", "env", "task", "run", "ok", "errors", "rewards"))


class _Record(msgspec.Struct, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """ATIF forbids fields it does not name, as Harbor's own models do."""


class AtifMetrics(_Record, kw_only=True):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    cost_usd: float | None = None
    # Raw JSON text, parsed straight into numpy by the episode codec (None: absent or null).
    prompt_token_ids: msgspec.Raw = None  # type: ignore[assignment]
    completion_token_ids: msgspec.Raw = None  # type: ignore[assignment]
    logprobs: list[float] | None = None
    extra: dict[str, Any] | None = None


class AtifToolCall(_Record, kw_only=True):
    tool_call_id: str
    function_name: str
    arguments: dict[str, Any]
    extra: dict[str, Any] | None = None


class AtifRef(_Record, kw_only=True):
    """A `SubagentTrajectoryRef`: `trajectory_id` (embedded) or `trajectory_path` (a file)."""

    trajectory_id: str | None = None
    session_id: str | None = None
    trajectory_path: str | None = None
    extra: dict[str, Any] | None = None


class AtifResult(_Record, kw_only=True):
    source_call_id: str | None = None
    content: str | list[dict[str, Any]] | None = None
    subagent_trajectory_ref: list[AtifRef] | None = None
    extra: dict[str, Any] | None = None


class AtifObservation(_Record, kw_only=True):
    results: list[AtifResult]


class AtifStep(_Record, kw_only=True):
    step_id: int
    timestamp: str | None = None
    source: Literal["system", "user", "agent"]
    model_name: str | None = None
    reasoning_effort: str | float | None = None
    message: str | list[dict[str, Any]]
    reasoning_content: str | None = None
    tool_calls: list[AtifToolCall] | None = None
    observation: AtifObservation | None = None
    metrics: AtifMetrics | None = None
    is_copied_context: bool | None = None
    llm_call_count: int | None = None
    extra: dict[str, Any] | None = None


class AtifAgent(_Record, kw_only=True):
    name: str
    version: str
    model_name: str | None = None
    tool_definitions: list[dict[str, Any]] | None = None
    extra: dict[str, Any] | None = None


class AtifTrajectory(_Record, kw_only=True):
    schema_version: str
    session_id: str | None = None
    trajectory_id: str | None = None
    agent: AtifAgent
    steps: list[AtifStep]
    notes: str | None = None
    final_metrics: dict[str, Any] | None = None
    continued_trajectory_ref: str | None = None
    extra: dict[str, Any] | None = None
    subagent_trajectories: list[AtifTrajectory] | None = None


_decode_trajectory = msgspec.json.Decoder(AtifTrajectory).decode


# --- recognising ---------------------------------------------------------------------------


# Any ATIF version, so that one this reader does not know is read as ATIF and refused by name.
_MARK = b'"ATIF-v'


def holds_atif(folder: Path) -> bool:
    """A folder holding ATIF trajectory files, in it or in folders below (Harbor keeps each
    trial's `agent/trajectory.json` in the trial's folder of its job's)."""
    return any(_file_is_atif(path) for path in folder.rglob("*.json"))


def _file_is_atif(path: Path) -> bool:
    """Its `schema_version` names ATIF: near the top, where writers put it, else anywhere."""
    with path.open("rb") as stream:
        head = stream.read(4096)
    if b'"schema_version"' in head and _MARK in head:
        return True
    whole = path.read_bytes()
    return b'"schema_version"' in whole and _MARK in whole


# --- reading -------------------------------------------------------------------------------


def _tokens(raw: msgspec.Raw | None) -> msgspec.Raw | None:
    return None if raw is None or bytes(raw) == b"null" else raw


def _carried(extra: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if extra is None else extra.get(CARRIED)


def _is_compaction(step: AtifStep) -> bool:
    management = (step.extra or {}).get("context_management")
    return isinstance(management, dict) and management.get("type") == "compaction"


def _text(content: str | list[dict[str, Any]] | None) -> str:
    """A message's text: a string, or the text parts of a multimodal list (other parts are
    named by their type, so a rendering shows something was there)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(
        part.get("text", "") if part.get("type") == "text" else f"[{part.get('type')}]"
        for part in content
    )


def _arguments(call: AtifToolCall) -> Any:
    """A tool call's arguments: ATIF's object, or what callgrove carried when they were not one
    (raw text a model wrote)."""
    carried = _carried(call.extra) or {}
    return carried.get("arguments", call.arguments)


def _tool_call_record(call: AtifToolCall) -> dict[str, Any]:
    """A tool call as a message's `tool_calls` entry (`Message.as_dict`), its extra kept."""
    record = {
        "id": call.tool_call_id,
        "type": "function",
        "function": {"name": call.function_name, "arguments": _arguments(call)},
    }
    extra = {k: v for k, v in (call.extra or {}).items() if k != CARRIED}
    return record | ({"extra": extra} if extra else {})


def _step_content(step: AtifStep) -> dict[str, Any] | None:
    """What an agent step says of its call besides tokens, in the shape of a rendered call's
    `content` (`response` a message as `Message.as_dict` gives it, a multimodal message's parts
    as they are); None when it says nothing. The writer writes it back (`_said`)."""
    response: dict[str, Any] = {"role": "assistant", "content": step.message}
    if step.reasoning_content:
        response["reasoning_content"] = step.reasoning_content
    if step.tool_calls:
        response["tool_calls"] = [_tool_call_record(c) for c in step.tool_calls]
    said = {
        "model": step.model_name,
        "reasoning_effort": step.reasoning_effort,
        "timestamp": step.timestamp,
        "usage": _usage(step.metrics),
    }
    content = {key: value for key, value in said.items() if value is not None}
    if step.message or len(response) > 2:
        content["response"] = response
    return content or None


def _results_not_kept(step: AtifStep) -> int:
    """Observation results whose text or `source_call_id` a token episode has no place for (a
    subagent reference's `source_call_id` is its spawn's `tool_call_id`)."""
    results = step.observation.results if step.observation else []
    return sum(
        r.content is not None or (r.source_call_id is not None and not r.subagent_trajectory_ref)
        for r in results
    )


def _is_history_text(step: AtifStep) -> bool:
    """A step whose messages are history, held in a token episode only as prompt tokens."""
    if step.source != "agent":
        return bool(_text(step.message))
    history = step.is_copied_context or step.llm_call_count == 0
    return bool(history and (_text(step.message) or step.tool_calls or step.reasoning_content))


def _where(trajectory: str, step: AtifStep | None = None) -> str:
    """Where in an episode's trajectories: a trajectory, and a step of it."""
    place = f"trajectory {trajectory}"
    return place if step is None else f"{place}, step {step.step_id}"


@dataclass
class _Node:
    """One agent: the trajectory (and its continuations) it was read from."""

    id: str
    trajectory: AtifTrajectory
    file: str
    parent: str | None = None
    start: str = "root"
    spawn: Spawn | None = None
    steps: list[AtifStep] = field(default_factory=list)


class _Reader:
    """One root trajectory and everything it links to, as one episode."""

    def __init__(
        self, root: AtifTrajectory, file: Path, folder: Path, chat: ChatFormat | None = None
    ):
        self.root = root
        self.chat = chat
        self.file = str(file)
        self.folder = folder
        self.nodes: list[_Node] = []
        self.gaps: list[dict[str, Any]] = []
        self.embedded: dict[str, AtifTrajectory] = {}
        self.copied = 0  # steps of copied history, never calls
        self.untokenised: list[tuple[_Node, AtifStep]] = []  # model steps without token ids
        self.routes: dict[str, np.ndarray] = {}  # the carried routes by call id, set once built
        self.record = self._record()  # the episode fields `extra.callgrove` gives, if any
        self.episode_id = (
            (self.record or {}).get("id") or root.trajectory_id or root.session_id or file.stem
        )

    def fail(self, message: str, trajectory: str, step: AtifStep | None = None) -> InputError:
        where = _where(trajectory, step)
        episode = getattr(self, "episode_id", None)
        return InputError(Problem(f"{where}: {message}", file=self.file, episode=episode))

    def _record(self) -> dict[str, Any] | None:
        carried = _carried(self.root.extra)
        if carried is None:
            return None
        record = carried.get("episode", {}) if isinstance(carried, dict) else None
        if not isinstance(record, dict):
            name = self.root.trajectory_id or "root"
            raise self.fail("extra.callgrove.episode must be an object", name)
        return record

    # The agents, each listed after the one that references it: calls are numbered agent by
    # agent in this order, so a subagent's calls come after the call that started it.
    def walk(self, trajectory: AtifTrajectory, node_id: str, file: str, parent: _Node | None):
        carried = _carried(trajectory.agent.extra) or {}
        node = _Node(carried.get("id", node_id), trajectory, file)
        if node.id in {n.id for n in self.nodes}:
            raise self.fail(f"agent {node.id!r} appears twice", node_id)
        self.nodes.append(node)
        for sub in trajectory.subagent_trajectories or []:
            if sub.trajectory_id is None:
                raise self.fail("an embedded subagent trajectory has no trajectory_id", node.id)
            self.embedded.setdefault(sub.trajectory_id, sub)
        node.steps = self._continued(trajectory, node.id)
        self._split_sidechains(node)
        referenced: set[str] = set()
        for step in node.steps:
            if step.source not in ("system", "user", "agent"):
                raise self.fail(f"source {step.source!r}", node.id, step)
            for result in step.observation.results if step.observation else []:
                for ref in result.subagent_trajectory_ref or []:
                    self._follow(ref, node, step, result, referenced)
        # An embedded subagent no reference names is still an agent of its embedder.
        for sub in trajectory.subagent_trajectories or []:
            if sub.trajectory_id not in referenced and sub.trajectory_id not in self._ids():
                child = self.walk(sub, sub.trajectory_id, file, node)
                self._link(child, node, None, None, None)
        return node

    def _split_sidechains(self, node: _Node) -> None:
        """Harbor's Claude Code converter keeps subagents' steps in the leader's trajectory,
        each marked `extra.is_sidechain` with the subagent's `agent_id`: each is its own agent."""
        sides: dict[str, list[AtifStep]] = {}
        own = []
        for step in node.steps:
            extra = step.extra or {}
            agent_id = extra.get("agent_id")
            if extra.get("is_sidechain") and isinstance(agent_id, str):
                sides.setdefault(agent_id, []).append(step)
            else:
                own.append(step)
        node.steps = own
        for agent_id, steps in sides.items():
            child = _Node(agent_id, node.trajectory, node.file, steps=steps)
            self.nodes.append(child)
            self._link(child, node, None, None, None)

    def _ids(self) -> set[str]:
        return {n.id for n in self.nodes} | {
            n.trajectory.trajectory_id for n in self.nodes if n.trajectory.trajectory_id
        }

    def _continued(self, trajectory: AtifTrajectory, node_id: str) -> list[AtifStep]:
        steps = list(trajectory.steps)
        seen = {self.file}
        while trajectory.continued_trajectory_ref is not None:
            path = self.folder / trajectory.continued_trajectory_ref
            if str(path) in seen or not path.is_file():
                self.gaps.append(
                    gap("atif_continuation_missing", node_id, f"{path} is not there or repeats")
                )
                break
            seen.add(str(path))
            trajectory = read_trajectory(path)
            # a segment numbers its steps from 1 again: the agent's are numbered on
            offset = len(steps)
            steps.extend(
                msgspec.structs.replace(step, step_id=step.step_id + offset)
                for step in trajectory.steps
            )
        return steps

    def _follow(
        self,
        ref: AtifRef,
        parent: _Node,
        step: AtifStep,
        result: AtifResult,
        referenced: set[str],
    ) -> None:
        if ref.trajectory_id is not None and ref.trajectory_id in self.embedded:
            referenced.add(ref.trajectory_id)
            if ref.trajectory_id in self._ids():
                return
            sub, file = self.embedded[ref.trajectory_id], parent.file
            node_id = ref.trajectory_id
        elif ref.trajectory_path is not None:
            path = self.folder / ref.trajectory_path
            if not path.is_file():
                reason = f"{_where(parent.id, step)}: {path} is not there"
                self.gaps.append(
                    gap("subagent_file_missing", step_call_id(parent.id, step), reason)
                )
                return
            sub, file = read_trajectory(path), str(path)
            node_id = sub.trajectory_id or path.stem
            if node_id in self._ids():
                return
        else:
            raise self.fail(
                f"subagent reference {ref.trajectory_id!r} names no embedded trajectory",
                parent.id,
                step,
            )
        child = self.walk(sub, node_id, file, parent)
        self._link(child, parent, step, result, ref)

    def _link(
        self,
        child: _Node,
        parent: _Node,
        step: AtifStep | None,
        result: AtifResult | None,
        ref: AtifRef | None,
    ) -> None:
        child.parent = parent.id
        said = (ref.extra or {}).get("start") if ref is not None else None
        if said in STARTS:
            child.start = said
        elif child.steps and child.steps[0].is_copied_context:
            child.start = "fork"  # it begins with its parent's history, copied
        else:
            child.start = "fresh"
            reason = "the reference does not say how it began: read as fresh"
            self.gaps.append({"kind": "atif_start_unknown", "agent": child.id, "reason": reason})
        if step is not None and step.source == "agent":
            child.spawn = Spawn(
                call=step_call_id(parent.id, step),
                tool_call_id=result.source_call_id if result else None,
                link="subagent_trajectory_ref",
            )

    def episode(self) -> Episode:
        self.walk(self.root, self.root.trajectory_id or "root", self.file, None)
        calls = self._token_calls()
        # Steps without token ids are rendered when no step has them, whether or not the
        # root carries episode fields (a reward added by hand): those are laid over it.
        if not any(calls.values()) and (self.untokenised or self.record is None):
            episode = self._rendered_episode()
        elif self.record is not None:
            episode = self._carried_episode(self.record, calls)
        else:
            episode = self._token_episode(calls)
        return self._trial_rewards(episode)

    def _trial_rewards(self, episode: Episode) -> Episode:
        """The Harbor trial's rewards, unless `extra.callgrove` said the episode's."""
        if "rewards" in (self.record or {}):
            return episode
        found = trial_rewards(Path(self.file))
        if found is not None:
            episode.rewards, result = found
            episode.meta = {**(episode.meta or {}), "rewards_from": str(result)}
        return episode

    def _model_steps(self, node: _Node) -> Iterator[AtifStep]:
        """The agent steps that are model calls."""
        for step in node.steps:
            if step.source != "agent":
                continue
            if step.is_copied_context or step.llm_call_count == 0:
                self.copied += bool(step.is_copied_context)
                continue
            yield step

    def _token_calls(self) -> dict[str, list[WireCall]]:
        """Each agent's steps that hold token ids, as calls, ledger order by walk order."""
        calls: dict[str, list[WireCall]] = {}
        seq = 0
        for node in self.nodes:
            calls[node.id] = []
            previous: _Sequence | None = None
            for step in self._model_steps(node):
                metrics = step.metrics or AtifMetrics()
                prompt = _tokens(metrics.prompt_token_ids)
                completion = _tokens(metrics.completion_token_ids)
                if completion is None:
                    self.untokenised.append((node, step))
                    continue
                if prompt is None:
                    raise self.fail("completion_token_ids without prompt_token_ids", node.id, step)
                if (step.llm_call_count or 1) > 1:
                    raise self.fail(
                        f"llm_call_count {step.llm_call_count}: one step's token ids cannot be "
                        "split into its calls",
                        node.id,
                        step,
                    )
                seq += 1
                carried = _carried(step.extra)
                # A step callgrove wrote carries its call's content (or its having none).
                content = _step_content(step) if carried is None else None
                fields = {
                    "id": f"{node.id}/step-{step.step_id}",
                    "seq": seq,
                    "purpose": "compaction" if _is_compaction(step) else "turn",
                    **({} if content is None else {"content": content}),
                    **({} if carried is None else self._carried_call(carried, node, step)),
                }
                routes = fields.pop("routes", None)
                if routes is not None:
                    self.routes[fields["id"]] = self._routes(routes, node, step)
                call = WireCall(
                    completion_ids=completion,  # type: ignore[arg-type]
                    logprobs=metrics.logprobs,
                    **fields,
                )
                previous = _prompt_after(call, prompt, previous)
                calls[node.id].append(call)
        return calls

    def _carried_call(self, carried: dict[str, Any], node: _Node, step: AtifStep) -> dict:
        unknown = sorted(carried.keys() - _CARRIED_CALL_FIELDS)
        if unknown:
            raise self.fail(f"extra.callgrove holds {unknown}, which no call has", node.id, step)
        return carried

    def _routes(self, routes: Any, node: _Node, step: AtifStep) -> np.ndarray:
        """A step's carried routes as an array; its shape is checked with the episode's."""
        try:
            array = np.asarray(msgspec.convert(routes, list[list[list[int]]]), dtype=ROUTE_DTYPE)
        except (msgspec.ValidationError, ValueError, OverflowError) as error:
            message = f"extra.callgrove.routes are no lists of expert indices: {error}"
            raise self.fail(message, node.id, step) from None
        return array.reshape(0, 0, 0) if array.shape == (0,) else array

    def _wire_agent(self, node: _Node, calls: list[WireCall]) -> WireAgent:
        return WireAgent(
            id=node.id,
            name=node.trajectory.agent.name,
            parent=node.parent,
            start=node.start,
            calls=calls,
            meta=join_spawn(node.spawn, _agent_meta(node)),  # read back as the agent's spawn
        )

    def _count_untokenised(self) -> None:
        for node, step in self.untokenised:
            reason = f"{_where(node.id, step)}: a model step without token ids"
            self.gaps.append(
                gap("atif_step_without_token_ids", step_call_id(node.id, step), reason)
            )
        self._count_history()

    def _count_history(self) -> None:
        """A token episode holds its history as the prompts' tokens: the text of the steps
        that are history, and of observation results, has no place in it. One gap per agent
        counts them (`messages`: system, user, copied and dispatch steps; `results`)."""
        for node in self.nodes:
            messages = sum(_is_history_text(step) for step in node.steps)
            results = sum(_results_not_kept(step) for step in node.steps)
            if messages or results:
                reason = (
                    "history kept as prompt tokens only: the text of its system, user and "
                    "copied steps and its observation results (with their source_call_id)"
                )
                self.gaps.append(
                    {
                        "kind": HISTORY_NOT_KEPT,
                        "agent": node.id,
                        "reason": reason,
                        "messages": messages,
                        "results": results,
                    }
                )

    def _token_episode(self, calls: dict[str, list[WireCall]]) -> Episode:
        self._count_untokenised()
        wire = WireEpisode(
            format=FORMAT,
            id=self.episode_id,
            agents=[self._wire_agent(node, calls[node.id]) for node in self.nodes],
            gaps=self.gaps or UNSET,
            meta=self._meta(),
        )
        return self._built(wire)

    def _carried_episode(
        self, carried: dict[str, Any], calls: dict[str, list[WireCall]]
    ) -> Episode:
        self._count_untokenised()
        try:
            agents = [self._carried_agent(node, calls[node.id]) for node in self.nodes]
            wire = self._carried_wire(carried)
        except msgspec.ValidationError as error:
            raise self.fail(f"extra.callgrove: {error}", self.nodes[0].id) from None
        wire.agents = _in_order(agents, (_carried(self.root.extra) or {}).get("agent_order"))
        if self.gaps:  # what was not found while reading it
            wire.gaps = [*(wire.gaps or []), *self.gaps]
        return self._built(wire)

    def _carried_wire(self, record: dict[str, Any]) -> WireEpisode:
        """The episode fields `extra.callgrove.episode` gives. callgrove writes the whole record;
        one without an `id` was written by hand or by another tool (a reward alone, say), and
        the rest is what ATIF says: its id, and the reader's meta beside any it gives."""
        fields = {**record, "id": self.episode_id, "format": FORMAT}
        if "id" not in record:
            fields["meta"] = {**self._meta(), **(record.get("meta") or {})}
        return msgspec.convert(fields, WireEpisode)

    def _overlaid(self, episode: Episode) -> Episode:
        """A rendered episode with the fields `extra.callgrove.episode` gives laid over it:
        its gaps and meta added to the reader's, any other field in place of the rendering's
        (its agents are the trajectories')."""
        if not self.record:
            return episode
        try:
            given = self._carried_wire(self.record)
        except msgspec.ValidationError as error:
            raise self.fail(f"extra.callgrove: {error}", self.nodes[0].id) from None
        wire = episode_to_wire(episode)
        for name in self.record.keys() & _LAID_OVER:
            setattr(wire, name, getattr(given, name))
        if given.gaps:
            wire.gaps = [*(wire.gaps or []), *given.gaps]
        wire.meta = {**(wire.meta or {}), **(given.meta or {})}
        return self._built(wire)

    def _carried_agent(self, node: _Node, calls: list[WireCall]) -> WireAgent:
        """The agent callgrove wrote, or one a later tool added (read as ATIF says it)."""
        carried = _carried(node.trajectory.agent.extra)
        if carried is None:
            return self._wire_agent(node, calls)
        agent = msgspec.convert(carried, WireAgent)
        agent.calls = calls
        return agent

    def _built(self, wire: WireEpisode) -> Episode:
        try:
            episode = episode_from_wire(wire)
            if self.routes:
                _give_routes(episode, self.routes)
            return episode
        except InputError as error:
            raise error.located(file=self.file, episode=wire.id) from None

    def _meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"source": "atif", "schema_version": self.root.schema_version}
        if self.root.session_id is not None:
            meta["session_id"] = self.root.session_id
        if self.copied:
            meta["copied_steps"] = self.copied
        return meta

    def _rendered_episode(self) -> Episode:
        agents = {node.id: _transcript_agent(node) for node in self.nodes}
        order = 0
        for node in self.nodes:
            history: Turn | None = None
            for step in node.steps:
                history, order = self._render_step(agents[node.id], node, step, history, order)
        for node, step in self.untokenised:
            if (step.llm_call_count or 1) > 1:
                reason = f"{_where(node.id, step)}: {step.llm_call_count} model calls"
                self.gaps.append(gap("atif_aggregated_step", step_call_id(node.id, step), reason))
        if self.chat is None and self.untokenised:  # some call is rendered
            reason = (
                "rendered with callgrove's byte-level format, not the model's tokenizer: "
                "give --tokenizer (or --model)"
            )
            self.gaps.append({"kind": RENDERED_BYTEWISE, "reason": reason})
        transcript = Transcript(
            id=self.episode_id,
            agents=list(agents.values()),
            gaps=[gap_from_json(g, self.episode_id) for g in self.gaps],
            meta={**self._meta(), "rendered_steps": sum(len(a.calls) for a in agents.values())},
        )
        try:
            return self._overlaid(TranscriptRenderer(self.chat).episode(transcript))
        except InputError as error:
            raise error.located(file=self.file, episode=self.episode_id) from None

    def _render_step(
        self,
        agent: TranscriptAgent,
        node: _Node,
        step: AtifStep,
        history: Turn | None,
        order: int,
    ) -> tuple[Turn | None, int]:
        text = _text(step.message)
        if step.source == "system" and _is_compaction(step):
            history = None  # the history was replaced by a summary
        if step.source != "agent":
            role = "system" if step.source == "system" else "user"
            history = extend(history, [Message(role, text)]) if text else history
        else:
            answer = Message(
                "assistant",
                text,
                thinking=step.reasoning_content or "",
                tool_calls=tuple(
                    ToolCall(c.tool_call_id, c.function_name, _arguments(c))
                    for c in step.tool_calls or []
                ),
            )
            is_call = not step.is_copied_context and step.llm_call_count != 0
            if is_call:
                order += 1
                call = TranscriptCall(
                    id=step_call_id(node.id, step),
                    agent=agent,
                    context=history,
                    response=answer,
                    order=(order,),
                    content=CallRecord(
                        source=Source(file=node.file, lines=[]),
                        model=step.model_name or node.trajectory.agent.model_name,
                        usage=_usage(step.metrics),
                    ),
                    purpose="compaction" if _is_compaction(step) else "turn",
                )
                agent.calls.append(call)
                history = call.answer
            else:
                history = extend(history, [answer])
        results = step.observation.results if step.observation else []
        tool_messages = [
            Message("tool", _text(r.content), tool_call_id=r.source_call_id)
            for r in results
            if r.content is not None
        ]
        return extend(history, tool_messages), order


def _give_routes(episode: Episode, routes: dict[str, np.ndarray]) -> None:
    """Each call its carried routes (whole: `routes_from` 0), checked as the episode's, then
    held as its prompt base's where they agree: memory grows with what each call adds, as its
    tokens' does, though ATIF repeats every prompt whole."""
    calls = list(episode.calls())
    for call in calls:
        call.routes = routes.get(call.id)
    _shape_empty_routes(calls)
    check_routes(calls, episode.id)
    for call in calls:
        if call.routes is not None and call.prompt_from is not None:
            share_routes(call, call.routes, episode.find)


def _shape_empty_routes(calls: list[Call]) -> None:
    """Routes over no position (a one-token call's), read as `[]`, given the layers and k of
    the episode's other routes (when none has any, (0, 0, 0): nothing tells them)."""
    shapes = [c.routes.shape[1:] for c in calls if c.routes is not None and len(c.routes)]
    for call in calls:
        if shapes and call.routes is not None and call.routes.shape == (0, 0, 0):
            call.routes = np.empty((0, *shapes[0]), dtype=ROUTE_DTYPE)


@dataclass(frozen=True)
class _Sequence:
    """A call's full sequence as JSON text without its closing bracket, and its length."""

    call: str
    text: bytes
    length: int


def _count(raw: bytes) -> int:
    """Token ids in a JSON list of them."""
    return 0 if raw.strip(b"[] \n") == b"" else raw.count(b",") + 1


def _prompt_after(call: WireCall, prompt: msgspec.Raw, previous: _Sequence | None) -> _Sequence:
    """Set the call's prompt, and return its full sequence for the next call of its agent.

    ATIF repeats each step's whole prompt. When it begins, byte for byte, with the JSON text
    of the agent's previous call's full sequence, the prompt is held as that call's tokens
    plus what follows (callgrove's compact form), and only what follows is parsed: reading
    costs what the episode adds, not the square of its length. Any other text (another
    spacing, a history that changed) is parsed whole."""
    text = bytes(prompt)
    completion = bytes(call.completion_ids)  # type: ignore[arg-type]
    length = None
    if previous is not None and text.startswith(previous.text):
        rest = text[len(previous.text) :]
        if rest[:1] in (b"]", b","):
            suffix = b"[" + rest[1:] if rest[:1] == b"," else b"[]"
            call.prompt_from = previous.call
            call.prompt_from_len = previous.length
            call.prompt_suffix_ids = msgspec.Raw(suffix)
            length = previous.length + _count(suffix)
    if length is None:
        call.prompt_ids = prompt  # type: ignore[assignment]
        length = _count(text)
    joined = text[:-1] + (b"," if length else b"") + completion.lstrip()[1:]
    return _Sequence(call.id, joined.rstrip()[:-1], length + _count(completion))


def _usage(metrics: AtifMetrics | None) -> dict[str, Any] | None:
    if metrics is None:
        return None
    usage = {
        "prompt_tokens": metrics.prompt_tokens,
        "completion_tokens": metrics.completion_tokens,
        "cached_tokens": metrics.cached_tokens,
        "cost_usd": metrics.cost_usd,
    }
    return {key: value for key, value in usage.items() if value is not None} or None


def _transcript_agent(node: _Node) -> TranscriptAgent:
    return TranscriptAgent(
        id=node.id,
        name=node.trajectory.agent.name,
        parent=node.parent,
        start=node.start,
        meta=_agent_meta(node),
        spawn=node.spawn,
    )


def _agent_meta(node: _Node) -> dict[str, Any]:
    """The file it was read from and its trajectory's agent (the writer writes it back from
    here)."""
    agent = node.trajectory.agent
    meta: dict[str, Any] = {"file": node.file, "version": agent.version}
    if agent.model_name is not None:
        meta["model_name"] = agent.model_name
    if agent.tool_definitions is not None:
        meta["tool_definitions"] = agent.tool_definitions
    return meta


def _in_order(agents: list[WireAgent], order: Any) -> list[WireAgent]:
    """The agents in the order callgrove wrote them in (`extra.callgrove.agent_order`), which
    the trajectories' own (the root first, each subagent after its referrer) need not be; as
    they were read when the order names other agents."""
    if not isinstance(order, list) or sorted(map(str, order)) != sorted(a.id for a in agents):
        return agents
    by_id = {agent.id: agent for agent in agents}
    return [by_id[agent_id] for agent_id in order]


def _call_fields(carried: dict[str, Any]) -> dict[str, Any]:
    """The call fields callgrove wrote under a step's `extra.callgrove`."""
    return {name: value for name, value in carried.items() if name in _CARRIED_CALL_FIELDS}


def step_call_id(agent: str, step: AtifStep) -> str:
    """The id of the call an agent step is (unless the step carries callgrove's own)."""
    carried = _carried(step.extra)
    return carried["id"] if carried and "id" in carried else f"{agent}/step-{step.step_id}"


def read_trajectory(path: Path) -> AtifTrajectory:
    """One ATIF document; an `InputError` naming the file and what is wrong."""
    try:
        trajectory = _decode_trajectory(path.read_bytes())
    except (OSError, msgspec.DecodeError) as error:
        raise InputError(Problem(f"not an ATIF trajectory: {error}", file=str(path))) from None
    _check_version(trajectory, str(path), None)
    return trajectory


def _check_version(
    trajectory: AtifTrajectory, file: str, line: int | None, name: str | None = None
) -> None:
    """The trajectory's version, and every embedded subagent trajectory's, is one this reader
    knows (a referenced file and a continuation are checked as they are read)."""
    name = name or trajectory.trajectory_id or trajectory.session_id or Path(file).stem
    if trajectory.schema_version not in ATIF_VERSIONS:
        message = (
            f"trajectory {name}: schema_version {trajectory.schema_version!r} is not one this "
            f"reader knows ({ATIF_VERSIONS[0]} to {ATIF_VERSIONS[-1]})"
        )
        raise InputError(Problem(message, file=file, line=line))
    for sub in trajectory.subagent_trajectories or []:
        _check_version(sub, file, line, sub.trajectory_id or f"{name} (an embedded subagent)")


def _roots(
    path: Path, diagnostics: Diagnostics | None
) -> Iterator[tuple[int, AtifTrajectory, Path]]:
    """The root trajectories a file or folder holds, numbered from 1: every line of a `.jsonl`
    file, the one document of a `.json` file, and in a folder each `.json` file no other file
    names as a subagent or a continuation, in it or below. One that cannot be read is
    `_refused`."""
    if path.is_dir():
        trajectories = {}
        for file in sorted(p for p in path.rglob("*.json") if _file_is_atif(p)):
            try:
                trajectories[file] = read_trajectory(file)
            except InputError as error:
                _refused(error, diagnostics)
        named = {
            (p.parent / name).resolve() for p, t in trajectories.items() for name in _files_named(t)
        }
        roots = [(p, t) for p, t in trajectories.items() if p.resolve() not in named]
        for number, (file, trajectory) in enumerate(roots, start=1):
            yield number, trajectory, file
        return
    if path.name.endswith(".jsonl"):
        with path.open("rb") as stream:
            for number, line in enumerate(stream, start=1):
                if not line.strip():
                    continue
                try:
                    yield number, _decoded_line(line, path, number), path
                except InputError as error:
                    _refused(error, diagnostics)
        return
    try:
        yield 1, read_trajectory(path), path
    except InputError as error:
        _refused(error, diagnostics)


def _refused(error: InputError, diagnostics: Diagnostics | None) -> None:
    """Raised without `diagnostics`; recorded there otherwise, and the rest is still read."""
    if diagnostics is None:
        raise error
    diagnostics.add(error.problem)


def _decoded_line(line: bytes, path: Path, number: int) -> AtifTrajectory:
    try:
        trajectory = _decode_trajectory(line)
    except msgspec.DecodeError as error:
        problem = Problem(f"not an ATIF trajectory: {error}", file=str(path), line=number)
        raise InputError(problem) from None
    _check_version(trajectory, str(path), number)
    return trajectory


def _files_named(trajectory: AtifTrajectory) -> Iterator[str]:
    if trajectory.continued_trajectory_ref is not None:
        yield trajectory.continued_trajectory_ref
    for step in trajectory.steps:
        for result in step.observation.results if step.observation else []:
            for ref in result.subagent_trajectory_ref or []:
                if ref.trajectory_path is not None and ref.trajectory_id is None:
                    yield ref.trajectory_path
    for sub in trajectory.subagent_trajectories or []:
        yield from _files_named(sub)


def read_atif(
    path: str | os.PathLike[str],
    diagnostics: Diagnostics | None = None,
    chat: ChatFormat | None = None,
) -> Iterator[tuple[int, Episode]]:
    """Stream `(number, episode)`, one episode per root trajectory. Without `diagnostics` the
    first bad trajectory raises `InputError` (naming file, trajectory and step); with it, each
    is recorded there and the rest are still read. Trajectories without token ids are rendered
    through `chat` (the model's chat format: `callgrove import`'s --model or --tokenizer);
    without it, through callgrove's byte-level format, and each such episode says so in its
    gaps (`atif_rendered_bytewise`). Through the format registry:
    `load(path, format="atif", chat=chat)`."""
    path = Path(path)
    folder = path if path.is_dir() else path.parent
    taken: set[str] = set()
    for number, trajectory, file in _roots(path, diagnostics):
        try:
            reader = _Reader(trajectory, file, folder, chat)
            if path.is_dir() and reader.episode_id in taken:
                # runs of one session saved as several files: each file is its own episode
                suffix = file.relative_to(path).with_suffix("")
                reader.episode_id = f"{reader.episode_id}:{suffix}"
            taken.add(reader.episode_id)
            episode = reader.episode()
        except InputError as error:
            _refused(error.located(file=str(file), line=number), diagnostics)
            continue
        yield number, episode


def takes_chat(form: Any) -> bool:
    """Whether an episode format's reader takes the `chat` option (`read_atif` does): the
    option is given only to such readers."""
    return "chat" in inspect.signature(form.read).parameters


class _HarborVerifier(msgspec.Struct):
    rewards: dict[str, float] | None = None


class _HarborStep(msgspec.Struct):
    step_name: str | None = None
    verifier_result: _HarborVerifier | None = None


class _HarborTrial(msgspec.Struct):
    """What is read of a Harbor trial's `result.json` (harbor.models.trial.result.TrialResult)."""

    verifier_result: _HarborVerifier | None = None
    step_results: list[_HarborStep] | None = None


def trial_rewards(trajectory: Path) -> tuple[dict[str, float], Path] | None:
    """The rewards Harbor's verifier gave the trial whose folder holds this trajectory file
    (`<trial>/agent/trajectory.json`, or a step's `<trial>/steps/<step>/agent/...`), read from
    the trial's `result.json`, and that file; None when there is none or it holds none. A
    `result.json` that cannot be read as one is an `InputError` naming it."""
    agent = trajectory.parent
    if agent.name != "agent" or not trajectory.name.endswith(".json"):
        return None
    trial, step = agent.parent, None
    if trial.parent.name == "steps":
        trial, step = trial.parent.parent, trial.name
    result = trial / "result.json"
    if not result.is_file():
        return None
    try:
        read = msgspec.json.decode(result.read_bytes(), type=_HarborTrial)
    except (OSError, msgspec.DecodeError) as error:
        message = f"not a Harbor trial result: {error}"
        raise InputError(Problem(message, file=str(result))) from None
    verifier = read.verifier_result
    if step is not None:
        steps = [s for s in read.step_results or [] if s.step_name == step]
        verifier = steps[0].verifier_result if steps else None
    if verifier is None or verifier.rewards is None:
        return None
    return dict(verifier.rewards), result


# --- writing -------------------------------------------------------------------------------


def _raw(values: Any) -> msgspec.Raw:
    return msgspec.Raw(orjson.dumps(values, option=orjson.OPT_SERIALIZE_NUMPY))


def _call_message(content: Any) -> str | list[dict[str, Any]]:
    """The message a call answered with, when an importer kept its messages (text, or a
    multimodal message's parts as ATIF read them)."""
    message = _response(content).get("content")
    if isinstance(message, list) and all(isinstance(part, dict) for part in message):
        return message
    return message if isinstance(message, str) else ""


def _response(content: Any) -> dict[str, Any]:
    response = content.get("response") if isinstance(content, dict) else None
    return response if isinstance(response, dict) else {}


def _atif_tool_call(record: Any) -> AtifToolCall | None:
    """A `tool_calls` entry of a kept message as ATIF's; arguments that are no object (raw
    text a model wrote) travel in its `extra.callgrove`. None for an entry of another shape."""
    function = record.get("function") if isinstance(record, dict) else None
    if not isinstance(function, dict) or not isinstance(record.get("id"), str):
        return None
    if not isinstance(function.get("name"), str):
        return None
    arguments = function.get("arguments")
    extra = dict(record.get("extra") or {})
    if not isinstance(arguments, dict):
        extra[CARRIED] = {"arguments": arguments}
        arguments = {}
    return AtifToolCall(
        tool_call_id=record["id"],
        function_name=function["name"],
        arguments=arguments,
        extra=extra or None,
    )


def _said(content: Any) -> dict[str, Any]:
    """The step fields a call's content gives back (`_step_content` in reverse): its message,
    reasoning and tool calls, the model that answered, when and with what effort."""
    response = _response(content)
    reasoning = response.get("reasoning_content")
    tool_calls = [_atif_tool_call(c) for c in response.get("tool_calls") or []]
    fields: dict[str, Any] = {
        "message": _call_message(content),
        "reasoning_content": reasoning if isinstance(reasoning, str) and reasoning else None,
        "tool_calls": [c for c in tool_calls if c is not None] or None,
    }
    if isinstance(content, dict):
        model, effort = content.get("model"), content.get("reasoning_effort")
        fields["model_name"] = model if isinstance(model, str) else None
        fields["reasoning_effort"] = effort if isinstance(effort, str | float | int) else None
        fields["timestamp"] = (
            content.get("timestamp") if _is_time(content.get("timestamp")) else None
        )
    return fields


def _is_time(value: Any) -> bool:
    """An ISO 8601 time, as Harbor's step model requires of a `timestamp`."""
    if not isinstance(value, str):
        return False
    try:
        datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return False
    return True


def _usage_metrics(content: Any) -> dict[str, Any]:
    """The cached tokens and cost a call's content recorded (ATIF's metrics hold them)."""
    usage = content.get("usage") if isinstance(content, dict) else None
    if not isinstance(usage, dict):
        return {}
    cached, cost = usage.get("cached_tokens"), usage.get("cost_usd")
    return {
        "cached_tokens": cached if isinstance(cached, int) else None,
        "cost_usd": float(cost) if isinstance(cost, int | float) else None,
    }


def episode_trajectory(episode: Episode) -> AtifTrajectory:
    """The episode as one root trajectory: its first agent without a parent at the root, every
    other agent an embedded subagent trajectory, referenced from the step of the call that
    started it (or, when none is recorded, from a system step at the end of its parent's)."""
    if not episode.agents:
        raise InputError(
            Problem("an episode with no agent has no trajectory in ATIF", episode=episode.id)
        )
    wire = _without_routes(episode_to_wire(episode))  # a step carries its call's, whole
    del wire["format"]  # the record is ATIF; the reader names callgrove's format again
    agents_wire = {agent["id"]: agent for agent in wire.pop("agents")}
    root = next((a for a in episode.agents if a.parent is None), episode.agents[0])
    children: dict[str, list[str]] = {}
    for agent in episode.agents:
        if agent is not root:
            children.setdefault(agent.parent or root.id, []).append(agent.id)
    trajectories = {}
    for agent in episode.agents:
        trajectories[agent.id] = _agent_trajectory(
            episode, agent, agents_wire[agent.id], children.get(agent.id, [])
        )
    top = trajectories[root.id]
    top.extra = {CARRIED: {"episode": wire, "agent_order": [a.id for a in episode.agents]}}
    top.session_id = episode.id
    subs = [trajectories[a.id] for a in episode.agents if a is not root]
    top.subagent_trajectories = subs or None
    return top


def _without_routes(wire: WireEpisode) -> dict[str, Any]:
    """The wire form as plain data, without the calls' routes (held as their bases')."""
    for agent in wire.agents:
        for call in agent.calls:
            call.routes = call.routes_from = UNSET
    return msgspec.to_builtins(wire)


def written_losses(episode: Episode) -> dict[str, int]:
    """What of `episode` its ATIF trajectory does not give back, counted by kind: the
    trajectory is read back as callgrove reads it and compared field by field, prompts as their
    tokens (`episode.<field>`, `agent.<field>`, `call.<field>`, `agent` or `call` for one not
    read back at all, `agent_order`). Empty for every episode callgrove holds today (what ATIF
    has no field for is carried under `extra.callgrove`); it costs one read of the trajectory,
    for `convert` to say what a conversion would leave out, if anything."""
    document = msgspec.json.encode(episode_trajectory(episode))
    try:
        reader = _Reader(_decode_trajectory(document), Path("written.json"), Path())
        back = reader.episode()
    except InputError:
        return {"episode": 1}
    return _losses(_comparable(episode), _comparable(back))


def _comparable(episode: Episode) -> dict[str, Any]:
    """The episode's wire form with each prompt as its tokens and its routes whole (how a
    prompt or its routes are held, whole or after another call's, is no content)."""
    wire = _without_routes(episode_to_wire(episode))
    for agent_wire, agent in zip(wire["agents"], episode.agents, strict=True):
        for call_wire, call in zip(agent_wire["calls"], agent.calls, strict=True):
            for name in ("prompt_ids", "prompt_from", "prompt_from_len", "prompt_suffix_ids"):
                call_wire.pop(name, None)
            call_wire["prompt"] = episode.prompt_ids(call).tolist()
            routes = episode.routes(call)
            if routes is not None:
                call_wire["routes"] = [list(routes.shape), routes.tolist()]
    return wire


def _losses(given: dict[str, Any], back: dict[str, Any]) -> dict[str, int]:
    counts: dict[str, int] = {}

    def differ(kind: str, ours: dict[str, Any], theirs: dict[str, Any], skip: str) -> None:
        for name in (ours.keys() | theirs.keys()) - {skip}:
            if ours.get(name) != theirs.get(name):
                counts[f"{kind}.{name}"] = counts.get(f"{kind}.{name}", 0) + 1

    differ("episode", given, back, "agents")
    agents = {a["id"]: a for a in back["agents"]}
    if [a["id"] for a in given["agents"]] != list(agents) and set(agents) >= {
        a["id"] for a in given["agents"]
    }:
        counts["agent_order"] = 1
    for agent in given["agents"]:
        read = agents.get(agent["id"])
        if read is None:
            counts["agent"] = counts.get("agent", 0) + 1
            continue
        differ("agent", agent, read, "calls")
        calls = {c["id"]: c for c in read["calls"]}
        for call in agent["calls"]:
            if call["id"] not in calls:
                counts["call"] = counts.get("call", 0) + 1
            else:
                differ("call", call, calls[call["id"]], "id")
    return counts


def _agent_trajectory(
    episode: Episode, agent: Agent, wire: dict[str, Any], children: list[str]
) -> AtifTrajectory:
    calls_wire = wire.pop("calls")
    steps: list[AtifStep] = []
    spawned: dict[str | None, list[str]] = {}
    for child in children:
        spawn = _agent(episode, child).spawn
        spawned.setdefault(spawn.call if spawn else None, []).append(child)
    for call, call_wire in zip(agent.calls, calls_wire, strict=True):
        carried = _call_fields(call_wire)
        routes = episode.routes(call)
        if routes is not None:
            carried["routes"] = _raw(np.ascontiguousarray(routes))
        step = AtifStep(
            step_id=len(steps) + 1,
            source="agent",
            **_said(call.content),
            metrics=AtifMetrics(
                prompt_tokens=call.prompt_len,
                completion_tokens=len(call.completion_ids),
                prompt_token_ids=_raw(episode.prompt_ids(call)),
                completion_token_ids=_raw(call.completion_ids),
                logprobs=None if call.logprobs is None else call.logprobs.tolist(),
                **_usage_metrics(call.content),
            ),
            extra={CARRIED: carried}
            | (
                {"context_management": {"type": "compaction"}}
                if call.purpose == "compaction"
                else {}
            ),
        )
        started = spawned.pop(call.id, [])
        if started:
            tool_call_ids = {c.tool_call_id for c in step.tool_calls or []}
            step.observation = AtifObservation(
                results=[_reference(episode, c, tool_call_ids) for c in started]
            )
        steps.append(step)
    unplaced = [child for group in spawned.values() for child in group]
    if unplaced or not steps:
        steps.append(
            AtifStep(
                step_id=len(steps) + 1,
                source="system",
                message="",
                observation=AtifObservation(
                    results=[_reference(episode, c, set()) for c in unplaced]
                )
                if unplaced
                else None,
            )
        )
    return AtifTrajectory(
        schema_version=WRITTEN_VERSION,
        trajectory_id=agent.id,
        agent=AtifAgent(name=agent.name, **_atif_agent(agent.meta), extra={CARRIED: wire}),
        steps=steps,
    )


def _atif_agent(meta: dict[str, Any] | None) -> dict[str, Any]:
    """The trajectory's agent fields an agent read from ATIF keeps in its meta."""
    meta = meta or {}
    version, model = meta.get("version"), meta.get("model_name")
    tools = meta.get("tool_definitions")
    return {
        "version": version if isinstance(version, str) else "unknown",
        "model_name": model if isinstance(model, str) else None,
        "tool_definitions": tools
        if isinstance(tools, list) and all(isinstance(t, dict) for t in tools)
        else None,
    }


def _agent(episode: Episode, agent_id: str) -> Agent:
    return next(a for a in episode.agents if a.id == agent_id)


def _reference(episode: Episode, child: str, tool_call_ids: set[str]) -> AtifResult:
    """The result referencing a subagent; its `source_call_id` the tool call that started it,
    where the step holds that call (ATIF allows no other)."""
    agent = _agent(episode, child)
    tool_call_id = agent.spawn.tool_call_id if agent.spawn is not None else None
    return AtifResult(
        source_call_id=tool_call_id if tool_call_id in tool_call_ids else None,
        subagent_trajectory_ref=[AtifRef(trajectory_id=child, extra={"start": agent.start})],
    )


class AtifWriter:
    """Episodes as ATIF: into a `.json` file (one episode), a `.jsonl` file (a trajectory per
    line) or a folder (`<episode id>.json` each)."""

    def __init__(self, path: Path, append: bool = False):
        self.path = path
        self.lines = 0
        self.names: set[str] = set()  # the files written into a folder
        self.single = path.name.endswith(".json")
        self.folder = not self.single and not path.name.endswith(".jsonl")
        if self.folder:
            path.mkdir(parents=True, exist_ok=True)
            self.stream = None
        else:
            self.stream = path.open("ab" if append else "wb")

    def write(self, episode: Episode) -> None:
        if self.single and self.lines:
            raise InputError(
                Problem(
                    "a .json file holds one trajectory: write to a folder or a .jsonl file",
                    file=str(self.path),
                    episode=episode.id,
                )
            )
        encoded = msgspec.json.encode(episode_trajectory(episode))
        if self.stream is None:
            (self.path / self._file_name(episode.id)).write_bytes(encoded + b"\n")
        else:
            self.stream.write(encoded + b"\n")
        self.lines += 1

    def _file_name(self, episode_id: str) -> str:
        """`<episode id>.json`, numbered on where two ids make one name (`a/b` and `a_b`): a
        later episode never overwrites an earlier one (the id read back is the carried one)."""
        base = _safe_name(episode_id)
        name, number = f"{base}.json", 1
        while name in self.names:
            number += 1
            name = f"{base}.{number}.json"
        self.names.add(name)
        return name

    def sync(self) -> None:
        if self.stream is not None:
            self.stream.flush()

    def close(self) -> None:
        if self.stream is not None:
            self.stream.close()

    def __enter__(self) -> AtifWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _safe_name(episode_id: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in episode_id)

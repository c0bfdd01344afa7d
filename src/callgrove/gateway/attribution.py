"""Which episode and agent a request belongs to, from the URL, the key and the harness's headers.

The episode comes from the URL prefix `/e/EPISODE/...` or from an API key `cg:EPISODE` (or
`cg:EPISODE:TOKEN` where client tokens are required); a request naming none is recorded under
the episode `untagged`. The agent comes from, in order:

- `X-Callgrove-Agent` (with `X-Callgrove-Parent`, `X-Callgrove-Start`, `X-Callgrove-Name`,
  `X-Callgrove-Purpose`) for one's own harnesses;
- Claude Code's `x-claude-code-session-id` (the main thread), `x-claude-code-agent-id` and
  `x-claude-code-parent-agent-id` (subagents);
- Codex's `thread-id`, `x-codex-parent-thread-id` and `x-codex-turn-metadata`
  (`history_initialization`, `request_kind`); a subagent's name is the importer's
  (`codex_records.agent_name`), read from the `spawn_agent` call that started it and the
  tool output naming the new thread (`CodexNames`);
- otherwise one agent, `main`, per episode.

A subagent whose parent is not named (Claude Code names none for subagents of the main thread)
is matched to the `Agent` / `Task` tool call, relayed earlier by the gateway, whose prompt its
first messages carry; that call also tells its start: a `fork`, a `background` run, or `fresh`.

Invariant: every call of an episode is given exactly one agent, made on that agent's first
call (`Roster.agent_for`) with a parent that has called before it, and the same agent for
every later call with its id. Only the harness's own word can change an agent once made: a
tool result naming which subagent a spawn started (`Roster.note_call`) trades the starts and
names of two subagents that a match by prompt had swapped, and a Codex output names a thread.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import msgspec
import orjson

from callgrove.chat import Message
from callgrove.episode import AGENT_STARTS, Agent
from callgrove.gateway.ledger import LedgerAgent
from callgrove.serving.web import HttpError
from callgrove.transcripts.claude_records import SPAWN_TOOLS, SpawnArguments
from callgrove.transcripts.codex_records import agent_name

EPISODE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
AGENT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}")
UNTAGGED = "untagged"
NAME_LIMIT = 256  # characters of an agent's name or task path a header may give (stored per call)
KEY_PREFIX = "cg:"
CODEX_SPAWN_TOOL = "spawn_agent"
CODEX_ROOT = "/root"  # the leader's `agent_name`, and every thread's in a v1 run
# Claude Code's compaction request appends its instruction to the last user message: it asks
# for a "summary of the conversation" and opens with "CRITICAL: Respond with TEXT ONLY. Do NOT
# call any tools." (2.1.332). Both must be there: a user's own prompt that asks for a summary of
# the conversation is an ordinary turn.
CLAUDE_COMPACTION_MARKS = ("summary of the conversation", "do not call any tools")
CLAUDE_VERSION = re.compile(r"claude-cli/(\d+\.\d+\.\d+)")
# A Task/Agent tool result names the subagent it started (the agent id its calls carry).
SPAWNED_AGENT = re.compile(r"agentId: ([A-Za-z0-9_-]+)")


def is_claude_compaction(messages: list[Message]) -> bool:
    """Whether a Claude Code request is a compaction: its last user message carries the
    compaction instruction (`CLAUDE_COMPACTION_MARKS`)."""
    last_user = next((m.text for m in reversed(messages) if m.role == "user"), "").lower()
    return all(mark in last_user for mark in CLAUDE_COMPACTION_MARKS)


def is_episode_id(value: str) -> bool:
    """Whether `value` is an episode id safe as a file name in the ledger folder (no
    separators, no dot-dot)."""
    return EPISODE_ID.fullmatch(value) is not None and ".." not in value


def valid_episode(value: str) -> str:
    """`value`, if it is an episode id (`is_episode_id`); else a 400."""
    if not is_episode_id(value):
        raise HttpError(400, f"invalid episode id {value[:80]!r}: letters, digits, . _ - only")
    return value


def bounded(value: str | None, header: str) -> str | None:
    """A header's value that is stored with the agent, if it is within `NAME_LIMIT`; a 400
    naming the header otherwise."""
    if value is not None and len(value) > NAME_LIMIT:
        raise HttpError(
            400, f"{header} of {len(value)} characters, over the {NAME_LIMIT}-character limit"
        )
    return value


def valid_agent(value: str) -> str:
    if not AGENT_ID.fullmatch(value):
        raise HttpError(400, f"invalid agent id {value[:80]!r}")
    return value


def episode_from_key(key: str | None) -> tuple[str | None, str | None]:
    """(episode, remaining token) of an API key `cg:EPISODE[:TOKEN]`; (None, key) otherwise."""
    if key is None or not key.startswith(KEY_PREFIX):
        return None, key
    episode, _, token = key[len(KEY_PREFIX) :].partition(":")
    return valid_episode(episode), token or None


@dataclass
class Identity:
    """The agent a request speaks for, as far as the request itself says."""

    agent: str
    name: str | None = None
    parent: str | None = None
    start: str | None = None
    purpose: str = "turn"
    # Claude Code's main thread: subagents without a parent header belong to it.
    root: str | None = None
    harness: str = "callgrove"
    version: str | None = None  # the harness CLI's release (Claude Code's user-agent)
    path: str | None = None  # a Codex v2 subagent's task path (`/root/NAME`)


def _metadata(raw: str | None) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return {}
    return data if isinstance(data, dict) else {}


def identify(headers: Any, messages: list[Message]) -> Identity:
    """The agent identity that the request's headers (and compaction markers) give."""
    own = headers.get("x-callgrove-agent")
    purpose = headers.get("x-callgrove-purpose") or "turn"
    if purpose not in ("turn", "compaction"):
        raise HttpError(400, "X-Callgrove-Purpose must be turn or compaction")
    if own:
        start = headers.get("x-callgrove-start")
        if start is not None and start not in AGENT_STARTS:
            raise HttpError(400, f"X-Callgrove-Start must be one of {', '.join(AGENT_STARTS)}")
        parent = headers.get("x-callgrove-parent")
        return Identity(
            valid_agent(own),
            bounded(headers.get("x-callgrove-name"), "X-Callgrove-Name"),
            valid_agent(parent) if parent else None,
            start,
            purpose,
        )
    session = headers.get("x-claude-code-session-id")
    if session:
        agent = headers.get("x-claude-code-agent-id")
        parent = headers.get("x-claude-code-parent-agent-id")
        if purpose == "turn" and is_claude_compaction(messages):
            purpose = "compaction"
        agent_line = headers.get("user-agent") or ""
        return Identity(
            valid_agent(agent or session),
            None if agent else "leader",
            valid_agent(parent) if parent else None,
            None if agent else "root",
            purpose,
            root=valid_agent(session),
            harness="claude-code",
            version=version[1] if (version := CLAUDE_VERSION.search(agent_line)) else None,
        )
    thread = headers.get("thread-id")
    if thread:
        meta = _metadata(headers.get("x-codex-turn-metadata"))
        parent = headers.get("x-codex-parent-thread-id") or meta.get("parent_thread_id")
        if meta.get("request_kind") == "compaction":
            purpose = "compaction"
        start = None
        if not parent:
            start = "root"
        elif meta.get("history_initialization") == "warm_fork":
            start = "fork"
        return Identity(
            valid_agent(thread),
            None if parent else agent_name(None, None, subagent=False),
            valid_agent(str(parent)) if parent else None,
            start,
            purpose,
            harness="codex",
            path=bounded(codex_path(meta.get("agent_name")), "x-codex-turn-metadata agent_name"),
        )
    return Identity("main", "leader", None, "root", purpose)


def codex_path(value: Any) -> str | None:
    """The task path a Codex request's `agent_name` gives, when it names one thread: v2 sends
    `/root/NAME` for a subagent; the bare `/root` (every thread of a v1 run) names none."""
    return value if isinstance(value, str) and value.startswith(CODEX_ROOT + "/") else None


@dataclass
class RelayedSpawn:
    """An `Agent` tool call the gateway relayed: who asked, with what prompt, how it runs."""

    agent: str
    prompt: str
    kind: str
    start: str
    tool_call_id: str = ""
    taken_by: str | None = None  # the subagent it started, once known


def spawns_in(agent: str, message: Message, version: str | None = None) -> list[RelayedSpawn]:
    """The subagent starts a relayed answer asks for (Claude Code's `Agent` / `Task` tool), each
    started as `SpawnArguments.start` says (the rule the importer follows too) for CLI
    `version`."""
    found = []
    for call in message.tool_calls:
        if call.name not in SPAWN_TOOLS:
            continue
        arguments = SpawnArguments.of(call.arguments)
        if arguments.prompt is None or not arguments.prompt.strip():
            continue
        kind = arguments.subagent_type or "general-purpose"
        start = arguments.start(version=version)
        found.append(RelayedSpawn(agent, arguments.prompt.strip(), kind, start, call.id or ""))
    return found


def match_spawn(spawns: list[RelayedSpawn], messages: list[Message]) -> RelayedSpawn | None:
    """The relayed spawn not yet taken whose prompt the newest user message carries (else an
    earlier one): one whose prompt is the whole message before one that only occurs in it,
    and of those the oldest (subagents start in the order they were asked for)."""
    free = [spawn for spawn in spawns if spawn.taken_by is None]
    for text in (m.text.strip() for m in reversed(messages) if m.role == "user"):
        whole = [spawn for spawn in free if spawn.prompt == text]
        if whole:
            return whole[0]
        inside = [spawn for spawn in free if spawn.prompt in text]
        if inside:
            return inside[0]
    return None


def spawned_agents(
    spawns: list[RelayedSpawn], messages: list[Message]
) -> list[tuple[RelayedSpawn, str]]:
    """(spawn, the agent id it started) for each tool result in `messages` that names the
    subagent of a relayed spawn: the harness's own word, which settles a match by prompt."""
    by_call = {spawn.tool_call_id: spawn for spawn in spawns if spawn.tool_call_id}
    found = []
    for message in messages:
        spawn = by_call.get(message.tool_call_id or "") if message.role == "tool" else None
        named = SPAWNED_AGENT.search(message.text) if spawn is not None else None
        if named is not None:
            found.append((spawn, named[1]))
    return found


class CodexSpawned(msgspec.Struct):
    """The output of Codex's `spawn_agent`: the thread it started and its nickname (v1), or
    the path of the task it started (v2)."""

    agent_id: str | None = None
    nickname: str | None = None
    task_name: str | None = None


_CODEX_SPAWNED = msgspec.json.Decoder(CodexSpawned)


@dataclass
class CodexNames:
    """Codex subagents' names as the importer gives them (`codex_records.agent_name`), from
    what the gateway relays: the role a `spawn_agent` call asks for (`agent_type`), and the
    nickname (v1) or task path (v2) its output names. The output reaches the gateway in the
    parent's next request, which may come before or after the subagent's own first call."""

    roles: dict[str, str | None] = field(default_factory=dict)  # spawn call id -> its role
    learned: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)
    paths: dict[str, str] = field(default_factory=dict)  # v2 task path -> thread
    path_of: dict[str, str] = field(default_factory=dict)  # thread -> its v2 task path

    def relayed(self, message: Message) -> None:
        """Note the `spawn_agent` calls of an answer the gateway relayed."""
        for call in message.tool_calls:
            if call.name == CODEX_SPAWN_TOOL and call.id:
                arguments = call.arguments if isinstance(call.arguments, dict) else {}
                role = arguments.get("agent_type")
                self.roles[call.id] = role if isinstance(role, str) and role else None

    def answered(self, messages: list[Message]) -> list[tuple[str, str]]:
        """(thread, its name) for each thread that has called and that a `spawn_agent` output
        in `messages` names; one that has not called yet takes its name when it does."""
        named = []
        for message in messages:
            if message.role != "tool" or message.tool_call_id not in self.roles:
                continue
            try:
                spawned = _CODEX_SPAWNED.decode(message.text)
            except (msgspec.ValidationError, msgspec.DecodeError):
                continue  # a failed spawn answers with an error text and starts no thread
            key = spawned.agent_id or spawned.task_name
            if not key:
                continue
            self.learned[key] = (self.roles[message.tool_call_id], spawned.nickname)  # type: ignore[index]
            thread = self.paths.get(key, key)
            if thread in self.path_of or spawned.agent_id:
                named.append((thread, self.name_of(thread)))
        return named

    def started(self, thread: str, path: str | None) -> str:
        """The name of a subagent thread making its first call (`path`: its v2 task path)."""
        if path:
            self.paths[path] = thread
            self.path_of[thread] = path
        return self.name_of(thread)

    def name_of(self, thread: str) -> str:
        path = self.path_of.get(thread)
        role, nickname = self.learned.get(thread) or self.learned.get(path or "") or (None, None)
        return agent_name(role, nickname, path, subagent=True)


@dataclass
class Roster:
    """An episode's agents as the gateway has attributed them, with the spawns relayed to them
    and the Codex names learned: everything that tells which agent the next call is."""

    episode: str
    agents: dict[str, Agent] = field(default_factory=dict)
    spawns: list[RelayedSpawn] = field(default_factory=list)
    codex_names: CodexNames = field(default_factory=CodexNames)

    def agent_for(self, who: Identity, messages: list[Message]) -> Agent:
        """The agent a request speaks for: one that has called, else a new one whose parent,
        start and name come from the headers, then from the relayed spawn it answers."""
        agent = self.agents.get(who.agent)
        if agent is not None:
            return agent
        parent, start, name = who.parent, who.start, who.name
        if parent is not None and (parent == who.agent or parent not in self.agents):
            what = "itself" if parent == who.agent else "no agent that has called"
            raise HttpError(
                400,
                f"episode {self.episode!r}: agent {who.agent!r} names parent {parent!r}, "
                f"{what} in this episode (a parent makes a call before its subagents do)",
            )
        if start != "root":
            reserved = [s for s in self.spawns if s.taken_by == who.agent]
            spawn = reserved[0] if reserved else match_spawn(self.spawns, messages)
            if spawn is not None:
                spawn.taken_by = who.agent
                parent = parent or spawn.agent
                start = start or spawn.start
                name = name or spawn.kind
            parent = parent or who.root
            if who.harness == "codex":
                name = self.codex_names.started(who.agent, who.path)
        start = start or ("root" if parent is None else "fresh")
        agent = Agent(
            id=who.agent,
            name=name or ("leader" if start == "root" else "subagent"),
            parent=parent,
            start=start,
        )
        self.agents[who.agent] = agent
        return agent

    def replayed(self, named: LedgerAgent, harness: str | None, path: str | None) -> Agent:
        """The agent a ledger line names, made on its first line."""
        agent = self.agents.get(named.id)
        if agent is None:
            agent = self.agents[named.id] = Agent(
                id=named.id, name=named.name, parent=named.parent, start=named.start
            )
            if harness == "codex" and agent.parent is not None:
                agent.name = self.codex_names.started(agent.id, path)
        return agent

    def note_call(
        self, agent: Agent, new: list[Message], response: Message, version: str | None
    ) -> None:
        """What a durable call tells: `new`, the messages its prompt added (tool results among
        them settle which subagent a spawn started), and `response`, the spawns it asks for
        (`version`: its harness CLI's release)."""
        for spawn, agent_id in spawned_agents(self.spawns, new):
            self._settle(spawn, agent_id)
        self.spawns.extend(spawns_in(agent.id, response, version))
        for thread, name in self.codex_names.answered(new):
            named = self.agents.get(thread)
            if named is not None and named.parent is not None:
                named.name = name
        self.codex_names.relayed(response)

    def _settle(self, spawn: RelayedSpawn, agent_id: str) -> None:
        """The harness named `agent_id` as `spawn`'s subagent: where a match by prompt gave it
        another spawn with the same prompt (one in the foreground, one in the background), the
        two agents trade spawns and so their starts and names."""
        agent = self.agents.get(agent_id)
        if spawn.taken_by == agent_id or agent is None or agent.parent != spawn.agent:
            if spawn.taken_by is None and agent_id not in self.agents:
                spawn.taken_by = agent_id  # the subagent has not called yet: it is reserved
            return
        held = next((s for s in self.spawns if s.taken_by == agent_id), None)
        other = self.agents.get(spawn.taken_by) if spawn.taken_by else None
        spawn.taken_by = agent_id
        _take(agent, spawn)
        if held is not None:
            held.taken_by = other.id if other is not None else None
            if other is not None:
                _take(other, held)


def _take(agent: Agent, spawn: RelayedSpawn) -> None:
    """`agent` is the subagent `spawn` started: its start and name are the spawn's."""
    agent.start = spawn.start  # type: ignore[assignment]
    agent.name = spawn.kind

"""The capture gateway: chat requests in, token prompts to the policy, every call in the ledger.

For each request the gateway finds who is calling (`attribution`), renders the conversation to
tokens, samples from the policy (any `PolicyClient`; over HTTP, `HttpPolicyClient` sends the
token ids to `/v1/completions`), parses the completion back into text and tool calls, appends
the call to the episode's ledger and waits for it to be durable, and only then answers, in the
API shape the client asked in.

Token-exact continuation: every recorded call is indexed by a hash of its conversation
(messages normalised: cache-control markers dropped, system text joined, reasoning left out)
through its answer. A request whose messages start with such a conversation is rendered as that
call's exact full token sequence plus the tokens of the messages added since, so the forest sees
the extension the harness meant; the longest such call wins, one of the requesting agent first.
A request that extends none (a compaction's next call, a fork that drops text) is rendered
whole and starts a new tree.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import shutil
import time
import warnings
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from callgrove.chat import ChatFormat, Message, ToolCall, tools_message
from callgrove.episode import TOKEN_DTYPE, Agent, Call, Episode, encode_episode, sampling_record
from callgrove.episode.record import base_of, concat, segments
from callgrove.formats import InputError
from callgrove.gateway.attribution import (
    UNTAGGED,
    CodexNames,
    Identity,
    Spawn,
    episode_from_key,
    identify,
    is_episode_id,
    match_spawn,
    spawned_agents,
    spawns_in,
    valid_episode,
)
from callgrove.gateway.ledger import (
    CALLS_SUFFIX,
    EPISODES_FILE,
    LOCK_FILE,
    QUARANTINE,
    AppendFile,
    CloseBody,
    LedgerLock,
    append_episode,
    call_from_line,
    call_line,
    close_body,
    close_record,
    last_line,
    private_folder,
    read_ledger,
    stored_episode_ids,
)
from callgrove.policy import Completion, PolicyClient, SamplingParams
from callgrove.policy.http import Piece, UpstreamError, sample_from_pieces
from callgrove.serving.apis import (
    ChatRequest,
    Reply,
    ReplyStream,
    anthropic_messages,
    anthropic_request,
    error_events,
    error_json,
    openai_chat_request,
    openai_history,
    openai_message,
    openai_tools,
    reply_events,
    reply_json,
    responses_request,
)
from callgrove.serving.streaming import PlainText
from callgrove.serving.web import (
    DEFAULT_BODY_LIMIT,
    HttpError,
    check_token,
    json_response,
    read_json,
    request_key,
    sse_response,
)

PARSERS: dict[str, Callable[[dict[str, Any]], ChatRequest]] = {
    "chat": openai_chat_request,
    "messages": anthropic_request,
    "responses": responses_request,
}


def message_key(message: Message) -> bytes:
    """What must match for two messages to be the same turn of a conversation."""
    calls = [[c.id, c.name, c.arguments] for c in message.tool_calls]
    return orjson.dumps(
        [message.role, message.text.strip(), calls, message.tool_call_id, message.is_error],
        option=orjson.OPT_SORT_KEYS,
    )


def chain_hashes(messages: list[Message], start: bytes = b"") -> list[bytes]:
    """The conversation hash after each message."""
    out = []
    current = start
    for message in messages:
        current = hashlib.blake2b(current + message_key(message), digest_size=16).digest()
        out.append(current)
    return out


def message_from_dict(data: dict[str, Any]) -> Message:
    """The inverse of `Message.as_dict` (ledger lines keep messages in that shape)."""
    calls = tuple(
        ToolCall(c["id"], c["function"]["name"], c["function"]["arguments"])
        for c in data.get("tool_calls") or []
    )
    return Message(
        data["role"],
        data.get("content") or "",
        data.get("reasoning_content") or "",
        calls,
        data.get("tool_call_id"),
        bool(data.get("is_error")),
    )


@dataclass(eq=False)
class Recorded:
    """A recorded call with what continuing from it needs."""

    call: Call
    response: Message
    previous: Message | None
    history: bytes
    tools: bytes
    agent: Agent  # the agent that made it (a call holds only its agent's index in an episode)


@dataclass(eq=False)
class EpisodeState:
    """One episode's ledger file and the calls it holds, as the gateway continues them."""

    id: str
    file: AppendFile | None  # None: read back only (a closed episode's record rebuilt)
    seq: int = 0
    numbered: int = 0  # the number of the newest call id handed out (`c<number>`)
    agents: dict[str, Agent] = field(default_factory=dict)
    by_history: dict[bytes, list[Recorded]] = field(default_factory=dict)
    by_id: dict[str, Recorded] = field(default_factory=dict)
    prompt_keys: dict[str, str] = field(default_factory=dict)
    spawns: list[Spawn] = field(default_factory=list)
    codex_names: CodexNames = field(default_factory=CodexNames)
    failed: list[dict[str, Any]] = field(default_factory=list)
    closing: bool = False  # a close waits for the calls in flight: it takes no new ones
    closed: bool = False
    closed_with: dict[str, Any] | None = None  # the close's body, from its `closing` line
    in_flight: int = 0  # calls taken and not yet recorded or failed
    idle: asyncio.Event | None = None  # set when the last call in flight ends (while closing)
    syncing: set[asyncio.Future[None]] = field(default_factory=set)  # lines written, not synced

    def enter(self) -> None:
        self.in_flight += 1

    def leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0 and self.idle is not None:
            self.idle.set()

    def forget(self, call_id: str) -> None:
        """Drop a replayed call whose line was never made durable (its fsync failed)."""
        recorded = self.by_id.pop(call_id, None)
        if recorded is None:
            return
        recorded.agent.calls.remove(recorded.call)
        self.by_history[recorded.history].remove(recorded)
        self.prompt_keys.pop(call_id, None)

    def full_ids(self, call: Call) -> np.ndarray:
        """A recorded call's prompt and completion, its prompt reference read through the
        calls recorded here."""
        return concat(segments(call, self.find, episode=self.id))

    def find(self, call_id: str) -> Call | None:
        """A recorded call by id, or None."""
        recorded = self.by_id.get(call_id)
        return None if recorded is None else recorded.call

    def next_call_id(self) -> str:
        self.numbered += 1
        return f"c{self.numbered}"

    def remember(
        self,
        recorded: Recorded,
        prompt_key: str,
        new: list[Message],
        version: str | None = None,
    ) -> None:
        """Index a durable call; `new`: the messages its prompt added (tool results among them
        settle which subagent a spawn started); `version`: its harness CLI's release."""
        self.by_history.setdefault(recorded.history, []).append(recorded)
        self.by_id[recorded.call.id] = recorded
        self.prompt_keys[recorded.call.id] = prompt_key
        for spawn, agent_id in spawned_agents(self.spawns, new):
            self._settle(spawn, agent_id)
        self.spawns.extend(spawns_in(recorded.agent.id, recorded.response, version))
        for thread, name in self.codex_names.answered(new):
            agent = self.agents.get(thread)
            if agent is not None and agent.parent is not None:
                agent.name = name
        self.codex_names.relayed(recorded.response)

    def _settle(self, spawn: Spawn, agent_id: str) -> None:
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

    def agent_for(self, who: Identity, messages: list[Message]) -> Agent:
        agent = self.agents.get(who.agent)
        if agent is not None:
            return agent
        parent, start, name = who.parent, who.start, who.name
        if parent is not None and (parent == who.agent or parent not in self.agents):
            what = "itself" if parent == who.agent else "no agent that has called"
            raise HttpError(
                400,
                f"episode {self.id!r}: agent {who.agent!r} names parent {parent!r}, {what} in "
                "this episode (a parent makes a call before its subagents do)",
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

    def base_for(
        self,
        agent: Agent,
        hashes: list[bytes],
        messages: list[Message],
        tools: bytes,
        compaction: bool,
    ) -> tuple[Recorded | None, int]:
        """The recorded call whose conversation this request extends the most, and its length."""
        for index in range(len(messages) - 1, -1, -1):
            if messages[index].role != "assistant":
                continue
            found = [
                r for r in self.by_history.get(hashes[index], ()) if compaction or r.tools == tools
            ]
            if found:
                own = [r for r in found if r.agent is agent]
                return (own or found)[-1], index + 1
        return None, 0


def _take(agent: Agent, spawn: Spawn) -> None:
    """`agent` is the subagent `spawn` started: its start and name are the spawn's."""
    agent.start = spawn.start  # type: ignore[assignment]
    agent.name = spawn.kind


def recorded_sampling(sent: dict | None, request: ChatRequest) -> dict | None:
    """A call's `sampling`: the distribution the policy sampled from (what was sent upstream,
    which its logprobs are under), with the client's own request beside it (`requested`) where
    the two differ (a training loop's settings replace the client's)."""
    if sent is None:
        return None
    asked = sampling_record(request.temperature, request.top_p)
    if all(sent.get(key) == value for key, value in asked.items()):
        return sent
    return {**sent, "requested": asked}


@dataclass(eq=False)
class Turn:
    """One call being handled: who makes it, what it extends, how it is sampled."""

    api: str
    request: ChatRequest
    state: EpisodeState
    agent: Agent
    who: Identity
    tools: Message | None
    tools_hash: bytes
    hashes: list[bytes]
    base: Recorded | None
    cut: int
    params: SamplingParams
    call_id: str | None = None  # handed out when the reply starts before the call is recorded


INT64_MAX = int(np.iinfo(np.int64).max)


def upstream_problem(
    prompt: np.ndarray, sample: Completion, max_tokens: int, vocab_size: int
) -> str | None:
    """What makes an upstream's sample unusable as a recorded call, or None: the ledger holds
    only token ids the policy has, log-probabilities that are ones, and what was asked for."""
    ids, logprobs, version = sample.completion_ids, sample.logprobs, sample.policy_version
    for name, values in (("prompt", prompt), ("completion", ids)):
        if values.dtype.kind not in "iu":
            return f"{name} token ids are not integers ({values.dtype})"
        if len(values) and (int(values.min()) < 0 or int(values.max()) >= vocab_size):
            return (
                f"{name} token ids run from {int(values.min())} to {int(values.max())}, "
                f"outside the vocabulary [0, {vocab_size})"
            )
    if not len(ids):
        return "the completion has no tokens"
    if len(ids) > max_tokens:
        return f"{len(ids)} completion tokens, more than the {max_tokens} asked for"
    if logprobs is None or len(logprobs) != len(ids):
        return f"{0 if logprobs is None else len(logprobs)} log-probabilities for {len(ids)} tokens"
    if not np.all(np.isfinite(logprobs)) or float(np.max(logprobs)) > 0:
        return "log-probabilities must be finite and at most 0"
    if version is not None and (
        not isinstance(version, int | np.integer)
        or isinstance(version, bool)
        or not 0 <= int(version) <= INT64_MAX
    ):
        return f"policy_version {version!r} is not a non-negative 64-bit integer"
    return None


class LedgerWriteError(RuntimeError):
    """A call's line could not be written or made durable: the call is not recorded."""


def closed_error(episode_id: str, while_in_flight: bool = False) -> HttpError:
    """What a call to a closed episode gets: a 400 that the harnesses' clients do not retry
    (Claude Code retries a 409 for minutes), naming the episode."""
    why = (
        "was closed while this call was in flight; the call is not recorded"
        if while_in_flight
        else "is closed; it takes no more calls"
    )
    return HttpError(400, f"episode {episode_id!r} {why}", no_retry=True)


class Gateway:
    """The gateway's state (episodes, ledger folder) and its HTTP routes."""

    def __init__(
        self,
        policy: PolicyClient,
        chat: ChatFormat,
        ledger: str | Path,
        *,
        tokens: list[str] | None = None,
        body_limit: int = DEFAULT_BODY_LIMIT,
        max_tokens: int = 4096,
        passthrough: bool = False,
        sampling: SamplingParams | None = None,
        close_wait: float = 30.0,
    ):
        self.policy = policy
        self.chat = chat
        self.ledger = private_folder(Path(ledger))
        self._lock = LedgerLock(self.ledger)  # `LedgerInUse` while another gateway holds it
        self.tokens = tokens or []
        self.body_limit = body_limit
        self.max_tokens = max_tokens
        # The upstream applies its own chat template: its reported token ids are recorded.
        self.passthrough = passthrough
        # A training loop's own sampling (temperature, top-p, seed, stop strings; its
        # max_tokens caps the request's): the calls are sampled as the loop samples its own.
        self.sampling = sampling
        # How long a close waits for the episode's calls in flight; later ones are refused.
        self.close_wait = close_wait
        # Open episodes only: a closed one's file is closed and its calls let go.
        self.vocab_size = chat.vocab_size
        self.episodes: dict[str, EpisodeState] = {}
        self.quarantined: dict[str, str] = {}  # damaged ledger files: episode -> why
        self.strays: list[str] = []  # files in the ledger folder that are no episode's
        self._in_flight = 0  # calls being handled now

    def release(self) -> None:
        """Close every open episode's file and give up the ledger folder's lock."""
        for state in self.episodes.values():
            if state.file is not None:
                state.file.close()
                state.file = None
        self.episodes.clear()
        self._lock.release()

    # -- episodes ------------------------------------------------------------------------------

    def _path(self, episode_id: str) -> Path:
        return self.ledger / f"{valid_episode(episode_id)}{CALLS_SUFFIX}"

    def episode(self, episode_id: str) -> EpisodeState:
        """The open state of an episode, recovered from its ledger file on first use. A closed
        episode raises the error late calls get; a damaged file is quarantined (and raises)."""
        state = self.episodes.get(episode_id)
        if state is not None:
            return state
        path = self._path(episode_id)
        self._refuse_quarantined(episode_id, path)
        if not path.exists():
            state = EpisodeState(episode_id, AppendFile(path))
        else:
            tail = last_line(path)
            if tail is not None and "closed" in tail:
                raise closed_error(episode_id)
            state = self._read_back(episode_id, path)
            if state.closed_with is not None:  # a close cut by a crash: finish it
                self._finish_close(state, close_body(episode_id, state.closed_with))
                raise closed_error(episode_id)
            state.file = AppendFile(path)
        self.episodes[episode_id] = state
        return state

    def _refuse_quarantined(self, episode_id: str, path: Path) -> None:
        if episode_id in self.quarantined or (self.ledger / QUARANTINE / path.name).exists():
            reason = self.quarantined.get(episode_id, "see the quarantine folder")
            raise HttpError(400, f"episode {episode_id!r} is quarantined: {reason}", no_retry=True)

    def _read_back(self, episode_id: str, path: Path) -> EpisodeState:
        """An episode's state from its ledger file (no file opened for writing); a damaged file
        is moved to the quarantine folder and reported, and `HttpError` says so."""
        state = EpisodeState(episode_id, None)
        try:
            for line in read_ledger(path):
                self._replay(state, line)
        except (ValueError, KeyError, TypeError, AttributeError, msgspec.MsgspecError) as error:
            self._quarantine(episode_id, path, f"{type(error).__name__}: {error}"[:2000])
            self._refuse_quarantined(episode_id, path)
        return state

    def _quarantine(self, episode_id: str, path: Path, reason: str) -> None:
        folder = private_folder(self.ledger / QUARANTINE)
        shutil.move(path, folder / path.name)
        (folder / f"{path.name}.reason").write_text(reason + "\n")
        self.quarantined[episode_id] = reason
        warnings.warn(
            f"{path}: damaged ledger file, episode {episode_id!r} quarantined in "
            f"{folder / path.name}: {reason}",
            stacklevel=3,
        )

    def recover(self) -> int:
        """Open every open episode that has a ledger file (after a restart), finishing closes
        a crash cut short; returns how many are open. A damaged file is quarantined and a file
        that is no episode's is listed in `strays`, both reported: the others still serve."""
        for path in sorted(self.ledger.iterdir()):
            name = path.name
            if name in (EPISODES_FILE, LOCK_FILE, QUARANTINE):
                continue
            episode_id = name[: -len(CALLS_SUFFIX)]
            if not (name.endswith(CALLS_SUFFIX) and path.is_file() and is_episode_id(episode_id)):
                self.strays.append(name)
                warnings.warn(f"{path}: not an episode's ledger file; left alone", stacklevel=2)
                continue
            with contextlib.suppress(HttpError):  # closed, or quarantined and reported
                self.episode(episode_id)
        return len(self.episodes)

    def _replay(self, state: EpisodeState, line: dict[str, Any]) -> None:
        if "closed" in line:
            state.closed = True
            return
        if "closing" in line:
            state.closed_with = line["closing"]
            return
        if "failed" in line:
            failure = line["failed"]
            state.failed.append(failure)
            if failure.get("call") is not None:
                state.forget(failure["call"])
            return
        info = line["agent"]
        agent = state.agents.get(info["id"])
        if agent is None:
            agent = state.agents[info["id"]] = Agent(
                id=info["id"], name=info["name"], parent=info["parent"], start=info["start"]
            )
            if line.get("harness") == "codex" and agent.parent is not None:
                agent.name = state.codex_names.started(agent.id, line.get("path"))
        call = call_from_line(line, state.id)
        recorded_base = base_of(call, state.find, state.id)  # a call recorded before it, or none
        agent.add(call)
        content = call.content or {}
        new = [message_from_dict(m) for m in content.get("prompt", [])]
        base = None if recorded_base is None else state.by_id[recorded_base.id]
        previous = new[-1] if new else (base.response if base else None)
        recorded = Recorded(
            call,
            message_from_dict(content["response"]),
            previous,
            bytes.fromhex(line["history"]),
            bytes.fromhex(line["tools"]),
            agent,
        )
        state.remember(recorded, line["prompt_key"], new, line.get("version"))
        state.seq = max(state.seq, call.seq)
        number = call.id[1:]
        if call.id.startswith("c") and number.isdigit():
            state.numbered = max(state.numbered, int(number))

    async def close(self, episode_id: str, data: dict[str, Any] | None = None) -> Episode:
        """Close the episode once its calls in flight have been recorded (waiting at most
        `close_wait` seconds; those still in flight then are refused, not recorded): its record
        goes to `episodes.jsonl` and is returned. Closing again with the same body returns the
        same record and stores nothing."""
        body = close_body(episode_id, data or {})
        state = self._closable(episode_id, body)
        if isinstance(state, Episode):
            return state
        state.closing = True
        try:
            if state.in_flight:
                state.idle = asyncio.Event()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(state.idle.wait(), self.close_wait)
            state.closed = True  # what is still in flight now is refused when it ends
            if state.syncing:  # lines already written: their calls are in (or out) once synced
                await asyncio.gather(*state.syncing, return_exceptions=True)
            return self._finish_close(state, body)
        finally:
            state.closing = False

    def close_episode(self, episode_id: str, data: dict[str, Any] | None = None) -> Episode:
        """`close` from code without an event loop: calls still in flight are refused."""
        body = close_body(episode_id, data or {})
        state = self._closable(episode_id, body)
        if isinstance(state, Episode):
            return state
        state.closed = True
        return self._finish_close(state, body)

    def _closable(self, episode_id: str, body: CloseBody) -> EpisodeState | Episode:
        """The open episode to close, or the record of one closed before with this body."""
        state = self.episodes.get(episode_id)
        if state is not None:
            if state.closing or state.closed:
                raise HttpError(409, f"episode {episode_id!r} is being closed", "conflict")
            return state
        path = self._path(episode_id)
        self._refuse_quarantined(episode_id, path)
        if not path.exists():
            raise HttpError(404, f"episode {episode_id!r} has no calls in this ledger", "not_found")
        tail = last_line(path)
        if tail is not None and "closed" in tail:
            return self._stored_close(episode_id, path, body)
        try:
            return self.episode(episode_id)
        except HttpError:
            if episode_id in self.quarantined:
                raise
            return self._stored_close(episode_id, path, body)  # a cut close, just finished

    def _stored_close(self, episode_id: str, path: Path, body: CloseBody) -> Episode:
        """The record a closed episode was stored with, rebuilt from its ledger, if `body` is
        the one it was closed with."""
        state = self._read_back(episode_id, path)
        if state.closed_with is None or close_body(episode_id, state.closed_with) != body:
            raise HttpError(
                409,
                f"episode {episode_id!r} is already closed"
                + ("" if state.closed_with is None else " with another body"),
                "conflict",
            )
        return self._record_of(state, body)

    def _record_of(self, state: EpisodeState, body: CloseBody) -> Episode:
        try:
            return close_record(
                state.id, list(state.agents.values()), state.prompt_keys, state.failed, body
            )
        except InputError as error:
            raise HttpError(400, f"the episode cannot close: {error}") from None

    def _finish_close(self, state: EpisodeState, body: CloseBody) -> Episode:
        """Write the close: the `closing` line (its body), the record, the `closed` line. Once
        the `closing` line is durable the close holds: a crash after it is finished on restart,
        storing the record once."""
        try:
            episode = self._record_of(state, body)
            file = state.file or AppendFile(self._path(state.id))
        except BaseException:
            state.closed = False
            raise
        try:
            if state.closed_with is None:
                closing = {"closing": msgspec.to_builtins(body), "time": time.time()}
                try:
                    file.append_now(orjson.dumps(closing) + b"\n")
                except OSError as error:
                    state.closed = False
                    raise HttpError(
                        500, f"the ledger could not record the close: {error}", "server_error"
                    ) from None
            state.closed = True
            self.episodes.pop(state.id, None)  # its calls and file are let go
            try:
                if state.closed_with is None or state.id not in stored_episode_ids(self.ledger):
                    append_episode(self.ledger, episode)
                file.append_now(orjson.dumps({"closed": time.time()}) + b"\n")
            except (OSError, InputError) as error:
                raise HttpError(
                    500,
                    f"episode {state.id!r} is closed but its record could not be stored yet "
                    f"({error}); a restarted gateway stores it",
                    "server_error",
                ) from None
        finally:
            if state.closed:
                file.close()
                state.file = None
        return episode

    # -- one call ------------------------------------------------------------------------------

    def _turn(self, api: str, chat_request: ChatRequest, episode_id: str, who: Identity) -> Turn:
        """Who calls, which recorded call the request extends, how it is sampled."""
        state = self.episode(episode_id)
        if state.closing or state.closed:
            raise closed_error(episode_id)
        agent = state.agent_for(who, chat_request.messages)
        messages = chat_request.messages
        tools = tools_message(chat_request.tools)
        tools_hash = hashlib.blake2b(message_key(tools) if tools else b"", digest_size=16).digest()
        hashes = chain_hashes(messages)
        base, cut = state.base_for(agent, hashes, messages, tools_hash, who.purpose == "compaction")
        params = self._params(chat_request)
        state.enter()  # `leave` once the call is recorded or failed
        return Turn(
            api,
            chat_request,
            state,
            agent,
            who,
            tools,
            tools_hash,
            hashes,
            base,
            cut,
            params,
        )

    async def call(
        self, api: str, chat_request: ChatRequest, episode_id: str, who: Identity
    ) -> Reply:
        """Render, sample, parse and record one call; returns the reply to send."""
        turn = self._turn(api, chat_request, episode_id, who)
        messages, base = chat_request.messages, turn.base
        try:
            if self.passthrough:
                prompt, sample, response, base = await self._passthrough(
                    chat_request, turn.params, turn.state, base
                )
                suffix = prompt[base.call.full_len :] if base else prompt
                new = messages[turn.cut :] if base else messages
            else:
                prompt, suffix, new = self._render(messages, turn, base)
                sample = self._checked(
                    prompt, await self.policy.sample(prompt, turn.params), turn.params
                )
                response = self.chat.parse(sample.completion_ids)
            return await self._record(turn, base, prompt, suffix, new, sample, response)
        except Exception as error:
            raise await self._failed(turn, error) from None
        finally:
            turn.state.leave()

    def streams(self, chat_request: ChatRequest) -> bool:
        """Whether this request's reply is streamed as the upstream samples it."""
        return chat_request.stream and not self.passthrough and hasattr(self.policy, "stream")

    async def stream_call(
        self, api: str, chat_request: ChatRequest, episode_id: str, who: Identity
    ) -> tuple[str, AsyncIterator[bytes]]:
        """The call streamed: its id, and its events as the upstream's pieces arrive. Errors
        before the first piece are raised (`HttpError`), later ones end the stream in the API's
        error events; either way the ledger records the failure. The call's line is durable
        before the terminal events are sent."""
        turn = self._turn(api, chat_request, episode_id, who)
        try:
            prompt, suffix, new = self._render(chat_request.messages, turn, turn.base)
            pieces = self.policy.stream(prompt, turn.params)  # type: ignore[attr-defined]
            first = await anext(pieces)
        except StopAsyncIteration:
            turn.state.leave()
            raise await self._failed(turn, UpstreamError("upstream stream sent nothing")) from None
        except Exception as error:
            turn.state.leave()
            raise await self._failed(turn, error) from None
        turn.call_id = turn.state.next_call_id()
        return turn.call_id, self._stream_events(turn, prompt, suffix, new, first, pieces)

    async def _stream_events(
        self,
        turn: Turn,
        prompt: np.ndarray,
        suffix: np.ndarray,
        new: list[Message],
        first: Piece,
        pieces: AsyncIterator[Piece],
    ) -> AsyncIterator[bytes]:
        self._in_flight += 1
        recorded = False
        try:
            version = first.policy_version if first.policy_version is not None else 0
            out = ReplyStream(turn.request, len(prompt), version)
            yield b"".join(out.opening())
            received = [first]
            plain = PlainText(self.chat)
            yield b"".join(out.text(plain.add(first.token_ids)))
            try:
                async for piece in pieces:
                    received.append(piece)
                    yield b"".join(out.text(plain.add(piece.token_ids)))
                sample = self._checked(prompt, sample_from_pieces(received, version), turn.params)
                response = self.chat.parse(sample.completion_ids)
                reply = await self._record(turn, turn.base, prompt, suffix, new, sample, response)
                recorded = True
            except Exception as error:
                recorded = True
                failed = await self._failed(turn, error)
                yield b"".join(error_events(turn.api, failed.status, failed.message, failed.kind))
                return
            yield b"".join(out.closing(reply))
        except (asyncio.CancelledError, GeneratorExit):
            # The client went away before the reply ended: the call never reached it whole, so
            # it is recorded as failed (not kept), and the upstream stops sampling it.
            if not recorded:
                await asyncio.shield(self._client_left(turn, pieces))
            raise
        finally:
            self._in_flight -= 1
            turn.state.leave()

    async def _client_left(self, turn: Turn, pieces: AsyncIterator[Piece]) -> None:
        await self._record_failure(
            turn.state, turn.agent, turn.api, "client disconnected before the reply ended"
        )
        closing = getattr(pieces, "aclose", None)
        if closing is not None:
            await closing()

    async def _failed(self, turn: Turn, error: BaseException) -> HttpError:
        """The client's error for a failed call, recorded in the ledger (an `HttpError` the
        gateway itself raised is the client's own mistake: not recorded)."""
        if isinstance(error, HttpError):
            return error
        if isinstance(error, LedgerWriteError):
            await self._record_failure(turn.state, turn.agent, turn.api, str(error))
            return HttpError(500, str(error), "server_error")
        if isinstance(error, UpstreamError):
            await self._record_failure(turn.state, turn.agent, turn.api, str(error))
            return HttpError(error.status, str(error), "upstream_error")
        # the policy failed: the client hears why; the ledger too
        await self._record_failure(
            turn.state, turn.agent, turn.api, f"{type(error).__name__}: {error}"
        )
        return HttpError(502, f"policy failed: {error}", "upstream_error")

    async def _record(
        self,
        turn: Turn,
        base: Recorded | None,
        prompt: np.ndarray,
        suffix: np.ndarray,
        new: list[Message],
        sample: Completion,
        response: Message,
    ) -> Reply:
        """Write the call's line and, once it is durable, add the call to its agent: a call is
        in the episode only if its line is on disk. Refused once the episode is closed."""
        state, agent, hashes = turn.state, turn.agent, turn.hashes
        if state.closed:
            raise closed_error(state.id, while_in_flight=True)

        previous = new[-1] if new else (base.response if base else None)
        state.seq += 1
        call = Call(
            id=turn.call_id or state.next_call_id(),
            seq=state.seq,
            completion_ids=sample.completion_ids,
            prompt_suffix=suffix,
            prompt_from=base.call.id if base else None,
            prompt_from_len=base.call.full_len if base else 0,
            logprobs=sample.logprobs,
            policy_version=sample.policy_version,
            purpose=turn.who.purpose,
            content={"prompt": [m.as_dict() for m in new], "response": response.as_dict()},
            sampling=recorded_sampling(sample.sampling, turn.request),
        )
        history = chain_hashes([response], hashes[-1] if hashes else b"")[0]
        prompt_key = hashes[-1].hex() if hashes else ""
        line = call_line(
            call,
            {
                "agent": {
                    "id": agent.id,
                    "name": agent.name,
                    "parent": agent.parent,
                    "start": agent.start,
                },
                "history": history.hex(),
                "prompt_key": prompt_key,
                "tools": turn.tools_hash.hex(),
                "api": turn.api,
                "harness": turn.who.harness,
                "version": turn.who.version,
                "path": turn.who.path,
                "time": time.time(),
            },
        )
        await self._append_call(state, call, line)
        agent.add(call)
        state.remember(
            Recorded(call, response, previous, history, turn.tools_hash, agent),
            prompt_key,
            new,
            turn.who.version,
        )
        return Reply(
            response,
            sample.finish_reason,
            len(prompt),
            len(sample.completion_ids),
            sample.policy_version,
            call_id=call.id,
        )

    def _checked(
        self, prompt: np.ndarray, sample: Completion, params: SamplingParams
    ) -> Completion:
        """The upstream's sample, if it can be recorded (`upstream_problem`); else a failed
        call, never a recorded one."""
        problem = upstream_problem(prompt, sample, params.max_tokens, self.vocab_size)
        if problem is not None:
            raise UpstreamError(f"upstream answer refused: {problem}", 502)
        return sample

    async def _append_call(self, state: EpisodeState, call: Call, line: bytes) -> None:
        """Append a call's line and wait until it is durable; `LedgerWriteError` if it is not
        (a line left unsynced is revoked by a `failed` line naming the call)."""
        alone = await self._alone()
        if state.closed or state.file is None:  # closed while this call waited its turn
            raise closed_error(state.id, while_in_flight=True)
        try:
            state.file.write(line)
        except OSError as error:
            raise LedgerWriteError(f"the ledger could not record the call: {error}") from None
        synced = asyncio.ensure_future(state.file.sync_written(alone))
        state.syncing.add(synced)
        try:
            await asyncio.shield(synced)
        except OSError as error:
            revoked = {"agent": None, "call": call.id, "error": f"not made durable: {error}"}
            with contextlib.suppress(OSError):
                state.file.append_now(orjson.dumps({"failed": revoked}) + b"\n")
            raise LedgerWriteError(f"the ledger could not make the call durable: {error}") from None
        finally:
            state.syncing.discard(synced)

    def _params(self, chat_request: ChatRequest) -> SamplingParams:
        max_tokens = min(chat_request.max_tokens, self.max_tokens)
        if self.sampling is None:
            return SamplingParams(
                max_tokens=max_tokens,
                temperature=chat_request.temperature,
                top_p=chat_request.top_p,
                stop_token_ids=self.chat.stop_token_ids,
                stop=chat_request.stop,
            )
        return msgspec.structs.replace(
            self.sampling,
            max_tokens=min(max_tokens, self.sampling.max_tokens),
            stop_token_ids=self.chat.stop_token_ids,
            stop=tuple(dict.fromkeys((*self.sampling.stop, *chat_request.stop))),
        )

    async def _alone(self) -> bool:
        """Whether no other call is in flight. One turn of the event loop first lets requests
        that have just arrived start (and count), so a burst is never taken for one call."""
        if self._in_flight > 1:
            return False
        await asyncio.sleep(0)
        return self._in_flight <= 1

    def _render(
        self, messages: list[Message], turn: Turn, base: Recorded | None
    ) -> tuple[np.ndarray, np.ndarray, list[Message]]:
        """(prompt, its suffix after the base call, the messages the suffix renders)."""
        if base is None:
            new = ([turn.tools] if turn.tools else []) + messages
            prompt = self.chat.render(new)
            return prompt, prompt, new
        new = messages[turn.cut :]
        suffix = np.concatenate(
            [self.chat.trailing(base.response, base.previous), self.chat.render(new, base.response)]
        ).astype(TOKEN_DTYPE)
        return np.concatenate([turn.state.full_ids(base.call), suffix]), suffix, new

    async def _passthrough(
        self,
        chat_request: ChatRequest,
        params: SamplingParams,
        state: EpisodeState,
        base: Recorded | None,
    ) -> tuple[np.ndarray, Completion, Message, Recorded | None]:
        """The upstream renders; its reported prompt ids are kept, referencing the base call
        only when they really start with its full sequence."""
        chat = getattr(self.policy, "chat", None)
        if chat is None:
            raise HttpError(500, "pass-through needs an HTTP upstream policy", "server_error")
        prompt, sample, raw = await chat(
            openai_history(chat_request.messages), openai_tools(chat_request.tools), params
        )
        sample = self._checked(prompt, sample, params)
        response = openai_message(raw, "upstream choices[0].message")
        if base is not None:
            length = base.call.full_len
            if len(prompt) <= length or not np.array_equal(
                prompt[:length], state.full_ids(base.call)
            ):
                base = None
        return prompt, sample, response, base

    async def _record_failure(
        self, state: EpisodeState, agent: Agent, api: str, message: str
    ) -> None:
        if state.closed or state.file is None:
            return  # the episode is closed: nothing goes after its `closed` line
        failure = {"agent": agent.id, "api": api, "error": message, "time": time.time()}
        try:
            await state.file.append(orjson.dumps({"failed": failure}) + b"\n")
        except OSError as error:
            warnings.warn(
                f"{state.file.path}: the failed call could not be recorded ({error}): {message}",
                stacklevel=2,
            )
            return
        state.failed.append(failure)

    # -- HTTP ----------------------------------------------------------------------------------

    def app(self) -> Starlette:
        routes = [Route("/health", self.health, methods=["GET"])]
        for prefix in ("", "/e/{episode}"):
            routes += [
                Route(f"{prefix}/v1/chat/completions", self._endpoint("chat"), methods=["POST"]),
                Route(f"{prefix}/v1/responses", self._endpoint("responses"), methods=["POST"]),
                Route(f"{prefix}/v1/messages", self._endpoint("messages"), methods=["POST"]),
                Route(f"{prefix}/v1/messages/count_tokens", self.count_tokens, methods=["POST"]),
                Route(f"{prefix}/v1/models", self.models, methods=["GET"]),
            ]
        routes.append(Route("/e/{episode}/close", self.close_route, methods=["POST"]))
        return Starlette(routes=routes)

    def _attribute(self, request: Request) -> str:
        """The request's episode, after checking its key."""
        path_episode = request.path_params.get("episode")
        key_episode, token = episode_from_key(request_key(request))
        check_token(token, self.tokens)
        episode = path_episode or key_episode or UNTAGGED
        return valid_episode(episode)

    def _endpoint(self, api: str) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            self._in_flight += 1
            try:
                return await answer(request)
            finally:
                self._in_flight -= 1

        async def answer(request: Request) -> Response:
            stream = False
            try:
                episode = self._attribute(request)
                data = await read_json(request, self.body_limit)
                stream = bool(data.get("stream"))
                chat_request = PARSERS[api](data)
                who = identify(request.headers, chat_request.messages)
                if self.streams(chat_request):
                    call_id, events = await self.stream_call(api, chat_request, episode, who)
                    streamed = sse_response(events)
                    streamed.headers.update(
                        {"x-callgrove-episode": episode, "x-callgrove-call": call_id}
                    )
                    return streamed
                reply = await self.call(api, chat_request, episode, who)
            except HttpError as error:
                return error.response(error_json(api, error.status, error.message, error.kind))
            headers = {
                "x-callgrove-policy-version": str(reply.policy_version),
                "x-callgrove-episode": episode,
                "x-callgrove-call": str(reply.call_id),
            }
            if stream:
                response = sse_response(reply_events(chat_request, reply))
                response.headers.update(headers)
                return response
            return json_response(reply_json(chat_request, reply), headers=headers)

        return endpoint

    async def count_tokens(self, request: Request) -> Response:
        try:
            self._attribute(request)
            data = await read_json(request, self.body_limit)
            messages = anthropic_messages(data)
            tools = tools_message([t for t in data.get("tools") or [] if isinstance(t, dict)])
            count = len(self.chat.render(([tools] if tools else []) + messages))
        except HttpError as error:
            return json_response(
                error_json("messages", error.status, error.message, error.kind), error.status
            )
        return json_response({"input_tokens": count})

    async def models(self, request: Request) -> Response:
        try:
            self._attribute(request)
        except HttpError as error:
            return json_response(
                error_json("chat", error.status, error.message, error.kind), error.status
            )
        return json_response(
            {
                "object": "list",
                "data": [{"id": "policy", "object": "model", "owned_by": "callgrove"}],
            }
        )

    async def close_route(self, request: Request) -> Response:
        try:
            episode = valid_episode(request.path_params["episode"])
            key_episode, token = episode_from_key(request_key(request))
            check_token(token, self.tokens)
            if key_episode not in (None, episode):
                raise HttpError(403, f"the key names episode {key_episode!r}, not {episode!r}")
            body = await read_json(request, self.body_limit, empty_ok=True)
            record = await self.close(episode, body)
        except HttpError as error:
            return error.response(error_json("chat", error.status, error.message, error.kind))
        return Response(encode_episode(record), media_type="application/json")

    async def health(self, request: Request) -> Response:
        """Liveness; the counts only to a client with a key (when keys are required)."""
        try:
            check_token(episode_from_key(request_key(request))[1], self.tokens)
        except HttpError:
            return json_response({"ok": True})
        return json_response(
            {"ok": True, "episodes": len(self.episodes), "quarantined": len(self.quarantined)}
        )

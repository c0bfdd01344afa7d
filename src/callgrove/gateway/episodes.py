"""The gateway's episodes: each open one's state, kept in step with its ledger file.

Invariant: an open episode's state is what replaying its ledger file gives. A call joins its
episode (its agent, the continuation index, the call ids handed out) only once its line is
durable, and `EpisodeState.replay` rebuilds exactly that after a restart, so a gateway that
recovers continues every history as the one that crashed would have. A damaged file is never
half-served: it is moved to the quarantine folder whole, with its reason, and the episode
refuses calls. A closed episode's file ends with its `closed` line and nothing after it; its
state is let go, and its record, rebuilt from the file, answers a repeated close.

The continuation index: every recorded call is keyed by a hash of its conversation through
its answer (`chain_hashes`); `EpisodeState.base_for` finds the recorded call a request's
messages extend the most.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import shutil
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import orjson

from callgrove.chat import Message, ToolCall
from callgrove.episode import Agent, Call, Episode
from callgrove.episode.record import base_of, concat, segments
from callgrove.errors import RunFailed
from callgrove.formats import InputError
from callgrove.gateway.attribution import Roster, is_episode_id, valid_episode
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
    call_note,
    close_body,
    close_record,
    last_line,
    private_folder,
    read_ledger,
    stored_episode_ids,
)
from callgrove.serving.web import HttpError


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


class LedgerWriteError(RunFailed, RuntimeError):
    """A call's line could not be written or made durable: the call is not recorded."""


@contextlib.contextmanager
def ledger_errors(episode_id: str) -> Iterator[None]:
    """An episode's ledger file that cannot be read or opened (no descriptor left, a disk
    error) as a 500 naming it: the gateway's fault, answered in the client's API shape."""
    try:
        yield
    except OSError as error:
        raise HttpError(
            500, f"the ledger could not open episode {episode_id!r}: {error}", "server_error"
        ) from None


def closed_error(episode_id: str, while_in_flight: bool = False) -> HttpError:
    """What a call to a closed episode gets: a 400 that the harnesses' clients do not retry
    (Claude Code retries a 409 for minutes), naming the episode."""
    why = (
        "was closed while this call was in flight; the call is not recorded"
        if while_in_flight
        else "is closed; it takes no more calls"
    )
    return HttpError(400, f"episode {episode_id!r} {why}", no_retry=True)


@dataclass(eq=False)
class EpisodeState:
    """One episode's ledger file and the calls it holds, as the gateway continues them."""

    id: str
    file: AppendFile | None  # None: read back only (a closed episode's record rebuilt)
    roster: Roster
    seq: int = 0
    numbered: int = 0  # the number of the newest call id handed out (`c<number>`)
    by_history: dict[bytes, list[Recorded]] = field(default_factory=dict)
    by_id: dict[str, Recorded] = field(default_factory=dict)
    prompt_keys: dict[str, str] = field(default_factory=dict)
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
        """Index a durable call; `new`: the messages its prompt added; `version`: its harness
        CLI's release (both tell attribution about the spawns, `Roster.note_call`)."""
        self.by_history.setdefault(recorded.history, []).append(recorded)
        self.by_id[recorded.call.id] = recorded
        self.prompt_keys[recorded.call.id] = prompt_key
        self.roster.note_call(recorded.agent, new, recorded.response, version)

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

    def replay(self, line: dict[str, Any]) -> None:
        """Take one ledger line back in, as the gateway took it when it wrote the line."""
        if "closed" in line:
            self.closed = True
            return
        if "closing" in line:
            self.closed_with = line["closing"]
            return
        if "failed" in line:
            failure = line["failed"]
            self.failed.append(failure)
            if failure.get("call") is not None:
                self.forget(failure["call"])
            return
        note = call_note(line)
        agent = self.roster.replayed(note.agent, note.harness, note.path)
        call = call_from_line(line, self.id)
        recorded_base = base_of(call, self.find, self.id)  # a call recorded before it, or none
        agent.add(call)
        content = call.content or {}
        new = [message_from_dict(m) for m in content.get("prompt", [])]
        base = None if recorded_base is None else self.by_id[recorded_base.id]
        previous = new[-1] if new else (base.response if base else None)
        recorded = Recorded(
            call,
            message_from_dict(content["response"]),
            previous,
            bytes.fromhex(note.history),
            bytes.fromhex(note.tools),
            agent,
        )
        self.remember(recorded, note.prompt_key, new, note.version)
        self.seq = max(self.seq, call.seq)
        number = call.id[1:]
        if call.id.startswith("c") and number.isdigit():
            self.numbered = max(self.numbered, int(number))

    async def append_call(self, call: Call, line: bytes, alone: bool) -> None:
        """Append a call's line and wait until it is durable; `LedgerWriteError` if it is not
        (a line left unsynced is revoked by a `failed` line naming the call). `alone`: no
        other call is in flight (`AppendFile.sync_written`)."""
        if self.closed or self.file is None:  # closed while this call waited its turn
            raise closed_error(self.id, while_in_flight=True)
        try:
            self.file.write(line)
        except OSError as error:
            raise LedgerWriteError(f"the ledger could not record the call: {error}") from None
        synced = asyncio.ensure_future(self.file.sync_written(alone))
        self.syncing.add(synced)
        try:
            await asyncio.shield(synced)
        except OSError as error:
            revoked = {"agent": None, "call": call.id, "error": f"not made durable: {error}"}
            with contextlib.suppress(OSError):
                self.file.append_now(orjson.dumps({"failed": revoked}) + b"\n")
            raise LedgerWriteError(f"the ledger could not make the call durable: {error}") from None
        finally:
            self.syncing.discard(synced)

    async def record_failure(self, agent: Agent, api: str, message: str) -> None:
        """A `failed` line for a call that is not recorded (a warning if even that fails)."""
        if self.closed or self.file is None:
            return  # the episode is closed: nothing goes after its `closed` line
        failure = {"agent": agent.id, "api": api, "error": message, "time": time.time()}
        try:
            await self.file.append(orjson.dumps({"failed": failure}) + b"\n")
        except OSError as error:
            warnings.warn(
                f"{self.file.path}: the failed call could not be recorded ({error}): {message}",
                stacklevel=2,
            )
            return
        self.failed.append(failure)


class Episodes:
    """A ledger folder's episodes: the open ones in memory (`open`), the closed ones on disk.
    One gateway at a time holds the folder (`LedgerInUse` while another does)."""

    def __init__(self, ledger: Path, close_wait: float = 30.0):
        self.ledger = private_folder(ledger)
        self._lock = LedgerLock(self.ledger)
        # How long a close waits for the episode's calls in flight; later ones are refused.
        self.close_wait = close_wait
        # Open episodes only: a closed one's calls are let go.
        self.open: dict[str, EpisodeState] = {}
        self.quarantined: dict[str, str] = {}  # damaged ledger files: episode -> why
        self.strays: list[str] = []  # files in the ledger folder that are no episode's

    def release(self) -> None:
        """Let every open episode go and give up the ledger folder's lock."""
        for state in self.open.values():
            state.file = None
        self.open.clear()
        self._lock.release()

    def _path(self, episode_id: str) -> Path:
        return self.ledger / f"{valid_episode(episode_id)}{CALLS_SUFFIX}"

    def episode(self, episode_id: str) -> EpisodeState:
        """The open state of an episode, recovered from its ledger file on first use. A closed
        episode raises the error late calls get; a damaged file is quarantined (and raises); a
        file that cannot be opened (no descriptor left, a disk error) is a 500, and the episode
        is opened again on its next call."""
        state = self.open.get(episode_id)
        if state is not None:
            return state
        with ledger_errors(episode_id):
            return self._opened(episode_id)

    def _opened(self, episode_id: str) -> EpisodeState:
        path = self._path(episode_id)
        self._refuse_quarantined(episode_id, path)
        if not path.exists():
            state = EpisodeState(episode_id, AppendFile(path), Roster(episode_id))
        else:
            tail = last_line(path)
            if tail is not None and "closed" in tail:
                raise closed_error(episode_id)
            state = self._read_back(episode_id, path)
            if state.closed_with is not None:  # a close cut by a crash: finish it
                self._finish_close(state, close_body(episode_id, state.closed_with))
                raise closed_error(episode_id)
            state.file = AppendFile(path)
        self.open[episode_id] = state
        return state

    def _refuse_quarantined(self, episode_id: str, path: Path) -> None:
        if episode_id in self.quarantined or (self.ledger / QUARANTINE / path.name).exists():
            reason = self.quarantined.get(episode_id, "see the quarantine folder")
            raise HttpError(400, f"episode {episode_id!r} is quarantined: {reason}", no_retry=True)

    def _read_back(self, episode_id: str, path: Path) -> EpisodeState:
        """An episode's state from its ledger file (no file opened for writing); a damaged file
        is moved to the quarantine folder and reported, and `HttpError` says so."""
        state = EpisodeState(episode_id, None, Roster(episode_id))
        try:
            for line in read_ledger(path):
                state.replay(line)
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
            try:
                self.episode(episode_id)
            except HttpError as error:  # closed, or quarantined and reported, or unreadable
                if error.status >= 500:
                    warnings.warn(error.message, stacklevel=2)
        return len(self.open)

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

    def close_now(self, episode_id: str, data: dict[str, Any] | None = None) -> Episode:
        """`close` from code without an event loop: calls still in flight are refused."""
        body = close_body(episode_id, data or {})
        state = self._closable(episode_id, body)
        if isinstance(state, Episode):
            return state
        state.closed = True
        return self._finish_close(state, body)

    def _closable(self, episode_id: str, body: CloseBody) -> EpisodeState | Episode:
        """The open episode to close, or the record of one closed before with this body."""
        with ledger_errors(episode_id):
            return self._found_to_close(episode_id, body)

    def _found_to_close(self, episode_id: str, body: CloseBody) -> EpisodeState | Episode:
        state = self.open.get(episode_id)
        if state is not None:
            if state.closing or state.closed:
                raise HttpError(409, f"episode {episode_id!r} is being closed", "conflict")
            if state.in_flight or state.file is None or state.file.exists():
                return state
            del self.open[episode_id]  # only refused requests named it: it holds nothing
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
                state.id,
                list(state.roster.agents.values()),
                state.prompt_keys,
                state.failed,
                body,
            )
        except InputError as error:
            raise HttpError(400, f"the episode cannot close: {error}") from None

    def _finish_close(self, state: EpisodeState, body: CloseBody) -> Episode:
        """Write the close: the `closing` line (its body), the record, the `closed` line. Once
        the `closing` line is durable the close holds: a crash after it is finished on restart,
        storing the record once."""
        try:
            episode = self._record_of(state, body)
            with ledger_errors(state.id):
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
            self.open.pop(state.id, None)  # its calls and file are let go
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
                state.file = None
        return episode

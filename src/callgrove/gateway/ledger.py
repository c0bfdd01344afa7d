"""The ledger: one append-only file per episode, one JSON line per call, fsynced before replying.

`LEDGER/EPISODE.calls.jsonl` gets a line for each call as it completes (the call in the episode
format's own form, with the agent and the hashes that let a restarted gateway continue
histories), a line for each failed upstream call, and, once the episode is closed, a `closing`
line (the close's body) and a `closed` line. Lines are written whole with one `write` (a write
that fails part way is cut back off) and made durable by a group commit: concurrent calls share
one `fsync`, and none is answered, or joins its episode, before the `fsync` that covers its line
has returned. A call with no other in flight fsyncs in place: handing off to the sync thread and
back would only add two wake-ups to its latency (and a request arriving meanwhile waits at most
one fsync). The hot path uses `fdatasync`: it makes the appended bytes and the file's new size
durable, which is all a reader needs, and skips the timestamps. A gateway restarted after a
crash reads every complete line back; a cut last line is reported and cut off, so the next
append starts a fresh line.

Closing turns the calls into an episode record (`callgrove.episode/1`) appended to
`LEDGER/episodes.jsonl`, also fsynced, between the `closing` and `closed` lines: a close cut by
a crash is finished on restart, and stores the record once. The folder and its files are
private to their owner; one gateway at a time holds the folder's lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import threading
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec
import orjson

from callgrove.episode import Agent, Call, Episode, EpisodeWriter, encode_episode
from callgrove.episode.checks import check_episode, check_run

# The codec's own form of one call: a ledger line is that plus the gateway's fields, so a field
# the format gains is written and read back here too.
from callgrove.episode.codec import _call_from_wire, _call_to_wire
from callgrove.errors import InvalidValue, UsageError
from callgrove.forest import abandoned_compactions
from callgrove.formats import InputError
from callgrove.formats.jsonl import json_numbers
from callgrove.formats.wire import WireCall, WirePolicy, WireRun
from callgrove.serving.web import HttpError

EPISODES_FILE = "episodes.jsonl"
CALLS_SUFFIX = ".calls.jsonl"
LOCK_FILE = ".gateway.lock"
QUARANTINE = "quarantine"  # damaged calls files are moved here, each with a `.reason` beside it
PRIVATE_FILE = 0o600
PRIVATE_FOLDER = 0o700


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class _Syncer:
    """A thread that makes appended lines durable: a group commit across every ledger file.

    Calls hand it (file, lines written so far, future); each round it takes everything that
    waits, fsyncs each file once (whatever number of lines wait on it), and then wakes the
    round's waiters with a single hand-off back to their event loop. While a round's fsyncs
    run, new lines gather for the next round, so the more calls arrive at once the fewer
    fsyncs and thread hand-offs each costs.
    """

    def __init__(self) -> None:
        self._ready = threading.Condition()
        self._waiting: list[tuple[AppendFile, int, asyncio.Future[None]]] = []
        self._thread: threading.Thread | None = None
        self._pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="ledger-fsync")

    def durable(self, file: AppendFile, target: int) -> asyncio.Future[None]:
        future = asyncio.get_running_loop().create_future()
        with self._ready:
            self._waiting.append((file, target, future))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ledger-fsync", daemon=True)
                self._thread.start()
            self._ready.notify()
        return future

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._waiting:
                    self._ready.wait()
                batch, self._waiting = self._waiting, []
            files = list({file for file, _, _ in batch})
            # Files of different episodes are fsynced side by side: the file system commits
            # them together, where one after another each would wait a whole disk round trip.
            outcomes = map(_fsync, files) if len(files) == 1 else self._pool.map(_fsync, files)
            errors = {file: error for file, error in zip(files, outcomes, strict=True) if error}
            by_loop: dict[asyncio.AbstractEventLoop, list] = {}
            for file, target, future in batch:
                by_loop.setdefault(future.get_loop(), []).append(
                    (future, errors.get(file) if file.synced < target else None)
                )
            for loop, done in by_loop.items():
                with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                    loop.call_soon_threadsafe(_settle, done)


def _fsync(file: AppendFile) -> OSError | None:
    covered = file.written  # every line written before the fsync starts
    try:
        with _opened(file.path) as fd:
            os.fdatasync(fd)
    except OSError as error:
        return error
    file.synced = max(file.synced, covered)
    return None


def _settle(done: list[tuple[asyncio.Future[None], OSError | None]]) -> None:
    for future, error in done:
        if future.done():
            continue
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)


_SYNCER = _Syncer()


@contextlib.contextmanager
def _opened(path: Path, create: bool = False) -> Iterator[int]:
    """A descriptor appending to `path`, closed on leaving."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | (os.O_CREAT if create else 0), PRIVATE_FILE)
    try:
        yield fd
    finally:
        os.close(fd)


class AppendFile:
    """An append-only file whose `append` returns once the line is durable (group-committed).

    It holds no file descriptor between writes: each write opens the file, appends and closes
    it, and each sync opens it again (an fsync makes the file's data durable through any
    descriptor of it). So the episodes open at once are bounded by memory, never by the
    process's descriptor limit: a harness that crashes leaves its episodes open, and they
    must not wedge the gateway. A write that fails part way (a full disk) is cut back off, so
    the file always ends with a whole line and holds no line whose call was not answered as
    recorded. The file is created (private) by its first line: a request refused before it
    leaves no file behind."""

    def __init__(self, path: Path):
        self.path = path
        self.size = path.stat().st_size if path.exists() else 0  # bytes of whole lines
        self.written = 0  # lines written, and of them made durable (the syncer advances it)
        self.synced = 0

    def exists(self) -> bool:
        """Whether a line was ever written (the file is made by its first)."""
        return self.path.exists()

    def write(self, line: bytes) -> None:
        """Write one whole line, or (on an error) nothing: a partial write is cut off."""
        with _opened(self.path, create=True) as fd:
            self._write(fd, line)

    def _write(self, fd: int, line: bytes) -> None:
        try:
            _write_all(fd, line)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, self.size)
            raise
        self.size += len(line)
        self.written += 1

    async def append(self, line: bytes, alone: bool = False) -> None:
        """Append `line`; return once it is durable."""
        self.write(line)
        await self.sync_written(alone)

    async def sync_written(self, alone: bool = False) -> None:
        """Return once every line written so far is durable. `alone`: no other call is in
        flight, so the fsync runs right here, sparing two thread hand-offs that would only add
        latency."""
        if alone:
            covered = self.written
            with _opened(self.path) as fd:
                os.fdatasync(fd)
            self.synced = max(self.synced, covered)
            return
        await _SYNCER.durable(self, self.written)

    def append_now(self, line: bytes) -> None:
        """Append and fsync without an event loop (closing, recovery repairs)."""
        with _opened(self.path, create=True) as fd:
            self._write(fd, line)
            os.fsync(fd)
        self.synced = max(self.synced, self.written)


def private_folder(path: Path) -> Path:
    """`path` as a folder only its owner can read: the ledger holds every prompt and tool
    output. An existing folder is narrowed too."""
    path.mkdir(parents=True, exist_ok=True, mode=PRIVATE_FOLDER)
    if path.stat().st_mode & 0o077:
        path.chmod(PRIVATE_FOLDER)
    return path


class LedgerLock:
    """An exclusive lock on a ledger folder, held for a gateway's life: two gateways on one
    folder would hand out the same call ids and interleave one episode's lines."""

    def __init__(self, ledger: Path):
        fd = os.open(ledger / LOCK_FILE, os.O_RDWR | os.O_CREAT, PRIVATE_FILE)
        # A file object: a gateway dropped without `release` frees the lock as it is freed.
        self._file = os.fdopen(fd, "r+b", buffering=0)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._file.read(64).decode(errors="replace").strip() or "unknown"
            self._file.close()
            raise LedgerInUse(
                f"{ledger}: another gateway (pid {holder}) records into this ledger folder; "
                "give each gateway its own --ledger"
            ) from None
        self._file.truncate(0)
        self._file.write(f"{os.getpid()}\n".encode())

    def release(self) -> None:
        self._file.close()  # closing the descriptor releases the lock


class LedgerInUse(UsageError, RuntimeError):
    """The ledger folder is locked by another gateway."""


def read_ledger(path: Path) -> Iterator[dict[str, Any]]:
    """The complete lines of a calls file; a cut last line (a crash mid-write) is cut off.
    A line that is not a JSON object raises `InvalidValue` naming the file and line."""
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):
        warnings.warn(
            f"{path}: last line cut off mid-write ({len(data) - end} bytes); truncated",
            stacklevel=2,
        )
        with open(path, "r+b") as stream:
            stream.truncate(end)
            os.fsync(stream.fileno())
    for number, raw in enumerate(data[:end].splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            line = orjson.loads(raw)
        except orjson.JSONDecodeError as error:
            raise InvalidValue(f"{path}:{number}: not valid JSON: {error}") from None
        if not isinstance(line, dict):
            raise InvalidValue(f"{path}:{number}: expected a JSON object")
        yield line


def last_line(path: Path) -> dict[str, Any] | None:
    """The last whole line of a calls file, read from its end (None: none, or not an object);
    a closed episode is known by it without reading its calls."""
    with open(path, "rb") as stream:
        size = stream.seek(0, os.SEEK_END)
        block = min(size, 1 << 16)
        while True:
            stream.seek(size - block)
            data = stream.read(block)
            end = data.rfind(b"\n")
            start = data.rfind(b"\n", 0, end) + 1 if end >= 0 else -1
            if end < 0 or (start == 0 and block < size):
                if block == size:
                    return None
                block = min(size, block * 4)
                continue
            break
    try:
        line = orjson.loads(data[start:end])
    except orjson.JSONDecodeError:
        return None
    return line if isinstance(line, dict) else None


class LedgerAgent(msgspec.Struct, frozen=True):
    """The agent a call line names, as the episode record will hold it."""

    id: str
    name: str
    parent: str | None
    start: str


class CallNote(msgspec.Struct, kw_only=True, frozen=True):
    """The gateway's fields beside a call on its ledger line: what it needs to take the call
    back in after a restart as it took it when it wrote the line."""

    agent: LedgerAgent
    history: str
    """Hex digest of the conversation through the call's reply (how a later request finds it)."""
    prompt_key: str
    """Hex digest of the conversation before the reply ("" for a first call)."""
    tools: str
    """Hex digest of the tools the request offered."""
    api: str
    """The client API the call came through (its dialect's name)."""
    harness: str | None = None
    version: str | None = None
    """The harness CLI's release, where its requests say."""
    path: str | None = None
    time: float = 0.0


def call_line(call: Call, note: CallNote) -> bytes:
    """A call as one ledger line: the episode format's own form of the call (its prompt as a
    reference into its base call) with the gateway's note beside it."""
    wire = msgspec.json.encode(_call_to_wire(call, json_numbers))
    return wire[:-1] + b"," + msgspec.json.encode(note)[1:] + b"\n"


def call_note(line: dict[str, Any]) -> CallNote:
    """The gateway's note of a call line read back (the call's own fields are left to
    `call_from_line`)."""
    return msgspec.convert(line, CallNote, strict=False)


_LINE_DECODER = msgspec.json.Decoder(WireCall)


def call_from_line(raw: bytes | dict[str, Any], episode: str) -> Call:
    """The call of a ledger line; its prompt reference stays a call id, checked where it is read
    (the episode names a call it does not hold)."""
    wire = (
        _LINE_DECODER.decode(raw)
        if isinstance(raw, bytes)
        else msgspec.convert(raw, WireCall, strict=False)
    )
    call = _call_from_wire(wire, episode)
    if wire.prompt_from is not msgspec.UNSET:
        call.prompt_from = wire.prompt_from
    return call


class CloseRun(msgspec.Struct, forbid_unknown_fields=True):
    """The `run` a close request may give (its policy span is the calls' own)."""

    id: str | None = None
    type: str = "train"
    step: int | None = None


class CloseBody(msgspec.Struct, forbid_unknown_fields=True):
    """A close request's body, as the episode format types its fields."""

    rewards: dict[str, float] = {}
    task: Any = None
    ok: bool = True
    run: CloseRun | None = None
    group: str | None = None


def close_body(episode: str, data: dict[str, Any]) -> CloseBody:
    """The close request's body, checked as the episode format checks it; a 400 naming the
    field that does not fit."""
    try:
        body = msgspec.convert(data, CloseBody)
        run = body.run or CloseRun()
        check_run(episode, WireRun(id=run.id, type=run.type, step=run.step), body.rewards)
    except (msgspec.ValidationError, InputError) as error:
        raise HttpError(400, f"episode {episode!r}: close body: {error}") from None
    return body


def close_record(
    episode_id: str,
    agents: list[Agent],
    prompt_keys: dict[str, str],
    failed: list[dict[str, Any]],
    body: CloseBody,
) -> Episode:
    """The episode record of a ledger's calls and the close request's body, checked against
    the episode format (`InputError` names what does not fit).

    A call that the same agent asked again with the same prompt (a retry) is kept only in its
    last attempt; the others are recorded with `kept: false`. So is a compaction its agent went
    on without (`abandoned_compactions`: its summary sampled, then dropped).
    """
    latest: dict[tuple[str, str], Call] = {}
    for agent in agents:
        for call in agent.calls:
            key = (agent.id, prompt_keys.get(call.id, call.id))
            earlier = latest.get(key)
            if earlier is not None:
                earlier.kept = False
            latest[key] = call
    versions = [c.policy_version for a in agents for c in a.calls if c.policy_version is not None]
    run = body.run or CloseRun()
    episode = Episode(
        id=episode_id,
        agents=agents,
        group=body.group,
        task=body.task,
        run=WireRun(
            id=run.id,
            type=run.type,
            step=run.step,
            policy=WirePolicy(start=min(versions), end=max(versions)) if versions else None,
        ),
        ok=body.ok,
        rewards=dict(body.rewards),
        objective="rl",
        meta={"gateway": {"failed_calls": failed}} if failed else None,
    )
    check_episode(episode)
    for call in abandoned_compactions(episode):
        call.kept = False
    return episode


class _EpisodeId(msgspec.Struct):
    """Just the id of an episode line: decodes it without the rest."""

    id: str


def stored_episode_ids(ledger: Path) -> set[str]:
    """The ids of the episodes `episodes.jsonl` holds (a cut or unreadable line holds none)."""
    path = ledger / EPISODES_FILE
    if not path.exists():
        return set()
    decoder = msgspec.json.Decoder(_EpisodeId)
    found = set()
    with open(path, "rb") as stream:
        for raw in stream:
            with contextlib.suppress(msgspec.DecodeError):
                found.add(decoder.decode(raw).id)
    return found


def append_episode(ledger: Path, episode: Episode) -> bytes:
    """Append the closed episode to `LEDGER/episodes.jsonl` (created private), durably;
    returns its line."""
    path = ledger / EPISODES_FILE
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, PRIVATE_FILE))
    with EpisodeWriter(path, append=True) as writer:
        writer.write(episode)
    return encode_episode(episode)

"""The ledger: one append-only file per episode, one JSON line per call, fsynced before replying.

`LEDGER/EPISODE.calls.jsonl` gets a line for each call as it completes (the call's tokens,
log-probabilities, agent and the hashes that let a restarted gateway continue histories), a
line for each failed upstream call, and a last `closed` line once the episode is closed. Lines
are written whole with one `write` and made durable by a group commit: concurrent calls share
one `fsync`, and none is answered before the `fsync` that covers its line has returned. A call
with no other in flight fsyncs in place: handing off to the sync thread and back would only add
two wake-ups to its latency (and a request arriving meanwhile waits at most one fsync). The
hot path uses `fdatasync`: it makes the appended bytes and the file's new size durable, which
is all a reader needs, and skips the timestamps. A
gateway restarted after a crash reads every complete line back; a cut last line is reported and
cut off, so the next append starts a fresh line.

Closing turns the calls into an episode record (`callgrove.episode/1`) appended to
`LEDGER/episodes.jsonl`, also fsynced.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from callgrove.episode import (
    LOGPROB_DTYPE,
    TOKEN_DTYPE,
    Agent,
    Call,
    Episode,
    EpisodeWriter,
    encode_episode,
)
from callgrove.formats.wire import WirePolicy, WireRun

EPISODES_FILE = "episodes.jsonl"
CALLS_SUFFIX = ".calls.jsonl"


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
        os.fdatasync(file.fd)
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


class AppendFile:
    """An append-only file whose `append` returns once the line is durable (group-committed)."""

    def __init__(self, path: Path):
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.written = 0  # lines written, and of them made durable (the syncer advances it)
        self.synced = 0

    async def append(self, line: bytes, alone: bool = False) -> None:
        """Append `line`; return once it is durable. `alone`: no other call is in flight, so
        the fsync runs right here, sparing two thread hand-offs that would only add latency."""
        _write_all(self.fd, line)
        self.written += 1
        if alone:
            os.fdatasync(self.fd)
            self.synced = max(self.synced, self.written)
            return
        await _SYNCER.durable(self, self.written)

    def append_now(self, line: bytes) -> None:
        """Append and fsync without an event loop (closing from code, recovery repairs)."""
        _write_all(self.fd, line)
        os.fsync(self.fd)
        self.written += 1
        self.synced = max(self.synced, self.written)

    def close(self) -> None:
        os.close(self.fd)


def read_ledger(path: Path) -> Iterator[dict[str, Any]]:
    """The complete lines of a calls file; a cut last line (a crash mid-write) is cut off."""
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
            raise ValueError(f"{path}:{number}: not valid JSON: {error}") from None
        if not isinstance(line, dict):
            raise ValueError(f"{path}:{number}: expected a JSON object")
        yield line


def call_line(call: Call, agent: Agent, extra: dict[str, Any]) -> bytes:
    """A call as one ledger line, its prompt as a reference into its base call."""
    record: dict[str, Any] = {
        "id": call.id,
        "seq": call.seq,
        "agent": {"id": agent.id, "name": agent.name, "parent": agent.parent, "start": agent.start},
        "purpose": call.purpose,
        "kept": call.kept,
        "completion_ids": call.completion_ids,
        "logprobs": call.logprobs,
        "policy_version": call.policy_version,
        **extra,
        "content": call.content,
    }
    if call.prompt_from is not None:
        record["prompt_from"] = call.prompt_from
        record["prompt_from_len"] = call.prompt_from_len
        record["prompt_suffix_ids"] = call.prompt_suffix
    else:
        record["prompt_ids"] = call.prompt_suffix
    return orjson.dumps(record, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n"


def call_from_line(line: dict[str, Any]) -> Call:
    """The call of a ledger line; its prompt reference stays a call id, checked where it is read
    (the episode names a call it does not hold)."""
    return Call(
        id=line["id"],
        seq=line["seq"],
        completion_ids=np.asarray(line["completion_ids"], dtype=TOKEN_DTYPE),
        prompt_suffix=np.asarray(
            line.get("prompt_suffix_ids", line.get("prompt_ids")), dtype=TOKEN_DTYPE
        ),
        prompt_from=line.get("prompt_from"),
        prompt_from_len=line.get("prompt_from_len", 0),
        logprobs=np.asarray(line["logprobs"], dtype=LOGPROB_DTYPE),
        policy_version=line.get("policy_version"),
        purpose=line.get("purpose", "turn"),
        kept=line.get("kept", True),
        content=line.get("content"),
    )


def close_record(
    episode_id: str,
    agents: list[Agent],
    prompt_keys: dict[str, str],
    failed: list[dict[str, Any]],
    body: dict[str, Any],
) -> Episode:
    """The episode record of a ledger's calls and the close request's body.

    A call that the same agent asked again with the same prompt (a retry) is kept only in its
    last attempt; the others are recorded with `kept: false`.
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
    run = body.get("run")
    return Episode(
        id=episode_id,
        agents=agents,
        group=body.get("group"),
        task=body.get("task"),
        run=WireRun(
            id=(run or {}).get("id"),
            type=(run or {}).get("type", "train"),
            step=(run or {}).get("step"),
            policy=WirePolicy(start=min(versions), end=max(versions)) if versions else None,
        ),
        ok=bool(body.get("ok", True)),
        rewards={str(k): float(v) for k, v in (body.get("rewards") or {}).items()},
        objective="rl",
        meta={"gateway": {"failed_calls": failed}} if failed else None,
    )


def append_episode(ledger: Path, episode: Episode) -> bytes:
    """Append the closed episode to `LEDGER/episodes.jsonl`, durably; returns its line."""
    with EpisodeWriter(ledger / EPISODES_FILE, append=True) as writer:
        writer.write(episode)
    return encode_episode(episode)

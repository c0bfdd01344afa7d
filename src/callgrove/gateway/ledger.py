"""The ledger: one append-only file per episode, one JSON line per call, fsynced before replying.

`LEDGER/EPISODE.calls.jsonl` gets a line for each call as it completes (the call's tokens,
log-probabilities, agent and the hashes that let a restarted gateway continue histories), a
line for each failed upstream call, and a last `closed` line once the episode is closed. Lines
are written whole with one `write` and made durable by a group commit: concurrent calls share
one `fsync`, and none is answered before the `fsync` that covers its line has returned. A
gateway restarted after a crash reads every complete line back; a cut last line is reported and
cut off, so the next append starts a fresh line.

Closing turns the calls into an episode record (`callgrove.episode/1`) appended to
`LEDGER/episodes.jsonl`, also fsynced.
"""

from __future__ import annotations

import asyncio
import os
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
# fsyncs of different episode files run side by side (the file system can commit them together);
# the default executor's few threads would queue them one behind another.
_SYNCERS = ThreadPoolExecutor(max_workers=64, thread_name_prefix="ledger-fsync")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class AppendFile:
    """An append-only file whose `append` returns once the line is durable (group-committed)."""

    def __init__(self, path: Path):
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._written = 0
        self._synced = 0
        self._syncing: asyncio.Future[None] | None = None

    async def append(self, line: bytes) -> None:
        _write_all(self.fd, line)
        self._written += 1
        target = self._written
        while self._synced < target:
            if self._syncing is None:
                self._syncing = asyncio.ensure_future(self._sync())
            await asyncio.shield(self._syncing)

    async def _sync(self) -> None:
        covered = self._written
        try:
            await asyncio.get_running_loop().run_in_executor(_SYNCERS, os.fsync, self.fd)
            self._synced = covered
        finally:
            self._syncing = None

    def append_now(self, line: bytes) -> None:
        """Append and fsync without an event loop (closing from code, recovery repairs)."""
        _write_all(self.fd, line)
        os.fsync(self.fd)
        self._written += 1
        self._synced = self._written

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
    if call.prompt_base is not None:
        record["prompt_from"] = call.prompt_base.id
        record["prompt_from_len"] = call.prompt_base_len
        record["prompt_suffix_ids"] = call.prompt_suffix
    else:
        record["prompt_ids"] = call.prompt_suffix
    return orjson.dumps(record, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n"


def call_from_line(line: dict[str, Any], earlier: dict[str, Call]) -> Call:
    base = earlier[line["prompt_from"]] if "prompt_from" in line else None
    return Call(
        id=line["id"],
        seq=line["seq"],
        completion_ids=np.asarray(line["completion_ids"], dtype=TOKEN_DTYPE),
        prompt_suffix=np.asarray(
            line.get("prompt_suffix_ids", line.get("prompt_ids")), dtype=TOKEN_DTYPE
        ),
        prompt_base=base,
        prompt_base_len=line.get("prompt_from_len", 0),
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

"""What a file or folder given to a command is, asked of the file kinds registry
(`callgrove.episode.files.kind_of`), so a wrong kind gets a hint instead of an error per line.

The registry knows every kind from the room that knows it: callgrove's own episode forms, the
foreign ones (`callgrove.interop`), harness transcripts (`callgrove.transcripts`). callgrove's
other files, written by the stages after episodes (a capture gateway's calls ledger and its
folder, samples, rows, a training run's metrics and its folder), are registered here, where
every one of those rooms can be seen, the first time a command asks.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

import callgrove.interop.formats
import callgrove.transcripts  # noqa: F401  registers harness transcripts
from callgrove.batch.samples import SAMPLE_SCHEMA
from callgrove.episode.binary.schema import PARQUET_SUFFIX, is_binary
from callgrove.episode.files import (
    FileKind,
    NotEpisodes,
    kind_of,
    not_an_episode_file,
    register,
)
from callgrove.formats.jsonl import iter_lines
from callgrove.orchestrator.sinks import METRICS


def what_is(path: Path) -> FileKind | None:
    """The registry's answer for `path`, callgrove's other files included: a `NotEpisodes`
    kind (with its hint), an `EpisodeFormat`, or None for a folder no kind holds."""
    _register_callgrove_files()
    return kind_of(path)


def not_episodes_hint(path: Path) -> str | None:
    """For a file that is not episodes but something callgrove knows (a harness transcript,
    one of callgrove's other files): what it is and what to do instead."""
    if not path.is_file():
        return None
    kind = what_is(path)
    return kind.hint if isinstance(kind, NotEpisodes) else None


@functools.cache
def _register_callgrove_files() -> None:
    """Register callgrove's files that hold no episodes, once: the gateway's names come with
    its module, imported only when a command first asks what a file is."""
    from callgrove.gateway.ledger import CALLS_SUFFIX, EPISODES_FILE

    calls_ledger = (
        f"a capture gateway's calls ledger ({CALLS_SUFFIX}: a line per call of one episode, "
        "while it is open)"
    )
    kinds = (
        NotEpisodes(
            "calls ledger",
            (CALLS_SUFFIX,),
            not_an_episode_file(
                calls_ledger,
                f"read {EPISODES_FILE} in the same folder, where each closed episode is written",
            ),
            # a call in the episode format's form with the gateway's fields beside it
            shows=_first_record_shows(
                lambda record: (
                    {"seq", "completion_ids", "history"} <= record.keys()
                    or (0 < len(record) <= 3 and record.keys() <= {"failed", "closing", "closed"})
                )
            ),
        ),
        NotEpisodes(
            "samples",
            (),
            not_an_episode_file(
                "a samples file (what `callgrove samples` writes for a trainer)",
                "give the episode files the samples were made from; callgrove.read_samples "
                "reads samples",
            ),
            shows=_first_record_shows(lambda record: set(SAMPLE_SCHEMA.names) <= record.keys()),
        ),
        NotEpisodes(
            "rows",
            (),
            not_an_episode_file(
                "a rows file (what `callgrove rows` writes)",
                "give the episode files the rows were made from",
            ),
            shows=_first_record_shows(lambda record: {"row", "path", "trains"} <= record.keys()),
        ),
        NotEpisodes(
            "metrics",
            (),
            not_an_episode_file(
                f"a training run's {METRICS} (a line per step)",
                "give the run's step_N/train/traces.jsonl, its episodes",
            ),
            shows=_first_record_shows(
                lambda record: (
                    "step" in record
                    and all(isinstance(v, int | float) or v is None for v in record.values())
                )
            ),
        ),
        NotEpisodes(
            "training run folder",
            (),
            not_an_episode_file(
                "a training run's folder",
                "its episodes are in step_N/train/traces.jsonl (give those)",
            ),
            holds=lambda folder: (folder / METRICS).is_file(),
        ),
        NotEpisodes(
            "ledger folder",
            (),
            f"a capture gateway's ledger folder: give its {EPISODES_FILE}, its closed episodes",
            holds=lambda folder: (folder / EPISODES_FILE).is_file(),
        ),
    )
    for kind in kinds:
        register(kind)


def _first_record_shows(test: Callable[[dict[str, Any]], bool]) -> Callable[[Path], bool]:
    """A content test of a file's first record, where it is one that is not an episode."""

    def shows(path: Path) -> bool:
        record = _first_record(path)
        return record is not None and test(record)

    return shows


def _first_record(path: Path) -> dict[str, Any] | None:
    """The first record of a JSON Lines file that is not an episode (its keys and values), or
    a binary file's columns (as keys); None for an episode or what cannot be read so. Kept for
    the file as it is now, since each kind's test asks for it in turn."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return _record_of(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=4)
def _record_of(path: Path, _mtime_ns: int, _size: int) -> dict[str, Any] | None:
    try:
        if is_binary(path):
            schema = _binary_schema(path)
            if (schema.metadata or {}).get(b"format") is not None:
                return None
            return dict.fromkeys(schema.names)
        for _number, line, _complete in iter_lines(path):
            record = orjson.loads(line)
            if not isinstance(record, dict) or "format" in record:
                return None
            return record
    except (OSError, EOFError, ValueError, pa.ArrowException):
        return None
    return None


def _binary_schema(path: Path) -> pa.Schema:
    if path.name.endswith(PARQUET_SUFFIX):
        return pq.read_schema(path)
    with pa.memory_map(str(path)) as source:
        return pa.ipc.open_file(source).schema

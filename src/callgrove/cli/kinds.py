"""What a file given to a command holds, so a wrong kind gets a hint instead of an error per line.

Three facts decide, each kept where it belongs: the episode format registry (`format_for`) knows
every form the commands read (callgrove's own, verifiers traces, NeMo Gym captures, ATIF
trajectories), the transcript importers' `sniff` knows harness transcripts, which must be
imported first, and the stages that write callgrove's other files (a gateway's calls ledger,
samples, rows, a training run's metrics) know their records, by which such a file given as
episodes is named.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from callgrove.batch.samples import SAMPLE_SCHEMA
from callgrove.episode import format_for
from callgrove.formats.jsonl import iter_lines
from callgrove.orchestrator.sinks import METRICS
from callgrove.transcripts.accounting import CLAUDE_CODE, CODEX, import_hint, sniff

HARNESS_KINDS = (CLAUDE_CODE, CODEX)
# verifiers names the file inside a run's results folder
VERIFIERS_FILE = "traces.jsonl"
BINARY_SUFFIXES = (".parquet", ".arrow")


def harness_kind(path: Path) -> str | None:
    """CLAUDE_CODE or CODEX for a harness transcript that would otherwise be read as episodes."""
    if not path.is_file() or format_for(path).name != "callgrove":
        return None
    if path.name.endswith(BINARY_SUFFIXES):
        return None
    found = sniff(path)
    return found if found in HARNESS_KINDS else None


@dataclass(frozen=True)
class OtherFile:
    """One of callgrove's files that is not episodes: what it is, what to give instead, and
    how its first record (a JSON object's keys and values, or a table's columns) shows it."""

    what: str
    instead: str
    shows: Callable[[dict[str, Any]], bool]
    suffix: str | None = None  # or its file name ends so


def _ledger_files() -> tuple[str, str]:
    from callgrove.gateway.ledger import CALLS_SUFFIX, EPISODES_FILE  # only when a file asks

    return CALLS_SUFFIX, EPISODES_FILE


def _other_files() -> tuple[OtherFile, ...]:
    calls_suffix, episodes_file = _ledger_files()
    return (
        OtherFile(
            f"a capture gateway's calls ledger ({calls_suffix}: a line per call of one "
            "episode, while it is open)",
            f"read {episodes_file} in the same folder, where each closed episode is written",
            # a call in the episode format's form with the gateway's fields beside it
            lambda record: (
                {"seq", "completion_ids", "history"} <= record.keys()
                or (0 < len(record) <= 3 and record.keys() <= {"failed", "closing", "closed"})
            ),
            calls_suffix,
        ),
        OtherFile(
            "a samples file (what `callgrove samples` writes for a trainer)",
            "give the episode files the samples were made from; callgrove.read_samples "
            "reads samples",
            lambda record: set(SAMPLE_SCHEMA.names) <= record.keys(),
        ),
        OtherFile(
            "a rows file (what `callgrove rows` writes)",
            "give the episode files the rows were made from",
            lambda record: {"row", "path", "trains"} <= record.keys(),
        ),
        OtherFile(
            f"a training run's {METRICS} (a line per step)",
            "give the run's step_N/train/traces.jsonl, its episodes",
            lambda record: (
                "step" in record
                and all(isinstance(v, int | float) or v is None for v in record.values())
            ),
        ),
    )


def _first_record(path: Path) -> dict[str, Any] | None:
    """The first record of a JSON Lines file that is not an episode (its keys and values), or
    a binary file's columns (as keys); None for an episode or what cannot be read so."""
    try:
        if path.name.endswith(BINARY_SUFFIXES):
            if path.name.endswith(".parquet"):
                schema = pq.read_schema(path)
            else:
                with pa.memory_map(str(path)) as source:
                    schema = pa.ipc.open_file(source).schema
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


def other_file(path: Path) -> OtherFile | None:
    """The callgrove file `path` is when it is one that holds no episodes (a calls ledger, a
    samples, rows or metrics file)."""
    if not path.is_file():
        return None
    others = _other_files()
    named = next((o for o in others if o.suffix and path.name.endswith(o.suffix)), None)
    if named is not None:
        return named
    record = _first_record(path)
    if record is None:
        return None
    return next((other for other in others if other.shows(record)), None)


def not_episodes_hint(path: Path) -> str | None:
    """For a file that is not episodes but something callgrove knows (a harness transcript,
    one of callgrove's other files): what it is and what to do instead."""
    kind = harness_kind(path)
    if kind is not None:
        return f"a {kind}, not an episode file: {import_hint(kind)}"
    other = other_file(path)
    if other is not None:
        return f"{other.what}, not an episode file: {other.instead}"
    return None


def folder_hint(path: Path) -> str | None:
    """For a folder of callgrove's given as episodes (a training run's, a gateway's ledger):
    where its episodes are."""
    _calls_suffix, episodes_file = _ledger_files()
    if (path / METRICS).is_file():
        return (
            "a training run's folder, not an episode file: its episodes are in "
            "step_N/train/traces.jsonl (give those)"
        )
    if (path / episodes_file).is_file():
        return f"a capture gateway's ledger folder: give its {episodes_file}, its closed episodes"
    return None

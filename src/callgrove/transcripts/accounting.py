"""Reading transcript lines and accounting for every one of them.

Each non-blank input line ends up either used (with what it became) or skipped with a reason;
lines that cannot be read at all are problems with file and line. `ImportReport.unaccounted`
is empty when nothing was lost, and the CLI prints the counts.
"""

from __future__ import annotations

import gc
import os
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, Protocol, TypeVar

import msgspec
import orjson

from callgrove.episode.files import (
    EPISODE_FORMAT_PREFIX,
    NotEpisodes,
    not_an_episode_file,
    register,
)
from callgrove.formats.jsonl import iter_lines
from callgrove.formats.looks import HEAD_BYTES
from callgrove.formats.problems import Diagnostics, InputError, Problem

R = TypeVar("R")


def parse_timestamp(value: Any) -> float | None:
    """Seconds since the epoch of an ISO 8601 timestamp; None when absent or unreadable."""
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def running_times(stamps: Sequence[Any]) -> list[float]:
    """Each line's time for the ledger order: its own timestamp, else the latest one before it
    (0.0 before any)."""
    times: list[float] = []
    last = 0.0
    for stamp in stamps:
        time = parse_timestamp(stamp)
        last = time if time is not None else last
        times.append(last)
    return times


class CallIds:
    """Call ids of one agent: `AGENT/KEY`, with `#2`, `#3`... when a key repeats."""

    def __init__(self, agent: str):
        self.agent = agent
        self.taken: set[str] = set()

    def new(self, key: str) -> str:
        base = f"{self.agent}/{key}"
        name, n = base, 1
        while name in self.taken:
            n += 1
            name = f"{base}#{n}"
        self.taken.add(name)
        return name


@dataclass(slots=True)
class Line:
    """One JSON object read from a transcript file."""

    file: str
    number: int
    data: dict[str, Any]


class FromLine(Protocol):
    """Anything read from a line of a file."""

    @property
    def file(self) -> str: ...

    @property
    def number(self) -> int: ...


class Outcome(msgspec.Struct, frozen=True):
    """What a line became: used (`what`), skipped (`reason`), or a problem (`problem`); `line`
    is its place in the importer's list of lines."""

    line: int
    used: str | None = None
    skipped: str | None = None
    problem: str | None = None


@dataclass
class ImportReport:
    """What happened to every input line, and what could not be used."""

    diagnostics: Diagnostics = field(default_factory=Diagnostics)
    lines_read: Counter[str] = field(default_factory=Counter)  # file -> non-blank lines
    used: dict[str, dict[int, str]] = field(default_factory=dict)  # file -> line -> what
    skipped: list[Problem] = field(default_factory=list)

    def use(self, line: FromLine, what: str) -> None:
        self.used.setdefault(line.file, {})[line.number] = what

    def skip(self, line: FromLine, reason: str) -> None:
        self.skipped.append(
            Problem(reason, file=line.file, line=line.number, severity="warning", kind="skipped")
        )

    def problem(
        self, message: str, file: str | None, line: int | None = None, *, severity: str = "error"
    ) -> None:
        self.diagnostics.add(
            Problem(message, file=file, line=line, severity=severity, kind="transcript")
        )

    def accounted(self, file: str) -> set[int]:
        """Line numbers of `file` that were used, skipped or reported."""
        numbers = set(self.used.get(file, {}))
        numbers.update(p.line for p in self.skipped if p.file == file and p.line is not None)
        numbers.update(
            p.line for p in self.diagnostics.problems if p.file == file and p.line is not None
        )
        return numbers

    def account(self, line: FromLine, outcome: Outcome) -> None:
        """Record what `line` became; a problem here is a warning (the rest still imports)."""
        if outcome.used is not None:
            self.use(line, outcome.used)
        elif outcome.skipped is not None:
            self.skip(line, outcome.skipped)
        else:
            self.problem(outcome.problem or "", line.file, line.number, severity="warning")

    def skipped_reasons(self) -> Counter[str]:
        return Counter(p.message for p in self.skipped)

    def used_kinds(self) -> Counter[str]:
        return Counter(what for lines in self.used.values() for what in lines.values())


def read_json_lines(path: str | os.PathLike[str], report: ImportReport) -> Iterator[Line]:
    """Yield each line that is a JSON object; report the rest with file and line.

    A final line cut off mid-write (no newline, not JSON) is a warning: everything before it
    still imports.
    """
    file = str(path)
    for number, data in read_records(path, report, _no_record, _as_object):
        yield Line(file, number, data)


def read_records(
    path: str | os.PathLike[str],
    report: ImportReport,
    decode: Callable[[bytes], R | None],
    from_object: Callable[[dict[str, Any]], R],
) -> Iterator[tuple[int, R]]:
    """Yield (line number, record) for each line: `decode` reads the line's bytes straight
    into its record (fast); where it gives None, the line is read as a JSON object and
    `from_object` makes the record of it. Lines that are not JSON objects are reported, as in
    `read_json_lines`."""
    file = str(path)
    try:
        lines = list(iter_lines(path))
    except OSError as error:
        report.problem(f"cannot read: {error.strerror or error}", file)
        return
    last = lines[-1][0] if lines else 0
    report.lines_read[file] += len(lines)
    for number, raw, complete in lines:
        record = decode(raw)
        if record is not None:
            yield number, record
            continue
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError as error:
            if number == last and not complete:
                report.problem(
                    "truncated final line (no newline, incomplete JSON); ignored",
                    file,
                    number,
                    severity="warning",
                )
            else:
                report.problem(f"not valid JSON: {error}", file, number)
            continue
        if not isinstance(data, dict):
            report.problem(f"expected a JSON object, found {type(data).__name__}", file, number)
            continue
        yield number, from_object(data)


def _no_record(raw: bytes) -> None:
    return None


def _as_object(data: dict[str, Any]) -> dict[str, Any]:
    return data


CLAUDE_CODE = "Claude Code session"
CODEX = "Codex rollout"
EPISODES = "callgrove episode file"
_CLAUDE_KEYS = frozenset({"uuid", "parentUuid", "sessionId", "leafUuid"})
_CODEX_TYPES = frozenset(
    {"session_meta", "response_item", "turn_context", "event_msg", "compacted"}
)
_HINTS = {
    CLAUDE_CODE: "import it with `callgrove import claude-code`",
    CODEX: "import it with `callgrove import codex`",
    EPISODES: "it is already episodes: give it to `callgrove rows`, `show` or `convert`",
}


def sniff(path: str | os.PathLike[str]) -> str:
    """What a file holds, judged from its first lines: one of the kinds above, else a phrase
    saying what it is not (binary, not JSON Lines, JSON of another kind, empty)."""
    try:
        with open(path, "rb") as stream:
            head = stream.read(HEAD_BYTES)
    except OSError as error:
        return f"unreadable ({error.strerror or error})"
    if not head.strip():
        return "empty"
    if b"\0" in head:
        return "a binary file (not text)"
    objects = []
    for raw in head.splitlines()[:50]:
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        if isinstance(value, dict):
            objects.append(value)
    if not objects:
        return "not JSON Lines (no line is a JSON object)"
    for value in objects:
        if str(value.get("format", "")).startswith(EPISODE_FORMAT_PREFIX):
            return EPISODES
        if value.get("type") in _CODEX_TYPES and isinstance(value.get("payload"), dict):
            return CODEX
        if _CLAUDE_KEYS & value.keys():
            return CLAUDE_CODE
    return "JSON Lines of another kind (neither a Claude Code session nor a Codex rollout)"


def _is_transcript(kind: str, path: Path) -> bool:
    return sniff(path) == kind


# A harness transcript given where episodes are read is named, with the command that imports it.
for _kind in (CLAUDE_CODE, CODEX):
    register(
        NotEpisodes(
            _kind,
            (),
            not_an_episode_file(f"a {_kind}", _HINTS[_kind]),
            shows=partial(_is_transcript, _kind),
        )
    )


def refuse_file(
    path: str | os.PathLike[str], expected: str, found: str, report: ImportReport
) -> None:
    """Report a file that is not an `expected` transcript as an error with a hint; every line
    it has is skipped with that reason, so none goes unaccounted."""
    hint = _HINTS.get(found)
    what = f"a {found}" if found in _HINTS else found
    message = f"not a {expected}: this is {what}" + (f"; {hint}" if hint else "")
    report.problem(message, str(path))
    report.lines_read[str(path)] += 0  # read, even when it has no line
    try:
        lines = list(iter_lines(path))
    except (OSError, InputError):
        return
    for number, _, _ in lines:
        report.lines_read[str(path)] += 1
        report.skip(Line(str(path), number, {}), f"not a {expected} ({found})")


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a transcript is built.

    Importing creates many long-lived objects and frees almost none; each automatic full
    collection rescans all of them, which made import time grow faster than the input.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()

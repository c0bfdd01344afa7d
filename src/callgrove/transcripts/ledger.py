"""Reading transcript lines and accounting for every one of them.

Each non-blank input line ends up either used (with what it became) or skipped with a reason;
lines that cannot be read at all are problems with file and line. `ImportReport.unaccounted`
is empty when nothing was lost, and the CLI prints the counts.
"""

from __future__ import annotations

import gc
import os
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson

from callgrove.formats.jsonl import iter_lines
from callgrove.formats.problems import Diagnostics, Problem


@dataclass(slots=True)
class Line:
    """One JSON object read from a transcript file."""

    file: str
    number: int
    data: dict[str, Any]


@dataclass
class ImportReport:
    """What happened to every input line, and what could not be used."""

    diagnostics: Diagnostics = field(default_factory=Diagnostics)
    lines_read: Counter[str] = field(default_factory=Counter)  # file -> non-blank lines
    used: dict[str, dict[int, str]] = field(default_factory=dict)  # file -> line -> what
    skipped: list[Problem] = field(default_factory=list)

    def use(self, line: Line, what: str) -> None:
        self.used.setdefault(line.file, {})[line.number] = what

    def skip(self, line: Line, reason: str) -> None:
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
    try:
        lines = list(iter_lines(path))
    except OSError as error:
        report.problem(f"cannot read: {error.strerror or error}", file)
        return
    last = lines[-1][0] if lines else 0
    for number, raw, complete in lines:
        report.lines_read[file] += 1
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
        yield Line(file, number, data)


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

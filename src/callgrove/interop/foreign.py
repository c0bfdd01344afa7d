"""Foreign JSON Lines files, streamed one decoded row at a time with located problems.

The same rules as callgrove's own reader: a malformed line is an error naming its file and line;
a final line without its newline that does not parse is the trace of a crash mid-write, a warning.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import msgspec

from callgrove.formats.jsonl import iter_lines
from callgrove.formats.problems import Diagnostics, InputError, Problem

Row = TypeVar("Row")


def iter_rows(
    path: str | os.PathLike[str],
    decode: Callable[[bytes], Row],
    diagnostics: Diagnostics | None = None,
) -> Iterator[tuple[int, Row]]:
    """Stream `(line number, decode(line))`.

    Without `diagnostics` the first bad line raises `InputError`; with it, bad lines are recorded
    there and skipped. A truncated final line is only ever a warning.
    """
    file = str(path)
    pending: Problem | None = None
    for number, line, complete in iter_lines(path):
        if pending is not None:
            report(InputError(pending), diagnostics)
            pending = None
        try:
            yield number, decode(line)
        except msgspec.DecodeError as error:
            malformed = not isinstance(error, msgspec.ValidationError)
            if malformed and not complete:
                pending = Problem(
                    "truncated final line (no newline, incomplete JSON); ignored",
                    file=file,
                    line=number,
                    severity="warning",
                    kind="truncated",
                )
            else:
                kind = "malformed" if malformed else "invalid"
                reason = "not valid JSON" if malformed else "unexpected shape"
                pending = Problem(f"{reason}: {error}", file=file, line=number, kind=kind)
        except InputError as error:
            pending = error.located(file=file, line=number).problem
    if pending is not None:
        report(InputError(pending), diagnostics)


def report(error: InputError, diagnostics: Diagnostics | None) -> None:
    """Record a problem, or raise it when there is nowhere to record it (warnings pass)."""
    if diagnostics is not None:
        diagnostics.add(error.problem)
    elif error.problem.severity != "warning":
        raise error


def gap(kind: str, call: str, reason: str) -> dict[str, Any]:
    """An episode gap (`Episode.gaps`): a part of the source that could not become a call."""
    return {"kind": kind, "call": call, "reason": reason}

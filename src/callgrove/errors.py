"""The root of every error callgrove raises, and the exit status each kind of error means.

The rule, stated here once and applied by the command line from the class of what it caught:

- 0: everything went through (nothing was raised, nothing was lost);
- 1: something failed or was lost (`RunFailed`, and the root for anything not classed): the
  work began and could not finish, or an episode of a stream could not be used;
- 2: the command was given something it cannot use (`UsageError`): an option, a config, an
  input or an output place, refused before the work.

A command that reads a stream of episodes goes on past one that cannot be used and exits 1
for it: that is counted as the stream is read, not raised.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import ClassVar

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


class CallgroveError(Exception):
    """Anything callgrove raises as an error: `except CallgroveError` catches each of them."""

    exit_code: ClassVar[int] = EXIT_FAILED


class UsageError(CallgroveError):
    """What a command or function was given cannot be used; nothing was done with it."""

    exit_code: ClassVar[int] = EXIT_USAGE


class RunFailed(CallgroveError):
    """Work that began could not finish, or lost part of what it was doing."""

    exit_code: ClassVar[int] = EXIT_FAILED


class InvalidValue(UsageError, ValueError):
    """A value callgrove was given (a setting, an option, a field, an argument) is not one it
    takes: the message names it and what it takes. Also a `ValueError`, so a caller's
    `except ValueError` and msgspec's checks of a struct's `__post_init__` still catch it."""


class StateError(RunFailed, RuntimeError):
    """What callgrove was asked to do cannot be done in the state things are in (a server that
    stopped, a loop already closed, a run folder held by another): the work stops, saying why.
    Also a `RuntimeError`, for callers that catch that."""


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """` (did you mean 'x'?)` for the choice closest to a mistyped `word`, or "" where none is
    close: what an error about an unknown name appends to its message."""
    close = difflib.get_close_matches(word, [str(choice) for choice in choices], n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""

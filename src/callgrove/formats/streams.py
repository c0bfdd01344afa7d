"""Inputs that can be read only once: standard input given as `-`, a pipe (`/dev/stdin`, a
process substitution's `/dev/fd/N`), a FIFO.

Readers open their file by name, some more than once (the form is told from the first line
before the reader starts from the top; Parquet seeks), and a second open of a pipe finds its
head gone. So such an input is copied, whole and once, into a temporary file the first time it
is named (`readable`), and every later use of the name in this process reads that copy:
problems found in it name the input (`problems.show_file_as`). A copy whose input's name has
no ending (`-`, `/dev/stdin`, `/dev/fd/63`) is named by what it holds (gzip, zstd, Parquet,
Arrow, a pretty-printed ATIF trajectory as `.json`, else JSON Lines), so compressed and binary
episodes, and a trajectory document read whole, come through a pipe too.
A descriptor's name open on a regular file (`/dev/stdin` given `< t.json`) is no stream: it is
read through that file's own name, which tells its form.

A FIFO that no writer opens would keep its reader waiting for ever: the reader waits
`FIFO_WAIT_S` for one, saying so, and then stops with an error.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import shutil
import stat
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO

from callgrove.formats.looks import HEAD_BYTES, suffix_by_content
from callgrove.formats.problems import InputError, Problem, show_file_as

STDIN = "-"
FIFO_WAIT_S = 10.0
# A writer already there lets the open return at once; past this, say that the reader waits.
_QUIET_WAIT_S = 0.2
# How long the open a FIFO's own reader wakes (see `_open_fifo`) may take to return.
_WAKE_S = 1.0
_COPY_BLOCK = 1 << 20

# Each stream's copy, by what tells it from other streams: a pipe or FIFO by its inode (a
# descriptor's number, /dev/fd/N, is reused for other pipes), standard input by the object
# this process reads it through. A character device is no stream here: /dev/null reads as an
# empty file, and one that never ends (/dev/urandom) is told from its head as not JSON Lines,
# where a copy would fill the disk.
_copies: dict[object, Path] = {}
_lock = threading.Lock()
_folder: Path | None = None


def _stream_key(path: str | os.PathLike[str]) -> object | None:
    """What tells the stream `path` is from any other (None: `path` is no stream)."""
    if str(path) == STDIN:
        return (STDIN, id(sys.stdin))
    try:
        status = os.stat(path)
    except (OSError, ValueError):
        return None
    return (status.st_dev, status.st_ino) if stat.S_ISFIFO(status.st_mode) else None


def readable(path: str | os.PathLike[str], waiting: Callable[[str], None] | None = None) -> Path:
    """The file to read `path` through: for an input that can be read only once, its copy
    (made now, the first time it is named; `waiting(message)` hears when a FIFO has no writer
    yet); any other path as it is. A FIFO no writer opens within `FIFO_WAIT_S`, or an input
    that cannot be read whole, raises `InputError` naming it."""
    key = _stream_key(path)
    if key is None:
        return _behind(Path(path))
    with _lock:
        copy = _copies.get(key)
        if copy is None:
            name = str(path)
            copy = _copies[key] = _copy(name, waiting)
            show_file_as(str(copy), name)
    return copy


# Names of a descriptor: what they open is the file the descriptor is open on.
_DESCRIPTOR_NAMES = ("/dev/stdin", "/dev/fd/", "/proc/self/fd/")


def _behind(path: Path) -> Path:
    """For a descriptor's name (`/dev/stdin`, `/dev/fd/N`) open on a regular file (`< t.json`),
    that file: its name, unlike the descriptor's, has the ending a reader is chosen by. Any other
    path, or a file with no ending, as it is."""
    if not str(path).startswith(_DESCRIPTOR_NAMES):
        return path
    real = Path(os.path.realpath(path))
    return real if real.is_file() and "." in real.name else path


def _copy(name: str, waiting: Callable[[str], None] | None) -> Path:
    global _folder
    if _folder is None:
        _folder = Path(tempfile.mkdtemp(prefix="callgrove-inputs-"))
        atexit.register(shutil.rmtree, _folder, ignore_errors=True)
    place = Path(tempfile.mkdtemp(dir=_folder))
    base = "stdin" if name == STDIN else Path(name).name
    unnamed = place / base
    try:
        with _open(name, waiting) as source, open(unnamed, "wb") as target:
            while block := source.read(_COPY_BLOCK):
                target.write(block)
    except OSError as error:
        raise InputError(
            Problem(
                f"cannot read it whole: {error.strerror or error}", file=name, kind="unreadable"
            )
        ) from None
    if "." in base:
        return unnamed
    with open(unnamed, "rb") as copied:
        named = unnamed.with_name(base + suffix_by_content(copied.read(HEAD_BYTES)))
    return unnamed.rename(named)


def _open(
    name: str, waiting: Callable[[str], None] | None
) -> contextlib.AbstractContextManager[IO[bytes]]:
    if name == STDIN:
        if sys.stdin is None:
            raise OSError(errno.EBADF, "this process has no standard input")
        if waiting is not None and sys.stdin.isatty():
            waiting("reading episodes from the terminal: end them with Ctrl-D")
        return contextlib.nullcontext(sys.stdin.buffer)  # read, never closed: it is the process's
    if not stat.S_ISFIFO(os.stat(name).st_mode):
        return open(name, "rb")
    return _open_fifo(name, waiting)


def _open_fifo(name: str, waiting: Callable[[str], None] | None) -> IO[bytes]:
    """Open a FIFO for reading, waiting at most `FIFO_WAIT_S` for a writer to open it (an
    open blocks until one does; a pipe that already has one, or had one, never waits)."""
    opened: list[IO[bytes]] = []
    failed: list[OSError] = []

    def open_it() -> None:
        try:
            opened.append(open(name, "rb"))  # noqa: SIM115 - handed to the caller
        except OSError as error:
            failed.append(error)

    opener = threading.Thread(target=open_it, name=f"open {name}", daemon=True)
    opener.start()
    opener.join(_QUIET_WAIT_S)
    if opener.is_alive() and waiting is not None:
        waiting(f"{name}: a FIFO with no writer yet; waiting up to {FIFO_WAIT_S:g} s for one")
    opener.join(FIFO_WAIT_S)
    if opener.is_alive():
        # Be the writer for a moment so the blocked open returns, and the FIFO is left as found.
        with contextlib.suppress(OSError):
            os.close(os.open(name, os.O_WRONLY | os.O_NONBLOCK))
        opener.join(_WAKE_S)
        for stream in opened:
            stream.close()
        raise InputError(
            Problem(
                f"no writer opened this FIFO within {FIFO_WAIT_S:g} s; nothing was read",
                file=name,
                kind="unreadable",
            )
        )
    if failed:
        raise failed[0]
    return opened[0]

"""Files callgrove writes: a new file appears whole or not at all; an appended file has one
writer at a time.

A new file is written under a unique temporary name beside its target and renamed onto it only
once complete, so a failed or killed write leaves whatever was there before untouched, two
writers of one target never mix their bytes, and a file can be rewritten from itself
(`save(p, load(p))`). Appending is for logs that must survive a crash line by line: the file is
held under an advisory lock (`flock`) for as long as it is open, so a second appender waits its
turn (or, past `LOCK_WAIT_S`, is refused) instead of interleaving lines.

A writer holds a lock on its temporary file while it lives; the kernel drops it when the
process dies, however it dies. The next write to the same target removes the temporary files
whose lock is free (their writer is gone) and says so with a warning; a live writer's file is
left alone.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import os
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO

from callgrove.formats.problems import InputError, Problem

# Files are created with the permissions a plain `open` would give them.
_UMASK = os.umask(0)
os.umask(_UMASK)


def output_error(path: str | os.PathLike[str], error: OSError | str) -> InputError:
    """An `InputError` for a path that cannot be written, saying why in words."""
    reason = error if isinstance(error, str) else (error.strerror or str(error))
    if isinstance(error, OSError) and error.errno == errno.ENOENT:
        reason = "its folder does not exist"
    elif isinstance(error, OSError) and error.errno in (errno.EISDIR, errno.ENOTDIR):
        reason = "it is a folder" if error.errno == errno.EISDIR else "a part of it is not a folder"
    return InputError(Problem(f"cannot write: {reason}", file=str(path), kind="output"))


_PARTIAL = ".partial"
# A temporary file younger than this is never removed: its writer may not have locked it yet.
LEFTOVER_AGE_S = 2.0


class LeftoverWarning(UserWarning):
    """Temporary files of earlier writes that never finished were removed."""


def _temporary_pattern(path: Path) -> str:
    return str(path.parent / f".{glob.escape(path.name)}.*{_PARTIAL}")


def remove_leftovers(path: str | os.PathLike[str]) -> list[Path]:
    """Remove the temporary files of earlier writes to `path` whose writer is dead (nobody
    holds their lock), warn about them, and return them."""
    removed = []
    now = time.time()
    for name in glob.glob(_temporary_pattern(Path(path))):
        try:
            handle = os.open(name, os.O_RDONLY)
        except OSError:
            continue
        try:
            if now - os.fstat(handle).st_mtime < LEFTOVER_AGE_S:
                continue
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.unlink(name)
            removed.append(Path(name))
        except OSError:  # locked: its writer is alive (or it is already gone)
            continue
        finally:
            os.close(handle)
    if removed:
        warnings.warn(
            f"{path}: removed {len(removed)} temporary file(s) left by earlier writes that "
            f"were killed before they finished: {', '.join(p.name for p in removed)}",
            LeftoverWarning,
            stacklevel=3,
        )
    return removed


class NewFile:
    """A file being written under a temporary name beside `path`; `commit()` moves it into
    place, `discard()` removes it. Nothing at `path` changes before `commit()`."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        if self.path.is_dir():
            raise output_error(self.path, "it is a folder")
        try:
            handle, name = tempfile.mkstemp(
                prefix=f".{self.path.name}.", suffix=_PARTIAL, dir=self.path.parent
            )
        except OSError as error:
            raise output_error(self.path, error) from None
        # held until commit or discard (or the process's death): tells later writers it lives
        fcntl.flock(handle, fcntl.LOCK_EX)
        self._lock: int | None = handle
        os.chmod(name, 0o666 & ~_UMASK)
        self.temp = Path(name)
        remove_leftovers(self.path)

    def commit(self) -> None:
        """Make the written file durable and move it onto its target in one step."""
        with open(self.temp, "rb+") as written:
            os.fsync(written.fileno())
        try:
            os.replace(self.temp, self.path)
        except OSError as error:
            self.discard()
            raise output_error(self.path, error) from None
        self._unlock()
        with contextlib.suppress(OSError):  # make the rename itself durable where possible
            folder = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(folder)
            finally:
                os.close(folder)

    def discard(self) -> None:
        self.temp.unlink(missing_ok=True)
        self._unlock()

    def _unlock(self) -> None:
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None


# How long an appender waits for another one to finish before it is refused: short appends
# (an episode at a time) take turns, a writer that holds the file open for a run is not waited on.
LOCK_WAIT_S = 10.0
_LOCK_POLL_S = 0.02


def open_locked_append(path: str | os.PathLike[str]) -> IO[bytes]:
    """Open `path` for appending (created if missing) under an exclusive advisory lock.

    Waits up to `LOCK_WAIT_S` for another appender to close it, then raises `InputError`; a
    path that cannot be written raises `InputError` too. The lock lasts until the returned file
    is closed.
    """
    remove_leftovers(path)
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            raw = open(path, "ab")  # noqa: SIM115 - the caller owns and closes it
        except OSError as error:
            raise output_error(path, error) from None
        try:
            fcntl.flock(raw.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raw.close()
            if time.monotonic() < deadline:
                time.sleep(_LOCK_POLL_S)
                continue
            raise InputError(
                Problem(
                    f"cannot append: another writer has held it for {LOCK_WAIT_S:g} s "
                    "(it holds its lock)",
                    file=str(path),
                    kind="output",
                )
            ) from None
        # The file may have been replaced (rewritten whole) while we waited: lock the one
        # that is at `path` now.
        try:
            if os.stat(path).st_ino == os.fstat(raw.fileno()).st_ino:
                return raw
        except FileNotFoundError:
            pass
        raw.close()


def check_output(output: Path, inputs: list[Path]) -> None:
    """Raise `InputError` for an output path that cannot be written, before any work is done:
    a folder, one whose folder is missing or read-only, or one of `inputs` (writing it would
    read and replace the same file at once)."""
    if output.is_dir():
        raise output_error(output, "it is a folder")
    folder = output.parent
    if not folder.is_dir():
        raise output_error(output, "its folder does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise output_error(output, "its folder is not writable")
    if not output.exists():
        return
    for source in inputs:
        with contextlib.suppress(OSError):
            if source.exists() and os.path.samefile(source, output):
                raise InputError(
                    Problem(
                        "is an input of this command too; write the output to another file",
                        file=str(output),
                        kind="output",
                    )
                )


def write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write a whole text file (UTF-8) the `NewFile` way: it appears complete or not at all."""
    new = NewFile(path)
    try:
        new.temp.write_text(text, encoding="utf-8")
    except BaseException:
        new.discard()
        raise
    new.commit()


@contextlib.contextmanager
def removed_if_unused(
    folder: str | os.PathLike[str], leftovers: Sequence[str] = ()
) -> Iterator[None]:
    """Make way for an output folder that the block creates: if the block fails (a usage error,
    or any other) while the folder holds nothing but `leftovers` (a lock file nobody holds any
    more), the folder is removed again, with the folders above it made for it. A command
    refused before it wrote anything then leaves nothing behind; a folder that was there
    before is left alone, and so is one that holds anything else."""
    target = Path(folder).absolute()
    missing = [path for path in (target, *target.parents) if not path.exists()]
    try:
        yield
    except BaseException:
        if missing:
            _remove_unused(target, missing[-1], leftovers)
        raise


def _remove_unused(folder: Path, made: Path, leftovers: Sequence[str]) -> None:
    """Remove `folder` and its parents up to `made` while each holds nothing but `leftovers`
    (files whose `flock` nobody holds: a live process's lock stays, and so does its folder)."""
    try:
        entries = list(folder.iterdir())
    except OSError:
        return
    if any(entry.name not in leftovers or not entry.is_file() for entry in entries):
        return
    for entry in entries:
        try:
            handle = os.open(entry, os.O_RDONLY)
        except OSError:
            return
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            entry.unlink()
        except OSError:  # held: another process took the folder over
            return
        finally:
            os.close(handle)
    for path in (folder, *folder.parents):
        try:
            path.rmdir()
        except OSError:  # no longer empty: someone else writes there
            return
        if path == made:
            return

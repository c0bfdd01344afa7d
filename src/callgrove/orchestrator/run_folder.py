"""A run's folder: one `callgrove train` in it at a time, and continued only as it was started.

A folder with a checkpoint is continued, with the settings it was started with (those of
`config.CHANGEABLE_ON_RESUME` aside); a folder holding a run's files but no checkpoint is
refused, since it can be neither continued nor redone without overwriting what it holds. A run
writes its first checkpoint (step 0) before anything else, so a folder it left holds one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import msgspec

from callgrove.orchestrator.config import TrainConfig, check_resume
from callgrove.orchestrator.errors import RunError
from callgrove.orchestrator.sinks import CHECKPOINT, METRICS, load_checkpoint

if TYPE_CHECKING:
    pass

LOCK = ".lock"
# What a run writes besides its checkpoint: files, and folders (step_N folders too).
RUN_FILES = ("config.toml", METRICS, "rewards.png", "loss.png")
RUN_FOLDERS = ("unused",)


class Progress(msgspec.Struct, forbid_unknown_fields=True):
    """Where a run is, as its checkpoint keeps it (supervised runs keep the first two)."""

    step: Annotated[int, msgspec.Meta(ge=0)]
    run_id: str
    next_group: Annotated[int, msgspec.Meta(ge=0)] = 0
    """The index of the next group to launch."""
    pending: list[Annotated[int, msgspec.Meta(ge=0)]] = []
    """Groups launched but not trained, launched again on resume."""
    counters: dict[str, float] = {}
    """The dispatcher's counters."""

    @classmethod
    def new(cls) -> Progress:
        """A new run's: no step taken, a fresh run id."""
        return cls(step=0, run_id=uuid.uuid4().hex)


@contextlib.contextmanager
def open_run(config: TrainConfig) -> Iterator[dict[str, Any] | None]:
    """Create and lock `run.out` for this process; yields the checkpoint to continue from
    (None: a new run), its `progress` checked and typed (`Progress`)."""
    out = Path(config.run.out)
    with _locked(out):
        checkpoint = load_checkpoint(out)
        if checkpoint is None:
            written = sorted(
                [name for name in (*RUN_FILES, *RUN_FOLDERS) if (out / name).exists()]
                + [p.name for p in out.glob("step_*") if p.is_dir()]
            )
            if written:
                raise RunError(
                    f"{out} holds a run ({', '.join(written[:4])}) but no {CHECKPOINT}: it can "
                    "be neither continued nor started over without overwriting it; restore "
                    "the checkpoint, or move the folder away"
                )
        else:
            if not isinstance(checkpoint["config"], dict):
                raise RunError(
                    f"{out / CHECKPOINT}: its config is damaged (not a table of settings); "
                    "restore the checkpoint, or move the folder away to start over"
                )
            check_resume(checkpoint["config"], config, str(out))
            try:
                progress = msgspec.convert(checkpoint["progress"], Progress)
            except msgspec.ValidationError as error:
                raise RunError(
                    f"{out / CHECKPOINT}: its progress is damaged ({error}); restore the "
                    "checkpoint, or move the folder away to start over"
                ) from None
            checkpoint["progress"] = progress
        first = progress.step if checkpoint else 0
        if blocked := _in_the_way(out, first, config.run.steps):
            raise RunError(
                f"{out} holds {'; '.join(blocked)}: move {'it' if len(blocked) == 1 else 'them'} "
                "away to run"
            )
        yield checkpoint


def _in_the_way(out: Path, first: int, steps: int) -> list[str]:
    """What the folder holds where the run will write something else: a folder where it writes
    a file, a file where it writes a folder (a step's after `first`, up to `steps`)."""
    blocked = [
        f"a folder {name} where the run writes a file"
        for name in RUN_FILES
        if (out / name).is_dir()
    ]
    blocked += [
        f"a file {name} where the run writes a folder"
        for name in RUN_FOLDERS
        if (out / name).exists() and not (out / name).is_dir()
    ]
    for entry in out.glob("step_*"):
        number = entry.name.removeprefix("step_")
        if number.isdigit() and first < int(number) <= steps and not entry.is_dir():
            blocked.append(f"a file {entry.name} where the run writes step {int(number)}'s folder")
    return sorted(blocked)


@contextlib.contextmanager
def _locked(out: Path) -> Iterator[None]:
    try:
        out.mkdir(parents=True, exist_ok=True)
        lock = (out / LOCK).open("a+")
    except (FileExistsError, NotADirectoryError):
        raise RunError(f"run.out {out}: a file is in the way, not a folder") from None
    except OSError as error:
        raise RunError(f"run.out {out}: cannot write there ({error.strerror})") from None
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "?"
            raise RunError(
                f"{out} is in use by another callgrove train (process {holder}); wait for it "
                "to end, or choose another run.out"
            ) from None
        lock.truncate(0)
        lock.write(str(os.getpid()))
        lock.flush()
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def restore(out: Path, checkpoint: dict[str, Any], *parts: tuple[str, Any]) -> None:
    """Load each named part of a checkpoint into its holder (a learner, a sampler, ...)."""
    for key, holder in parts:
        try:
            holder.load_state_dict(checkpoint[key])
        except (KeyError, TypeError, ValueError, RuntimeError) as error:
            first_line = (str(error).strip().splitlines() or [""])[0]
            raise RunError(
                f"{out / CHECKPOINT}: its {key} does not fit this run "
                f"({type(error).__name__}: {first_line})"
            ) from None


def nothing_to_do(checkpoint: dict[str, Any] | None, steps: int) -> int | None:
    """The step a run already finished when it holds all `steps` (rerunning it changes
    nothing), else None."""
    done = checkpoint["progress"].step if checkpoint else 0
    return done if checkpoint and done >= steps else None

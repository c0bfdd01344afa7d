"""The Typer application shared by every subcommand module, and console helpers."""

from __future__ import annotations

import contextlib
import inspect
import os
import re
import time
from collections.abc import Iterable, Iterator
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Annotated, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption
from typer.models import DefaultPlaceholder

from callgrove.chat import ChatFormat
from callgrove.cli.kinds import not_episodes_hint, what_is
from callgrove.episode import Episode, format_for, load_located
from callgrove.episode.binary.schema import ARROW_SUFFIX, PARQUET_SUFFIX
from callgrove.episode.files import EPISODE_FORMS, EpisodeFormat, NotEpisodes, folders_read
from callgrove.errors import EXIT_OK, CallgroveError, RunFailed, UsageError
from callgrove.formats.output import check_output
from callgrove.formats.problems import Diagnostics, InputError
from callgrove.formats.streams import readable
from callgrove.formats.text import printable
from callgrove.interop import GYM
from callgrove.interop.atif import takes_chat

T = TypeVar("T")

app = typer.Typer(
    name="callgrove",
    help="Multi-agent LLM rollouts as exactly-once RL training rows.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# Piped output is read by people and scripts alike: wide enough that tables do not wrap ids.
_PIPE_WIDTH = 200
out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)
for _console in (out, err):
    if not _console.is_terminal:
        _console.width = _PIPE_WIDTH

FilesArg = Annotated[
    list[Path],
    typer.Argument(metavar="FILE", help=f"Episode files ({EPISODE_FORMS}).", show_default=False),
]


def safe(value: object) -> str:
    """`value` as text for a rich markup string: ids, paths and messages come from input, and
    a `[bold]` or `[trimmed]` in them must print as written, never style or vanish; control
    characters print as escapes, never reaching the terminal raw."""
    return escape(printable(str(value)))


def cell(value: object, style: str = "") -> Text:
    """A table cell that shows `value` exactly (table cells are otherwise read as markup),
    control characters as escapes."""
    return Text(printable(str(value)), style=style)


def _version(show: bool) -> None:
    if show:
        try:
            number = version("callgrove")
        except PackageNotFoundError:  # run from a source tree that was never installed
            number = "unknown (not installed)"
        out.print(f"callgrove {number}")
        raise typer.Exit(EXIT_OK)


@app.callback()
def main_options(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version",
            "-V",
            help="Print callgrove's version and exit.",
            callback=_version,
            is_eager=True,
        ),
    ] = False,
) -> None:
    """Multi-agent LLM rollouts as exactly-once RL training rows."""


def plain_help(typer_app: typer.Typer) -> None:
    """Every command's help as a user reads it: each paragraph on one line, so the terminal
    wraps it to its width (help is written wrapped in the source; rich help would keep those
    line breaks), and parameters named by their metavar alone (`FILE...`), without the
    annotation's type tag (`<list[Path]>`, `<bool>`)."""
    for command in typer_app.registered_commands:
        text = command.help or (command.callback.__doc__ if command.callback else None)
        if text:
            command.help = _one_line_paragraphs(text)
        if _unset(command.cls, TyperCommand):
            command.cls = _PlainCommand
    for group in typer_app.registered_groups:
        if _unset(group.cls, TyperGroup):
            group.cls = _PlainGroup
        if group.typer_instance is not None:
            plain_help(group.typer_instance)
    if _unset(typer_app.info.cls, TyperGroup):
        typer_app.info.cls = _PlainGroup


def _unset(cls: object, default: type) -> bool:
    return isinstance(cls, DefaultPlaceholder) or cls in (None, default)


class _PlainArgument(TyperArgument):
    """An argument shown as its metavar: `FILE...` in the usage line and the help panel."""

    def display_type_rich(self, ctx: typer.Context) -> str | None:
        return None

    @property
    def display_name_raw(self) -> str:
        return self.metavar or (self.name or "").upper()

    def _usage_display_name(self) -> str:
        name = self.display_name_raw if self.required else f"[{self.display_name_raw}]"
        return name + ("..." if self.nargs != 1 else "")

    def _rich_display_name(self) -> str:
        return self.display_name_raw + ("..." if self.nargs != 1 else "")


class _PlainOption(TyperOption):
    """An option whose help shows a value's metavar or type (one value's, for an option that
    may be given again), and nothing for a flag."""

    def display_type_rich(self, ctx: typer.Context) -> str | None:
        if self.is_flag:
            return None
        shown = super().display_type_rich(ctx)
        return re.sub(r"^<list\[(.*)\]>$", r"<\1>", shown) if shown else shown


def _plain_parameters(params: list) -> list:
    for param in params:
        if type(param) is TyperArgument:
            param.__class__ = _PlainArgument
        elif type(param) is TyperOption:
            param.__class__ = _PlainOption
    return params


class _PlainCommand(TyperCommand):
    def get_params(self, ctx: typer.Context) -> list:
        return _plain_parameters(super().get_params(ctx))

    def invoke(self, ctx: typer.Context) -> object:
        """The command, where an error of callgrove's that ends it is one line on stderr and
        the exit status its class names (`callgrove.errors`): the one place that maps them."""
        try:
            return super().invoke(ctx)
        except CallgroveError as error:
            err.print(f"[red]error[/]: {safe(error)}")
            raise typer.Exit(error.exit_code) from None


class _PlainGroup(TyperGroup):
    def get_params(self, ctx: typer.Context) -> list:
        return _plain_parameters(super().get_params(ctx))


def _one_line_paragraphs(text: str) -> str:
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(
        p if p.startswith("\b") else " ".join(line.strip() for line in p.splitlines())
        for p in paragraphs
    )


# A command whose output is its last argument also takes it as -o, like every other output.
OutputOption = Annotated[
    Path | None,
    typer.Option("--out", "-o", metavar="OUT", help="The output, given as an option instead."),
]


def one_output(argument: Path | None, option: Path | None) -> Path:
    """The output given as the OUT argument or as -o (one of them): a usage error otherwise."""
    if (argument is None) == (option is None):
        raise UsageError("give the output once: as the OUT argument or as -o OUT")
    return argument if argument is not None else option  # type: ignore[return-value]


InvocationsOption = Annotated[
    Path | None,
    typer.Option(
        "--invocations",
        metavar="FILE",
        help="With a NeMo Gym token capture: its rollout records (JSONL), which say which agent "
        "made each call.",
    ),
]


def episode_inputs(files: list[Path], invocations: Path | None = None) -> list[Path]:
    """The inputs to read, as given but for a verifiers results folder, read as the
    traces.jsonl in it (a NeMo Gym capture folder is read whole), and an input that can be
    read only once (`-` for standard input, a pipe, a FIFO), read whole now and given as its
    copy (`formats.streams`; problems in it name the input). Usage errors (exit 2), named
    on stderr before any work: a path that is not there, a folder that is neither, a harness
    transcript (with the command that imports it), and --invocations without one Gym capture;
    an input that cannot be read whole (a FIFO no writer opens) is an error (exit 1). An
    empty file is a warning: it holds no episodes."""
    inputs = [_episode_input(given) for given in files]
    if invocations is not None:
        gym = [path for path in inputs if format_for(path) is GYM]
        if len(inputs) != 1 or len(gym) != 1:
            raise UsageError(
                "--invocations goes with one NeMo Gym capture (a folder or a .tokens.jsonl)"
            )
        if not read_once(invocations).is_file():
            raise UsageError(f"--invocations {invocations}: no such file")
    return inputs


def _episode_input(given: Path) -> Path:
    """One input of `episode_inputs`: the path read for it, or its usage error."""
    path = read_once(given)
    if path.is_dir():
        path = _folder_input(given, path)
    elif not path.exists():
        raise UsageError(f"{path}: no such file")
    hint = not_episodes_hint(path)
    if hint is not None:
        raise UsageError(f"{given}: {hint}")
    if path.is_file() and path.stat().st_size == 0:
        err.print(f"[yellow]warning[/]: {safe(given)}: an empty file, no episodes in it")
    return path


def _folder_input(given: Path, folder: Path) -> Path:
    """What is read of a folder given: itself, or the results file in it its form reads."""
    kind = what_is(folder)
    if not isinstance(kind, EpisodeFormat):
        raise UsageError(f"{given}: {_not_read(kind)}")
    return kind.read_path(folder)


def folder_without_episodes(path: Path) -> str | None:
    """For a folder that no episode format reads: what it is, where that is known."""
    if not path.is_dir():
        return None
    kind = what_is(path)
    return None if isinstance(kind, EpisodeFormat) else _not_read(kind)


def _not_read(folder_kind: NotEpisodes | None) -> str:
    """What a folder not read as episodes is: its kind's hint, else what it lacks, each form
    that reads folders named (`folders_read`)."""
    if folder_kind is not None:
        return folder_kind.hint
    *others, last = folders_read()
    named = f"{', '.join(others)} nor {last}" if others else last
    return f"a folder holding neither {named}"


def read_once(path: Path) -> Path:
    """`path`, or for an input that can be read only once its copy, read whole now; a FIFO
    with no writer is said to wait, and one that gets none is an error (exit 1)."""
    try:
        return readable(path, waiting=lambda message: err.print(safe(message)))
    except InputError as error:  # given rightly, but it never came: the work failed
        raise RunFailed(str(error)) from None


def read_input(
    path: Path,
    diagnostics: Diagnostics,
    invocations: Path | None = None,
    chat: ChatFormat | None = None,
) -> Iterator[tuple[int, Episode]]:
    """`(line, episode)` of one input of `episode_inputs`, a Gym capture with its invocations,
    text-only trajectories rendered with `chat` (`--tokenizer`; else callgrove's bytes, said in
    the episodes' gaps)."""
    options: dict[str, object] = {"invocations": invocations} if invocations is not None else {}
    if chat is not None and takes_chat(format_for(path)):
        options["chat"] = chat
    return load_located(path, diagnostics, **options)


def require_output(output: Path | None, inputs: list[Path], option: str = "") -> None:
    """An output that cannot be written (a folder, a missing or read-only folder, one of the
    inputs) is a usage error (exit 2), named before any work is done."""
    if output is None:
        return
    try:
        check_output(output, inputs)
    except InputError as error:
        raise UsageError(f"{option} {error}" if option else str(error)) from None


def progress_bar(unit: str) -> Progress:
    """The progress bar of long commands: on stderr, only when it is a terminal.

    Over bytes read ("1.2/3.4 MB", see `reading`), since a file's episode count is unknown
    until it is read, the description saying how many episodes are done; or over a count of
    `unit` ("3/40 episodes") where that is what is known."""
    amount = DownloadColumn() if unit == "bytes" else MofNCompleteColumn()
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TaskProgressColumn(),
        amount,
        *([] if unit == "bytes" else [TextColumn(unit)]),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    )


# How often a bar looks up how far a file has been read (a few system calls each time).
_LOOK_EVERY_S = 0.1


def reading(
    progress: Progress, path: Path, items: Iterable[T], unit: str = "episodes"
) -> Iterator[T]:
    """`items` read from `path`, passed through while `progress` shows a task for the file
    that moves with the bytes read so far (within one long file too; for Parquet and Arrow,
    whose readers keep no offset, the file's size times the share of its episodes read), and
    counts `unit`."""
    total = path.stat().st_size
    task = progress.add_task(path.name, total=total)
    position, rows = ReadPosition(path), _binary_rows(path)
    count, next_look = 0, 0.0
    for item in items:
        count += 1
        now = time.monotonic()
        if now >= next_look:
            next_look = now + _LOOK_EVERY_S
            done = position.bytes() or (total * count // rows if rows else 0)
            progress.update(task, completed=done, description=f"{path.name} · {count:,} {unit}")
        yield item
    progress.update(task, completed=total, description=f"{path.name} · {count:,} {unit}")


def _binary_rows(path: Path) -> int | None:
    """The episodes a Parquet or Arrow file holds, from its footer (a row each,
    docs/episode-storage.md): how far along their readers are, since those leave no file offset."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if path.name.endswith(PARQUET_SUFFIX):
            return pq.read_metadata(path).num_rows
        if path.name.endswith(ARROW_SUFFIX):
            with pa.memory_map(str(path)) as source:
                return pa.ipc.open_file(source).count_rows()
    except (OSError, pa.ArrowException):
        return None
    return None


class ReadPosition:
    """How far this process has read `path`: the offset of the descriptor that has the file
    open (found by device and inode among the process's descriptors, so whichever reader
    opened it, compressed files counting compressed bytes). Readers that do not move the
    offset (positional reads, memory maps) leave it at 0."""

    def __init__(self, path: Path):
        stat = path.stat()
        self._file = (stat.st_dev, stat.st_ino)
        self._descriptor: int | None = None
        self._last = 0

    def bytes(self) -> int:
        if self._descriptor is None or not self._is_ours(self._descriptor):
            self._descriptor = self._find()
        if self._descriptor is not None:
            with contextlib.suppress(OSError):
                self._last = max(self._last, os.lseek(self._descriptor, 0, os.SEEK_CUR))
        return self._last

    def _is_ours(self, descriptor: int) -> bool:
        try:
            stat = os.fstat(descriptor)
        except OSError:
            return False
        return (stat.st_dev, stat.st_ino) == self._file

    def _find(self) -> int | None:
        for folder in ("/proc/self/fd", "/dev/fd"):
            with contextlib.suppress(OSError):
                descriptors = sorted(int(name) for name in os.listdir(folder) if name.isdigit())
                return next((d for d in descriptors if self._is_ours(d)), None)
        return None

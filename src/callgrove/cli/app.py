"""The Typer application shared by every subcommand module, and console helpers."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

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

# Exit statuses (docs/episode-format.md, section 4): all went through, some episode failed, usage error.
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def require_files(files: list[Path]) -> None:
    """A missing input file is a usage error (exit 2), named on stderr."""
    for path in files:
        if not path.is_file():
            err.print(f"error: {path}: no such file")
            raise typer.Exit(EXIT_USAGE)


def progress_bar() -> Progress:
    """The progress bar of long commands: on stderr, only when it is a terminal."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    )

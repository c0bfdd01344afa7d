"""The Typer application shared by every subcommand module, and console helpers."""

from __future__ import annotations

import typer
from rich.console import Console

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

# Exit statuses (spec section 4): all went through, some episode failed, usage error.
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2

"""The `callgrove` command line: each subcommand lives in its own module and registers on `app`."""

from __future__ import annotations

from callgrove.cli.app import app, plain_help

# Subcommand modules register themselves on import (one line each).
from callgrove.cli import rows as _rows  # noqa: F401  isort: skip
from callgrove.cli import convert as _convert  # noqa: F401  isort: skip
from callgrove.cli import samples as _samples  # noqa: F401  isort: skip
from callgrove.cli import show as _show  # noqa: F401  isort: skip
from callgrove.cli import stats as _stats  # noqa: F401  isort: skip
from callgrove.cli import importers as _importers  # noqa: F401  isort: skip
from callgrove.cli import synth as _synth  # noqa: F401  isort: skip
from callgrove.cli import gateway as _gateway  # noqa: F401  isort: skip
from callgrove.cli import train as _train  # noqa: F401  isort: skip
from callgrove.cli import bench as _bench  # noqa: F401  isort: skip
from callgrove.cli import race as _race  # noqa: F401  isort: skip
from callgrove.cli import audit as _audit  # noqa: F401  isort: skip

plain_help(app)


def main() -> None:
    app()


__all__ = ["app", "main"]

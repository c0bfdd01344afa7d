"""Why a run stopped, when it was not the config: `callgrove train` prints the message alone."""

from __future__ import annotations

from callgrove.errors import RunFailed


class RunError(RunFailed, RuntimeError):
    """A run cannot go on (or cannot start) for the reason its message names."""

"""Names a package loads on first use (those backed by torch), so importing the package needs no
torch: `__getattr__ = lazy_names(__name__, {name: module})`."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_names(
    package: str, modules: dict[str, str], first: Callable[[], None] | None = None
) -> Callable[[str], Any]:
    """A module `__getattr__` that imports each of `modules`' names from its module when first
    asked for (after `first`, which may refuse: a missing extra) and keeps it on `package`."""

    def __getattr__(name: str) -> Any:
        if name not in modules:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        if first is not None:
            first()
        value = getattr(importlib.import_module(modules[name]), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__

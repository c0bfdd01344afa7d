"""Built-in environments, by name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from callgrove.orchestrator.env import Environment
from callgrove.orchestrator.envs.arithmetic import Arithmetic
from callgrove.orchestrator.envs.digits import Copy, Relay

ENVIRONMENTS: dict[str, Callable[..., Environment]] = {
    "relay": Relay,
    "copy": Copy,
    "arithmetic": Arithmetic,
}


def make_env(name: str, options: dict[str, Any] | None = None) -> Environment:
    """A built-in environment, or `module:attribute` naming a factory (class or function)."""
    if ":" in name:
        import importlib

        module, _, attribute = name.partition(":")
        factory = getattr(importlib.import_module(module), attribute)
    elif name in ENVIRONMENTS:
        factory = ENVIRONMENTS[name]
    else:
        known = ", ".join(sorted(ENVIRONMENTS))
        raise ValueError(f"unknown environment {name!r}; built in: {known}, or module:attribute")
    return factory(**(options or {}))


__all__ = ["ENVIRONMENTS", "Arithmetic", "Copy", "Relay", "make_env"]

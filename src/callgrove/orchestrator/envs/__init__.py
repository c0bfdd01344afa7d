"""Built-in environments, by name."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

from callgrove.errors import InvalidValue
from callgrove.orchestrator.env import Environment
from callgrove.orchestrator.envs.arithmetic import Arithmetic
from callgrove.orchestrator.envs.digits import Copy, Handoff, Relay
from callgrove.orchestrator.envs.repair import Repair

ENVIRONMENTS: dict[str, Callable[..., Environment]] = {
    "relay": Relay,
    "copy": Copy,
    "arithmetic": Arithmetic,
    "handoff": Handoff,
    "repair": Repair,
}


def make_env(name: str, options: dict[str, Any] | None = None) -> Environment:
    """A built-in environment, or `module:attribute` naming a factory (class or function); the
    module is looked for on the import path and in the current folder. Whatever keeps it from
    being built is an `InvalidValue` naming the environment and why."""
    if ":" in name:
        import importlib

        module, _, attribute = name.partition(":")
        here = os.getcwd()
        if here not in sys.path:  # as `python -m` finds a module in the current folder (here
            sys.path.append(here)  # after the installed ones, which it must not shadow)
        try:
            factory = getattr(importlib.import_module(module), attribute)
        except ImportError as error:
            raise InvalidValue(
                f"environment {name!r}: cannot import {module}: {error} (searched the current "
                f"folder {here} and the import path)"
            ) from None
        except AttributeError:
            raise InvalidValue(
                f"environment {name!r}: module {module} has no {attribute}"
            ) from None
    elif name in ENVIRONMENTS:
        factory = ENVIRONMENTS[name]
    else:
        known = ", ".join(sorted(ENVIRONMENTS))
        raise InvalidValue(f"unknown environment {name!r}; built in: {known}, or module:attribute")
    try:
        env = factory(**(options or {}))
    except Exception as error:  # options it rejects (TypeError), or its own checks
        raise InvalidValue(
            f"environment {name!r} with options {options or {}} could not be built: "
            f"{type(error).__name__}: {error}"
        ) from error
    if not isinstance(env, Environment):
        raise InvalidValue(
            f"environment {name!r}: its factory returned {type(env).__name__}, not an "
            "environment (an object with name, task, eval_tasks and run)"
        )
    if not isinstance(env.name, str) or not env.name:  # every episode records it as its env
        raise InvalidValue(
            f"environment {name!r}: its name is {env.name!r}, not a non-empty string"
        )
    return env


__all__ = ["ENVIRONMENTS", "Arithmetic", "Copy", "Handoff", "Relay", "Repair", "make_env"]

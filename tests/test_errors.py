"""One error root: every exception class callgrove defines derives from `CallgroveError`, and
its kind names the exit status the command line gives it (`callgrove.errors`)."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import callgrove as cg
from callgrove.errors import EXIT_FAILED, EXIT_USAGE, CallgroveError, RunFailed, UsageError

# Exceptions that signal within one module and are never seen as errors (each says why in its
# docstring): a line read with warnings, a line or a conversion stopped after its problem was
# recorded, a rank's agreed error, and the BaseException that ends an abandoned loop's thread.
NOT_ERRORS = {
    "callgrove.formats.jsonl.ReadWithWarnings",
    "callgrove.formats.jsonl._Refused",
    "callgrove.cli.convert._Stopped",
    "callgrove.train.ranks.rank._Agreed",
    "callgrove.orchestrator.env.EnvironmentBlocked",
}


def exception_classes() -> dict[str, type[BaseException]]:
    """Every exception class (warnings aside) defined in callgrove's modules, by full name; a
    module whose optional dependency is not installed is passed over."""
    found = {}
    for module_info in pkgutil.walk_packages(cg.__path__, "callgrove."):
        try:
            module = importlib.import_module(module_info.name)
        except ModuleNotFoundError as missing:
            if (missing.name or "").startswith("callgrove"):
                raise
            continue
        for value in vars(module).values():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and not issubclass(value, Warning)
                and value.__module__ == module.__name__
            ):
                found[f"{value.__module__}.{value.__qualname__}"] = value
    return found


def test_every_exception_callgrove_defines_derives_from_the_root():
    classes = exception_classes()
    assert len(classes) > 15  # the walk found them (the public ones of several stages)
    assert classes.keys() >= NOT_ERRORS, sorted(NOT_ERRORS - classes.keys())
    outside = sorted(
        name
        for name, cls in classes.items()
        if name not in NOT_ERRORS and not issubclass(cls, CallgroveError)
    )
    assert not outside
    assert not [name for name in NOT_ERRORS if issubclass(classes[name], CallgroveError)]


@pytest.mark.parametrize(
    ("error", "kind", "builtin"),
    [
        (cg.InputError, UsageError, ValueError),
        ("callgrove.orchestrator.config.ConfigError", UsageError, ValueError),
        ("callgrove.batch.packing.OverlongError", UsageError, ValueError),
        ("callgrove.gateway.ledger.LedgerInUse", UsageError, RuntimeError),
        ("callgrove.orchestrator.errors.RunError", RunFailed, RuntimeError),
        ("callgrove.orchestrator.env.RewardError", RunFailed, ValueError),
        ("callgrove.gateway.harness.CloseFailed", RunFailed, RuntimeError),
        ("callgrove.policy.vllm.VllmError", RunFailed, RuntimeError),
        ("callgrove.train.ranks.driver.RankFailed", RunFailed, OSError),
    ],
)
def test_each_error_keeps_the_builtin_its_callers_catch_and_takes_its_kinds_exit(
    error, kind, builtin
):
    if isinstance(error, str):
        module, _, name = error.rpartition(".")
        error = getattr(importlib.import_module(module), name)
    assert issubclass(error, kind) and issubclass(error, builtin)
    assert error.exit_code == (EXIT_USAGE if kind is UsageError else EXIT_FAILED)


def test_the_root_is_public():
    assert cg.CallgroveError is CallgroveError
    assert {"CallgroveError", "UsageError", "RunFailed"} <= set(cg.__all__)

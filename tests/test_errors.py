"""One error root: every exception class callgrove defines derives from `CallgroveError`, and
its kind names the exit status the command line gives it (`callgrove.errors`)."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import callgrove as cg
from callgrove.errors import (
    EXIT_FAILED,
    EXIT_USAGE,
    CallgroveError,
    InvalidValue,
    RunFailed,
    UsageError,
)
from callgrove.formats.ranges import check_choice, check_range

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


@pytest.mark.parametrize(
    "check",
    [
        lambda: check_range("steps", -1, at_least=0),
        lambda: check_range("lr", float("nan"), above=0),
        lambda: check_range("steps", "ten", at_least=0),
        lambda: check_choice("executor", "slurm", ("local", "ray")),
    ],
)
def test_the_range_and_choice_checks_raise_an_invalid_value(check):
    with pytest.raises(InvalidValue) as caught:
        check()
    assert isinstance(caught.value, ValueError)  # what `except ValueError` and msgspec catch
    assert isinstance(caught.value, UsageError) and caught.value.exit_code == EXIT_USAGE


# The only places in src/callgrove that may still raise a bare ValueError or RuntimeError:
# internal invariants no setting, option, argument or file can reach (a callgrove bug), each as
# "file:function" under src/callgrove with why. Whatever a user can cause raises a callgrove
# error where it is found (`InvalidValue`, `StateError`, or a more specific class).
INTERNAL_INVARIANTS = {
    # TRL's required reward function; SamplesGRPOTrainer never lets TRL call it.
    "interop/trl.py:_advantages_come_from_callgrove",
    # The dispatcher pins the policy for an evaluation; an unpinned eval episode is its bug.
    "orchestrator/dispatcher.py:Dispatcher.evaluate",
    # `name` is always callgrove's own constant ("logprobs" or "advantages").
    "episode/spread.py:_values",
    # Streamed and final text both come from the same completion through callgrove's decoder.
    "serving/dialects/dialect.py:ReplyStream.closing",
}


def bare_builtin_raises() -> dict[str, list[str]]:
    """`raise ValueError(...)` / `raise RuntimeError(...)` sites in callgrove's modules, each
    `file:function` (the function's qualified name) with the lines it raises on."""
    found: dict[str, list[str]] = {}

    def visit(node: ast.AST, path: str, scope: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            inner = scope
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                inner = [*scope, child.name]
            if isinstance(child, ast.Raise) and child.exc is not None:
                raised = child.exc.func if isinstance(child.exc, ast.Call) else child.exc
                if isinstance(raised, ast.Name) and raised.id in ("ValueError", "RuntimeError"):
                    site = f"{path}:{'.'.join(scope) or '<module>'}"
                    found.setdefault(site, []).append(f"{raised.id} on line {child.lineno}")
            visit(child, path, inner)

    package = Path(cg.__file__).parent
    for module in sorted(package.rglob("*.py")):
        visit(ast.parse(module.read_text()), module.relative_to(package).as_posix(), [])
    return found


def test_no_user_facing_value_or_runtime_error_is_raised_bare():
    found = bare_builtin_raises()
    unexpected = {site: lines for site, lines in found.items() if site not in INTERNAL_INVARIANTS}
    assert not unexpected, (
        "raise InvalidValue / StateError (callgrove.errors) or a more specific callgrove error "
        f"for what a user can cause: {unexpected}"
    )
    assert found.keys() >= INTERNAL_INVARIANTS, sorted(INTERNAL_INVARIANTS - found.keys())

"""Problems found in input: what went wrong and exactly where, so nothing is dropped silently."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace

from msgspec import UNSET, UnsetType

from callgrove.errors import UsageError

# Files read under another name than the one they are shown by: the temporary copy of an input
# that can be read only once (`formats.streams`) is shown as that input.
_SHOWN_AS: dict[str, str] = {}


def show_file_as(file: str, name: str) -> None:
    """Show `file` as `name` wherever a problem names it."""
    _SHOWN_AS[file] = name


def shown_file(file: object) -> str:
    """The name `file` is shown by: the input's, for the copy of an input read once."""
    return _SHOWN_AS.get(str(file), str(file))


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing that could not be used, with every coordinate known for it."""

    message: str
    file: str | None = None
    line: int | None = None
    episode: str | None = None
    call: str | None = None
    severity: str = "error"  # "error" or "warning"
    kind: str = "invalid"
    # The group of the episode it is about (None: the episode has none), where it could be
    # read: a lost episode's group is not scored as if whole (`UNSET`: not known).
    group: str | UnsetType | None = UNSET

    @property
    def where(self) -> str:
        """`file:line`, as much of it as is known."""
        file = None if self.file is None else shown_file(self.file)
        return ":".join(str(part) for part in (file, self.line) if part is not None)

    def __str__(self) -> str:
        where = self.where
        names = ", ".join(
            f"{label} {value}"
            for label, value in (("episode", self.episode), ("call", self.call))
            if value is not None
        )
        prefix = ": ".join(part for part in (where, names) if part)
        return f"{prefix}: {self.message}" if prefix else self.message


class InputError(UsageError, ValueError):
    """Raised for input that cannot be used; carries the located `Problem`."""

    def __init__(self, problem: Problem):
        super().__init__(str(problem))
        self.problem = problem

    def located(self, **where: object) -> InputError:
        """The same error with missing coordinates (file, line, episode, group) filled in."""
        missing = {k: v for k, v in where.items() if getattr(self.problem, k) in (None, UNSET)}
        return InputError(replace(self.problem, **missing))


@dataclass
class Diagnostics:
    """Collects problems while a stream goes on; counts them by kind and severity."""

    problems: list[Problem] = field(default_factory=list)
    # Kinds of warning this reader of the input cannot go on past (`convert` refuses to drop
    # fields the format does not have): recorded as errors, and what holds them is not used.
    refused: frozenset[str] = frozenset()

    def add(self, problem: Problem) -> None:
        if problem.kind in self.refused and problem.severity == "warning":
            problem = replace(problem, severity="error")
        self.problems.append(problem)

    def refuses(self, problems: list[Problem]) -> bool:
        return any(problem.kind in self.refused for problem in problems)

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "warning"]

    def counts(self) -> Counter[str]:
        return Counter(p.kind for p in self.problems)

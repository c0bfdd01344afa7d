"""Scoring from the command line: the algorithm a user chooses (the training config's names and
settings, `[algorithm]`), and groups of episodes read from files scored by it.

Shared by `samples` and `convert --onto`: neither writes advantages an episode does not have.
An episode that was never scored is an error naming its file, line and episode, unless an
algorithm is chosen to score its group.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Annotated, get_args

import typer
from msgspec import UNSET

from callgrove.credit import ALGORITHMS, Algorithm, Scope, finalize_group
from callgrove.episode import Episode
from callgrove.episode.checks import DUPLICATE
from callgrove.errors import UsageError
from callgrove.formats.problems import Diagnostics, Problem

AlgorithmName = StrEnum("AlgorithmName", {name: name for name in ALGORITHMS})  # type: ignore[misc]
ScopeName = StrEnum("ScopeName", {name: name for name in get_args(Scope)})  # type: ignore[misc]

_OPTION_NAMES = {
    "scope": "--scope",
    "scale_by_std": "--scale-by-std",
    "local_seats": "--local-seat",
    "decay": "--decay",
}
_CHOICES = ", ".join(ALGORITHMS)

AlgorithmOption = Annotated[
    AlgorithmName | None,
    typer.Option(
        "--algorithm",
        help="Score each group with this algorithm (the training config's [algorithm] names) "
        "and write its advantages; without it the episodes' own advantages are used, and an "
        "episode that has none is an error.",
    ),
]
ScopeOption = Annotated[
    ScopeName | None,
    typer.Option(
        "--scope", help="With grpo: the baseline per seat or per whole episode [default: seat]."
    ),
]
ScaleOption = Annotated[
    bool,
    typer.Option(
        "--scale-by-std",
        help="With grpo or hierarchical_grpo: divide advantages by the group's std.",
    ),
]
LocalSeatOption = Annotated[
    list[str] | None,
    typer.Option(
        "--local-seat",
        metavar="SEAT",
        help="With hierarchical_grpo: a seat baselined within its episode (may be given again).",
    ),
]
DecayOption = Annotated[
    float | None,
    typer.Option("--decay", help="With ema: the baseline's decay per group [default: 0.9]."),
]


def chosen_algorithm(
    name: AlgorithmName | None,
    scope: ScopeName | None = None,
    scale_by_std: bool = False,
    local_seats: list[str] | None = None,
    decay: float | None = None,
) -> Algorithm | None:
    """The algorithm the options name (None without --algorithm); a setting without
    --algorithm, one the algorithm does not read, or a value out of range is a usage error."""
    given = {
        "scope": scope,
        "scale_by_std": scale_by_std or None,
        "local_seats": tuple(local_seats) if local_seats else None,
        "decay": decay,
    }
    given = {key: value for key, value in given.items() if value is not None}
    if name is None:
        if given:
            raise UsageError(
                f"{_OPTION_NAMES[next(iter(given))]} goes with --algorithm ({_CHOICES})"
            )
        return None
    kind = ALGORITHMS[name.value]
    for key in given:
        if key not in kind.__struct_fields__:  # one given to another is refused, not ignored
            raise UsageError(f"{_OPTION_NAMES[key]} is not a setting of --algorithm {name.value}")
    try:
        return kind(**given)
    except ValueError as error:
        raise UsageError(str(error)) from None


@dataclass(slots=True)
class Located:
    """An episode and where it was read: the file and its line (row, in a binary file)."""

    episode: Episode
    file: Path
    line: int

    def problem(self, message: str) -> Problem:
        return Problem(message, file=str(self.file), line=self.line, episode=self.episode.id)


@dataclass
class Scoring:
    """What scoring the groups did: groups scored, and episodes left unscored (their group
    was refused, each refusal a problem) by id of the `Located` object."""

    groups: int = 0
    alone: int = 0  # episodes with no group, each scored as a group of one
    refused: set[int] = field(default_factory=set)
    unassigned_calls: Counter[str] = field(default_factory=Counter)


def score_groups(located: list[Located], algorithm: Algorithm, diagnostics: Diagnostics) -> Scoring:
    """Score every group (episodes with the same `group`, across files, in the order read;
    an episode without a group alone) with `algorithm`, writing advantages onto its calls.

    Supervised episodes take no advantages and are left out. A group holding a completed
    episode with no reward is refused whole (its baseline would be wrong without it), as is
    one the algorithm refuses, and one an episode of which was lost in reading (an error in
    `diagnostics` before scoring; every group, when a lost episode's group is not known);
    each refusal is a problem naming file, line and episode, and the group's episodes are in
    `refused`."""
    lost = _lost_by_group(diagnostics)
    groups: dict[object, list[Located]] = {}
    scoring = Scoring()
    for item in located:
        episode = item.episode
        if episode.supervised:
            continue
        if episode.group is None:
            scoring.alone += 1
        key = episode.group if episode.group is not None else (None, id(item))
        groups.setdefault(key, []).append(item)
    for key, members in groups.items():
        first_lost = lost.get(key, lost.get(UNSET)) if not isinstance(key, tuple) else None
        if first_lost is not None:
            diagnostics.add(members[0].problem(_lost_message(members[0].episode, first_lost)))
            scoring.refused.update(id(m) for m in members)
            continue
        unscored = [m for m in members if m.episode.ok and not m.episode.scored]
        if unscored:
            for member in unscored:
                diagnostics.add(
                    member.problem(
                        f"no reward to score it by (group {member.episode.group!r} not scored)"
                    )
                )
            scoring.refused.update(id(m) for m in members)
            continue
        try:
            credit = finalize_group(algorithm, [m.episode for m in members])
        except ValueError as error:
            diagnostics.add(members[0].problem(f"group {members[0].episode.group!r}: {error}"))
            scoring.refused.update(id(m) for m in members)
            continue
        scoring.groups += 1
        scoring.unassigned_calls.update(credit.unassigned_calls)
    return scoring


def _lost_by_group(diagnostics: Diagnostics) -> dict[object, Problem]:
    """The first episode lost in reading of each group (`UNSET`: of a group not known); a
    second copy of an episode id is no loss."""
    lost: dict[object, Problem] = {}
    for problem in diagnostics.errors:
        if problem.kind != DUPLICATE:
            lost.setdefault(problem.group, problem)
    lost.pop(None, None)  # an episode of no group was scored alone: no group lacks it
    return lost


def _lost_message(episode: Episode, lost: Problem) -> str:
    where = lost.where or "its input"
    if lost.group is UNSET:
        return (
            f"group {episode.group!r} not scored: an episode whose group could not be read was "
            f"lost ({where}), and any group may lack it"
        )
    return (
        f"group {episode.group!r} not scored: an episode of it was lost ({where}); its "
        "baseline would be wrong without it"
    )


def never_scored(episode: Episode) -> bool:
    """A completed episode with calls to train and not one advantage on them: it was never
    scored (writing it out would give `null` advantages for a trainer to guess at)."""
    if not episode.ok or episode.supervised:
        return False
    trained = [call for agent in episode.agents if agent.trainable for call in agent.calls]
    trained = [call for call in trained if call.kept]
    return bool(trained) and all(call.advantages is None for call in trained)


def unscored_message(episode: Episode) -> str:
    what = "no reward and no advantages" if not episode.scored else "no advantages"
    return (
        f"{what} on its calls: it was never scored; give --algorithm ({_CHOICES}) to score "
        "its group"
    )

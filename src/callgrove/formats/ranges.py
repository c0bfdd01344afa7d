"""Range checks for numeric settings: every setting's error names it, its range and the value.

A float setting must also be finite: `nan` compares false with every bound, so a check written
as `if value < 0` lets it through, and `inf` passes a lower bound."""

from __future__ import annotations

import math
from collections.abc import Iterable

from callgrove.errors import InvalidValue


def check_range(
    name: str,
    value: float,
    *,
    at_least: float | None = None,
    above: float | None = None,
    at_most: float | None = None,
    below: float | None = None,
) -> None:
    """Raise `InvalidValue` unless `value` is a finite number within the given bounds."""
    bounds = [
        f"{sign} {bound}"
        for sign, bound in ((">=", at_least), (">", above), ("<=", at_most), ("<", below))
        if bound is not None
    ]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidValue(f"{name} must be a number, not {value!r}")
    wanted = " and ".join(bounds)
    if isinstance(value, float):
        wanted = f"a finite number {wanted}".rstrip()
    inside = (
        math.isfinite(value)
        and (at_least is None or value >= at_least)
        and (above is None or value > above)
        and (at_most is None or value <= at_most)
        and (below is None or value < below)
    )
    if not inside:
        raise InvalidValue(f"{name} must be {wanted}, not {value!r}")


def check_choice(name: str, value: str, choices: Iterable[str]) -> None:
    """Raise `InvalidValue` unless `value` is one of `choices`."""
    known = tuple(choices)
    if value not in known:
        raise InvalidValue(f"{name} must be one of {known}, not {value!r}")

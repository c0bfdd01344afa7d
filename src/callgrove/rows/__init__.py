"""Rows: one per leaf, each kept call trained in exactly one, with loss masks (docs/episode-format.md, section 3)."""

from callgrove.rows.build import CallSpan, EpisodeRows, Row, RowSettings, build_rows
from callgrove.rows.check import CheckSummary, Violation, check_rows

__all__ = [
    "CallSpan",
    "CheckSummary",
    "EpisodeRows",
    "Row",
    "RowSettings",
    "Violation",
    "build_rows",
    "check_rows",
]

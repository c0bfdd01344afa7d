"""Degeneracy is measured, dropping is decided.

Every detector measures every call (and so every row and agent), whatever the others found:
a rate never depends on which detector ran first. A separate drop policy then reads the
measurements and decides which rows do not train. Both land on the episode
(`meta.degeneracy`) and in the step's metrics.

- gibberish: sampled tokens the policy itself gave a very low log-probability (rare tokens
  drawn from the tail); a call is gibberish when it has at least `gibberish_tokens` of them.
- repetition: the longest run of near-certain tokens (the policy locked into a loop); a call
  repeats when the run reaches `repetition_run`.
- truncation: a completion that no stop token ended (`max_tokens` cut it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from callgrove.episode import Call
from callgrove.rows import EpisodeRows, Row


@dataclass(frozen=True, slots=True)
class DegeneracySettings:
    gibberish_logprob: float = -9.0
    gibberish_tokens: int = 2
    repetition_logprob: float = -0.01
    repetition_run: int = 64
    drop: tuple[str, ...] = ("gibberish", "repetition")
    stop_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        unknown = set(self.drop) - set(DETECTORS)
        if unknown:
            raise ValueError(f"degeneracy.drop names unknown detectors {sorted(unknown)}")


def _gibberish(call: Call, settings: DegeneracySettings) -> tuple[int, bool]:
    if call.logprobs is None:
        return 0, False
    count = int(np.count_nonzero(call.logprobs < settings.gibberish_logprob))
    return count, count >= settings.gibberish_tokens


def _repetition(call: Call, settings: DegeneracySettings) -> tuple[int, bool]:
    if call.logprobs is None or not len(call.logprobs):
        return 0, False
    certain = np.concatenate([[False], call.logprobs >= settings.repetition_logprob, [False]])
    edges = np.flatnonzero(np.diff(certain.astype(np.int8)))
    longest = int((edges[1::2] - edges[0::2]).max()) if len(edges) else 0
    return longest, longest >= settings.repetition_run


def _truncation(call: Call, settings: DegeneracySettings) -> tuple[int, bool]:
    ids = call.completion_ids
    truncated = not len(ids) or int(ids[-1]) not in settings.stop_token_ids
    return int(truncated), truncated


# name -> measure(call) -> (measurement, flagged)
DETECTORS: dict[str, Callable[[Call, DegeneracySettings], tuple[int, bool]]] = {
    "gibberish": _gibberish,
    "repetition": _repetition,
    "truncation": _truncation,
}


@dataclass
class DegeneracyReport:
    """Flag counts per seat and detector, over rows and over calls, and rows dropped."""

    rows: int = 0
    calls: int = 0
    dropped_rows: int = 0
    row_flags: dict[str, dict[str, int]] = field(default_factory=dict)  # seat -> detector -> n
    call_flags: dict[str, dict[str, int]] = field(default_factory=dict)
    seat_rows: dict[str, int] = field(default_factory=dict)
    seat_calls: dict[str, int] = field(default_factory=dict)


def measure_calls(calls: Sequence[Call], settings: DegeneracySettings) -> dict[int, dict[str, Any]]:
    """Every detector on every call: id(call) -> {detector: measurement, "flags": [...]}."""
    measured = {}
    for call in calls:
        record: dict[str, Any] = {}
        flags = []
        for name, detector in DETECTORS.items():
            value, flagged = detector(call, settings)
            record[name] = value
            if flagged:
                flags.append(name)
        record["flags"] = flags
        measured[id(call)] = record
    return measured


def _row_flags(row: Row, measured: dict[int, dict[str, Any]]) -> list[str]:
    flags = {flag for call in row.trains for flag in measured[id(call)]["flags"]}
    return [name for name in DETECTORS if name in flags]


def apply(
    episode_rows: Sequence[EpisodeRows], settings: DegeneracySettings, report: DegeneracyReport
) -> list[EpisodeRows]:
    """Measure every call and row, record it on each episode, and return the rows that train
    (the drop policy: a row goes when one of its trained calls is flagged by a detector in
    `settings.drop`)."""
    kept = []
    for er in episode_rows:
        measured = measure_calls(er.forest.calls, settings)
        rows_meta, keep = [], []
        for row in er.rows:
            flags = _row_flags(row, measured)
            dropped = any(flag in settings.drop for flag in flags)
            rows_meta.append(
                {"row": row.index, "agent": row.agent.id, "flags": flags, "dropped": dropped}
            )
            seat = row.agent.name
            report.rows += 1
            report.seat_rows[seat] = report.seat_rows.get(seat, 0) + 1
            for flag in flags:
                seat_counts = report.row_flags.setdefault(seat, {})
                seat_counts[flag] = seat_counts.get(flag, 0) + 1
            if dropped:
                report.dropped_rows += 1
            else:
                keep.append(row)
        calls_meta = {}
        for call in er.forest.calls:
            record = measured[id(call)]
            calls_meta[call.id] = record
            seat = call.agent.name if call.agent else ""
            report.calls += 1
            report.seat_calls[seat] = report.seat_calls.get(seat, 0) + 1
            for flag in record["flags"]:
                seat_counts = report.call_flags.setdefault(seat, {})
                seat_counts[flag] = seat_counts.get(flag, 0) + 1
        episode = er.episode
        episode.meta = {
            **(episode.meta or {}),
            "degeneracy": {"rows": rows_meta, "calls": calls_meta},
        }
        kept.append(EpisodeRows(episode=episode, forest=er.forest, rows=keep, settings=er.settings))
    return kept

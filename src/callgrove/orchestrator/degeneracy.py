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

import msgspec
import numpy as np

from callgrove.episode import Call
from callgrove.formats.ranges import check_choice, check_range
from callgrove.rows import EpisodeRows, Row


class DegeneracySettings(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    """`[degeneracy]`: the detectors' thresholds and which of them drop a row."""

    gibberish_logprob: float = -9.0
    """A sampled token at or below this log-probability is drawn from the tail."""
    gibberish_tokens: int = 2
    repetition_logprob: float = -0.01
    """A sampled token at or above this log-probability is near-certain."""
    repetition_run: int = 64
    drop: tuple[str, ...] = ("gibberish", "repetition")
    """The detectors whose flag keeps a row from training (every detector still measures)."""
    stop_token_ids: tuple[int, ...] = ()
    """Tokens that end a completion, for truncation (a run adds its chat format's)."""

    def __post_init__(self) -> None:
        check_range("gibberish_logprob", self.gibberish_logprob, at_most=0)
        check_range("gibberish_tokens", self.gibberish_tokens, at_least=1)
        check_range("repetition_logprob", self.repetition_logprob, at_most=0)
        check_range("repetition_run", self.repetition_run, at_least=1)
        for name in self.drop:
            check_choice("drop", name, DETECTORS)


def _token_arrays(calls: Sequence[Call]) -> tuple[np.ndarray, np.ndarray]:
    """Every call's sampling logprobs laid end to end (NaN where a call recorded none), and
    each token's call index."""
    lengths = np.fromiter((len(c.completion_ids) for c in calls), np.int64, len(calls))
    logprobs = np.concatenate(
        [
            np.full(len(c.completion_ids), np.nan) if c.logprobs is None else c.logprobs
            for c in calls
        ]
        or [np.zeros(0)]
    )
    owner = np.repeat(np.arange(len(calls)), lengths)
    return logprobs, owner


def _gibberish(
    calls: Sequence[Call], settings: DegeneracySettings
) -> tuple[np.ndarray, np.ndarray]:
    logprobs, owner = _token_arrays(calls)
    counts = np.bincount(owner, logprobs < settings.gibberish_logprob, len(calls)).astype(np.int64)
    return counts, counts >= settings.gibberish_tokens


def _repetition(
    calls: Sequence[Call], settings: DegeneracySettings
) -> tuple[np.ndarray, np.ndarray]:
    """Longest run of near-certain tokens within each call."""
    logprobs, owner = _token_arrays(calls)
    certain = logprobs >= settings.repetition_logprob
    # A run breaks at an uncertain token and where one call ends and the next begins.
    breaks = ~certain | np.r_[True, owner[1:] != owner[:-1]] if len(owner) else certain
    run_id = np.cumsum(breaks)
    run_lengths = np.bincount(run_id, certain)  # certain tokens per run
    longest = np.zeros(len(calls), dtype=np.int64)
    if len(owner):
        np.maximum.at(longest, owner, run_lengths[run_id].astype(np.int64))
    return longest, longest >= settings.repetition_run


def _truncation(
    calls: Sequence[Call], settings: DegeneracySettings
) -> tuple[np.ndarray, np.ndarray]:
    stops = set(settings.stop_token_ids)
    truncated = np.fromiter(
        (not len(c.completion_ids) or int(c.completion_ids[-1]) not in stops for c in calls),
        bool,
        len(calls),
    )
    return truncated.astype(np.int64), truncated


# name -> measure(calls) -> (measurement per call, flagged per call), every call at once
DETECTORS: dict[
    str, Callable[[Sequence[Call], DegeneracySettings], tuple[np.ndarray, np.ndarray]]
] = {
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


def measure_calls(calls: Sequence[Call], settings: DegeneracySettings) -> list[dict[str, Any]]:
    """Every detector on every call, in the order given: {detector: measurement, "flags": [...]}."""
    measured: list[dict[str, Any]] = [{"flags": []} for _ in calls]
    if not calls:
        return measured
    for name, detector in DETECTORS.items():
        values, flagged = detector(calls, settings)
        for record, value, flag in zip(measured, values.tolist(), flagged.tolist(), strict=True):
            record[name] = value
            if flag:
                record["flags"].append(name)
    return measured


def _row_flags(row: Row, measured: list[dict[str, Any]]) -> list[str]:
    """`measured`: the row's episode's forest calls, in forest order."""
    forest = row.forest
    assert forest is not None, "rows are measured as `build_rows` made them"
    flags = {flag for call in row.trains for flag in measured[forest.index_of(call)]["flags"]}
    return [name for name in DETECTORS if name in flags]


def apply(
    episode_rows: Sequence[EpisodeRows], settings: DegeneracySettings, report: DegeneracyReport
) -> list[EpisodeRows]:
    """Measure every call and row, record it on each episode, and return the rows that train
    (the drop policy: a row goes when one of its trained calls is flagged by a detector in
    `settings.drop`)."""
    kept = []
    every = measure_calls([call for er in episode_rows for call in er.forest.calls], settings)
    first = 0
    for er in episode_rows:
        measured = every[first : first + len(er.forest.calls)]
        first += len(er.forest.calls)
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
        for call, record in zip(er.forest.calls, measured, strict=True):
            calls_meta[call.id] = record
            seat = er.episode.agent_of(call).name
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
        if len(keep) == len(er.rows):
            kept.append(er)
        else:
            kept.append(
                EpisodeRows(episode=episode, forest=er.forest, rows=keep, settings=er.settings)
            )
    return kept

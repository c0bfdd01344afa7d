"""One account of what a command read: episodes used, lost, read twice, and calls lost inside.

Every command that reads episodes keeps one `Intake` over all its inputs, whatever their number
and form. An episode is *read twice* when its id was read before, in any input, or when an
earlier input held the same calls (the same tokens and log-probabilities) under another id: the
second copy is an error and is not used, so nothing trains twice. A *lost* episode is one that
could not be read or used (an error in `diagnostics`). A *lost call* is a model call the policy
sampled that the source could not give as a call that trains (an episode gap of a kind in
`LOST_CALL_GAPS`); any other gap is a part *converted with loss* (a link, a label or text not
recovered, the calls all there). "Each trained exactly once" may be said only of an intake
that is `whole`.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from callgrove.episode.checks import DUPLICATE, read_twice
from callgrove.episode.provenance import LOST_CALL_GAPS, Gap
from callgrove.episode.record import Episode
from callgrove.formats.problems import Diagnostics, Problem, shown_file

# The kind of problem of an episode that was read but could not be used (no rows, no samples).
UNUSABLE = "unusable"


@dataclass(frozen=True, slots=True)
class Seen:
    """What the intake keeps of an episode read: where, its id, the digest of its calls (None
    for an episode with no calls, which no other can repeat) and its gaps by kind. Small and
    plain, so a shard worker can hand it to the process that keeps the intake."""

    file: str
    line: int
    id: str
    digest: bytes | None
    gaps: tuple[str, ...] = ()
    lost_calls: tuple[Problem, ...] = ()


def seen(episode: Episode, file: str, line: int) -> Seen:
    """The intake's record of `episode`, read at `file:line`."""
    gaps = tuple(episode.gaps or ())
    lost = tuple(
        _lost_call_problem(gap, episode.id, file, line)
        for gap in gaps
        if gap.kind in LOST_CALL_GAPS
    )
    return Seen(file, line, episode.id, calls_digest(episode), tuple(g.kind for g in gaps), lost)


def calls_digest(episode: Episode) -> bytes | None:
    """A digest of every call's prompt length, completion tokens and log-probabilities: equal
    for two copies of one episode, apart for two samplings (their tokens or log-probabilities
    differ). None for an episode without calls."""
    digest = hashlib.blake2b(digest_size=16)
    calls = 0
    for call in episode.calls():
        calls += 1
        digest.update(call.prompt_len.to_bytes(8, "little"))
        digest.update(np.ascontiguousarray(call.completion_ids).tobytes())
        digest.update(
            b"" if call.logprobs is None else np.ascontiguousarray(call.logprobs).tobytes()
        )
    return digest.digest() if calls else None


def _lost_call_problem(gap: Gap, episode: str, file: str, line: int) -> Problem:
    call = gap.call if isinstance(gap.call, str) else None
    reason = gap.reason if isinstance(gap.reason, str) else "a sampled call was not recorded"
    return Problem(
        f"{gap.kind}: {reason}",
        file=file,
        line=line,
        episode=episode,
        call=call,
        severity="warning",
        kind=gap.kind,
    )


@dataclass
class Intake:
    """The account of every input of one command (see the module's docstring)."""

    diagnostics: Diagnostics = field(default_factory=Diagnostics)
    admitted: int = 0  # read once (a copy read before is not admitted)
    lost_calls: list[Problem] = field(default_factory=list)
    partial: Counter[str] = field(default_factory=Counter)  # other gaps, by kind
    _ids: dict[str, str] = field(default_factory=dict)  # id -> where it was first read
    _digests: dict[bytes, tuple[str, str, str]] = field(default_factory=dict)

    def admit(self, record: Seen) -> bool:
        """Take an episode read; False (an error recorded, the copy not to be used) when it was
        read before."""
        # ids are unique within a file (its reader refuses a second): one seen already was
        # read in another input, or in this one given twice
        first = self._ids.get(record.id)
        if first is not None:
            return self._repeat(record, f"episode id already read at {first}")
        earlier = self._digests.get(record.digest) if record.digest is not None else None
        if earlier is not None and earlier[1] != record.file:
            return self._repeat(
                record, f"the same calls as episode {earlier[0]} read at {earlier[2]}"
            )
        where = f"{shown_file(record.file)}:{record.line}"
        self._ids[record.id] = where
        if record.digest is not None:
            self._digests.setdefault(record.digest, (record.id, record.file, where))
        self.admitted += 1
        self.lost_calls.extend(record.lost_calls)
        self.partial.update(kind for kind in record.gaps if kind not in LOST_CALL_GAPS)
        return True

    def admit_episode(self, episode: Episode, file: str, line: int) -> bool:
        return self.admit(seen(episode, file, line))

    def _repeat(self, record: Seen, why: str) -> bool:
        self.diagnostics.add(read_twice(record.id, why, record.file, record.line))
        return False

    def unusable(self, problem: Problem) -> None:
        """An episode admitted but that could not be used (no rows): lost, with `problem`
        (of kind `UNUSABLE`)."""
        self.diagnostics.add(problem)

    @property
    def episodes(self) -> int:
        """Episodes read once and used."""
        return self.admitted - sum(p.kind == UNUSABLE for p in self.diagnostics.errors)

    @property
    def lost(self) -> list[Problem]:
        """The errors that lost input: everything but copies read twice."""
        return [p for p in self.diagnostics.errors if p.kind != DUPLICATE]

    @property
    def read_twice(self) -> int:
        """Copies not used: read again in another input, or twice in one file."""
        return sum(p.kind == DUPLICATE for p in self.diagnostics.errors)

    @property
    def whole(self) -> bool:
        """Nothing lost, no call lost inside an episode, nothing read twice."""
        return not self.diagnostics.errors and not self.lost_calls

    def lost_call_kinds(self) -> Counter[str]:
        return Counter(problem.kind for problem in self.lost_calls)

    def admit_all(self, records: Iterable[Seen]) -> None:
        """Admit the records a shard's worker read, in order."""
        for record in records:
            self.admit(record)

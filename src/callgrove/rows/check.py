"""The invariant checker: recomputes what every row must satisfy and lists what does not.

It trusts nothing the rows carry: walks are checked against the forest and the tokens, masks
are rebuilt from the calls, and ownership is recounted over all rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from callgrove.episode import Call
from callgrove.episode.provenance import LOST_CALL_GAPS
from callgrove.rows.build import EpisodeRows, Row


@dataclass(frozen=True, slots=True)
class Violation:
    episode: str
    row: int | None
    call: str | None
    message: str

    def __str__(self) -> str:
        where = [f"episode {self.episode}"]
        if self.row is not None:
            where.append(f"row {self.row}")
        if self.call is not None:
            where.append(f"call {self.call}")
        return f"{', '.join(where)}: {self.message}"


@dataclass(frozen=True, slots=True)
class CheckSummary:
    episode: str
    kept_calls: int
    rows: int
    trained_once: int
    duplicates: int
    untrainable: int
    violations: list[Violation]
    lost_calls: int = 0  # sampled calls the source did not give as calls (the episode's gaps)
    route_breaks: int = 0  # calls a tree of their own because their parent routed otherwise

    @property
    def ok(self) -> bool:
        return not self.violations

    def line(self) -> str:
        """The human check line, as in docs/episode-format.md: `12 kept calls, each trained exactly once`."""
        if not self.ok:
            return f"{self.kept_calls} kept calls, {len(self.violations)} violation(s)"
        notes = []
        if self.duplicates:
            notes.append(f"{self.duplicates} in duplicate rows")
        if self.untrainable:
            notes.append(f"{self.untrainable} of untrainable agents")
        extra = f" ({'; '.join(notes)}, no loss)" if notes else ""
        if self.route_breaks:
            extra += f"; {self.route_breaks} started a new tree (their parent routed otherwise)"
        if self.lost_calls:
            return (
                f"{self.kept_calls} kept calls, each in one row{extra}; NOT exactly once: "
                f"{self.lost_calls} sampled call(s) lost (see the episode's gaps)"
            )
        return f"{self.kept_calls} kept calls, each trained exactly once{extra}"


def check_rows(result: EpisodeRows) -> CheckSummary:
    """Every invariant of the rows (docs/episode-format.md, section 3) over one episode's rows."""
    episode_id = result.episode.id
    violations: list[Violation] = []
    forest = result.forest
    kept = [c for c in result.episode.calls() if c.kept]
    leaves = {forest.calls[i].index for i in forest.leaves}
    for row in result.rows:
        violations += _check_walk(row, result, leaves)
        violations += _check_tokens(row, result)
    violations += _check_ownership(result, kept)
    if len(result.rows) != len(leaves):
        violations.append(
            Violation(episode_id, None, None, f"{len(result.rows)} rows for {len(leaves)} leaves")
        )
    duplicate_rows = [r for r in result.rows if r.duplicate_of is not None]
    return CheckSummary(
        episode=episode_id,
        kept_calls=len(kept),
        rows=len(result.rows),
        trained_once=len(kept) - sum(len(r.trains) for r in duplicate_rows),
        duplicates=sum(len(r.trains) for r in duplicate_rows),
        untrainable=sum(1 for c in kept if not result.episode.agent_of(c).trainable),
        violations=violations,
        lost_calls=sum(gap.kind in LOST_CALL_GAPS for gap in result.episode.gaps or ()),
        route_breaks=len(result.forest.route_breaks),
    )


def _check_walk(row: Row, result: EpisodeRows, leaves: set[int]) -> list[Violation]:
    forest, episode = result.forest, result.episode.id
    bad = []
    if not row.path:
        return [Violation(episode, row.index, None, "empty walk")]
    if row.path[-1].index not in leaves:
        bad.append(Violation(episode, row.index, row.path[-1].id, "walk does not end at a leaf"))
    if forest.parent_of(row.path[0]) is not None:
        bad.append(Violation(episode, row.index, row.path[0].id, "walk does not start at a root"))
    for parent, child in zip(row.path, row.path[1:], strict=False):
        if forest.parent_of(child) is not parent:
            bad.append(
                Violation(
                    episode,
                    row.index,
                    child.id,
                    f"walk steps from {parent.id}, which is not its parent",
                )
            )
        elif parent.seq >= child.seq or not forest.pool.same_prefix(
            forest.pool.at(parent), forest.pool.at(child), parent.full_len
        ):
            bad.append(
                Violation(
                    episode,
                    row.index,
                    child.id,
                    f"prompt does not extend {parent.id}'s full sequence",
                )
            )
    on_path = {c.index for c in row.path}
    listed = row.trains + row.context
    if len(listed) != len(row.path) or {c.index for c in listed} != on_path:
        bad.append(Violation(episode, row.index, None, "trains + context is not exactly the walk"))
    return bad


def _check_tokens(row: Row, result: EpisodeRows) -> list[Violation]:
    episode = result.episode.id
    bad = []
    tokens = result.token_ids(row)
    if not np.array_equal(tokens, result.episode.full_ids(row.leaf)):
        bad.append(
            Violation(
                episode, row.index, row.leaf.id, "tokens differ from the leaf's full sequence"
            )
        )
    expected = np.zeros(row.leaf.full_len, dtype=np.uint8)
    if row.duplicate_of is None:
        for call in row.trains:
            if result.episode.agent_of(call).trainable:
                expected[call.prompt_len : call.full_len] = 1
    mask = result.loss_mask(row)
    if mask.shape != expected.shape or not np.array_equal(mask, expected):
        bad.append(
            Violation(
                episode, row.index, None, "loss mask is not 1 exactly on the trained completions"
            )
        )
    if row.duplicate_of is not None:
        original = result.rows[row.duplicate_of]
        if original.duplicate_of is not None or not np.array_equal(
            result.token_ids(original), tokens
        ):
            bad.append(
                Violation(
                    episode,
                    row.index,
                    None,
                    f"duplicate_of {row.duplicate_of} names no identical trained row",
                )
            )
    return bad


def _check_ownership(result: EpisodeRows, kept: list[Call]) -> list[Violation]:
    episode = result.episode.id
    trained_in: dict[int, list[Row]] = {c.index: [] for c in kept}
    held_by: dict[int, list[Row]] = {c.index: [] for c in kept}
    for row in result.rows:
        for call in row.trains:
            trained_in.setdefault(call.index, []).append(row)
        for call in row.path:
            held_by.setdefault(call.index, []).append(row)
    bad = []
    for call in kept:
        owners = trained_in[call.index]
        if len(owners) != 1:
            bad.append(
                Violation(episode, None, call.id, f"trained in {len(owners)} rows, not exactly one")
            )
            continue
        holders = held_by[call.index]
        own = [r for r in holders if r.leaf.agent_index == call.agent_index]
        expected = min(own or holders, key=lambda r: r.leaf.seq)
        if owners[0] is not expected:
            bad.append(
                Violation(
                    episode,
                    owners[0].index,
                    call.id,
                    f"trained in row {owners[0].index}, the rule says row {expected.index}",
                )
            )
    return bad

"""The call forest (docs/episode-format.md, section 2): every kept call's parent, found from the tokens alone.

A parent of X is the kept call P with lower `seq` whose full sequence is the longest exact
prefix of X's prompt. Candidates come from prefix hashes (`TokenPool`): scanning X's prompt
from its end, the first pooled token whose prefix hash equals some call's full-sequence hash
marks the longest candidate length. Each candidate is then confirmed token for token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from callgrove.episode import Agent, Call, Episode
from callgrove.episode.record import share_routes
from callgrove.errors import InvalidValue
from callgrove.forest.tokens import TokenPool


@dataclass(slots=True, eq=False)
class Forest:
    """Kept calls in `seq` order with parent links; all indices refer to `calls`.

    A snapshot: the pool holds the tokens and how each prompt was held when it was built, so
    changing how a call holds its prompt later (`compact_prompts`) does not invalidate it.
    """

    episode: Episode
    calls: list[Call]
    parent: list[int]
    pool: TokenPool = field(repr=False)
    ledger_index: list[int] = field(default_factory=list, repr=False)  # per kept call
    full_hash: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint32), repr=False)
    """Each kept call's full-sequence hash (`TokenPool`): equal sequences, equal hashes."""
    same_sequences: dict[tuple[int, int], bool] = field(default_factory=dict, repr=False)
    """Pairs of calls (ledger indices, lower first) already compared whole while building, and
    whether they hold the same sequence (`TokenPool.same_sequence`)."""
    route_breaks: list[int] = field(default_factory=list)
    """Calls whose token parent routed their shared prefix otherwise than their own forward
    did (mixtures of experts): roots instead, their prompt untrained context."""
    children: list[list[int]] = field(default_factory=list)
    roots: list[int] = field(default_factory=list)
    leaves: list[int] = field(default_factory=list)
    tree_of: list[int] = field(default_factory=list)
    _position: list[int] = field(default_factory=list, repr=False)  # ledger index -> kept place
    _new_tokens: NewTokens | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self._position = [-1] * len(self.pool.calls)
        for position, index in enumerate(self.ledger_index):
            self._position[index] = position
        self.children = [[] for _ in self.calls]
        for child, parent in enumerate(self.parent):
            if parent >= 0:
                self.children[parent].append(child)
        self.roots = [i for i, p in enumerate(self.parent) if p < 0]
        self.leaves = [i for i, kids in enumerate(self.children) if not kids]
        self.tree_of = [0] * len(self.calls)
        for i, parent in enumerate(self.parent):  # parents precede children in seq order
            self.tree_of[i] = i if parent < 0 else self.tree_of[parent]

    def index_of(self, call: Call) -> int:
        """The call's place in `calls`."""
        position = self._position[self.pool.at(call)]
        if position < 0:
            raise InvalidValue(f"call {call.id} is not kept: it has no place in the forest")
        return position

    def parent_of(self, call: Call) -> Call | None:
        parent = self.parent[self.index_of(call)]
        return None if parent < 0 else self.calls[parent]

    def new_tokens(self) -> NewTokens:
        """Per call, the tokens it adds to its parent's full sequence (all of it for a root)."""
        if self._new_tokens is None:
            self._new_tokens = NewTokens.of(self)
        return self._new_tokens

    def path_to(self, index: int) -> list[int]:
        """Indices from the root down to `index`."""
        path = [index]
        while self.parent[path[-1]] >= 0:
            path.append(self.parent[path[-1]])
        path.reverse()
        return path


@dataclass(slots=True)
class NewTokens:
    """What each kept call adds to its parent's full sequence (all of it for a root), columnar.

    Call i's new tokens are `tokens[start[i] : start[i] + length[i]]`: its new prompt tokens
    (`prompt_length[i]` of them), then its completion. Where the call's own prompt suffix covers
    everything past its parent (the usual case) that is a slice of the pool; only the other
    calls' new tokens are copied, once, behind the pool's. A row is its walk's slices end to end.
    """

    tokens: np.ndarray  # int32: the pool's tokens, then the copied new tokens
    start: np.ndarray  # int64 (K,)
    length: np.ndarray  # int64 (K,)
    prompt_length: np.ndarray  # int64 (K,)

    @classmethod
    def of(cls, forest: Forest) -> NewTokens:
        pool, kept = forest.pool, np.asarray(forest.ledger_index, dtype=np.int64)
        layout = pool.layout
        full_len = layout.full_len[kept]
        parent = np.asarray(forest.parent, dtype=np.int64)
        begin = np.where(parent >= 0, full_len[np.maximum(parent, 0)], 0)
        length = full_len - begin
        prompt_length = layout.prompt_len[kept] - begin
        base_len = layout.base_len[kept]
        start = layout.suffix_start[kept] + begin - base_len
        copied: list[np.ndarray] = []
        cursor = len(pool.tokens)
        for i in np.flatnonzero(base_len > begin).tolist():  # the base holds some new tokens
            copied += pool.pieces(forest.ledger_index[i], int(begin[i]), int(full_len[i]))
            start[i] = cursor
            cursor += int(length[i])
        tokens = np.concatenate([pool.tokens, *copied]) if copied else pool.tokens
        return cls(tokens, start, length, prompt_length)


def build_forest(episode: Episode) -> Forest:
    """Parents, roots, leaves and trees of the episode's kept calls."""
    ledger = episode.ledger()
    pool = TokenPool.build(ledger)
    kept = np.flatnonzero(np.fromiter((c.kept for c in ledger), bool, len(ledger)))
    calls = [ledger[index] for index in kept.tolist()]
    if len(kept) < 2:  # a parent is an earlier kept call: a lone one is a root, found unhashed
        return Forest(episode, calls, [-1] * len(kept), pool, ledger_index=kept.tolist())
    finder = _ParentFinder(pool, kept, episode.agents)
    parents = finder.parents()
    breaks = _route_breaks(episode, calls, parents)
    for index in breaks:
        parents[index] = -1
    return Forest(
        episode=episode,
        calls=calls,
        parent=parents,
        route_breaks=breaks,
        pool=pool,
        ledger_index=kept.tolist(),
        full_hash=finder.full_hashes,
        same_sequences=finder.same,
    )


def _route_breaks(episode: Episode, calls: list[Call], parents: list[int]) -> list[int]:
    """The calls (places in `calls`) whose parent's routes over the shared prefix are not the
    call's own: both recorded, and unequal somewhere before the parent's last token."""
    breaks = []
    for index, parent_index in enumerate(parents):
        call = calls[index]
        if parent_index < 0 or call.routes is None:
            continue
        parent = calls[parent_index]
        span = parent.full_len - 1
        if parent.routes is None or (call.prompt_from == parent.id and call.routes_from == span):
            continue  # unknown, or held as the parent's own (equal when they were shared)
        mine, theirs = episode.routes(call), episode.routes(parent)
        if not np.array_equal(mine[:span], theirs[:span]):  # type: ignore[index]
            breaks.append(index)
    return breaks


_SEARCH_EACH_BELOW = 4  # kept calls; below it the array operations' fixed cost dominates


class _ParentFinder:
    """Parents of the kept calls (given by ledger index), as places among the kept calls."""

    def __init__(self, pool: TokenPool, kept: np.ndarray, agents: list[Agent]):
        self.pool = pool
        self.kept = kept
        self.agents = agents
        layout = pool.layout
        full_lengths = layout.full_len[kept]
        self.full_hashes = pool.hashes[layout.locate(kept, full_lengths - 1)[0]]
        self.marked = _ends_of_known(pool, full_lengths, self.full_hashes)
        self.same: dict[tuple[int, int], bool] = {}  # pairs of calls settled, by ledger index

    def parents(self) -> list[int]:
        """Each kept call's parent (its place among the kept calls), -1 for a root.

        Most calls are settled with array operations. A call whose own prompt suffix holds no
        candidate end ("quiet") either has no candidate at all (its prompt references nothing)
        or its longest candidates are as long as the referenced call's full sequence (when the
        prompt resends a whole kept call): that call is the parent if no other kept call has
        the same full hash; otherwise the calls of that hash are confirmed against it and the
        tie-break picks (`_among_twins`). Every other call is searched from its prompt's end and
        confirmed token by token (`parent_of`).
        """
        layout, kept, calls = self.pool.layout, self.kept, self.pool.calls
        place_of = np.full(len(layout.base), -1, dtype=np.int64)
        place_of[kept] = np.arange(len(kept))
        if len(kept) < _SEARCH_EACH_BELOW:  # a few calls: searching each costs less
            found = [self.parent_of(index) for index in kept.tolist()]
            return [-1 if p < 0 else int(place_of[p]) for p in found]
        start = layout.suffix_start[kept]
        stop = start + layout.suffix_len[kept]
        quiet = np.searchsorted(self.marked, start) == np.searchsorted(self.marked, stop)
        base = layout.base[kept]
        base_place = np.where(base >= 0, place_of[base], -1)
        whole = base_place >= 0
        whole[whole] = layout.base_len[kept[whole]] == layout.full_len[base[whole]]
        seq = np.fromiter((c.seq for c in calls), np.int64, len(calls))
        whole[whole] = seq[base[whole]] < seq[kept[whole]]
        unique = np.zeros(len(kept), dtype=bool)
        if len(kept):
            sorted_hashes = np.sort(self.full_hashes)
            counts = np.searchsorted(sorted_hashes, self.full_hashes, side="right")
            counts -= np.searchsorted(sorted_hashes, self.full_hashes)
            unique[whole] = counts[base_place[whole]] == 1
        parents = np.where(quiet & whole & unique, base_place, -1)
        for i in np.flatnonzero(quiet & whole & ~unique).tolist():
            parents[i] = place_of[self._among_twins(int(kept[i]), int(base[i]))]
        for i in np.flatnonzero(~quiet | ((base >= 0) & ~whole)).tolist():
            found = self.parent_of(int(kept[i]))
            parents[i] = -1 if found < 0 else place_of[found]
        return parents.tolist()

    def _among_twins(self, index: int, base: int) -> int:
        """The parent of a call whose prompt is the kept call `base`'s full sequence and more,
        with nothing that could be a longer candidate: among the kept calls holding exactly
        that sequence, with lower seq, the tie-break's best."""
        pool = self.pool
        call, length = pool.calls[index], pool.full_len[base]
        matches = [
            p
            for p in self._calls_of_hash(pool.hashes[pool.index_at(base, length - 1)])
            if p == base
            or (
                pool.calls[p].seq < call.seq
                and pool.full_len[p] == length
                and self._same_sequence(p, base)
            )
        ]
        return max(matches, key=lambda p: _tie_rank(pool.calls[p], call, self.agents))

    def _same_sequence(self, a: int, b: int) -> bool:
        """Do calls `a` and `b` hold the same full sequence? Each pair is compared once."""
        return self.pool.same_sequence(a, b, self.same)

    def _calls_of_hash(self, value: np.uint32) -> list[int]:
        """The kept calls (ledger indices) whose full hash is `value`."""
        return self.kept[self.full_hashes == value].tolist()

    def parent_of(self, index: int) -> int:
        """The parent's ledger index (-1 for none), searched from the prompt's end."""
        for start, stop in self.pool.ranges(index, self.pool.prompt_len[index]):
            k = int(np.searchsorted(self.marked, stop)) - 1
            while k >= 0 and self.marked[k] >= start:
                found = self._confirmed(index, int(self.marked[k]))
                if found >= 0:
                    return found
                k -= 1
        return -1

    def _confirmed(self, index: int, pooled: int) -> int:
        """The best candidate whose full sequence ends at this pooled token of the prompt."""
        pool = self.pool
        length = pool.position_of(pooled) + 1
        call = pool.calls[index]
        matches = [
            p
            for p in self._calls_of_hash(pool.hashes[pooled])
            if pool.calls[p].seq < call.seq
            and pool.full_len[p] == length
            and pool.same_prefix(p, index, length)
        ]
        if not matches:
            return -1
        return max(matches, key=lambda p: _tie_rank(pool.calls[p], call, self.agents))


def _ends_of_known(pool: TokenPool, full_lengths: np.ndarray, known: np.ndarray) -> np.ndarray:
    """Pool indices, ascending, whose prefix hash is one of the `known` full hashes.

    Such a prefix is as long as some kept call's full sequence, so only the tokens at those
    positions are looked at: in each call's pooled span (its suffix, then its completion, at
    positions base_len .. full_len), one token per kept full length that falls inside it.
    """
    layout = pool.layout
    lengths = np.sort(full_lengths)
    lengths = lengths[np.diff(lengths, prepend=-1) != 0]  # distinct (np.unique costs more)
    first = np.searchsorted(lengths, layout.base_len, side="right")
    count = np.searchsorted(lengths, layout.full_len, side="right") - first
    owner = np.repeat(np.arange(len(first)), count)
    which = np.arange(len(owner)) + (first - (np.cumsum(count) - count))[owner]
    ends = layout.suffix_start[owner] + lengths[which] - 1 - layout.base_len[owner]
    if not len(known):
        return ends[:0]
    known = np.sort(known)
    hashes = pool.hashes[ends]
    slot = np.minimum(np.searchsorted(known, hashes), len(known) - 1)
    return ends[known[slot] == hashes]


def _tie_rank(candidate: Call, call: Call, agents: list[Agent]) -> tuple[bool, bool, int]:
    """The tie-break (docs/episode-format.md, section 2): the call's own agent, then its agent's
    parent agent, then the highest seq."""
    return (
        candidate.agent_index == call.agent_index,
        agents[candidate.agent_index].id == agents[call.agent_index].parent,
        candidate.seq,
    )


def compact_prompts(episode: Episode) -> None:
    """Rebase every kept call's prompt onto its forest parent (for memory and compact writing).

    The tokens do not change, only how they are held: the parent's full sequence by reference
    plus the call's own new prompt tokens. Forests and rows built before stay valid (a forest
    keeps its own snapshot of how prompts were held).
    """
    forest = build_forest(episode)
    for index, call in enumerate(forest.calls):
        parent_index = forest.parent[index]
        if parent_index < 0:
            continue
        parent = forest.calls[parent_index]
        if call.prompt_from == parent.id and call.prompt_from_len == parent.full_len:
            continue
        suffix = episode.prompt_ids(call)[parent.full_len :].copy()
        routes = episode.routes(call)  # resolved through the old reference, before it changes
        call.prompt_from, call.prompt_from_len, call.prompt_suffix = (
            parent.id,
            parent.full_len,
            suffix,
        )
        share_routes(call, routes, episode.find)

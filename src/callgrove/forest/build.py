"""The call forest (docs/episode-format.md, section 2): every kept call's parent, found from the tokens alone.

A parent of X is the kept call P with lower `seq` whose full sequence is the longest exact
prefix of X's prompt. Candidates come from prefix hashes (`TokenPool`): scanning X's prompt
from its end, the first pooled token whose prefix hash equals some call's full-sequence hash
marks the longest candidate length. Each candidate is then confirmed token for token.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from callgrove.episode import Agent, Call, Episode
from callgrove.forest.tokens import TokenPool


@dataclass(slots=True, eq=False)
class Forest:
    """Kept calls in `seq` order with parent links; all indices refer to `calls`."""

    episode: Episode
    calls: list[Call]
    parent: list[int]
    pool: TokenPool = field(repr=False)
    children: list[list[int]] = field(default_factory=list)
    roots: list[int] = field(default_factory=list)
    leaves: list[int] = field(default_factory=list)
    tree_of: list[int] = field(default_factory=list)
    _index: dict[int, int] = field(default_factory=dict, repr=False)
    _new_tokens: NewTokens | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self._index = {id(call): i for i, call in enumerate(self.calls)}
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
        return self._index[id(call)]

    def parent_of(self, call: Call) -> Call | None:
        parent = self.parent[self.index_of(call)]
        return None if parent < 0 else self.calls[parent]

    def new_tokens(self) -> NewTokens:
        """Per call, the tokens it adds to its parent's full sequence (all of it for a root),
        with completion marks over them; a row is their concatenation along its walk."""
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
    """Each call's new tokens and a 0/1 mark per token (1 on its completion), as views.

    Where a call's prompt is held on its parent (the usual case), both are one contiguous slice
    of the pool, so a row is assembled by concatenating views, with no per-token work.
    """

    tokens: list[np.ndarray]
    completion_marks: list[np.ndarray]
    blank: np.ndarray  # zeros, as long as the longest new-token run: marks of a context call

    @classmethod
    def of(cls, forest: Forest) -> NewTokens:
        pool = forest.pool
        tokens, marks = [], []
        for call, parent in zip(forest.calls, forest.parent, strict=True):
            start = forest.calls[parent].full_len if parent >= 0 else 0
            if call.prompt_base_len == start:
                begin = pool.suffix_start[id(call)]
                end = begin + call.full_len - start
                tokens.append(pool.tokens[begin:end])
                marks.append(pool.completion_marks[begin:end])
            else:
                tokens.append(np.concatenate(call.segments(start=start)))
                mark = np.zeros(call.full_len - start, dtype=np.uint8)
                mark[call.prompt_len - start :] = 1
                marks.append(mark)
        longest = max((len(t) for t in tokens), default=0)
        return cls(tokens, marks, np.zeros(longest, dtype=np.uint8))


def build_forest(episode: Episode) -> Forest:
    """Parents, roots, leaves and trees of the episode's kept calls."""
    every_call = sorted(episode.calls(), key=lambda c: c.seq)
    kept = [c for c in every_call if c.kept]
    pool = TokenPool.build(every_call)
    finder = _ParentFinder(pool, kept)
    index = {id(call): i for i, call in enumerate(kept)}
    parents = [-1 if (p := finder.parent_of(call)) is None else index[id(p)] for call in kept]
    return Forest(episode=episode, calls=kept, parent=parents, pool=pool)


class _ParentFinder:
    def __init__(self, pool: TokenPool, kept: list[Call]):
        self.pool = pool
        self.by_hash: dict[int, list[Call]] = defaultdict(list)
        full_hashes = np.empty(len(kept), dtype=np.uint64)
        for i, call in enumerate(kept):
            full_hashes[i] = pool.full_hash(call)
            self.by_hash[int(full_hashes[i])].append(call)
        self.marked = _positions_of_known(pool.hashes, full_hashes)

    def parent_of(self, call: Call) -> Call | None:
        for start, stop in self.pool.ranges(call, call.prompt_len):
            k = int(np.searchsorted(self.marked, stop)) - 1
            while k >= 0 and self.marked[k] >= start:
                found = self._confirmed(call, int(self.marked[k]))
                if found is not None:
                    return found
                k -= 1
        return None

    def _confirmed(self, call: Call, pooled: int) -> Call | None:
        """The best candidate whose full sequence ends at this pooled token of the prompt."""
        length = int(self.pool.positions[pooled]) + 1
        matches = [
            p
            for p in self.by_hash.get(int(self.pool.hashes[pooled]), ())
            if p.seq < call.seq and p.full_len == length and self.pool.same_prefix(p, call, length)
        ]
        if not matches:
            return None
        return max(matches, key=lambda p: _tie_rank(p, call))


def _positions_of_known(hashes: np.ndarray, known: np.ndarray) -> np.ndarray:
    """Indices of `hashes` whose value is in `known`, ascending.

    A bit table on high hash bits rules out almost every token with one gather; only the few
    that pass are checked exactly against the sorted known values.
    """
    if not len(known):
        return np.zeros(0, dtype=np.int64)
    bits = max(16, int(len(known) * 64).bit_length())
    shift = np.uint64(64 - bits)
    table = np.zeros(1 << bits, dtype=bool)
    table[known >> shift] = True
    candidates = np.flatnonzero(table[hashes >> shift])
    known = np.sort(known)
    slot = np.minimum(np.searchsorted(known, hashes[candidates]), len(known) - 1)
    return candidates[known[slot] == hashes[candidates]]


def _tie_rank(candidate: Call, call: Call) -> tuple[bool, bool, int]:
    """Spec 2.2 tie-break: the call's own agent, then its agent's parent agent, then highest seq."""
    own: Agent | None = call.agent
    candidate_agent = candidate.agent
    return (
        candidate_agent is own,
        own is not None and candidate_agent is not None and candidate_agent.id == own.parent,
        candidate.seq,
    )


def compact_prompts(episode: Episode) -> None:
    """Rebase every kept call's prompt onto its forest parent (for memory and compact writing).

    The tokens do not change, only how they are held: the parent's full sequence by reference
    plus the call's own new prompt tokens. Forests built before this must be built again.
    """
    forest = build_forest(episode)
    for index, call in enumerate(forest.calls):
        parent_index = forest.parent[index]
        if parent_index < 0:
            continue
        parent = forest.calls[parent_index]
        if call.prompt_base is parent and call.prompt_base_len == parent.full_len:
            continue
        suffix = call.prompt_ids()[parent.full_len :].copy()
        call.prompt_base, call.prompt_base_len, call.prompt_suffix = parent, parent.full_len, suffix

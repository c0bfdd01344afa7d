"""An episode's distinct tokens in one pool, with a prefix hash at every pooled token.

Each call contributes two pieces to the pool: its prompt suffix and its completion. Every other
token of its full sequence is a prefix of an earlier call's sequence. Because sequences only
ever grow by appending to a prefix, a pooled token sits at the same position, behind the same
prefix, in every sequence that holds it. So one prefix hash per pooled token serves every
sequence, and the work is linear in the distinct tokens, not in the sum of prompt lengths.

The hash of a prefix is the sum, modulo 2**64, of a random 64-bit value of each (position,
token) pair: cheap to extend with a numpy cumulative sum. Equal hashes are only candidates;
`same_prefix` settles every match exactly.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from callgrove.episode import Call

_MASK64 = (1 << 64) - 1


def _mix64(values: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: a well-spread 64-bit value for each input (wrapping arithmetic)."""
    z = values.astype(np.uint64, copy=True)
    z ^= z >> np.uint64(30)
    z *= np.uint64(0xBF58476D1CE4E5B9)
    z ^= z >> np.uint64(27)
    z *= np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return z


@dataclass(slots=True)
class PoolLayout:
    """Where each ledger call's pieces lie in the pool, as arrays by ledger index.

    Array operations over many calls read these (prefix offsets, full hashes, parents, new
    tokens); the walks that follow one call's references read the same values as lists.
    """

    base: np.ndarray  # int64: ledger index of its prompt base, -1 for none
    base_len: np.ndarray  # int64: how much of the base its prompt resends
    suffix_start: np.ndarray  # int64: pool index of its prompt suffix; the completion follows
    suffix_len: np.ndarray  # int64
    completion_len: np.ndarray  # int64

    @property
    def prompt_len(self) -> np.ndarray:
        return self.base_len + self.suffix_len

    @property
    def full_len(self) -> np.ndarray:
        return self.base_len + self.suffix_len + self.completion_len

    def locate(self, calls: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Pool index of the token at `positions[i]` of call `calls[i]`'s full sequence,
        following prompt references for all at once (as many rounds as the deepest)."""
        calls = np.array(calls, dtype=np.int64)
        found = np.empty(len(calls), dtype=np.int64)
        pending = np.arange(len(calls))
        while pending.size:
            call, position = calls[pending], positions[pending]
            offset = position - self.base_len[call]
            here = offset >= 0
            found[pending[here]] = self.suffix_start[call[here]] + offset[here]
            pending = pending[~here]
            calls[pending] = self.base[call[~here]]
        return found


@dataclass(slots=True)
class TokenPool:
    """Pooled tokens of an episode's ledger and where each call's pieces lie in the pool.

    Everything about a call is held by its place in the ledger (`Call.index`): the pool is a
    snapshot of how the prompts were held when it was built, so changing how a call holds its
    prompt afterwards (`compact_prompts`) leaves the pool, and the forest built on it, valid.
    """

    calls: list[Call]  # the ledger: every call in `seq` order, call.index == its place here
    tokens: np.ndarray  # int32, every call's suffix then completion, in call order
    layout: PoolLayout
    # The layout as lists, by ledger index: the walks below read them one value at a time.
    suffix_start: list[int]  # pool index of its prompt suffix
    completion_start: list[int]  # pool index of its completion
    base: list[int]  # ledger index of its prompt base, -1 for none
    base_len: list[int]  # how much of the base its prompt resends
    prompt_len: list[int]
    full_len: list[int]
    # Made on first use (`positions`, `hashes`): a lone kept call's forest never needs them.
    _positions: np.ndarray | None = None
    _hashes: np.ndarray | None = None

    @classmethod
    def build(cls, calls: list[Call]) -> TokenPool:
        """`calls` is an episode's ledger (`Episode.ledger()`): every call a prompt refers to,
        in `seq` order, each at its `index`."""
        # One pass over the calls into lists (cheap for the many small episodes of a step),
        # then the same values as arrays for the operations over many calls.
        base, base_len, suffix_len, completion_len = [], [], [], []
        suffix_start, completion_start, prompt_len, full_len = [], [], [], []
        pieces: list[np.ndarray] = []
        cursor = 0
        for i, call in enumerate(calls):
            suffix, completion = call.prompt_suffix, call.completion_ids
            base.append(_base_index(i, call, calls))
            base_len.append(call.prompt_base_len)
            suffix_len.append(len(suffix))
            completion_len.append(len(completion))
            prompt_len.append(call.prompt_base_len + len(suffix))
            full_len.append(prompt_len[-1] + len(completion))
            suffix_start.append(cursor)
            completion_start.append(cursor + len(suffix))
            cursor += len(suffix) + len(completion)
            pieces += (suffix, completion)
        tokens = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int32)
        layout = PoolLayout(
            np.array(base, dtype=np.int64),
            np.array(base_len, dtype=np.int64),
            np.array(suffix_start, dtype=np.int64),
            np.array(suffix_len, dtype=np.int64),
            np.array(completion_len, dtype=np.int64),
        )
        return cls(
            calls,
            tokens,
            layout,
            suffix_start=suffix_start,
            completion_start=completion_start,
            base=base,
            base_len=base_len,
            prompt_len=prompt_len,
            full_len=full_len,
        )

    @property
    def positions(self) -> np.ndarray:
        """int64: the position of each pooled token in the sequences that hold it."""
        if self._positions is None:
            self._hash()
        return self._positions  # type: ignore[return-value]

    @property
    def hashes(self) -> np.ndarray:
        """uint64: the hash of the prefix ending at (and including) each pooled token."""
        if self._hashes is None:
            self._hash()
        return self._hashes  # type: ignore[return-value]

    def _hash(self) -> None:
        """Every pooled token's position and prefix hash (the module docstring)."""
        layout = self.layout
        count = len(layout.base)
        lengths = np.empty(2 * count, dtype=np.int64)  # pieces: suffix, completion, call by call
        lengths[0::2], lengths[1::2] = layout.suffix_len, layout.completion_len
        piece_starts = np.empty(2 * count, dtype=np.int64)
        piece_starts[0::2] = layout.suffix_start
        piece_starts[1::2] = layout.suffix_start + layout.suffix_len
        piece_positions = np.empty(2 * count, dtype=np.int64)
        piece_positions[0::2], piece_positions[1::2] = layout.base_len, layout.prompt_len
        positions = np.arange(len(self.tokens), dtype=np.int64) + np.repeat(
            piece_positions - piece_starts, lengths
        )
        tokens = self.tokens.astype(np.uint64)
        running = np.cumsum(_mix64((positions.astype(np.uint64) << np.uint64(32)) | tokens))
        offsets = _prefix_offsets(layout, running, piece_starts, piece_positions)
        self._positions, self._hashes = positions, running + np.repeat(offsets, lengths)

    def at(self, call: Call) -> int:
        """The call's place in this pool's ledger (its `index`, checked to be this call)."""
        i = call.index
        if not (0 <= i < len(self.calls) and self.calls[i] is call):
            raise ValueError(
                f"call {call.id} is not in this pool's ledger (was the episode changed after "
                "its forest was built?)"
            )
        return i

    def index_at(self, i: int, position: int) -> int:
        """Pool index of the token at `position` of call `i`'s full sequence."""
        while True:
            if position >= self.prompt_len[i]:
                return self.completion_start[i] + position - self.prompt_len[i]
            if position >= self.base_len[i]:
                return self.suffix_start[i] + position - self.base_len[i]
            i = self.base[i]

    def ranges(self, i: int, length: int) -> Iterator[tuple[int, int]]:
        """Pool ranges (start, stop) holding call `i`'s full[:length], last range first, lazily."""
        while i >= 0 and length > 0:
            prompt_len, base_len = self.prompt_len[i], self.base_len[i]
            if length > prompt_len:
                start = self.completion_start[i]
                yield start, start + length - prompt_len
                length = prompt_len
            if length > base_len:
                start = self.suffix_start[i]
                yield start, start + length - base_len
                length = base_len
            i = self.base[i]

    def pieces(self, i: int, start: int, stop: int) -> list[np.ndarray]:
        """Views of the pool that concatenate to call `i`'s full[start:stop]."""
        parts: list[np.ndarray] = []
        position = stop
        for first, last in self.ranges(i, stop):
            position -= last - first  # the sequence position of pool index `first`
            if position <= start:
                parts.append(self.tokens[first + start - position : last])
                break
            parts.append(self.tokens[first:last])
        parts.reverse()
        return parts

    def full_hash(self, i: int) -> int:
        return int(self.hashes[self.index_at(i, self.full_len[i] - 1)])

    def same_prefix(self, a: int, b: int, length: int) -> bool:
        """Exactly: do calls `a` and `b` hold the same tokens in their first `length`?

        Walks both from the end. Where both hold the same pooled token at the same position,
        everything before is the same too (a pooled token always follows the same prefix), so
        the walk stops there; every other token is compared by value.
        """
        if length > self.full_len[a] or length > self.full_len[b]:
            return False
        left, right = self.ranges(a, length), self.ranges(b, length)
        l_start, l_end = next(left, (0, 0))
        r_start, r_end = next(right, (0, 0))
        while l_end > l_start and r_end > r_start:
            if l_end == r_end:
                return True  # same pooled token at the same position: the prefixes agree
            span = min(l_end - l_start, r_end - r_start)
            if not np.array_equal(
                self.tokens[l_end - span : l_end], self.tokens[r_end - span : r_end]
            ):
                return False
            l_end, r_end = l_end - span, r_end - span
            if l_end == l_start:
                l_start, l_end = next(left, (0, 0))
            if r_end == r_start:
                r_start, r_end = next(right, (0, 0))
        return True  # both walks covered `length` tokens, all equal


def _base_index(i: int, call: Call, calls: list[Call]) -> int:
    """The ledger index of the call's prompt base (-1 for none), checked to be an earlier call
    of the same ledger; the call itself checked to be at its index."""
    if call.index != i:
        raise ValueError(f"call {call.id} is not at its ledger index ({call.index})")
    referenced = call.prompt_base
    if referenced is None:
        return -1
    b = referenced.index
    if not (0 <= b < i and calls[b] is referenced):
        raise ValueError(
            f"call {call.id}: its prompt refers to {referenced.id}, which is not an "
            "earlier call of the same episode"
        )
    return b


def _prefix_offsets(
    layout: PoolLayout, running: np.ndarray, piece_starts: np.ndarray, piece_positions: np.ndarray
) -> np.ndarray:
    """What turns each piece's slice of the pool-wide running sum into prefix hashes.

    A piece's prefix hash is its base prefix's hash (the running sum at the base's last token,
    plus that token's own piece offset) plus its own running sum. So each offset is a constant
    plus the offset of an earlier piece; the chains are summed by pointer jumping.
    """
    owner = np.repeat(np.arange(len(layout.base)), 2)
    has_base = piece_positions > 0
    last = np.zeros(len(piece_starts), dtype=np.int64)
    last[has_base] = layout.locate(owner[has_base], piece_positions[has_base] - 1)
    before = np.zeros(len(piece_starts), dtype=np.uint64)
    started = piece_starts > 0
    before[started] = running[piece_starts[started] - 1]
    total = np.where(has_base, running[last], np.uint64(0)) - before
    depends = np.where(has_base, np.searchsorted(piece_starts, last, side="right") - 1, -1)
    while True:
        linked = np.flatnonzero(depends >= 0)
        if not linked.size:
            return total
        target = depends[linked]
        total[linked] += total[target]
        depends[linked] = depends[target]

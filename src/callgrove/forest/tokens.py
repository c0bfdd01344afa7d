"""An episode's distinct tokens in one pool, with a prefix hash at every pooled token.

Each call contributes two pieces to the pool: its prompt suffix and its completion. Every other
token of its full sequence is a prefix of an earlier call's sequence. Because sequences only
ever grow by appending to a prefix, a pooled token sits at the same position, behind the same
prefix, in every sequence that holds it. So one prefix hash per pooled token serves every
sequence, and the work is linear in the distinct tokens, not in the sum of prompt lengths.

The hash of a prefix is the sum, modulo 2**32, of a random 32-bit value of each (position,
token) pair: cheap to extend with a numpy cumulative sum. Equal hashes are only candidates;
`same_prefix` settles every match exactly.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from callgrove.episode import Call
from callgrove.episode.record import not_an_earlier_call
from callgrove.errors import InvalidValue


def _prefix_sums(tokens: np.ndarray, shifts: np.ndarray, span: np.ndarray) -> np.ndarray:
    """The running sum, over the pool, of a well-spread 32-bit value of each pooled token's
    (position, token) pair: the murmur3 finaliser of `position * golden ^ token`.

    A pooled token's position is its pool index plus its call's shift (`shifts`, repeated over
    the call's `span`). 32 bits suffice: an equal hash is only ever a candidate, confirmed
    token for token, and the few hashes compared within an episode rarely meet by chance;
    32-bit arithmetic also runs in the processor's vector lanes, which 64-bit multiplication
    does not. Computed in place in one array (plus one scratch array), since fresh memory for
    every temporary costs more than the arithmetic.
    """
    z = np.repeat(shifts.astype(np.uint32), span)
    z += np.arange(len(tokens), dtype=np.uint32)
    z *= np.uint32(0x9E3779B1)
    z ^= tokens.view(np.uint32) if tokens.dtype == np.int32 else tokens.astype(np.uint32)
    scratch = np.empty_like(z)
    for shift, multiplier in ((16, 0x85EBCA6B), (13, 0xC2B2AE35)):
        np.right_shift(z, np.uint32(shift), out=scratch)
        z ^= scratch
        z *= np.uint32(multiplier)
    np.right_shift(z, np.uint32(16), out=scratch)
    z ^= scratch
    return np.cumsum(z, dtype=np.uint32, out=z)


def prefix_hashes(tokens: np.ndarray) -> np.ndarray:
    """uint32: the hash of every prefix of one sequence (`tokens[: i + 1]` at `i`), equal to
    `TokenPool.hashes` at a pooled token with the same prefix, so a sequence from elsewhere (a
    trainer's row) finds the pooled tokens it holds. Equal hashes are only candidates."""
    tokens = np.ascontiguousarray(tokens, dtype=np.int32)
    return _prefix_sums(tokens, np.zeros(1, np.int64), np.array([len(tokens)]))


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
    prompt_len: np.ndarray  # int64: base_len + suffix_len
    full_len: np.ndarray  # int64: prompt_len + the completion's length

    def locate(self, calls: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Pool index of the token at `positions[i]` of call `calls[i]`'s full sequence, and
        the call whose own tokens hold it, following prompt references for all at once (as
        many rounds as the deepest reference chain)."""
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
        return found, calls


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
    # Made on first use (`hashes`): a lone kept call's forest never needs them.
    _hashes: np.ndarray | None = None

    @classmethod
    def build(cls, calls: list[Call]) -> TokenPool:
        """`calls` is an episode's ledger (`Episode.ledger()`): every call a prompt refers to,
        in `seq` order, each at its `index`."""
        count = len(calls)
        position = {call.id: i for i, call in enumerate(calls)}
        base = np.fromiter(
            (_base_index(i, call, position) for i, call in enumerate(calls)), np.int64, count
        )
        base_len = np.fromiter((c.prompt_from_len for c in calls), np.int64, count)
        suffix_len = np.fromiter((len(c.prompt_suffix) for c in calls), np.int64, count)
        completion_len = np.fromiter((len(c.completion_ids) for c in calls), np.int64, count)
        prompt_len = base_len + suffix_len
        full_len = prompt_len + completion_len
        span = suffix_len + completion_len  # a call's own tokens: its suffix, then completion
        suffix_start = np.cumsum(span) - span
        pieces = [piece for c in calls for piece in (c.prompt_suffix, c.completion_ids)]
        tokens = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int32)
        layout = PoolLayout(base, base_len, suffix_start, suffix_len, prompt_len, full_len)
        return cls(
            calls,
            tokens,
            layout,
            suffix_start=suffix_start.tolist(),
            completion_start=(suffix_start + suffix_len).tolist(),
            base=base.tolist(),
            base_len=base_len.tolist(),
            prompt_len=prompt_len.tolist(),
            full_len=full_len.tolist(),
        )

    @property
    def hashes(self) -> np.ndarray:
        """uint32: the hash of the prefix ending at (and including) each pooled token."""
        if self._hashes is None:
            layout = self.layout
            span = layout.full_len - layout.base_len  # a call's own run: suffix, completion
            running = _prefix_sums(self.tokens, layout.base_len - layout.suffix_start, span)
            running += np.repeat(_prefix_offsets(layout, running), span)
            self._hashes = running
        return self._hashes

    def at(self, call: Call) -> int:
        """The call's place in this pool's ledger (its `index`, checked to be this call)."""
        i = call.index
        if not (0 <= i < len(self.calls) and self.calls[i] is call):
            raise InvalidValue(
                f"call {call.id} is not in this pool's ledger (was the episode changed after "
                "its forest was built?)"
            )
        return i

    def position_of(self, pooled: int) -> int:
        """The position of the pooled token at `pooled` in every sequence that holds it."""
        i = bisect.bisect_right(self.suffix_start, pooled) - 1  # the last call starting there
        return self.base_len[i] + pooled - self.suffix_start[i]

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

    def same_sequence(self, a: int, b: int, known: dict[tuple[int, int], bool]) -> bool:
        """Exactly: do calls `a` and `b` hold the same full sequence? `known` holds the pairs
        (lower index first) settled so far and is added to.

        Where both prompts resend the whole sequence of an earlier call, of the same length,
        the two are the same exactly when those earlier calls are and their own tokens (suffix,
        then completion) are: so down chains of such calls (an agent and its twin) each level
        costs one comparison of its own tokens, once, whatever pair asks.
        """
        pending: list[tuple[int, int]] = []
        while True:  # down both chains while each level rests on a whole earlier sequence
            if a == b:
                below = True
                break
            key = (a, b) if a < b else (b, a)
            if key in known:
                below = known[key]
                break
            length, base_len = self.full_len[a], self.base_len[a]
            if length != self.full_len[b]:
                below = known[key] = False
                break
            if base_len != self.base_len[b]:
                below = known[key] = self.same_prefix(a, b, length)
                break
            pending.append(key)
            if base_len == 0:
                below = True  # nothing resent: the own tokens are the whole sequence
                break
            a, b = self.base[a], self.base[b]
            if self.full_len[a] != base_len or self.full_len[b] != base_len:
                below = self.same_prefix(a, b, base_len)
                break
        for first, second in reversed(pending):
            below = below and self._same_own_tokens(first, second)
            known[first, second] = below
        return below

    def _same_own_tokens(self, a: int, b: int) -> bool:
        """Are the tokens calls `a` and `b` pool themselves (suffix, then completion) equal?"""
        own_a, own_b = self.full_len[a] - self.base_len[a], self.full_len[b] - self.base_len[b]
        start_a, start_b = self.suffix_start[a], self.suffix_start[b]
        return own_a == own_b and np.array_equal(
            self.tokens[start_a : start_a + own_a], self.tokens[start_b : start_b + own_b]
        )

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


def _base_index(i: int, call: Call, position: dict[str, int]) -> int:
    """The ledger index of the call's prompt base (-1 for none), checked to be an earlier call
    of the same ledger; the call itself checked to be at its index."""
    if call.index != i:
        raise InvalidValue(f"call {call.id} is not at its ledger index ({call.index})")
    if call.prompt_from is None:
        return -1
    b = position.get(call.prompt_from, i)
    if b >= i:
        raise InvalidValue(f"call {call.id}: {not_an_earlier_call(call.prompt_from)}")
    return b


def _prefix_offsets(layout: PoolLayout, running: np.ndarray) -> np.ndarray:
    """What turns each call's slice of the pool-wide running sum into prefix hashes.

    A call's own tokens (suffix, then completion) extend its base prefix: their prefix hashes
    are the hash at the base's last token (the running sum there plus the offset of the call
    whose tokens hold it) plus their own running sum. So each offset is a constant plus the
    offset of an earlier call; the chains are summed by pointer jumping.
    """
    has_base = layout.base_len > 0
    last, holder = layout.locate(layout.base[has_base], layout.base_len[has_base] - 1)
    total = np.zeros(len(has_base), dtype=np.uint32)
    total[has_base] = running[last]
    started = layout.suffix_start > 0
    total[started] -= running[layout.suffix_start[started] - 1]
    depends = np.full(len(has_base), -1, dtype=np.int64)
    depends[has_base] = holder
    while True:
        linked = np.flatnonzero(depends >= 0)
        if not linked.size:
            return total
        target = depends[linked]
        total[linked] += total[target]
        depends[linked] = depends[target]

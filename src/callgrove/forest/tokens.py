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
class TokenPool:
    """Pooled tokens of a set of calls and where each call's pieces lie in the pool."""

    tokens: np.ndarray  # int32, every call's suffix then completion, in call order
    positions: np.ndarray  # int64, the position of each pooled token in its sequences
    hashes: np.ndarray  # uint64, the hash of the prefix ending at (and including) each token
    completion_marks: np.ndarray  # uint8, 1 on completion tokens, 0 on prompt suffixes
    suffix_start: dict[int, int]  # id(call) -> pool index of its prompt suffix
    completion_start: dict[int, int]  # id(call) -> pool index of its completion

    @classmethod
    def build(cls, calls: list[Call]) -> TokenPool:
        """`calls` must hold every call a prompt refers to, and be in `seq` order."""
        pieces: list[np.ndarray] = []
        piece_positions: list[int] = []
        suffix_start: dict[int, int] = {}
        completion_start: dict[int, int] = {}
        cursor = 0
        for call in calls:
            suffix_start[id(call)] = cursor
            cursor += len(call.prompt_suffix)
            completion_start[id(call)] = cursor
            cursor += len(call.completion_ids)
            pieces += (call.prompt_suffix, call.completion_ids)
            piece_positions += (call.prompt_base_len, call.prompt_len)
        lengths = np.fromiter((len(p) for p in pieces), dtype=np.int64, count=len(pieces))
        tokens = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int32)
        piece_starts = np.cumsum(lengths) - lengths
        positions = np.arange(cursor, dtype=np.int64) + np.repeat(
            np.asarray(piece_positions, dtype=np.int64) - piece_starts, lengths
        )
        values = _mix64((positions.astype(np.uint64) << np.uint64(32)) | tokens.astype(np.uint64))
        running = np.cumsum(values, dtype=np.uint64)
        marks = np.repeat(np.tile(np.array([0, 1], dtype=np.uint8), len(calls)), lengths)
        pool = cls(tokens, positions, running, marks, suffix_start, completion_start)
        offsets = pool._prefix_offsets(calls, piece_starts)
        pool.hashes = running + np.repeat(offsets, lengths)
        return pool

    def _prefix_offsets(self, calls: list[Call], piece_starts: np.ndarray) -> np.ndarray:
        """What turns each piece's slice of the pool-wide running sum into prefix hashes.

        A piece's prefix hash is its base prefix's hash plus its own running sum; pieces are
        visited in `seq` order, so every base prefix is already final when it is read.
        """
        running = self.hashes
        offsets = np.zeros(len(piece_starts), dtype=np.uint64)

        def prefix_hash(call: Call, length: int) -> int:
            index = self.index_at(call, length - 1)
            piece = int(np.searchsorted(piece_starts, index, side="right")) - 1
            return (int(running[index]) + int(offsets[piece])) & _MASK64

        for number, call in enumerate(calls):
            for piece, position in (
                (2 * number, call.prompt_base_len),
                (2 * number + 1, call.prompt_len),
            ):
                start = int(piece_starts[piece])
                before = int(running[start - 1]) if start else 0
                base = prefix_hash(call, position) if position else 0
                offsets[piece] = (base - before) & _MASK64
        return offsets

    def index_at(self, call: Call, position: int) -> int:
        """Pool index of the token at `position` of `call`'s full sequence."""
        while True:
            if position >= call.prompt_len:
                return self.completion_start[id(call)] + position - call.prompt_len
            if position >= call.prompt_base_len:
                return self.suffix_start[id(call)] + position - call.prompt_base_len
            call = call.prompt_base  # type: ignore[assignment]

    def ranges(self, call: Call, length: int) -> Iterator[tuple[int, int]]:
        """Pool ranges (start, stop) holding `call.full[:length]`, last range first, lazily."""
        current: Call | None = call
        while current is not None and length > 0:
            if length > current.prompt_len:
                start = self.completion_start[id(current)]
                yield start, start + length - current.prompt_len
                length = current.prompt_len
            if length > current.prompt_base_len:
                start = self.suffix_start[id(current)]
                yield start, start + length - current.prompt_base_len
                length = current.prompt_base_len
            current = current.prompt_base

    def full_hash(self, call: Call) -> int:
        return int(self.hashes[self.index_at(call, call.full_len - 1)])

    def same_prefix(self, a: Call, b: Call, length: int) -> bool:
        """Exactly: do `a.full[:length]` and `b.full[:length]` hold the same tokens?

        Walks both from the end. Where both hold the same pooled token at the same position,
        everything before is the same too (a pooled token always follows the same prefix), so
        the walk stops there; every other token is compared by value.
        """
        if length > a.full_len or length > b.full_len:
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

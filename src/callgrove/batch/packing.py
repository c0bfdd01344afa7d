"""Packing samples into micro-batches of `seq_len` tokens, balanced across data-parallel ranks.

Samples are laid end to end in the varlen layout that flash-attention style kernels take: one
flat array per field, position ids restarting at 0 for every sample, and `cu_seqlens` (the
cumulative sample lengths, starting at 0) marking where each sample begins. Attention must not
cross those boundaries.

Steps: samples longer than `seq_len` are refused or cut (`overlong`); the samples are dealt to
ranks longest first, each to the rank with the fewest tokens so far, which leaves the ranks at
most one sample's tokens apart; each rank's samples are packed first-fit-decreasing into
micro-batches; ranks with fewer micro-batches get empty ones so every rank runs the same
number of steps. Only per-sample work runs in Python; tokens move in numpy.

A learner of several ranks deals each step the same way (`deal`), but in whole units: the rows
that share a trie stay on one rank, weighed by the tokens they forward.
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, Literal

import numpy as np

from callgrove.batch.samples import (
    FIELD_DTYPES,
    TOKEN_FIELDS,
    UNSAMPLED,
    Sample,
    arrays_to_torch,
)
from callgrove.batch.tree import _scope_key, trie_nodes
from callgrove.errors import InvalidValue, UsageError

Overlong = Literal["error", "truncate"]
CU_SEQLENS_DTYPE = np.int32


@dataclass(frozen=True, slots=True)
class PackSettings:
    """`seq_len`: tokens per micro-batch. `overlong`: a longer sample is an error, or is cut to
    its first `seq_len` tokens (the loss past the cut goes with them; each cut is reported).
    `ranks`: data-parallel ranks to balance across."""

    seq_len: int
    overlong: Overlong = "error"
    ranks: int = 1

    def __post_init__(self) -> None:
        if self.seq_len < 1:
            raise InvalidValue(f"seq_len is {self.seq_len}, expected at least 1")
        if self.overlong not in ("error", "truncate"):
            raise InvalidValue(f"overlong is {self.overlong!r}, expected 'error' or 'truncate'")
        if self.ranks < 1:
            raise InvalidValue(f"ranks is {self.ranks}, expected at least 1")


@dataclass(frozen=True, slots=True)
class Truncation:
    """A sample cut to `seq_len`: what it lost."""

    sample: int  # index into the packed sequence of samples
    episode: str
    row: int
    cut_tokens: int
    cut_loss_tokens: int


@dataclass(eq=False)
class MicroBatch:
    """Samples laid end to end (varlen layout), at most `seq_len` tokens, unpadded.

    `arrays` holds the fields of `TOKEN_FIELDS` concatenated over the samples (`logprobs` is
    None when any of them has none); `cu_seqlens[i]:cu_seqlens[i + 1]` is the i-th sample,
    `samples[i]` its index in the input.
    """

    arrays: dict[str, np.ndarray | None]
    cu_seqlens: np.ndarray
    samples: np.ndarray
    seq_len: int

    def __repr__(self) -> str:
        return (
            f"MicroBatch(samples={len(self.samples)}, tokens={int(self.cu_seqlens[-1])}, "
            f"seq_len={self.seq_len})"
        )

    @property
    def num_tokens(self) -> int:
        return int(self.cu_seqlens[-1])

    @property
    def padding(self) -> int:
        return self.seq_len - self.num_tokens

    @property
    def max_seqlen(self) -> int:
        return int(np.diff(self.cu_seqlens).max(initial=0))

    def padded_arrays(
        self, pad_token_id: int = 0
    ) -> tuple[dict[str, np.ndarray | None], np.ndarray]:
        """The arrays padded to `seq_len` and `cu_seqlens` with the padding as one last segment
        (a valid varlen layout whose padding attends only to itself and carries no loss)."""
        pad = self.padding
        if pad == 0:
            return self.arrays, self.cu_seqlens
        fill = {"token_ids": pad_token_id, **UNSAMPLED}
        arrays: dict[str, np.ndarray | None] = {}
        for name, values in self.arrays.items():
            if values is None:
                arrays[name] = None
            elif name == "position_ids":
                arrays[name] = np.concatenate([values, np.arange(pad, dtype=values.dtype)])
            else:
                tail = np.full(pad, fill.get(name, 0), dtype=values.dtype)
                arrays[name] = np.concatenate([values, tail])
        cu_seqlens = np.append(self.cu_seqlens, CU_SEQLENS_DTYPE(self.seq_len))
        return arrays, cu_seqlens

    def to_torch(self, pad: bool = False, pad_token_id: int = 0) -> dict[str, Any]:
        """Tensors of the per-token fields, `cu_seqlens` (int32) and `max_seqlen` (int)."""
        arrays, cu_seqlens = (
            self.padded_arrays(pad_token_id) if pad else (self.arrays, self.cu_seqlens)
        )
        lengths = np.diff(cu_seqlens)
        tensors = arrays_to_torch({**arrays, "cu_seqlens": cu_seqlens})
        tensors["max_seqlen"] = int(lengths.max(initial=0))
        return tensors


@dataclass(eq=False)
class PackedBatch:
    """Micro-batches per rank (`ranks[r]`, equally many for every rank) and what was cut."""

    ranks: list[list[MicroBatch]]
    truncations: list[Truncation]
    settings: PackSettings

    def __repr__(self) -> str:
        steps = len(self.ranks[0]) if self.ranks else 0
        return (
            f"PackedBatch(ranks={len(self.ranks)}, micro_batches_per_rank={steps}, "
            f"truncations={len(self.truncations)}, seq_len={self.settings.seq_len})"
        )

    @property
    def micro_batches(self) -> list[MicroBatch]:
        return [mb for rank in self.ranks for mb in rank]

    @property
    def num_tokens(self) -> int:
        return sum(mb.num_tokens for mb in self.micro_batches)

    @property
    def capacity(self) -> int:
        return self.settings.seq_len * len(self.micro_batches)

    @property
    def padding_fraction(self) -> float:
        """Share of the micro-batches' `seq_len` slots holding no sample token."""
        return 1.0 - self.num_tokens / self.capacity if self.capacity else 0.0

    def rank_tokens(self) -> list[int]:
        return [sum(mb.num_tokens for mb in rank) for rank in self.ranks]


def pack(samples: Sequence[Sample], settings: PackSettings) -> PackedBatch:
    """Pack `samples` into micro-batches of at most `settings.seq_len` tokens per rank."""
    lengths = np.fromiter((s.num_tokens for s in samples), dtype=np.int64, count=len(samples))
    truncations = _overlong(samples, lengths, settings)
    lengths = np.minimum(lengths, settings.seq_len)
    longest_first = np.argsort(-lengths, kind="stable")
    plans = [
        _first_fit(members, lengths, settings.seq_len)
        for members in deal_to_ranks(longest_first, lengths, settings.ranks)
    ]
    steps = max(len(plan) for plan in plans)
    empty = np.zeros(0, dtype=np.int64)
    for plan in plans:  # every rank runs the same number of steps
        plan += [empty] * (steps - len(plan))
    laid_out = iter(
        _lay_out(samples, lengths, [members for plan in plans for members in plan], settings)
    )
    ranks = [[next(laid_out) for _ in plan] for plan in plans]
    return PackedBatch(ranks, truncations, settings)


class OverlongError(UsageError, ValueError):
    """Samples longer than `seq_len`: how many, and the longest (`episode`, `row`, `tokens`)."""

    def __init__(
        self,
        samples: Sequence[Sample],
        over: np.ndarray,
        lengths: np.ndarray,
        seq_len: int,
        hint: str = "",
    ):
        longest = int(over[np.argmax(lengths[over])])
        self.count = int(over.size)
        self.episode, self.row = samples[longest].episode, samples[longest].row
        self.tokens, self.seq_len = int(lengths[longest]), seq_len
        named = ", ".join(
            f"episode {samples[i].episode} row {samples[i].row} ({lengths[i]} tokens)"
            for i in over[:5]
        )
        more = f" and {over.size - 5} more" if over.size > 5 else ""
        super().__init__(
            f"{over.size} samples are longer than seq_len {seq_len}: {named}{more}{hint}"
        )


def refuse_overlong(samples: Sequence[Sample], seq_len: int) -> None:
    """An `OverlongError` if any sample is longer than `seq_len` tokens."""
    lengths = np.fromiter((s.num_tokens for s in samples), dtype=np.int64, count=len(samples))
    over = np.flatnonzero(lengths > seq_len)
    if over.size:
        raise OverlongError(samples, over, lengths, seq_len)


def _overlong(
    samples: Sequence[Sample], lengths: np.ndarray, settings: PackSettings
) -> list[Truncation]:
    over = np.flatnonzero(lengths > settings.seq_len)
    if over.size and settings.overlong == "error":
        hint = " (overlong='truncate' cuts them)"
        raise OverlongError(samples, over, lengths, settings.seq_len, hint)
    return [
        Truncation(
            sample=int(i),
            episode=samples[i].episode,
            row=samples[i].row,
            cut_tokens=int(lengths[i] - settings.seq_len),
            cut_loss_tokens=int(np.count_nonzero(samples[i].loss_mask[settings.seq_len :])),
        )
        for i in over
    ]


def deal_to_ranks(order: np.ndarray, lengths: np.ndarray, ranks: int) -> list[list[int]]:
    """Longest first (`order`), each sample (or any unit of work of `lengths` tokens) to the
    rank holding the fewest tokens (ties: lowest rank).

    When a rank last received a sample it was the lightest, so it ends at most that sample's
    length above any other rank.
    """
    if ranks == 1:
        return [order.tolist()]
    heap = [(0, rank) for rank in range(ranks)]
    members: list[list[int]] = [[] for _ in range(ranks)]
    for index, length in zip(order.tolist(), lengths[order].tolist(), strict=True):
        load, rank = heapq.heappop(heap)
        members[rank].append(index)
        heapq.heappush(heap, (load + length, rank))
    return members


def deal(
    samples: Sequence[Sample], ranks: int, *, batching: str, tree_scope: str
) -> list[np.ndarray]:
    """Each of `ranks` learner ranks' samples (indices into `samples`, ascending) for a step
    batched as `batching` (`tree` or `packed`) at tree scope `tree_scope`.

    The rows are dealt whole, in the units tree packing needs together (the rows of one trie: a
    call tree, an episode, a group; a group for tree scope `step`, whose tries then form within
    each rank; a sample alone when packed), each rank taking the next heaviest unit while it is
    the lightest (`deal_to_ranks`), weighed by the tokens it forwards (trie nodes tree-packed,
    row tokens packed). Each rank then packs its share as one process packs a step.
    """
    if batching == "packed":
        units = [[i] for i in range(len(samples))]
        weights = np.array([s.num_tokens for s in samples], dtype=np.int64)
    else:
        # Scope `step` makes a trie per micro-batch of a rank's share: the group, whose
        # episodes usually share a prompt, is the largest unit worth keeping on one rank.
        scope = "group" if tree_scope == "step" else tree_scope
        keyed: dict[Hashable, list[int]] = {}
        for index, s in enumerate(samples):
            keyed.setdefault(_scope_key(scope, s.episode, s.group, s.root), []).append(index)
        units = list(keyed.values())
        weights = np.array(
            [trie_nodes([samples[i].token_ids for i in unit]) for unit in units], dtype=np.int64
        )
    order = np.argsort(-weights, kind="stable")
    return [
        np.sort(np.asarray([i for u in members for i in units[u]], dtype=np.int64))
        for members in deal_to_ranks(order, weights, ranks)
    ]


def _first_fit(longest_first: list[int], lengths: np.ndarray, seq_len: int) -> list[np.ndarray]:
    """First-fit-decreasing: each sample (longest first) into the first micro-batch with room.

    The lengths only shrink, so a micro-batch with room for one sample has room for every later
    one until it takes a sample itself: such micro-batches wait in a heap by room and move to a
    heap by position once they fit, and the first of those takes the sample. Every micro-batch
    moves once per sample it takes, so the search costs O(n log n), not a scan of every
    micro-batch per sample.
    """
    bins: list[list[int]] = []
    waiting: list[tuple[int, int]] = []  # (-room, bin) of bins that fit none of the samples yet
    fitting: list[int] = []  # bins with room for the current sample (and every later one)
    room_of: list[int] = []
    for index, length in zip(longest_first, lengths[longest_first].tolist(), strict=True):
        while waiting and -waiting[0][0] >= length:
            heapq.heappush(fitting, heapq.heappop(waiting)[1])
        if fitting:
            first = heapq.heappop(fitting)
            bins[first].append(index)
            room = room_of[first] = room_of[first] - length
        else:
            first, room = len(bins), seq_len - length
            bins.append([index])
            room_of.append(room)
        heapq.heappush(waiting, (-room, first))
    # Within a micro-batch keep the input order: rows of one episode stay together.
    return [np.sort(np.array(b, dtype=np.int64)) for b in bins]


def _lay_out(
    samples: Sequence[Sample], lengths: np.ndarray, bins: list[np.ndarray], settings: PackSettings
) -> list[MicroBatch]:
    """Every micro-batch written into one array per field (one large allocation instead of many
    small ones); each micro-batch's arrays are views into them, None for a field some sample of
    it lacks. Samples are copied in input order, each to its place in the layout: samples built
    together lie one after the other in memory, and reading them in order keeps the copy's cost
    per token the same however many there are (reading them in layout order does not)."""
    layout = np.concatenate([np.zeros(0, dtype=np.int64), *bins])
    starts = np.zeros(len(layout) + 1, dtype=np.int64)  # of each sample, in layout order
    np.cumsum(lengths[layout], out=starts[1:])
    place = np.zeros(len(samples), dtype=np.int64)
    place[layout] = starts[:-1]
    first = np.zeros(len(bins) + 1, dtype=np.int64)  # each micro-batch's first sample
    np.cumsum([len(members) for members in bins], out=first[1:])
    spans = [(a, b, int(starts[a]), int(starts[b])) for a, b in pairwise(first.tolist())]
    where = list(zip(place.tolist(), lengths.tolist(), strict=True))
    arrays: list[dict[str, np.ndarray | None]] = [{} for _ in bins]
    for name in TOKEN_FIELDS:
        buffer = np.empty(int(starts[-1]), dtype=FIELD_DTYPES[name])
        lacking = set()
        for index, (sample, (at, n)) in enumerate(zip(samples, where, strict=True)):
            part = getattr(sample, name)
            if part is None:
                lacking.add(index)
            else:
                np.copyto(buffer[at : at + n], part[:n] if n < len(part) else part, "same_kind")
        for view, members, (_, _, lo, hi) in zip(arrays, bins, spans, strict=True):
            missing = lacking and not lacking.isdisjoint(members.tolist())
            view[name] = None if missing else buffer[lo:hi]
    return [
        MicroBatch(
            view,
            (starts[a : b + 1] - starts[a]).astype(CU_SEQLENS_DTYPE),
            members,
            settings.seq_len,
        )
        for view, members, (a, b, _, _) in zip(arrays, bins, spans, strict=True)
    ]

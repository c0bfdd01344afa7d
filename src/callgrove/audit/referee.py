"""The referee: for every token a policy sampled in a capture, how many times a trainer's rows
train it, and whether each time it trains in the context it was sampled in.

A sampled token is one completion token of one call, with its context: the call's prompt and
the completion tokens before it. A trainer's row trains the token at position `p` when its
loss mask is on there; it trains it *in context* when the row's tokens up to and including
`p` are exactly the call's, and *in a wrong context* when the row holds a run of the call's
completion tokens (at least `WRONG_CONTEXT_RUN` of them, or the whole completion when it is
shorter) behind other tokens: a summary trained after the compaction that wrote it, a leader's
turn trained inside a fork whose first call was not an exact copy, a subagent's turn trained
inside another agent's history. A loss-on token that is neither trains a token no policy
sampled (a prompt or tool token with loss on).

Each episode's tokens are pooled as the forest pools them (`forest.TokenPool`), with a prefix
hash per token; a row's prefix hashes (`forest.prefix_hashes`) find candidates, and every
candidate run is confirmed token for token before it counts. Identical samples (twin agents,
identical episodes of a greedy group) are several sampled tokens with one context: each
training goes to one of them, the row's own episode first, then one not yet trained.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from callgrove.episode import Episode
from callgrove.forest import TokenPool, prefix_hashes

WRONG_CONTEXT_RUN = 8
"""How many completion tokens in a row, behind other tokens, make a wrong-context training: a
shorter run of equal tokens is as likely a coincidence (a common phrase in a tool's output)."""

TO_TRAIN = "train"
NOT_KEPT = "not kept"
NOT_TRAINABLE = "not trainable"
"""A sampled call's state: `TO_TRAIN` (a kept call of a trainable agent, to be trained once),
`NOT_KEPT` (a retry or abandoned attempt the capture keeps for accounting), `NOT_TRAINABLE` (an
agent whose calls are context only)."""

UNKNOWN = "?"  # the owner of a row that names none and trains no call in its context


@dataclass(frozen=True, slots=True)
class TrainedRow:
    """One row a trainer was fed: its tokens, where its loss is on, the advantage per token
    (None where the batch holds none), where it was read, and the episode and agent it names
    (None where the batch names none)."""

    token_ids: np.ndarray
    loss_mask: np.ndarray
    advantages: np.ndarray | None
    where: str
    episode: str | None = None
    agent: str | None = None  # the agent's id
    seat: str | None = None  # the agent's name


@dataclass(frozen=True, slots=True)
class Training:
    """One row's training of a run of a call's completion tokens."""

    row: str  # where the row was read
    row_agent: str  # the agent the row names, or whose call its last in-context token is
    row_seat: str  # that agent's name
    first: int  # the run's first completion index
    tokens: int
    in_context: bool
    advantage: float | None  # the mean over the run


@dataclass(slots=True)
class CallAudit:
    """One sampled call and how the batch trained its tokens."""

    episode: str
    call: str
    agent: str
    seat: str
    state: str
    tokens: int
    trained: np.ndarray  # int32 per completion token: how many times it trained
    wrong_context: np.ndarray  # int32 per completion token: how many of those were out of context
    twin_untrained: int = 0  # untrained tokens an identical sample in the episode trained
    trainings: list[Training] = field(default_factory=list)

    @property
    def untrained(self) -> int:
        return int(np.count_nonzero(self.trained == 0))

    @property
    def once(self) -> int:
        return int(np.count_nonzero(self.trained == 1))

    @property
    def twice_or_more(self) -> int:
        return int(np.count_nonzero(self.trained >= 2))

    @property
    def wrong_context_tokens(self) -> int:
        return int(np.count_nonzero(self.wrong_context))

    def record(self) -> dict:
        return {
            "episode": self.episode,
            "call": self.call,
            "agent": self.agent,
            "seat": self.seat,
            "state": self.state,
            "tokens": self.tokens,
            "trained_0": self.untrained,
            "trained_1": self.once,
            "trained_2_or_more": self.twice_or_more,
            "wrong_context": self.wrong_context_tokens,
            "twin_untrained": self.twin_untrained,
            "trainings": [
                {
                    "row": t.row,
                    "row_agent": t.row_agent,
                    "row_seat": t.row_seat,
                    "first": t.first,
                    "tokens": t.tokens,
                    "in_context": t.in_context,
                    "advantage": t.advantage,
                }
                for t in self.trainings
            ],
        }


@dataclass(slots=True)
class Unsampled:
    """Loss-on tokens of one row that no policy sampled."""

    row: str
    positions: list[int]


@dataclass(slots=True)
class AuditReport:
    """What the batch did with every sampled token of the capture."""

    calls: list[CallAudit]
    rows: int = 0
    row_tokens: int = 0  # every token the rows forward
    loss_tokens: int = 0
    unsampled: list[Unsampled] = field(default_factory=list)

    def to_train(self) -> list[CallAudit]:
        return [c for c in self.calls if c.state == TO_TRAIN]

    @property
    def sampled_tokens(self) -> int:
        """Sampled tokens to be trained: the kept calls' of trainable agents."""
        return sum(c.tokens for c in self.to_train())

    def _sum(self, name: str) -> int:
        return sum(getattr(c, name) for c in self.to_train())

    @property
    def untrained(self) -> int:
        return self._sum("untrained")

    @property
    def once(self) -> int:
        return self._sum("once")

    @property
    def twice_or_more(self) -> int:
        return self._sum("twice_or_more")

    @property
    def wrong_context(self) -> int:
        return self._sum("wrong_context_tokens")

    @property
    def twin_untrained(self) -> int:
        return self._sum("twin_untrained")

    @property
    def trained_not_to_train(self) -> int:
        """Trained tokens of calls the capture says not to train (not kept, not trainable)."""
        return sum(int(np.count_nonzero(c.trained)) for c in self.calls if c.state != TO_TRAIN)

    @property
    def unsampled_tokens(self) -> int:
        return sum(len(u.positions) for u in self.unsampled)

    @property
    def forwarded_per_sampled(self) -> float:
        sampled = self.sampled_tokens
        return self.row_tokens / sampled if sampled else float("nan")

    @property
    def exact(self) -> bool:
        """No sampled token trains twice or in a wrong context."""
        return not (self.twice_or_more or self.wrong_context)

    def totals(self) -> dict:
        return {
            "sampled_tokens": self.sampled_tokens,
            "trained_0": self.untrained,
            "trained_1": self.once,
            "trained_2_or_more": self.twice_or_more,
            "wrong_context": self.wrong_context,
            "twin_untrained": self.twin_untrained,
            "trained_unsampled": self.unsampled_tokens,
            "trained_not_to_train": self.trained_not_to_train,
            "rows": self.rows,
            "row_tokens": self.row_tokens,
            "loss_tokens": self.loss_tokens,
            "forwarded_per_sampled": self.forwarded_per_sampled,
            "exact": self.exact,
        }


@dataclass(slots=True)
class _Candidate:
    call: int  # index into the referee's calls
    first: int  # completion index
    tokens: int  # how many row tokens it covers from there
    position: int  # the row position it starts at


class Referee:
    """The capture's sampled tokens, indexed to be found in trainers' rows; `take` each row,
    then `report`."""

    def __init__(self, episodes: Iterable[Episode]) -> None:
        self.episodes: list[Episode] = []
        self.pools: list[TokenPool] = []
        self.calls: list[CallAudit] = []
        self._call_episode: list[int] = []
        self._ledger_index: list[int] = []
        starts, hashes, positions = [0], [], []
        for episode in episodes:
            self._index_episode(episode, starts, hashes, positions)
        self._start = np.array(starts, dtype=np.int64)  # each call's first token, then the end
        self._hash = np.concatenate(hashes) if hashes else np.zeros(0, np.uint32)
        self._position = np.concatenate(positions) if positions else np.zeros(0, np.int64)
        self._call_of = np.repeat(np.arange(len(self.calls)), np.diff(self._start)).astype(np.int64)
        self._order = np.argsort(self._hash, kind="stable")
        self._sorted = self._hash[self._order]
        self._words: dict[bytes, list[int]] | None = None  # runs of completion tokens, made once
        self._short: dict[bytes, list[int]] | None = None
        self.report_so_far = AuditReport(self.calls)

    def _index_episode(self, episode: Episode, starts, hashes, positions) -> None:
        ledger = episode.ledger()
        pool = TokenPool.build(ledger)
        number = len(self.episodes)
        self.episodes.append(episode)
        self.pools.append(pool)
        for i, call in enumerate(ledger):
            agent = episode.agent_of(call)
            state = (
                TO_TRAIN
                if call.kept and agent.trainable
                else NOT_KEPT
                if not call.kept
                else NOT_TRAINABLE
            )
            n = len(call.completion_ids)
            start = pool.completion_start[i]
            hashes.append(pool.hashes[start : start + n])
            positions.append(pool.prompt_len[i] + np.arange(n, dtype=np.int64))
            starts.append(starts[-1] + n)
            zeros = np.zeros(n, dtype=np.int32)
            self.calls.append(
                CallAudit(episode.id, call.id, agent.id, agent.name, state, n, zeros, zeros.copy())
            )
            self._call_episode.append(number)
            self._ledger_index.append(i)

    # -- one row ------------------------------------------------------------------------------

    def take(self, row: TrainedRow) -> None:
        """Find every loss-on token of `row` among the sampled tokens and count it."""
        report = self.report_so_far
        report.rows += 1
        report.row_tokens += len(row.token_ids)
        loss = np.flatnonzero(row.loss_mask)
        report.loss_tokens += len(loss)
        if not len(loss):
            return
        tokens = np.ascontiguousarray(row.token_ids, dtype=np.int32)
        row_hash = prefix_hashes(tokens)
        run_end = _run_ends(loss)
        lo = np.searchsorted(self._sorted, row_hash[loss], "left")
        hi = np.searchsorted(self._sorted, row_hash[loss], "right")
        found: list[tuple[_Candidate, bool]] = []
        unsampled: list[int] = []
        i = 0
        while i < len(loss):
            p = int(loss[i])
            end = int(run_end[i])
            match = self._in_context(row, tokens, row_hash, p, end, lo[i], hi[i])
            in_context = match is not None
            if match is None:
                match = self._out_of_context(row, tokens, p, end)
            if match is None:
                unsampled.append(p)
                i += 1
                continue
            found.append((match, in_context))
            i += match.tokens
        owner = (row.agent, row.seat or row.agent) if row.agent else self._owner(found)
        for match, in_context in found:
            self._count(row, owner, match, in_context)
        if unsampled:
            report.unsampled.append(Unsampled(row.where, unsampled))

    def _in_context(self, row, tokens, row_hash, p, end, lo, hi) -> _Candidate | None:
        """The sampled call whose tokens, with their whole context, the row holds from `p`."""
        confirmed = []
        for t in self._order[lo:hi]:
            if self._position[t] != p:
                continue
            call = int(self._call_of[t])
            first = int(t - self._start[call])
            span = min(end - p, self.calls[call].tokens - first)
            own = self._hash[t : t + span] == row_hash[p : p + span]
            covered = span if own.all() else int(np.argmin(own))
            if self._same_tokens(call, tokens, p + covered):
                confirmed.append(_Candidate(call, first, covered, p))
        return self._preferred(confirmed, row)

    def _same_tokens(self, call: int, tokens: np.ndarray, length: int) -> bool:
        """Exactly: does the row start with the call's first `length` full-sequence tokens?"""
        pool = self.pools[self._call_episode[call]]
        position = 0
        for piece in pool.pieces(self._ledger_index[call], 0, length):
            if not np.array_equal(piece, tokens[position : position + len(piece)]):
                return False
            position += len(piece)
        return position == length

    def _out_of_context(self, row, tokens, p, end) -> _Candidate | None:
        """A run of some call's completion tokens the row holds from `p` behind other tokens."""
        words, short = self._completion_runs()
        found = []
        if end - p >= WRONG_CONTEXT_RUN:
            for t in words.get(tokens[p : p + WRONG_CONTEXT_RUN].tobytes(), ()):
                call = int(self._call_of[t])
                first = int(t - self._start[call])
                completion = self._completion(call)
                span = min(end - p, len(completion) - first)
                same = completion[first : first + span] == tokens[p : p + span]
                covered = span if same.all() else int(np.argmin(same))
                found.append(_Candidate(call, first, covered, p))
        for length in range(1, min(WRONG_CONTEXT_RUN, end - p + 1)):
            for call in short.get(tokens[p : p + length].tobytes(), ()):
                found.append(_Candidate(call, 0, length, p))
        return self._preferred(found, row)

    def _completion_runs(self) -> tuple[dict[bytes, list[int]], dict[bytes, list[int]]]:
        """Every run of `WRONG_CONTEXT_RUN` completion tokens (by its first token's index), and
        every shorter completion whole (by its call): made on the first out-of-context look."""
        if self._words is None:
            words: dict[bytes, list[int]] = {}
            short: dict[bytes, list[int]] = {}
            for call in range(len(self.calls)):
                completion = self._completion(call)
                if len(completion) < WRONG_CONTEXT_RUN:
                    short.setdefault(completion.tobytes(), []).append(call)
                    continue
                windows = np.lib.stride_tricks.sliding_window_view(completion, WRONG_CONTEXT_RUN)
                start = int(self._start[call])
                for offset, window in enumerate(windows):
                    words.setdefault(window.tobytes(), []).append(start + offset)
            self._words, self._short = words, short
        return self._words, self._short

    def _completion(self, call: int) -> np.ndarray:
        episode = self.episodes[self._call_episode[call]]
        ledger_call = episode.ledger()[self._ledger_index[call]]
        return np.ascontiguousarray(ledger_call.completion_ids, dtype=np.int32)

    def _preferred(self, found: Sequence[_Candidate], row: TrainedRow) -> _Candidate | None:
        """Of equally good places for a training: the longest run, then a call to train, of the
        row's own episode, not yet trained there, first in the capture."""
        found = [f for f in found if f.tokens > 0]
        if not found:
            return None

        def rank(candidate: _Candidate) -> tuple:
            audit = self.calls[candidate.call]
            return (
                -candidate.tokens,
                audit.state != TO_TRAIN,
                row.episode is not None and audit.episode != row.episode,
                bool(audit.trained[candidate.first]),
                candidate.call,
            )

        return min(found, key=rank)

    def _owner(self, found: list[tuple[_Candidate, bool]]) -> tuple[str, str]:
        """The agent (id, name) whose call the row's last in-context training is: its leaf's."""
        for match, in_context in reversed(found):
            if in_context:
                audit = self.calls[match.call]
                return audit.agent, audit.seat
        return UNKNOWN, UNKNOWN

    def _count(
        self, row: TrainedRow, owner: tuple[str, str], match: _Candidate, in_context: bool
    ) -> None:
        audit = self.calls[match.call]
        run = slice(match.first, match.first + match.tokens)
        audit.trained[run] += 1
        if not in_context:
            audit.wrong_context[run] += 1
        advantage = None
        if row.advantages is not None:
            trained = row.advantages[match.position : match.position + match.tokens]
            advantage = float(np.mean(trained))
        audit.trainings.append(
            Training(row.where, *owner, match.first, match.tokens, in_context, advantage)
        )

    # -- the report ---------------------------------------------------------------------------

    def report(self) -> AuditReport:
        """The report of every row taken, with the untrained tokens that a twin trained."""
        for number, audit in enumerate(self.calls):
            if audit.state == TO_TRAIN and audit.untrained:
                audit.twin_untrained = self._twin_trained(number)
        return self.report_so_far

    def _twin_trained(self, call: int) -> int:
        """Untrained tokens of `call` whose identical sample in the same episode trained."""
        audit = self.calls[call]
        start = int(self._start[call])
        untrained = start + np.flatnonzero(audit.trained == 0)
        lo = np.searchsorted(self._sorted, self._hash[untrained], "left")
        hi = np.searchsorted(self._sorted, self._hash[untrained], "right")
        pool = self.pools[self._call_episode[call]]
        count = 0
        for t, low, high in zip(untrained.tolist(), lo.tolist(), hi.tolist(), strict=True):
            for other in self._order[low:high].tolist():
                twin = int(self._call_of[other])
                if (
                    twin != call
                    and self._call_episode[twin] == self._call_episode[call]
                    and self._position[other] == self._position[t]
                    and self.calls[twin].trained[other - self._start[twin]]
                    and pool.same_prefix(
                        self._ledger_index[call], self._ledger_index[twin], self._position[t] + 1
                    )
                ):
                    count += 1
                    break
        return count


def _run_ends(loss: np.ndarray) -> np.ndarray:
    """For each loss-on position, the end (exclusive) of the run of consecutive loss-on
    positions holding it."""
    breaks = np.flatnonzero(np.diff(loss) != 1)
    ends = np.append(loss[breaks] + 1, loss[-1] + 1)
    run_of = np.searchsorted(breaks, np.arange(len(loss)), "left")
    return ends[run_of]


def audit(episodes: Iterable[Episode], rows: Iterable[TrainedRow]) -> AuditReport:
    """Every sampled token of `episodes`, and how `rows` train it."""
    referee = Referee(episodes)
    for row in rows:
        referee.take(row)
    return referee.report()

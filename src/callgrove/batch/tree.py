"""Tree packing: every distinct token of a set of rows is forwarded once.

Row-wise training runs shared history again in every row that holds it. Rows that share a prefix
are nodes of one trie instead: a node is a distinct (prefix, token), its position id is its
depth, and it attends to exactly its ancestors, so its hidden states and its next-token
distribution are the ones every row holding it would compute.

The trie is built from the token sequences alone (rows read back from files carry nothing
else), and then cut into paths: the longest row claims all of its nodes, each further row
claims the nodes no earlier row holds, which is always a suffix of it. A path attends to the
ancestors of its head (a prefix of an earlier row) and causally within itself, so its attention
costs at most what its row costs row-wise, and a path with no ancestors is plain causal
attention. Paths are laid out one after the other, so every parent index points backwards.

The loss stays per row: each 1 of a row's loss mask becomes a target (node, row, the row's
per-token values there), so a node trained by two rows (identical twins allowed to train twice)
is counted twice, exactly as row-wise, and a duplicate row with an all-zero mask adds nothing.

Scope `step` lets rows of different groups share nodes too (a harness's system prompt and tool
definitions, the same in every episode, forwarded once), within a micro-batch's budget:
`pack_micro_batches` deals the rows in trie order, so rows sharing long prefixes land in one
micro-batch, and starts a new one when the next row's new nodes would pass the budget.
"""

from __future__ import annotations

import sys
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import TYPE_CHECKING

import numpy as np

from callgrove.batch.samples import SAMPLING_FIELDS, Sample
from callgrove.errors import InvalidValue
from callgrove.rows.columns import RowColumns

if TYPE_CHECKING:
    from callgrove.rows import EpisodeRows

TREE_SCOPES = ("tree", "episode", "group", "step")
# Carried onto the targets: what the loss reads at each trained token.
SAMPLE_VALUES = ("logprobs", "advantages", "policy_versions", *SAMPLING_FIELDS)
NODE_DTYPE = np.int64  # indices feed torch gathers, which take int64
CHUNK_TOKENS = 1 << 18  # rows gathered together: few numpy calls, temporaries that fit a cache


@dataclass(frozen=True, slots=True)
class TreeSettings:
    """Which rows may share trie nodes: rows of one call tree, of one episode, of a group (a
    group's episodes usually start from the same task prompt, which is then forwarded once), or
    of the whole step (within a micro-batch's budget, `pack_micro_batches`)."""

    scope: str = "group"
    """`tree`, `episode`, `group` (the default) or `step`."""

    def __post_init__(self) -> None:
        if self.scope not in TREE_SCOPES:
            raise InvalidValue(f"tree scope must be one of {TREE_SCOPES}, not {self.scope!r}")


@dataclass(slots=True, eq=False)
class TreeBatch:
    """Rows packed as a trie: node arrays for the forward pass, row maps and targets for the loss."""

    token_ids: np.ndarray  # int32 (N,): one entry per distinct trie node
    position_ids: np.ndarray  # int64 (N,): the node's depth, its position in every row
    parent: np.ndarray  # int64 (N,): the node's parent, -1 at depth 0
    path_bounds: np.ndarray  # int64 (P+1,): path p is nodes [bounds[p], bounds[p+1])
    context_nodes: np.ndarray  # int64: the ancestors of each path's head, root first
    context_bounds: np.ndarray  # int64 (P+1,): path p's ancestors are context_nodes[b[p]:b[p+1]]
    row_nodes: np.ndarray  # int64: each row's tokens as nodes, row after row
    row_bounds: np.ndarray  # int64 (R+1,): row r is row_nodes[b[r]:b[r+1]]
    loss_mask: np.ndarray  # uint8 (N,): 1 where some row trains the node
    target_nodes: np.ndarray  # int64 (T,): one target per 1 in a row's loss mask, row by row
    target_rows: np.ndarray  # int64 (T,)
    target_values: dict[str, np.ndarray] = field(default_factory=dict)  # name -> (T,)

    def __repr__(self) -> str:
        return (
            f"TreeBatch(rows={len(self.row_bounds) - 1}, nodes={self.num_tokens}, "
            f"row_tokens={self.num_row_tokens}, targets={len(self.target_nodes)})"
        )

    @property
    def num_tokens(self) -> int:
        """Tokens forwarded: the distinct nodes of the trie."""
        return len(self.token_ids)

    @property
    def num_row_tokens(self) -> int:
        """Tokens the same rows forward row-wise."""
        return int(self.row_bounds[-1])

    @property
    def num_rows(self) -> int:
        return len(self.row_bounds) - 1

    @property
    def num_paths(self) -> int:
        return len(self.path_bounds) - 1

    @property
    def forwarded_token_ratio(self) -> float:
        """Row-wise tokens per tree-packed token (1.0 when nothing is shared)."""
        return self.num_row_tokens / max(self.num_tokens, 1)

    @property
    def num_attention_pairs(self) -> int:
        """Query-key pairs a path-by-path attention scores (each path against its ancestors and,
        causally, itself)."""
        own = np.diff(self.path_bounds)
        context = np.diff(self.context_bounds)
        return int((own * context + own * (own + 1) // 2).sum())

    @property
    def num_row_attention_pairs(self) -> int:
        """Query-key pairs causal attention scores over the same rows row-wise."""
        lengths = np.diff(self.row_bounds)
        return int((lengths * (lengths + 1) // 2).sum())

    def row_slice(self, row: int) -> np.ndarray:
        """Row `row`'s tokens as node indices, in row order."""
        return self.row_nodes[self.row_bounds[row] : self.row_bounds[row + 1]]

    def path_nodes(self, path: int) -> tuple[int, int]:
        return int(self.path_bounds[path]), int(self.path_bounds[path + 1])

    def path_context(self, path: int) -> np.ndarray:
        return self.context_nodes[self.context_bounds[path] : self.context_bounds[path + 1]]


def pack_tree(
    token_ids: Sequence[np.ndarray],
    loss_masks: Sequence[np.ndarray],
    values: Mapping[str, Sequence[np.ndarray]] | None = None,
    trie_keys: Sequence[Hashable] | None = None,
    row_names: Sequence[str] | None = None,
) -> TreeBatch:
    """Pack rows into one trie per trie key (rows of different keys never share a node).

    `values` are per-token arrays of each row (sampling logprobs, advantages, policy versions)
    carried onto the targets at the row's loss-mask positions. `row_names` name the rows in
    errors (default: `row <index>`).

    The cost grows linearly with the rows: each output array is allocated once and filled in
    place, the targets are gathered a chunk of rows at a time (temporaries stay cache-sized),
    and each row's nearest claimed neighbours are found in one pass over the sorted rows.
    """
    values = dict(values or {})
    rows = [np.asarray(tokens) for tokens in token_ids]
    masks = [np.asarray(mask) for mask in loss_masks]
    names = list(row_names) if row_names is not None else [f"row {i}" for i in range(len(rows))]
    _check_rows(rows, masks, values, trie_keys, names)
    lengths = np.fromiter(map(len, rows), dtype=NODE_DTYPE, count=len(rows))
    row_bounds = _bounds(lengths)
    targets = _targets(masks, values, row_bounds, names)
    claims = _claim_paths(rows, lengths, trie_keys)
    row_nodes = claims.row_nodes(row_bounds)
    token_parts = (rows[r][d:] for r, d in zip(claims.path_rows, claims.path_depths, strict=True))
    target_nodes = row_nodes[targets.positions]
    loss_mask = np.zeros(claims.num_nodes, dtype=np.uint8)
    loss_mask[target_nodes] = 1
    return TreeBatch(
        token_ids=_fill(token_parts, claims.num_nodes, np.int32),
        position_ids=claims.position_ids(),
        parent=claims.parents(row_nodes, row_bounds),
        path_bounds=claims.path_bounds,
        context_nodes=claims.context_nodes(row_nodes, row_bounds),
        context_bounds=_bounds(np.asarray(claims.path_depths, dtype=NODE_DTYPE)),
        row_nodes=row_nodes,
        row_bounds=row_bounds,
        loss_mask=loss_mask,
        target_nodes=target_nodes,
        target_rows=targets.rows,
        target_values=targets.values,
    )


def pack_samples(samples: Sequence[Sample], settings: TreeSettings | None = None) -> TreeBatch:
    """Tree-pack samples (rows read back from files; default: a trie per group; a sample's
    `root` names its call tree for scope "tree"): sampling logprobs, advantages, policy
    versions and each trained token's sampling distribution go onto the targets; `logprobs` is left out when a
    sample has none, so an importance-weighted loss refuses the batch instead of inventing them."""
    settings = settings or TreeSettings()
    values = {
        name: [getattr(s, name) for s in samples]
        for name in SAMPLE_VALUES
        if all(getattr(s, name) is not None for s in samples)
    }
    keys = [_scope_key(settings.scope, s.episode, s.group, s.root) for s in samples]
    names = [f"episode {s.episode} row {s.row}" for s in samples]
    tokens, masks = [s.token_ids for s in samples], [s.loss_mask for s in samples]
    return pack_tree(tokens, masks, values, keys, names)


def pack_micro_batches(
    samples: Sequence[Sample], settings: TreeSettings, budget: int
) -> list[tuple[TreeBatch, np.ndarray]]:
    """A step's samples as tree-packed micro-batches, each with the index in `samples` of each
    of its rows. Scopes `tree`, `episode` and `group` give one batch (their tries are small);
    scope `step` gives one trie per micro-batch of at most `budget` nodes (`deal_rows`)."""
    if settings.scope != "step":
        return [(pack_samples(samples, settings), np.arange(len(samples)))]
    dealt = deal_rows([s.token_ids for s in samples], budget)
    return [(pack_samples([samples[i] for i in rows], settings), rows) for rows in dealt]


def deal_rows(rows: Sequence[np.ndarray], budget: int) -> list[np.ndarray]:
    """Row indices in micro-batches whose trie holds at most `budget` nodes each (a row longer
    than that alone), each batch's indices ascending. Rows are dealt in lexicographic order:
    rows sharing a prefix are neighbours there, and a row adds to its batch's trie its length
    less the prefix it shares with the row before it, so the count is exact as it goes."""
    if budget < 1:
        raise InvalidValue(f"a micro-batch's budget must be at least 1 token, not {budget}")
    arrays = [np.asarray(row) for row in rows]
    order, shared, _ = _sorted_prefixes(arrays, None)
    batches: list[list[int]] = []
    nodes = 0
    for place, r in enumerate(order):
        new = len(arrays[r]) - (shared[place - 1] if place and batches else 0)
        if not batches or (batches[-1] and nodes + new > budget):
            batches.append([])
            nodes, new = 0, len(arrays[r])
        batches[-1].append(r)
        nodes += new
    return [np.sort(np.asarray(batch, dtype=NODE_DTYPE)) for batch in batches]


def trie_nodes(rows: Sequence[np.ndarray]) -> int:
    """The nodes of one trie over `rows` (what tree-packing them forwards): their tokens less
    the prefix each shares with its neighbour in lexicographic order."""
    arrays = [np.asarray(row) for row in rows]
    _, shared, _ = _sorted_prefixes(arrays, None)
    return sum(len(row) for row in arrays) - sum(shared)


def pack_episode_rows(
    episode_rows: Iterable[EpisodeRows], settings: TreeSettings = TreeSettings()
) -> TreeBatch:
    """Tree-pack the rows of episodes (rows of `callgrove.rows`), carrying their sampling
    logprobs onto the targets when every row has them."""
    parts = list(episode_rows)
    columns = RowColumns.of(parts)
    rows = [row for part in parts for row in part.rows]
    where = columns.row_slices()
    values = {}
    if not columns.owned_without("logprobs").any():
        logprobs = columns.values("logprobs")
        values["logprobs"] = [logprobs[w] for w in where]
    names, keys = [], []
    for row in rows:
        episode = row.episode
        names.append(f"episode {episode.id} row {row.index} (root call {row.path[0].id})")
        root = row.path[0].id if settings.scope == "tree" else None
        keys.append(_scope_key(settings.scope, episode.id, episode.group, root))
    tokens = [columns.token_ids[w] for w in where]
    masks = [columns.loss_mask[w] for w in where]
    return pack_tree(tokens, masks, values, keys, names)


def _scope_key(scope: str, episode: str, group: str | None, root: str | None = None) -> Hashable:
    """Rows with equal keys may share trie nodes. An episode without a group is its own group."""
    if scope == "step":
        return ("step",)
    if scope == "group" and group is not None:
        return ("group", group)
    if scope == "tree":
        return ("tree", episode, root)
    return ("episode", episode)


def _check_rows(
    rows: list[np.ndarray],
    masks: list[np.ndarray],
    values: Mapping[str, Sequence[np.ndarray]],
    trie_keys: Sequence[Hashable] | None,
    names: list[str],
) -> None:
    if any(n is not None and len(n) != len(rows) for n in (masks, trie_keys, names)):
        raise InvalidValue("tree packing needs one loss mask (and trie key, and name) per row")
    for name, arrays in values.items():
        if len(arrays) != len(rows):
            raise InvalidValue(f"tree packing: {name!r} has {len(arrays)} rows, not {len(rows)}")
    for index, (tokens, mask) in enumerate(zip(rows, masks, strict=True)):
        if tokens.ndim != 1 or mask.shape != tokens.shape:
            raise InvalidValue(f"{names[index]}: token ids and loss mask must be 1-d of one length")
        if len(tokens) and int(tokens.min()) < 0:
            raise InvalidValue(f"{names[index]}: negative token id {int(tokens.min())}")
        for name, arrays in values.items():
            if np.shape(arrays[index]) != tokens.shape:
                raise InvalidValue(f"{names[index]}: {name!r} is not one value per token")


def _check_targets_predicted(
    flat_mask: np.ndarray, row_bounds: np.ndarray, first: int, last: int, names: list[str]
) -> None:
    """A loss on a row's first token has no prediction to train: refuse it, never drop it.
    `flat_mask` is the loss mask of rows `first` to `last` laid end to end."""
    with_tokens = first + np.flatnonzero(np.diff(row_bounds[first : last + 1]))
    unpredicted = with_tokens[flat_mask[row_bounds[with_tokens] - row_bounds[first]]]
    if len(unpredicted):
        raise InvalidValue(
            f"{names[int(unpredicted[0])]}: its loss mask is 1 on its first token, "
            "which nothing predicts"
        )


@dataclass(frozen=True, slots=True)
class _Targets:
    """One target per 1 in a row's loss mask, row by row."""

    positions: np.ndarray  # int64 (T,): where, in the rows laid end to end
    rows: np.ndarray  # int64 (T,)
    values: dict[str, np.ndarray]  # name -> (T,): the rows' values there


def _targets(
    masks: list[np.ndarray],
    values: Mapping[str, Sequence[np.ndarray]],
    row_bounds: np.ndarray,
    names: list[str],
) -> _Targets:
    """The targets, gathered a chunk of rows at a time (a chunk's temporaries stay in cache)."""
    positions, rows = [], []
    picked: dict[str, list[np.ndarray]] = {name: [] for name in values}
    for first, last in _chunks(row_bounds):
        offset = int(row_bounds[first])
        flat_mask = _concat(masks[first:last], np.uint8).astype(bool)
        _check_targets_predicted(flat_mask, row_bounds, first, last, names)
        where = np.flatnonzero(flat_mask)
        counts = np.diff(np.searchsorted(where, row_bounds[first : last + 1] - offset))
        positions.append(where + offset)
        rows.append(np.repeat(np.arange(first, last, dtype=NODE_DTYPE), counts))
        for name, arrays in values.items():
            picked[name].append(_concat(list(arrays[first:last]), None)[flat_mask])
    return _Targets(
        positions=_concat(positions, NODE_DTYPE),
        rows=_concat(rows, NODE_DTYPE),
        values={name: _concat(parts, None) for name, parts in picked.items()},
    )


def _chunks(row_bounds: np.ndarray) -> list[tuple[int, int]]:
    """Ranges of rows of about `CHUNK_TOKENS` tokens each (a longer row is a range of its own)."""
    total = int(row_bounds[-1])
    cuts = np.searchsorted(row_bounds, np.arange(CHUNK_TOKENS, total, CHUNK_TOKENS))
    edges = np.unique(np.concatenate([[0], cuts, [len(row_bounds) - 1]]))
    return list(zip(edges[:-1].tolist(), edges[1:].tolist(), strict=True))


def _sorted_prefixes(
    rows: list[np.ndarray], trie_keys: Sequence[Hashable] | None
) -> tuple[list[int], list[int], list[int]]:
    """Rows in lexicographic order within trie keys (keys in order of first appearance), the
    common prefix length of each neighbouring pair (0 across keys; the longest prefix a row
    shares with any row is shared with a neighbour), and the key's number at each place."""
    if trie_keys is None:
        keyed = [list(range(len(rows)))]
    else:
        members: dict[Hashable, list[int]] = {}
        for r, key in enumerate(trie_keys):
            members.setdefault(key, []).append(r)
        keyed = list(members.values())
    order: list[int] = []
    shared: list[int] = []
    group: list[int] = []
    for number, rows_of_key in enumerate(keyed):
        # Big-endian bytes of non-negative ids compare as the id sequences do, prefixes first.
        sort_keys = {r: rows[r].astype(">u4").tobytes() for r in rows_of_key}
        ranked = sorted(rows_of_key, key=sort_keys.__getitem__)
        if order:
            shared.append(0)
        shared.extend(_common_prefix(rows[a], rows[b]) for a, b in pairwise(ranked))
        order.extend(ranked)
        group.extend([number] * len(ranked))
    return order, shared, group


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differs = a[:n] != b[:n]
    first = int(differs.argmax()) if n else 0
    return first if n and differs[first] else n


@dataclass(frozen=True, slots=True)
class _Claims:
    """Which nodes each row reuses and which it claims as a new path (the module docstring)."""

    lengths: np.ndarray  # int64 (R,)
    depth: list[int]  # the row's first `depth` nodes are those of row `source`
    source: list[int]  # -1 when the row reuses nothing
    start: list[int]  # the first node it claims (its own nodes are start, start + 1, ...)
    claim_order: list[int]  # longest first: a row's source claims before it
    path_rows: list[int]  # rows owning a non-empty path, in layout order
    path_depths: list[int]  # their attach depths
    path_bounds: np.ndarray  # int64 (P+1,): path p is nodes [bounds[p], bounds[p+1])

    @property
    def num_nodes(self) -> int:
        return int(self.path_bounds[-1])

    def row_nodes(self, row_bounds: np.ndarray) -> np.ndarray:
        """Each row's tokens as nodes, row after row, written in claim order."""
        nodes = np.empty(int(row_bounds[-1]), dtype=NODE_DTYPE)
        ramp = _ramp(self.lengths)
        bounds = row_bounds.tolist()
        for r in self.claim_order:
            at, depth, end = bounds[r], self.depth[r], bounds[r + 1]
            if depth:
                source_at = bounds[self.source[r]]
                nodes[at : at + depth] = nodes[source_at : source_at + depth]
            if end > at + depth:
                np.add(ramp[: end - at - depth], self.start[r], out=nodes[at + depth : end])
        return nodes

    def position_ids(self) -> np.ndarray:
        """A path's nodes sit at its attach depth and below."""
        positions = np.empty(self.num_nodes, dtype=NODE_DTYPE)
        ramp = _ramp(self.lengths)
        bounds = self.path_bounds.tolist()
        for p, depth in enumerate(self.path_depths):
            np.add(
                ramp[: bounds[p + 1] - bounds[p]], depth, out=positions[bounds[p] : bounds[p + 1]]
            )
        return positions

    def parents(self, row_nodes: np.ndarray, row_bounds: np.ndarray) -> np.ndarray:
        """Within a path each node's parent is the node before it; a path's head hangs below the
        last node it reuses (-1 at depth 0)."""
        parent = np.arange(-1, self.num_nodes - 1, dtype=NODE_DTYPE)
        depths = np.asarray(self.path_depths, dtype=NODE_DTYPE)
        last_reused = row_bounds[self.path_rows] + depths - 1
        heads = np.where(depths > 0, row_nodes[np.maximum(last_reused, 0)], -1)
        parent[self.path_bounds[:-1]] = heads
        return parent

    def context_nodes(self, row_nodes: np.ndarray, row_bounds: np.ndarray) -> np.ndarray:
        """Each path's ancestors: the nodes its row reuses."""
        bounds = row_bounds.tolist()
        reused = (
            row_nodes[bounds[r] : bounds[r] + d]
            for r, d in zip(self.path_rows, self.path_depths, strict=True)
        )
        return _fill(reused, sum(self.path_depths), NODE_DTYPE)


def _claim_paths(
    rows: list[np.ndarray], lengths: np.ndarray, trie_keys: Sequence[Hashable] | None
) -> _Claims:
    """Longest rows first, each row reuses the nodes of the claimed row it shares most with and
    claims the rest as a new path. The claimed row it shares most with is the nearest one
    before or after it in the sorted order (within its key); both are found for every row in
    one pass each way, in time linear in the rows."""
    order, shared, group = _sorted_prefixes(rows, trie_keys)
    place = np.empty(len(rows), dtype=NODE_DTYPE)
    place[order] = np.arange(len(rows))
    claim_order = np.lexsort((place, -lengths))
    claim_time = np.empty(len(rows), dtype=NODE_DTYPE)
    claim_time[claim_order] = np.arange(len(rows))
    times = claim_time[order].tolist()
    before, before_depth = _nearest_earlier_claim(times, shared, group)
    after, after_depth = _nearest_earlier_claim(times[::-1], shared[::-1], group[::-1])
    last = len(rows) - 1
    depth, source = [0] * len(rows), [-1] * len(rows)
    for i, r in enumerate(order):
        if before_depth[i] > 0:
            depth[r], source[r] = before_depth[i], order[before[i]]
        j = last - i
        if after_depth[j] > depth[r]:
            depth[r], source[r] = after_depth[j], order[last - after[j]]
    own = lengths - np.asarray(depth, dtype=NODE_DTYPE)
    claimed = own[claim_order]
    start = np.empty(len(rows), dtype=NODE_DTYPE)
    start[claim_order] = np.cumsum(claimed) - claimed
    path_rows = claim_order[claimed > 0].tolist()
    return _Claims(
        lengths=lengths,
        depth=depth,
        source=source,
        start=start.tolist(),
        claim_order=claim_order.tolist(),
        path_rows=path_rows,
        path_depths=[depth[r] for r in path_rows],
        path_bounds=_bounds(claimed[claimed > 0]),
    )


def _nearest_earlier_claim(
    times: list[int], shared: list[int], group: list[int]
) -> tuple[list[int], list[int]]:
    """For each place of the sorted order: the nearest place before it in its group whose row
    claims earlier, and the prefix the two rows share (the least neighbouring share between
    them); -1 and 0 when there is none. A stack holds the places still in view, each with the
    least share from it to the next place in view, so every place is pushed and popped once."""
    nearest, depth = [-1] * len(times), [0] * len(times)
    stack: list[list[int]] = []  # [place, least share from it to the next place in view]
    for i, time in enumerate(times):
        if i and group[i] != group[i - 1]:
            stack.clear()
        elif stack:
            stack[-1][1] = min(stack[-1][1], shared[i - 1])
        while stack and times[stack[-1][0]] > time:
            gap = stack.pop()[1]
            if stack:
                stack[-1][1] = min(stack[-1][1], gap)
        if stack:
            nearest[i], depth[i] = stack[-1]
        stack.append([i, sys.maxsize])
    return nearest, depth


def _ramp(lengths: np.ndarray) -> np.ndarray:
    return np.arange(int(lengths.max(initial=0)), dtype=NODE_DTYPE)


def _bounds(lengths: np.ndarray) -> np.ndarray:
    bounds = np.zeros(len(lengths) + 1, dtype=NODE_DTYPE)
    np.cumsum(lengths, out=bounds[1:])
    return bounds


def _fill(parts: Iterable[np.ndarray], total: int, dtype: type) -> np.ndarray:
    """The parts laid end to end in one array written once (`total` is their length)."""
    out = np.empty(total, dtype=dtype)
    at = 0
    for part in parts:
        out[at : at + len(part)] = part
        at += len(part)
    return out


def _concat(parts: list[np.ndarray], dtype: type | None) -> np.ndarray:
    if not parts:
        return np.zeros(0, dtype=dtype or np.float64)
    joined = np.concatenate([np.asarray(p) for p in parts])
    return joined if dtype is None else joined.astype(dtype, copy=False)

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
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from callgrove.batch.samples import Sample
from callgrove.rows.columns import RowColumns

if TYPE_CHECKING:
    from callgrove.rows import EpisodeRows

TREE_SCOPES = ("tree", "episode", "group")
SAMPLE_VALUES = ("logprobs", "advantages", "policy_versions")  # carried onto the targets
NODE_DTYPE = np.int64  # indices feed torch gathers, which take int64


@dataclass(frozen=True, slots=True)
class TreeSettings:
    """Which rows may share trie nodes: rows of one call tree, of one episode, or of a group
    (a group's episodes usually start from the same task prompt, which is then forwarded once)."""

    scope: str = "tree"

    def __post_init__(self) -> None:
        if self.scope not in TREE_SCOPES:
            raise ValueError(f"tree scope must be one of {TREE_SCOPES}, not {self.scope!r}")


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
    """
    values = dict(values or {})
    rows = [np.asarray(tokens) for tokens in token_ids]
    masks = [np.asarray(mask) for mask in loss_masks]
    names = list(row_names) if row_names is not None else [f"row {i}" for i in range(len(rows))]
    _check_rows(rows, masks, values, trie_keys, names)
    order, shared, group = _sorted_prefixes(rows, trie_keys)
    row_nodes, attach_depth, path_rows = _claim_paths(rows, order, shared, group)

    path_lengths = np.array([len(rows[r]) - attach_depth[r] for r in path_rows], dtype=NODE_DTYPE)
    path_bounds = np.concatenate([[0], np.cumsum(path_lengths)]).astype(NODE_DTYPE)
    token_parts, position_parts, parent_parts, context_parts = [], [], [], []
    for r in path_rows:
        depth = attach_depth[r]
        nodes = row_nodes[r]
        token_parts.append(rows[r][depth:])
        position_parts.append(np.arange(depth, len(rows[r]), dtype=NODE_DTYPE))
        parent_parts.append(
            np.concatenate([nodes[depth - 1 : depth] if depth else [-1], nodes[depth:-1]])
        )
        context_parts.append(nodes[:depth])
    context_lengths = np.array([attach_depth[r] for r in path_rows], dtype=NODE_DTYPE)
    row_lengths = np.array([len(row) for row in rows], dtype=NODE_DTYPE)
    all_row_nodes = _concat(row_nodes, NODE_DTYPE)

    num_nodes = int(path_bounds[-1])
    row_bounds = np.concatenate([[0], np.cumsum(row_lengths)]).astype(NODE_DTYPE)
    flat_mask = _concat(masks, np.uint8).astype(bool)
    target_nodes = all_row_nodes[flat_mask]
    loss_mask = np.zeros(num_nodes, dtype=np.uint8)
    loss_mask[target_nodes] = 1
    target_rows = np.repeat(np.arange(len(rows), dtype=NODE_DTYPE), row_lengths)[flat_mask]
    target_depths = np.flatnonzero(flat_mask) - row_bounds[target_rows]
    _check_targets_predicted(target_depths, target_rows, names)
    return TreeBatch(
        token_ids=_concat(token_parts, np.int32),
        position_ids=_concat(position_parts, NODE_DTYPE),
        parent=_concat(parent_parts, NODE_DTYPE),
        path_bounds=path_bounds,
        context_nodes=_concat(context_parts, NODE_DTYPE),
        context_bounds=np.concatenate([[0], np.cumsum(context_lengths)]).astype(NODE_DTYPE),
        row_nodes=all_row_nodes,
        row_bounds=row_bounds,
        loss_mask=loss_mask,
        target_nodes=target_nodes,
        target_rows=target_rows,
        target_values={
            name: _concat(list(arrays), None)[flat_mask] for name, arrays in values.items()
        },
    )


def pack_samples(samples: Sequence[Sample], settings: TreeSettings | None = None) -> TreeBatch:
    """Tree-pack samples (rows read back from files; default: a trie per episode; a sample's
    `root` names its call tree for scope "tree"): sampling
    logprobs, advantages and policy versions go onto the targets; `logprobs` is left out when a
    sample has none, so an importance-weighted loss refuses the batch instead of inventing them."""
    settings = settings or TreeSettings(scope="episode")
    values = {
        name: [getattr(s, name) for s in samples]
        for name in SAMPLE_VALUES
        if all(getattr(s, name) is not None for s in samples)
    }
    keys = [_scope_key(settings.scope, s.episode, s.group, s.root) for s in samples]
    names = [f"episode {s.episode} row {s.row}" for s in samples]
    tokens, masks = [s.token_ids for s in samples], [s.loss_mask for s in samples]
    return pack_tree(tokens, masks, values, keys, names)


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
        raise ValueError("tree packing needs one loss mask (and trie key, and name) per row")
    for name, arrays in values.items():
        if len(arrays) != len(rows):
            raise ValueError(f"tree packing: {name!r} has {len(arrays)} rows, not {len(rows)}")
    for index, (tokens, mask) in enumerate(zip(rows, masks, strict=True)):
        if tokens.ndim != 1 or mask.shape != tokens.shape:
            raise ValueError(f"{names[index]}: token ids and loss mask must be 1-d of one length")
        if len(tokens) and int(tokens.min()) < 0:
            raise ValueError(f"{names[index]}: negative token id {int(tokens.min())}")
        for name, arrays in values.items():
            if np.shape(arrays[index]) != tokens.shape:
                raise ValueError(f"{names[index]}: {name!r} is not one value per token")


def _check_targets_predicted(
    target_depths: np.ndarray, target_rows: np.ndarray, names: list[str]
) -> None:
    """A loss on a row's first token has no prediction to train: refuse it, never drop it."""
    unpredicted = target_rows[target_depths == 0]
    if len(unpredicted):
        raise ValueError(
            f"{names[int(unpredicted[0])]}: its loss mask is 1 on its first token, "
            "which nothing predicts"
        )


def _sorted_prefixes(
    rows: list[np.ndarray], trie_keys: Sequence[Hashable] | None
) -> tuple[list[int], np.ndarray, list[int]]:
    """Rows in lexicographic order (within trie keys), the common prefix length of each
    neighbouring pair (the longest prefix a row shares with any row is shared with a
    neighbour), and the trie key's number at each place of the order."""
    key_index: dict[Hashable, int] = {}
    ranks = [key_index.setdefault(k, len(key_index)) for k in trie_keys] if trie_keys else None
    # Big-endian bytes of non-negative ids compare as the id sequences do, prefixes first.
    sort_keys = [row.astype(">u4").tobytes() for row in rows]
    if ranks is None:
        order = sorted(range(len(rows)), key=sort_keys.__getitem__)
    else:
        order = sorted(range(len(rows)), key=lambda r: (ranks[r], sort_keys[r]))
    shared = np.zeros(max(len(rows) - 1, 0), dtype=NODE_DTYPE)
    for i in range(len(order) - 1):
        a, b = rows[order[i]], rows[order[i + 1]]
        if ranks is not None and ranks[order[i]] != ranks[order[i + 1]]:
            continue
        n = min(len(a), len(b))
        differs = np.flatnonzero(a[:n] != b[:n])
        shared[i] = differs[0] if len(differs) else n
    return order, shared, [0] * len(order) if ranks is None else [ranks[r] for r in order]


def _claim_paths(
    rows: list[np.ndarray], order: list[int], shared: np.ndarray, group: list[int]
) -> tuple[list[np.ndarray], list[int], list[int]]:
    """Longest rows first, each row reuses the nodes of the claimed row it shares most with and
    claims the rest as a new path. Returns each row's node indices, its attach depth, and the
    rows that own a (non-empty) path, in layout order. A claimed neighbour under another trie
    key shares nothing (no scan across the keys between: the work stays linear in the rows)."""
    place = {row: i for i, row in enumerate(order)}
    by_length = sorted(range(len(rows)), key=lambda r: (-len(rows[r]), place[r]))
    claimed_places: list[int] = []
    row_nodes: list[np.ndarray] = [np.zeros(0, NODE_DTYPE)] * len(rows)
    attach_depth = [0] * len(rows)
    path_rows: list[int] = []
    next_node = 0
    for r in by_length:
        i = place[r]
        k = bisect.bisect(claimed_places, i)
        best_row, best_depth = -1, 0
        if k > 0 and group[j := claimed_places[k - 1]] == group[i]:
            # the nearest claimed row before it shares the most among earlier ones
            depth = int(shared[j:i].min())
            if depth > best_depth:
                best_row, best_depth = order[j], depth
        if k < len(claimed_places) and group[j := claimed_places[k]] == group[i]:
            depth = int(shared[i:j].min())
            if depth > best_depth:
                best_row, best_depth = order[j], depth
        bisect.insort(claimed_places, i)
        own = len(rows[r]) - best_depth
        row_nodes[r] = np.concatenate(
            [
                row_nodes[best_row][:best_depth],
                np.arange(next_node, next_node + own, dtype=NODE_DTYPE),
            ]
        )
        attach_depth[r] = best_depth
        if own:
            path_rows.append(r)
            next_node += own
    return row_nodes, attach_depth, path_rows


def _concat(parts: list[np.ndarray], dtype: type | None) -> np.ndarray:
    if not parts:
        return np.zeros(0, dtype=dtype or np.float64)
    joined = np.concatenate([np.asarray(p) for p in parts])
    return joined if dtype is None else joined.astype(dtype, copy=False)

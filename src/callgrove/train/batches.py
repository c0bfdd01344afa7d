"""What the model and the loss take, built from a packed varlen batch or a tree-packed batch.

Both layouts reduce to the same pieces: a flat run of tokens with position ids, the token each
one is predicted from (`predecessor`: the previous token of its sequence, or its trie parent),
an attention layout, and one loss target per 1 in a row's loss mask. Everything downstream
(log-probabilities, the loss, its gradients) is written once against these pieces.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from callgrove.batch.packing import MicroBatch
from callgrove.batch.samples import Sample
from callgrove.batch.tree import SAMPLE_VALUES, TreeBatch
from callgrove.episode.record import NO_ROUTE, ROUTE_DTYPE
from callgrove.errors import InvalidValue
from callgrove.networks.tiny import AttentionLayout, TreeLayout, VarlenLayout


@dataclass(slots=True, eq=False)
class ModelBatch:
    token_ids: torch.Tensor  # long (N,): the tokens forwarded
    position_ids: torch.Tensor  # long (N,)
    predecessor: torch.Tensor  # long (N,): the token whose logits predict this one, -1 for none
    layout: AttentionLayout
    row_tokens: torch.Tensor  # long: each row's tokens as indices into the forwarded tokens
    row_bounds: list[int]  # row r is row_tokens[row_bounds[r]:row_bounds[r + 1]]
    target_index: torch.Tensor  # long (T,): forwarded token trained by each target
    target_rows: torch.Tensor  # long (T,): the row each target belongs to
    target_values: dict[str, torch.Tensor]  # name -> (T,): logprobs, advantages, ...
    # A mixture of experts' recorded routes per forwarded token (N, layers, k), or None
    routes: torch.Tensor | None = None

    @property
    def num_rows(self) -> int:
        return len(self.row_bounds) - 1

    @property
    def num_tokens(self) -> int:
        """Tokens forwarded."""
        return len(self.token_ids)

    @property
    def num_row_tokens(self) -> int:
        """Tokens the same rows forward row-wise."""
        return self.row_bounds[-1]

    @property
    def forwarded_token_ratio(self) -> float:
        return self.num_row_tokens / max(self.num_tokens, 1)

    def to(self, device: torch.device | str) -> ModelBatch:
        """The same batch with every tensor on `device`."""
        return replace(
            self,
            token_ids=self.token_ids.to(device),
            position_ids=self.position_ids.to(device),
            predecessor=self.predecessor.to(device),
            layout=self.layout.to(device),
            row_tokens=self.row_tokens.to(device),
            target_index=self.target_index.to(device),
            target_rows=self.target_rows.to(device),
            target_values={name: v.to(device) for name, v in self.target_values.items()},
            routes=None if self.routes is None else self.routes.to(device),
        )


def tree_model_batch(batch: TreeBatch) -> ModelBatch:
    """The model's view of a tree-packed batch: trie nodes, forwarded once each."""
    contexts = [torch.from_numpy(batch.path_context(p)) for p in range(batch.num_paths)]
    return ModelBatch(
        token_ids=torch.from_numpy(batch.token_ids.astype(np.int64)),
        position_ids=torch.from_numpy(batch.position_ids),
        predecessor=torch.from_numpy(batch.parent),
        layout=TreeLayout(batch.path_bounds.tolist(), contexts),
        row_tokens=torch.from_numpy(batch.row_nodes),
        row_bounds=batch.row_bounds.tolist(),
        target_index=torch.from_numpy(batch.target_nodes),
        target_rows=torch.from_numpy(batch.target_rows),
        target_values=_tensors(batch.target_values),
    )


def packed_model_batch(
    token_ids: np.ndarray,
    cu_seqlens: np.ndarray,
    loss_mask: np.ndarray,
    position_ids: np.ndarray | None = None,
    values: dict[str, np.ndarray] | None = None,
) -> ModelBatch:
    """The model's view of sequences laid end to end (`cu_seqlens`, flash-attention style);
    `values` are per-token arrays (sampling logprobs, advantages) read at the loss mask."""
    bounds = np.asarray(cu_seqlens, dtype=np.int64)
    lengths = np.diff(bounds)
    starts = np.repeat(bounds[:-1], lengths)
    index = np.arange(bounds[-1], dtype=np.int64)
    positions = index - starts if position_ids is None else np.asarray(position_ids, np.int64)
    mask = np.asarray(loss_mask[: bounds[-1]]).astype(bool)
    target_index = index[mask]
    if len(target_index) and (target_index == starts[mask]).any():
        row = int(np.searchsorted(bounds, target_index[target_index == starts[mask]][0], "right"))
        raise InvalidValue(f"sequence {row - 1}: loss on its first token, which nothing predicts")
    return ModelBatch(
        token_ids=torch.from_numpy(np.asarray(token_ids[: bounds[-1]], dtype=np.int64)),
        position_ids=torch.from_numpy(positions),
        predecessor=torch.from_numpy(np.where(index == starts, -1, index - 1)),
        layout=VarlenLayout(bounds.tolist()),
        row_tokens=torch.from_numpy(index),
        row_bounds=bounds.tolist(),
        target_index=torch.from_numpy(target_index),
        target_rows=torch.from_numpy(np.repeat(np.arange(len(lengths)), lengths)[mask]),
        target_values=_tensors(
            {k: np.asarray(v)[: bounds[-1]][mask] for k, v in (values or {}).items()}
        ),
    )


def micro_batch_model_batch(micro_batch: MicroBatch) -> ModelBatch:
    """The model's view of one varlen micro-batch of `callgrove.batch.pack` (unpadded)."""
    arrays = micro_batch.arrays
    values = {name: arrays[name] for name in SAMPLE_VALUES if arrays[name] is not None}
    return packed_model_batch(
        arrays["token_ids"],
        micro_batch.cu_seqlens,
        arrays["loss_mask"],
        arrays["position_ids"],
        values,
    )


def attach_routes(batch: ModelBatch, samples: Sequence[Sample]) -> bool:
    """Give the batch the recorded routes of its forwarded tokens from its rows' samples (in
    row order); False, and none given, where two rows holding one forwarded token (a trie
    node) recorded different routes for it."""
    routed = [sample.routes for sample in samples]
    shape = next((r.shape[1:] for r in routed if r is not None), None)
    if shape is None:
        return True
    routes = np.full((batch.num_tokens, *shape), NO_ROUTE, dtype=ROUTE_DTYPE)
    row_tokens = batch.row_tokens.numpy()
    for row, recorded in enumerate(routed):
        if recorded is None:
            continue
        tokens = row_tokens[batch.row_bounds[row] : batch.row_bounds[row + 1]]
        mine = recorded[: len(tokens)]
        known = mine[:, 0, 0] != NO_ROUTE
        held = routes[tokens][:, 0, 0] != NO_ROUTE
        both = known & held
        if both.any() and not np.array_equal(routes[tokens[both]], mine[both]):
            return False
        routes[tokens[known]] = mine[known]
    batch.routes = torch.from_numpy(routes)
    return True


def _tensors(values: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {name: torch.from_numpy(np.ascontiguousarray(v)) for name, v in values.items()}

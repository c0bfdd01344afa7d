"""What crosses the pipes between the driver and its ranks, and how whole tensors travel.

A step goes out as one `Share` per rank and comes back as one `RankStep` per rank. Whole
values leave the ranks gathered (`shipped`): rank 0 writes every tensor into one buffer of
shared memory per dtype, and only the buffers' file descriptors cross the pipe. Whole values
arrive in every rank and are sharded there as the model is (`sharded_like`).

Checkpoints: `state_dict` gathers the full state into the one-process learner's format
(`ModelLearner.state_dict`, `HFLearner.state_dict`), so a checkpoint taken at one world size
loads at any other; `load_state_dict` gives every rank the full state to keep its shards of.
`weights()` is the gathered full state (the adapters alone with LoRA), as the one-process
learner gives it.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.distributed.tensor import DTensor, distribute_tensor

from callgrove.batch import Sample
from callgrove.train.learner import Measured


@dataclass(frozen=True, slots=True)
class Share:
    """One rank's part of a step, and what it needs of the whole step."""

    samples: list[Sample]
    indices: np.ndarray
    """Each sample's index in the step's samples."""
    denominator: float
    loss_tokens: int
    step_samples: int


@dataclass(frozen=True, slots=True)
class RankStep:
    loss: float
    """The whole step's loss (summed across ranks)."""
    grad_norm: float
    forwarded_tokens: int
    row_tokens: int
    measured: list[Measured]
    seconds: dict[str, float]
    peak_memory: dict[str, float]


@dataclass(frozen=True, slots=True)
class Place:
    index: int


@dataclass(frozen=True, slots=True)
class Shipped:
    """A value whose tensors lie end to end in one buffer of shared memory per dtype: what
    crosses the pipe is a file descriptor a buffer, and the bytes are written once (a full
    model's weights every step, for the sampler)."""

    skeleton: Any
    """The value with a `Place` for each tensor."""
    places: list[tuple[torch.dtype, tuple[int, ...], int]]
    """Each tensor's dtype, shape and offset in its dtype's buffer."""
    buffers: dict[torch.dtype, torch.Tensor]

    def value(self) -> Any:
        """The value, its tensors views of the buffers."""
        tensors = [
            self.buffers[dtype][offset : offset + math.prod(shape)].view(shape)
            for dtype, shape, offset in self.places
        ]

        def filled(item: Any) -> Any:
            if isinstance(item, Place):
                return tensors[item.index]
            if isinstance(item, dict):
                return {key: filled(v) for key, v in item.items()}
            if isinstance(item, list | tuple):
                return type(item)(filled(v) for v in item)
            return item

        return filled(self.skeleton)


@torch.no_grad()
def shipped(value: Any, keep: bool) -> Shipped | None:
    """`value` whole where `keep` (rank 0), its tensors in buffers of shared memory (None on the
    other ranks; every rank must call this alike: each DTensor's gather is a collective)."""
    tensors: list[torch.Tensor] = []

    def placed(item: Any) -> Any:
        if isinstance(item, torch.Tensor):
            tensors.append(item)
            return Place(len(tensors) - 1)
        if isinstance(item, dict):
            return {key: placed(v) for key, v in item.items()}
        if isinstance(item, list | tuple):
            return type(item)(placed(v) for v in item)
        return item

    skeleton = placed(value)
    places: list[tuple[torch.dtype, tuple[int, ...], int]] = []
    ends = Counter[torch.dtype]()
    for tensor in tensors:  # a DTensor's shape and dtype are the whole tensor's
        places.append((tensor.dtype, tuple(tensor.shape), ends[tensor.dtype]))
        ends[tensor.dtype] += tensor.numel()
    buffers = {dtype: torch.empty(end, dtype=dtype) for dtype, end in ends.items()}
    for tensor, (dtype, _, offset) in zip(tensors, places, strict=True):
        whole = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
        if keep:
            buffers[dtype][offset : offset + whole.numel()].copy_(whole.detach().reshape(-1))
    if not keep:
        return None
    for buffer in buffers.values():
        buffer.share_memory_()
    return Shipped(skeleton, places, buffers)


def sharded_like(value: Any, reference: Any) -> Any:
    """`value` (whole) sharded as `reference` is, where that is a DTensor, recursively."""
    if isinstance(reference, DTensor) and isinstance(value, torch.Tensor):
        local = value.to(device=reference.device, dtype=reference.dtype)
        # Every rank holds the whole value: each keeps its shard, no communication.
        return distribute_tensor(
            local, reference.device_mesh, reference.placements, src_data_rank=None
        )
    if isinstance(value, dict) and isinstance(reference, dict):
        return {key: sharded_like(v, reference.get(key)) for key, v in value.items()}
    return value

"""The learners (the `train` extra, torch): model batches of packed varlen or tree-packed rows,
per-token log-probabilities, the clipped policy-gradient and supervised losses, a dataset over
sample files that collates either kind of batch, and the learners that take one optimizer step
per step of samples, in this process or across ranks. The networks they train are
`callgrove.networks`.

Its settings (`LearnerSettings`, `LossSettings`) are torch-free, so a training config loads
without torch; the torch-backed names load on first use, and say which extra to install when
torch is missing.
"""

from __future__ import annotations

import importlib
from typing import Any

from callgrove.networks import require_torch
from callgrove.train.settings import NORMALISATIONS, LearnerSettings, LossSettings

_TORCH_NAMES = {
    "ModelBatch": "batches",
    "micro_batch_model_batch": "batches",
    "packed_model_batch": "batches",
    "tree_model_batch": "batches",
    "UNITS": "data",
    "PackedCollate": "data",
    "SampleDataset": "data",
    "TreeCollate": "data",
    "logprobs_from_logits": "loss",
    "policy_loss": "loss",
    "row_logprobs": "loss",
    "supervised_loss": "loss",
    "token_logprobs": "loss",
}


def __getattr__(name: str) -> Any:
    if name not in _TORCH_NAMES:
        raise AttributeError(f"module 'callgrove.train' has no attribute {name!r}")
    require_torch()
    value = getattr(importlib.import_module(f"callgrove.train.{_TORCH_NAMES[name]}"), name)
    globals()[name] = value
    return value


__all__ = [
    "NORMALISATIONS",
    "LearnerSettings",
    "LossSettings",
    *sorted(_TORCH_NAMES),
]

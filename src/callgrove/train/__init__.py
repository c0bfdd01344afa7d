"""A reference trainer (the `train` extra, torch): a tiny decoder-only transformer that runs packed
varlen batches and tree-packed batches, per-token log-probabilities, and a clipped
policy-gradient loss, and a dataset over sample files that collates either kind of batch. The
only stage that imports torch.

Its settings (`LearnerSettings`, `LossSettings`) are torch-free, so a training config loads
without torch; the torch-backed names load on first use, and say which extra to install when
torch is missing.
"""

from __future__ import annotations

import importlib
from typing import Any

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
    "TinyConfig": "settings",
    "TinyDecoder": "model",
    "TreeLayout": "model",
    "VarlenLayout": "model",
}


def require_torch() -> None:
    """Torch is importable, else a `ModuleNotFoundError` saying which extra installs it."""
    try:
        import torch  # noqa: F401
    except ModuleNotFoundError as missing:
        raise ModuleNotFoundError(
            "callgrove.train needs torch, the `train` extra: pip install 'callgrove[train]' "
            "(from a checkout: pip install -e '.[train]')",
            name=missing.name,
        ) from None


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
    "require_torch",
    *sorted(_TORCH_NAMES),
]

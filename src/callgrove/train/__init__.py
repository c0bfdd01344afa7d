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

from callgrove.lazy import lazy_names
from callgrove.networks import require_torch
from callgrove.train.settings import NORMALISATIONS, LearnerSettings, LossSettings

_TORCH_NAMES = {
    "ModelBatch": "callgrove.train.batches",
    "micro_batch_model_batch": "callgrove.train.batches",
    "packed_model_batch": "callgrove.train.batches",
    "tree_model_batch": "callgrove.train.batches",
    "UNITS": "callgrove.train.data",
    "PackedCollate": "callgrove.train.data",
    "SampleDataset": "callgrove.train.data",
    "TreeCollate": "callgrove.train.data",
    "logprobs_from_logits": "callgrove.train.loss",
    "policy_loss": "callgrove.train.loss",
    "row_logprobs": "callgrove.train.loss",
    "supervised_loss": "callgrove.train.loss",
    "token_logprobs": "callgrove.train.loss",
}


__getattr__ = lazy_names(__name__, _TORCH_NAMES, require_torch)

__all__ = [
    "NORMALISATIONS",
    "LearnerSettings",
    "LossSettings",
    *sorted(_TORCH_NAMES),
]

"""A reference trainer (the `train` extra, torch): a tiny decoder-only transformer that runs packed
varlen batches and tree-packed batches, per-token log-probabilities, and a clipped
policy-gradient loss, and a dataset over sample files that collates either kind of batch. The
only stage that imports torch."""

try:
    import torch  # noqa: F401  the one stage that needs it: say how to get it
except ModuleNotFoundError as missing:
    raise ModuleNotFoundError(
        "callgrove.train needs torch, the `train` extra: pip install 'callgrove[train]' "
        "(from a checkout: pip install -e '.[train]')",
        name=missing.name,
    ) from None


from callgrove.train.batches import (
    ModelBatch,
    micro_batch_model_batch,
    packed_model_batch,
    tree_model_batch,
)
from callgrove.train.data import UNITS, PackedCollate, SampleDataset, TreeCollate
from callgrove.train.loss import (
    NORMALISATIONS,
    LossSettings,
    logprobs_from_logits,
    policy_loss,
    row_logprobs,
    supervised_loss,
    token_logprobs,
)
from callgrove.train.model import TinyConfig, TinyDecoder, TreeLayout, VarlenLayout

__all__ = [
    "NORMALISATIONS",
    "UNITS",
    "LossSettings",
    "ModelBatch",
    "PackedCollate",
    "SampleDataset",
    "TinyConfig",
    "TinyDecoder",
    "TreeCollate",
    "TreeLayout",
    "VarlenLayout",
    "logprobs_from_logits",
    "micro_batch_model_batch",
    "packed_model_batch",
    "policy_loss",
    "row_logprobs",
    "supervised_loss",
    "token_logprobs",
    "tree_model_batch",
]

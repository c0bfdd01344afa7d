"""What the tests of trainers with a dual clip (verl, OpenRLHF) share: samples some of whose
ratios pass the dual clip, the shares of trained tokens each clip reaches, and one case's
figures with the assertions every such case must meet."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from callgrove.batch.samples import Sample

from .reference_loss import Agreement, Clip, token_terms

TOLERANCE = 1e-5

# The sampling logprob of every third negative-advantage trained token is lowered by log 5,
# so its ratio (about 5) passes the default dual clip of 3.
FAR_STALE = float(np.log(5.0))


def far_stale(samples: list[Sample]) -> list[Sample]:
    """The samples with some negative-advantage tokens sampled far from the current policy
    (ratio about 5): the dual clip bounds their terms. The others stay within +-0.3."""
    out = []
    for sample in samples:
        negative = np.flatnonzero((sample.loss_mask == 1) & (sample.advantages < 0))
        logprobs = sample.logprobs.copy()
        logprobs[negative[::3]] -= np.float32(FAR_STALE)
        out.append(dataclasses.replace(sample, logprobs=logprobs))
    return out


@dataclasses.dataclass(frozen=True)
class ClipShares:
    clipped: float
    """Share of trained tokens whose term a clip changes (PPO's or the dual one)."""
    dual_clipped: float
    """Share whose term the dual clip bounds."""


def clip_shares(model: torch.nn.Module, samples: list[Sample], clip: Clip) -> ClipShares:
    """Which clips the samples' ratios reach under `clip`, from one forward pass: each
    unclipped term is -ratio x advantage."""
    with torch.no_grad():
        terms = torch.cat([token_terms(model, s, Clip(1e9, 1e9)) for s in samples]).numpy()
    advantages = np.concatenate([s.advantages[1:][s.loss_mask[1:] == 1] for s in samples])
    ratios = -terms / advantages
    positive, negative = advantages > 0, advantages < 0
    dual = negative & (ratios > clip.dual_clip)
    clipped = (positive & (ratios > 1 + clip.clip_high)) | (negative & (ratios < 1 - clip.clip_low))
    return ClipShares(float((clipped | dual).mean()), float(dual.mean()))


@dataclasses.dataclass(frozen=True)
class Case:
    agreement: Agreement
    shares: ClipShares
    micro_batches: int


def assert_agrees(case: Case) -> None:
    assert 0 < case.shares.clipped < 1
    assert case.shares.dual_clipped > 0, "no ratio reached the dual clip"
    assert case.micro_batches > 1
    assert case.agreement.loss <= TOLERANCE, case.agreement
    assert case.agreement.gradient <= TOLERANCE, case.agreement

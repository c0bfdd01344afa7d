"""A plain-torch clipped policy-gradient loss, written from the definitions and nothing of
callgrove's or a trainer's code, that every trainer adapter's test holds the trainer's own loss
against; and the two figures a comparison reports.

Each sample is forwarded alone, whole, unpadded (positions 0, 1, ...). Token t is predicted by
the logits at t - 1, divided by the temperature t itself was sampled at; its importance ratio
is exp(logp - sampling logprob), clipped PPO-style to [1 - clip_low, 1 + clip_high], and, with
`dual_clip` c, a negative advantage's term is bounded by c x |A| (verl's and OpenRLHF's dual
clip). `token` averages the terms over every trained token of the batch; `sequence` within
each sample, then over the samples.

Not every trainer clips: `trust_region="probability_mask"` is DPPO's binary total-variation
mask (arXiv 2602.04879) instead, where a token whose probability rose from the sampler's by more
than `clip_high` (positive advantage) or fell by more than `clip_low` (otherwise) leaves the
policy term, value and gradient, and the ratio is never clipped; `squared_log_ratio` adds that
coefficient times (logp - sampling logprob)^2 on every trained token (a KL-like penalty).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from callgrove.batch import Sample


@dataclass(frozen=True)
class Clip:
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    normalisation: str = "token"
    trust_region: str = "clip"  # or "probability_mask"
    squared_log_ratio: float = 0.0


def token_terms(model: torch.nn.Module, sample: Sample, clip: Clip) -> torch.Tensor:
    """The loss term of each of `sample`'s trained tokens, in order."""
    ids = torch.from_numpy(sample.token_ids.astype(np.int64))
    logits = model(input_ids=ids[None]).logits[0, :-1]
    dtype = logits.dtype
    temperatures = torch.from_numpy(sample.temperatures[1:].astype(np.float64)).to(dtype)
    trained = torch.from_numpy(sample.loss_mask[1:].astype(bool))
    scaled = logits[trained] / temperatures[trained, None]
    logp = torch.log_softmax(scaled, dim=-1).gather(-1, ids[1:][trained, None])[:, 0]
    old = torch.from_numpy(sample.logprobs[1:].astype(np.float64)).to(dtype)[trained]
    advantage = torch.from_numpy(sample.advantages[1:].astype(np.float64)).to(dtype)[trained]
    ratio = torch.exp(logp - old)
    if clip.trust_region == "clip":
        clipped = torch.clamp(ratio, 1 - clip.clip_low, 1 + clip.clip_high)
        terms = torch.maximum(-ratio * advantage, -clipped * advantage)
        if clip.dual_clip is not None:
            bounded = torch.minimum(terms, -clip.dual_clip * advantage)
            terms = torch.where(advantage < 0, bounded, terms)
    elif clip.trust_region == "probability_mask":
        moved = logp.exp() - old.exp()
        outside = torch.where(advantage > 0, moved > clip.clip_high, moved < -clip.clip_low)
        terms = torch.where(outside, torch.zeros_like(ratio), -ratio * advantage)
    else:
        raise ValueError(f"unknown trust region {clip.trust_region!r}")
    if clip.squared_log_ratio:
        terms = terms + clip.squared_log_ratio * (logp - old) ** 2
    return terms


def reference_loss(model: torch.nn.Module, samples: Sequence[Sample], clip: Clip) -> torch.Tensor:
    per_sample = [token_terms(model, sample, clip) for sample in samples]
    if clip.normalisation == "token":
        return torch.cat(per_sample).sum() / sum(len(terms) for terms in per_sample)
    if clip.normalisation == "sequence":
        return torch.stack([terms.mean() for terms in per_sample]).mean()
    raise ValueError(f"unknown normalisation {clip.normalisation!r}")


def clipped_share(model: torch.nn.Module, samples: Sequence[Sample], clip: Clip) -> float:
    """The share of trained tokens whose ratio leaves the clip range, or whose probability the
    mask's (a test asserts it lies strictly between 0 and 1, so clipping is compared, not only
    the plain ratio)."""
    plain = replace(clip, clip_low=1e9, clip_high=1e9, dual_clip=None)
    with torch.no_grad():
        unclipped = torch.cat([token_terms(model, s, plain) for s in samples])
        terms = torch.cat([token_terms(model, s, clip) for s in samples])
    return float((terms != unclipped).double().mean())


@dataclass(frozen=True)
class Agreement:
    """How far a trainer's loss and gradient are from the reference's: the loss's relative
    difference, and the largest over parameters of |g - g_ref| / max(|g_ref|, |whole g_ref|)
    (one backward pass rounds relative to the whole gradient)."""

    loss: float
    gradient: float


def agreement(
    got: torch.Tensor,
    want: torch.Tensor,
    got_model: torch.nn.Module,
    want_model: torch.nn.Module,
) -> Agreement:
    """Compare two losses whose `backward()` has run on the two models (same parameter names)."""
    wanted = {name: p.grad for name, p in want_model.named_parameters() if p.grad is not None}
    whole = torch.cat([g.flatten() for g in wanted.values()]).norm()
    worst = 0.0
    for name, parameter in got_model.named_parameters():
        if name not in wanted:
            continue
        if parameter.grad is None:
            raise AssertionError(f"{name}: the trainer's loss gave it no gradient")
        error = (parameter.grad - wanted[name]).norm()
        worst = max(worst, float(error / max(wanted[name].norm(), whole)))
    return Agreement(float(abs(got.item() - want.item()) / abs(want.item())), worst)

"""Per-token log-probabilities and a clipped policy-gradient loss over any `ModelBatch`.

The policy loss scores every trained token under the distribution it was sampled from (its
temperature, top-p and top-k ride on the batch's targets), with the samplers' own function
(`sampling.distribution`): before any update the learner's log-probability of a token is the
recorded one, up to the two sides' round-off, which `PolicyTerms` lets a step measure."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from callgrove.batch.samples import SAMPLING_FIELDS
from callgrove.errors import InvalidValue
from callgrove.networks.tiny import TinyDecoder
from callgrove.sampling.distribution import cuts, sampling_distribution
from callgrove.train.batches import ModelBatch
from callgrove.train.settings import LossSettings

# Per target token: the distribution it was sampled from.
SAMPLING_VALUES = tuple(SAMPLING_FIELDS)


@dataclass(frozen=True, slots=True)
class Predictions:
    """The model's log-distributions at the predecessors of some tokens, each distinct
    predecessor computed once (once per sampling distribution and scored token, when scored):
    a long row's logits (tokens x vocabulary) are never formed whole, only where a token is
    trained or its log-probability is asked for."""

    log_distribution: torch.Tensor
    """(distinct predecessors, vocabulary)."""
    rows: torch.Tensor
    """For each token, its row of `log_distribution`."""
    predicted: torch.Tensor
    """For each token, whether anything predicts it (a sequence's first token: no)."""
    tokens: torch.Tensor

    def logprobs(self) -> torch.Tensor:
        picked = self.log_distribution[self.rows, self.tokens]
        return torch.where(self.predicted, picked, torch.zeros_like(picked))

    def entropies(self) -> torch.Tensor:
        distribution = self.log_distribution
        # Tokens a cut removed hold -inf: they add nothing (and no NaN to the gradient).
        finite = torch.where(torch.isfinite(distribution), distribution, 0.0)
        entropy = -(distribution.exp() * finite).sum(dim=-1)[self.rows]
        return torch.where(self.predicted, entropy, torch.zeros_like(entropy))


def predictions(
    model: TinyDecoder, batch: ModelBatch, index: torch.Tensor, scored: bool = False
) -> Predictions:
    """Forward `batch` and read the distributions predicting the tokens at `index` (the model
    computes logits only at their distinct predecessors: `at=`). `scored`: `index` is the
    batch's targets, each read under the distribution it was sampled from (its temperature,
    top-p and top-k, `sampling.distribution`); otherwise the model's own distribution."""
    sampling = _target_sampling(batch) if scored else None
    positions, read = _predictors(batch, index, sampling)
    return read(model(batch.token_ids, batch.position_ids, batch.layout, at=positions))


def logprobs_from_logits(
    logits: torch.Tensor, batch: ModelBatch, index: torch.Tensor
) -> torch.Tensor:
    """Log-probability of the tokens at `index`, each read from its predecessor's row of
    `logits` (every forwarded token's; 0 for a token that nothing predicts)."""
    positions, read = _predictors(batch, index, None)
    return read(logits[positions]).logprobs()


def _target_sampling(batch: ModelBatch) -> torch.Tensor | None:
    """(targets, 3): each target's temperature, top-p and top-k; None when the batch carries
    none (the model's own distribution). An unknown one (NaN) is an error: a run fills them
    with its own settings first (`batch.fill_unknown_sampling`)."""
    values = batch.target_values
    if not all(name in values for name in SAMPLING_VALUES):
        return None
    sampling = torch.stack([values[name].to(torch.float64) for name in SAMPLING_VALUES], dim=1)
    if bool(torch.isnan(sampling).any()):
        raise InvalidValue(
            "a trained token's sampling distribution is unknown (its call recorded no "
            "`sampling`): fill it with the run's settings first (fill_unknown_sampling)"
        )
    return sampling


def _predictors(batch: ModelBatch, index: torch.Tensor, sampling: torch.Tensor | None):
    """The distinct positions whose logits predict the tokens at `index` (one per distinct
    sampling distribution and token there, when `sampling` gives each token's), and how to read
    the `Predictions` from the logits at those positions."""
    predecessor = batch.predecessor[index]
    tokens = batch.token_ids[index]
    key = predecessor.clamp(min=0)
    if sampling is None:
        distinct, rows = torch.unique(key, return_inverse=True)
        positions = distinct
    else:
        # Each scored token gets a row of its own context, distribution and token: the token is
        # kept in its cut (`keep`), so siblings sharing a predecessor in a trie must not keep
        # each other in, or a token's score would depend on the layout of its batch.
        settings, setting_of = torch.unique(sampling, dim=0, return_inverse=True)
        triple = torch.stack([key, setting_of, tokens], dim=1)
        distinct, rows = torch.unique(triple, dim=0, return_inverse=True)
        positions = distinct[:, 0]

    def read(logits: torch.Tensor) -> Predictions:
        if sampling is None:
            log_distribution = torch.log_softmax(logits, dim=-1)
        else:
            temperature, top_p, top_k = settings[distinct[:, 1]].unbind(dim=1)
            top_k = top_k.long()
            keep = None
            if cuts(temperature, top_p, top_k):  # the scored tokens stay in (see there)
                keep = torch.zeros(logits.shape, dtype=torch.bool, device=logits.device)
                keep[rows, tokens] = True
            log_distribution = sampling_distribution(logits, temperature, top_p, top_k, keep)
        return Predictions(log_distribution, rows, predecessor >= 0, tokens)

    return positions, read


def token_logprobs(model: TinyDecoder, batch: ModelBatch) -> torch.Tensor:
    """Log-probability of every forwarded token under `model`'s own distribution."""
    return predictions(model, batch, torch.arange(batch.num_tokens)).logprobs()


def row_logprobs(model: TinyDecoder, batch: ModelBatch) -> list[torch.Tensor]:
    """Each row's per-token log-probabilities, in row order, whatever the layout."""
    per_row = token_logprobs(model, batch)[batch.row_tokens]
    return [per_row[s:e] for s, e in zip(batch.row_bounds[:-1], batch.row_bounds[1:], strict=True)]


@dataclass(frozen=True, slots=True)
class PolicyTerms:
    """A batch's policy-gradient loss and what its forward measured, per target token."""

    loss: torch.Tensor
    logprobs: torch.Tensor
    """The learner's log-probabilities of the targets before the update (detached), under the
    distribution each was sampled from."""
    sampler_logprobs: torch.Tensor
    weights: torch.Tensor | None = None
    """The mismatch weight of each target when a correction is on (0: masked)."""
    clipped: torch.Tensor | None = None
    """Per target: whether clipping took its gradient away (the clipped term was the smaller)."""


def policy_loss(
    model: TinyDecoder,
    batch: ModelBatch,
    settings: LossSettings = LossSettings(),
    denominator: float | None = None,
) -> torch.Tensor:
    """The clipped policy-gradient loss of a batch (`policy_terms`)."""
    return policy_terms(model, batch, settings, denominator).loss


def policy_terms(
    model: TinyDecoder,
    batch: ModelBatch,
    settings: LossSettings = LossSettings(),
    denominator: float | None = None,
) -> PolicyTerms:
    """The clipped policy-gradient loss of a batch; needs `logprobs` (sampling) and `advantages`
    on its targets, each target scored under the distribution it was sampled from. `denominator`
    replaces the batch's own count of trained tokens (or of rows that train something): with
    the count over all micro-batches of a step, the micro-batch losses add up to the loss of
    the whole step."""
    missing = {"logprobs", "advantages"} - batch.target_values.keys()
    if missing and len(batch.target_index):
        raise InvalidValue(f"policy loss needs {sorted(missing)} on every trained token")
    if not len(batch.target_index):
        nothing = torch.zeros(0)
        return PolicyTerms(_nothing_trained(model, batch), nothing, nothing)
    predicted = predictions(model, batch, batch.target_index, scored=True)
    logprobs = predicted.logprobs()
    old = batch.target_values["logprobs"].to(logprobs.dtype)
    advantages = batch.target_values["advantages"].to(logprobs.dtype)
    weights = None
    if settings.corrects_mismatch:
        weights = _mismatch_weights(logprobs.detach() - old, batch, settings)
        ratio = torch.exp(logprobs - logprobs.detach())
    else:
        ratio = torch.exp(logprobs - old)
    clipped = ratio.clamp(1.0 - settings.clip_low, 1.0 + settings.clip_high)
    per_token = -torch.minimum(ratio * advantages, clipped * advantages)
    cut = (clipped * advantages < ratio * advantages).detach()
    if weights is not None:
        per_token = per_token * weights
    if settings.entropy_coef:
        per_token = per_token - settings.entropy_coef * predicted.entropies()
    return PolicyTerms(
        _normalised(per_token, batch, settings, denominator), logprobs.detach(), old, weights, cut
    )


def _mismatch_weights(
    log_ratio: torch.Tensor, batch: ModelBatch, settings: LossSettings
) -> torch.Tensor:
    """Each target's mismatch ratio, capped and masked as `settings` say."""
    weights = torch.exp(log_ratio)
    low, high = settings.mismatch_bounds
    if settings.mismatch_mask == "token":
        weights = torch.where((weights < low) | (weights > high), 0.0, weights)
    elif settings.mismatch_mask == "row":
        rows = batch.target_rows
        sums = torch.zeros(
            batch.num_rows, dtype=log_ratio.dtype, device=log_ratio.device
        ).index_add(0, rows, log_ratio)
        counts = torch.bincount(rows, minlength=batch.num_rows).clamp(min=1)
        row_ratio = torch.exp(sums / counts)[rows]
        weights = torch.where((row_ratio < low) | (row_ratio > high), 0.0, weights)
    if settings.mismatch_cap is not None:
        weights = weights.clamp(max=settings.mismatch_cap)
    return weights


def _normalised(
    per_token: torch.Tensor, batch: ModelBatch, settings: LossSettings, denominator: float | None
) -> torch.Tensor:
    if settings.normalisation == "token":
        return per_token.sum() / (denominator or len(per_token))
    row_sums = torch.zeros(
        batch.num_rows, dtype=per_token.dtype, device=per_token.device
    ).index_add(0, batch.target_rows, per_token)
    row_counts = torch.bincount(batch.target_rows, minlength=batch.num_rows)
    training = row_counts > 0
    row_means = row_sums[training] / row_counts[training]
    return row_means.sum() / (denominator or len(row_means))


def supervised_loss(
    model: TinyDecoder, batch: ModelBatch, denominator: float | None = None
) -> torch.Tensor:
    """Cross-entropy on the trained tokens (imported transcripts: no sampling logprobs, no
    advantages), summed and divided by `denominator` (default: the batch's trained tokens; the
    step's count makes micro-batch losses add up to the step's)."""
    if not len(batch.target_index):
        return _nothing_trained(model, batch)
    logprobs = predictions(model, batch, batch.target_index).logprobs()
    return -logprobs.sum() / (denominator or len(logprobs))


def _nothing_trained(model: TinyDecoder, batch: ModelBatch) -> torch.Tensor:
    """A zero loss still tied to the model (a backward pass through it is then a no-op)."""
    first = torch.zeros(1, dtype=torch.long, device=batch.token_ids.device)
    logits = model(batch.token_ids, batch.position_ids, batch.layout, at=first)
    return logits.sum() * 0.0

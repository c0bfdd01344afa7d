"""Per-token log-probabilities and a clipped policy-gradient loss over any `ModelBatch`."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from callgrove.formats.ranges import check_choice, check_range
from callgrove.train.batches import ModelBatch
from callgrove.train.model import TinyDecoder

NORMALISATIONS = ("token", "sequence")


@dataclass(frozen=True, slots=True)
class LossSettings:
    """PPO-style clipping of the importance ratio against the sampling policy, and how the
    per-token terms are averaged: over every trained token of the batch (`token`), or within
    each row and then over the rows that train something (`sequence`).

    `entropy_coef` subtracts that multiple of the entropy of the model's distribution at each
    trained token from the token's term: a policy trained from scratch otherwise tends to
    collapse onto one answer for every task, after which a group's episodes all score alike,
    every advantage is zero and learning stops."""

    clip_low: float = 0.2
    clip_high: float = 0.2
    normalisation: str = "token"
    entropy_coef: float = 0.0

    def __post_init__(self) -> None:
        check_choice("normalisation", self.normalisation, NORMALISATIONS)
        check_range("clip_low", self.clip_low, at_least=0, below=1)
        check_range("clip_high", self.clip_high, at_least=0)
        check_range("entropy_coef", self.entropy_coef, at_least=0)


@dataclass(frozen=True, slots=True)
class Predictions:
    """The model's log-distributions at the predecessors of some tokens, each distinct
    predecessor computed once: a long row's logits (tokens x vocabulary) are never formed whole,
    only where a token is trained or its log-probability is asked for."""

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
        entropy = -(distribution.exp() * distribution).sum(dim=-1)[self.rows]
        return torch.where(self.predicted, entropy, torch.zeros_like(entropy))


def predictions(model: TinyDecoder, batch: ModelBatch, index: torch.Tensor) -> Predictions:
    """Forward `batch` and read the distributions predicting the tokens at `index` (the model
    computes logits only at their distinct predecessors: `at=`)."""
    positions, read = _predictors(batch, index)
    return read(model(batch.token_ids, batch.position_ids, batch.layout, at=positions))


def logprobs_from_logits(
    logits: torch.Tensor, batch: ModelBatch, index: torch.Tensor
) -> torch.Tensor:
    """Log-probability of the tokens at `index`, each read from its predecessor's row of
    `logits` (every forwarded token's; 0 for a token that nothing predicts)."""
    positions, read = _predictors(batch, index)
    return read(logits[positions]).logprobs()


def _predictors(batch: ModelBatch, index: torch.Tensor):
    """The distinct positions whose logits predict the tokens at `index`, and how to read the
    `Predictions` from the logits at those positions."""
    predecessor = batch.predecessor[index]
    positions, rows = torch.unique(predecessor.clamp(min=0), return_inverse=True)

    def read(logits: torch.Tensor) -> Predictions:
        return Predictions(
            torch.log_softmax(logits, dim=-1), rows, predecessor >= 0, batch.token_ids[index]
        )

    return positions, read


def token_logprobs(model: TinyDecoder, batch: ModelBatch) -> torch.Tensor:
    """Log-probability of every forwarded token under `model`."""
    return predictions(model, batch, torch.arange(batch.num_tokens)).logprobs()


def row_logprobs(model: TinyDecoder, batch: ModelBatch) -> list[torch.Tensor]:
    """Each row's per-token log-probabilities, in row order, whatever the layout."""
    per_row = token_logprobs(model, batch)[batch.row_tokens]
    return [per_row[s:e] for s, e in zip(batch.row_bounds[:-1], batch.row_bounds[1:], strict=True)]


def policy_loss(
    model: TinyDecoder,
    batch: ModelBatch,
    settings: LossSettings = LossSettings(),
    denominator: float | None = None,
) -> torch.Tensor:
    """The clipped policy-gradient loss of a batch; needs `logprobs` (sampling) and `advantages`
    on its targets. `denominator` replaces the batch's own count of trained tokens (or of rows
    that train something): with the count over all micro-batches of a step, the micro-batch
    losses add up to the loss of the whole step."""
    missing = {"logprobs", "advantages"} - batch.target_values.keys()
    if missing and len(batch.target_index):
        raise ValueError(f"policy loss needs {sorted(missing)} on every trained token")
    if not len(batch.target_index):
        return _nothing_trained(model, batch)
    predicted = predictions(model, batch, batch.target_index)
    logprobs = predicted.logprobs()
    old = batch.target_values["logprobs"].to(logprobs.dtype)
    advantages = batch.target_values["advantages"].to(logprobs.dtype)
    ratio = torch.exp(logprobs - old)
    clipped = ratio.clamp(1.0 - settings.clip_low, 1.0 + settings.clip_high)
    per_token = -torch.minimum(ratio * advantages, clipped * advantages)
    if settings.entropy_coef:
        per_token = per_token - settings.entropy_coef * predicted.entropies()
    if settings.normalisation == "token":
        return per_token.sum() / (denominator or len(per_token))
    row_sums = torch.zeros(batch.num_rows, dtype=per_token.dtype).index_add(
        0, batch.target_rows, per_token
    )
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
    logits = model(
        batch.token_ids, batch.position_ids, batch.layout, at=torch.zeros(1, dtype=torch.long)
    )
    return logits.sum() * 0.0

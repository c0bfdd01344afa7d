"""Per-token log-probabilities and a clipped policy-gradient loss over any `ModelBatch`."""

from __future__ import annotations

from dataclasses import dataclass

import torch

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
        if self.normalisation not in NORMALISATIONS:
            raise ValueError(f"normalisation must be one of {NORMALISATIONS}")
        if self.entropy_coef < 0:
            raise ValueError("entropy_coef must not be negative")


def predicted_log_softmax(
    logits: torch.Tensor, batch: ModelBatch, index: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The log-distribution over the vocabulary that predicts each token at `index` (read from
    its predecessor's logits), and which of those tokens have a predecessor at all."""
    predecessor = batch.predecessor[index]
    return torch.log_softmax(logits[predecessor.clamp(min=0)], dim=-1), predecessor >= 0


def logprobs_from_logits(
    logits: torch.Tensor, batch: ModelBatch, index: torch.Tensor
) -> torch.Tensor:
    """Log-probability of the tokens at `index`, each read from its predecessor's logits
    (0 for a token that nothing predicts)."""
    return pick(*predicted_log_softmax(logits, batch, index), batch.token_ids[index])


def pick(log_distribution: torch.Tensor, predicted: torch.Tensor, tokens: torch.Tensor):
    """Each token's log-probability in its row of `log_distribution` (0 where nothing predicts
    the token)."""
    picked = log_distribution.gather(1, tokens[:, None])[:, 0]
    return torch.where(predicted, picked, torch.zeros_like(picked))


def entropies(log_distribution: torch.Tensor, predicted: torch.Tensor) -> torch.Tensor:
    """Entropy of each row of a log-distribution (0 where nothing predicts the token)."""
    entropy = -(log_distribution.exp() * log_distribution).sum(dim=-1)
    return torch.where(predicted, entropy, torch.zeros_like(entropy))


def token_logprobs(model: TinyDecoder, batch: ModelBatch) -> torch.Tensor:
    """Log-probability of every forwarded token under `model`."""
    logits = model(batch.token_ids, batch.position_ids, batch.layout)
    return logprobs_from_logits(logits, batch, torch.arange(batch.num_tokens))


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
    logits = model(batch.token_ids, batch.position_ids, batch.layout)
    if not len(batch.target_index):
        return logits.sum() * 0.0
    distribution, predicted = predicted_log_softmax(logits, batch, batch.target_index)
    logprobs = pick(distribution, predicted, batch.token_ids[batch.target_index])
    old = batch.target_values["logprobs"].to(logprobs.dtype)
    advantages = batch.target_values["advantages"].to(logprobs.dtype)
    ratio = torch.exp(logprobs - old)
    clipped = ratio.clamp(1.0 - settings.clip_low, 1.0 + settings.clip_high)
    per_token = -torch.minimum(ratio * advantages, clipped * advantages)
    if settings.entropy_coef:
        per_token = per_token - settings.entropy_coef * entropies(distribution, predicted)
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
    logits = model(batch.token_ids, batch.position_ids, batch.layout)
    if not len(batch.target_index):
        return logits.sum() * 0.0
    logprobs = logprobs_from_logits(logits, batch, batch.target_index)
    return -logprobs.sum() / (denominator or len(logprobs))

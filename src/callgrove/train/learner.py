"""The reference learner: the tiny decoder, AdamW, and one optimizer step per call of
`train_step` over tree-packed (default) or packed micro-batches.

It satisfies `callgrove.policy.Learner` (see there for the contract). Tree packing forwards
each distinct token of the step's rows once, a trie per group of episodes (a group's episodes
share their task prompt), or with tree scope `step` a trie per micro-batch of `seq_len` nodes
shared by rows of every group; packing lays rows end to end in micro-batches of `seq_len` tokens.
Either way the loss of a step has one denominator over all its micro-batches, so gradient
accumulation gives the gradient of the whole step. The objective is the clipped policy-gradient
loss (`rl`: sampling logprobs and advantages on the loss tokens) or cross-entropy on the loss
tokens (`sft`: imported transcripts, no advantages; a mean over the step's loss tokens).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from callgrove.batch import PackSettings, Sample, pack
from callgrove.batch.tree import TreeSettings, pack_micro_batches
from callgrove.train.batches import ModelBatch, micro_batch_model_batch, tree_model_batch
from callgrove.train.loss import PolicyTerms, policy_terms, supervised_loss
from callgrove.train.model import TinyConfig, TinyDecoder
from callgrove.train.settings import LearnerSettings

# A step's phases as `StepReport.seconds` names them: packing the rows into model batches, the
# forward and backward passes, and gradient clipping with the optimizer's update.
LEARNER_PHASES = ("batching", "forward_backward", "optimizer")


@dataclass(slots=True)
class StepReport:
    """What one optimizer step did."""

    loss: float
    samples: int
    loss_tokens: int
    forwarded_tokens: int
    """Tokens the model forwarded (distinct trie nodes when tree-packed)."""
    row_tokens: int
    """Tokens the same rows hold row-wise."""
    grad_norm: float = 0.0
    mismatch: dict[str, float] = field(default_factory=dict)
    """The learner against the sampler on every trained token, before the update
    (`mismatch_metrics`)."""
    extra: dict[str, float] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    """Where the step's time went, by phase (`LEARNER_PHASES`)."""

    @property
    def forwarded_token_ratio(self) -> float:
        """Row-wise tokens per forwarded token: 1.0 row-wise, above 1 when tree packing saves."""
        return self.row_tokens / max(self.forwarded_tokens, 1)


class ModelLearner:
    """A model that takes token ids, position ids and an attention layout (the tiny decoder, a
    Hugging Face model behind `HFPolicyModel`), AdamW over its trainable parameters, and its
    version."""

    def __init__(self, model: nn.Module, settings: LearnerSettings = LearnerSettings()):
        self.settings = settings
        self.model = model
        self.trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
        self.optimizer = torch.optim.AdamW(
            self.trainable.values(),
            lr=settings.learning_rate,
            weight_decay=settings.weight_decay,
        )
        self._version = 0

    @property
    def version(self) -> int:
        return self._version

    def model_batches(self, samples: Sequence[Sample]) -> list[ModelBatch]:
        return [batch for batch, _ in self.batches_with_samples(samples)]

    def batches_with_samples(
        self, samples: Sequence[Sample]
    ) -> list[tuple[ModelBatch, np.ndarray]]:
        """The step's model batches, each with the index in `samples` of each of its rows."""
        if not samples:
            return []
        if self.settings.batching == "tree":
            settings = TreeSettings(self.settings.tree_scope)
            dealt = pack_micro_batches(samples, settings, self.settings.seq_len)
            return [(tree_model_batch(tree), rows) for tree, rows in dealt]
        packed = pack(samples, PackSettings(seq_len=self.settings.seq_len))
        return [
            (micro_batch_model_batch(mb), mb.samples) for mb in packed.ranks[0] if mb.num_tokens
        ]

    def loss(self, batch: ModelBatch, denominator: float) -> PolicyTerms | torch.Tensor:
        """The batch's loss: `PolicyTerms` for the RL objective, a tensor for SFT."""
        if self.settings.objective == "sft":
            return supervised_loss(self.model, batch, denominator)
        return policy_terms(self.model, batch, self.settings, denominator)

    def train_step(self, samples: Sequence[Sample]) -> StepReport:
        """One optimizer step over `samples`; `FloatingPointError` (and no step) when the loss
        or the gradient is not finite."""
        started = time.perf_counter()
        with_samples = self.batches_with_samples(samples)
        batches = [batch for batch, _ in with_samples]
        loss_tokens = sum(s.num_loss_tokens for s in samples)
        denominator = self._denominator(samples, loss_tokens)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        batched = time.perf_counter()
        total = 0.0
        measured = []
        for batch, rows_of in with_samples:
            terms = self.loss(batch, denominator)
            loss = terms if isinstance(terms, torch.Tensor) else terms.loss
            loss.backward()
            total += float(loss.detach())
            if isinstance(terms, PolicyTerms):
                versions = batch.target_values.get("policy_versions")
                measured.append(
                    Measured(
                        terms,
                        rows_of[batch.target_rows.numpy()],
                        None if versions is None else versions.numpy(),
                    )
                )
        grad_norm = 0.0
        forwarded = time.perf_counter()
        if batches and loss_tokens:
            grad_norm = float(
                torch.nn.utils.clip_grad_norm_(self.trainable.values(), self.settings.max_grad_norm)
            )
            if not (math.isfinite(total) and math.isfinite(grad_norm)):
                # Stepping would write nan into every weight, and all later steps with them.
                self.optimizer.zero_grad(set_to_none=True)
                raise FloatingPointError(
                    f"loss {total} and gradient norm {grad_norm} of {len(samples)} samples are "
                    "not both finite: no optimizer step taken"
                )
            self.optimizer.step()
        self._version += 1
        stepped = time.perf_counter()
        return StepReport(
            loss=total,
            samples=len(samples),
            loss_tokens=loss_tokens,
            forwarded_tokens=sum(b.num_tokens for b in batches),
            row_tokens=sum(b.num_row_tokens for b in batches),
            grad_norm=grad_norm,
            mismatch=mismatch_metrics(measured, samples, self._version - 1),
            extra=_clip_fraction(measured),
            seconds=dict(
                zip(
                    LEARNER_PHASES,
                    (batched - started, forwarded - batched, stepped - forwarded),
                    strict=True,
                )
            ),
        )

    def _denominator(self, samples: Sequence[Sample], loss_tokens: int) -> float:
        if self.settings.objective == "sft" or self.settings.normalisation == "token":
            return float(max(loss_tokens, 1))
        return float(max(sum(1 for s in samples if s.num_loss_tokens), 1))

    def weights(self) -> dict[str, torch.Tensor]:
        return {name: t.detach().clone() for name, t in self.model.state_dict().items()}

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "version": self._version,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self._version = int(state["version"])


@dataclass(frozen=True, slots=True)
class Measured:
    """What one batch's forward measured on its targets, and whose they are."""

    terms: PolicyTerms
    samples: np.ndarray
    """The index in the step's samples of each target's row."""
    versions: np.ndarray | None
    """The policy version that sampled each target (None: not carried)."""


def mismatch_metrics(
    measured: Sequence[Measured], samples: Sequence[Sample], version: int
) -> dict[str, float]:
    """The learner's log-probability of each trained token against the sampler's, measured in
    the step's forward before its update: the mean and largest absolute difference, the k3
    estimate of KL(sampler || learner) (the mean of m - 1 - log m, m the ratio of the learner's
    probability to the sampler's; 0 when they agree), the mean of m (1 when they agree), and,
    with a correction on, the share of tokens it masked. Over every trained token (`all`), per
    seat, and over the tokens sampled by the very weights being trained (`on_policy`, version
    `version`): there the two sides differ only by how they compute, while the others also
    hold the policy's change since an older version sampled them."""
    if not measured:
        return {}
    difference = np.concatenate(
        [
            m.terms.logprobs.double().numpy() - m.terms.sampler_logprobs.double().numpy()
            for m in measured
        ]
    )
    weights = [m.terms.weights for m in measured]
    masked = (
        np.concatenate([w.numpy() == 0 for w in weights])
        if all(w is not None for w in weights)
        else None
    )
    seats = np.asarray([s.seat for s in samples], dtype=object)[
        np.concatenate([m.samples for m in measured])
    ]
    groups = {"all": slice(None)}
    groups |= {seat: seats == seat for seat in sorted(set(seats.tolist()))}
    if all(m.versions is not None for m in measured):
        groups["on_policy"] = np.concatenate([m.versions for m in measured]) == version
    metrics: dict[str, float] = {}
    for name, chosen in groups.items():
        d = difference[chosen]
        if not d.size:
            continue
        metrics[f"{name}/mean_abs"] = float(np.abs(d).mean())
        metrics[f"{name}/max_abs"] = float(np.abs(d).max())
        metrics[f"{name}/k3"] = float(np.mean(np.expm1(d) - d))
        metrics[f"{name}/ratio_mean"] = float(np.mean(np.exp(d)))
        if masked is not None:
            metrics[f"{name}/masked"] = float(masked[chosen].mean())
    return metrics


class TinyLearner(ModelLearner):
    """A `TinyDecoder` in training, its optimizer and its version."""

    def __init__(
        self, config: TinyConfig, settings: LearnerSettings = LearnerSettings(), seed: int = 0
    ):
        torch.manual_seed(seed)
        self.config = config
        super().__init__(TinyDecoder(config), settings)


def _clip_fraction(measured: Sequence[Measured]) -> dict[str, float]:
    """The share of trained tokens whose gradient clipping took away (`clip_fraction`)."""
    cut = [m.terms.clipped for m in measured if m.terms.clipped is not None]
    tokens = sum(len(c) for c in cut)
    return {"clip_fraction": float(sum(int(c.sum()) for c in cut)) / tokens} if tokens else {}

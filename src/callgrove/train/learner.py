"""The reference learner: the tiny decoder, AdamW, and one optimizer step per call of
`train_step` over tree-packed (default) or packed micro-batches.

It satisfies `callgrove.models.Learner` (see there for the contract). Tree packing forwards
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
from callgrove.networks.moe import Routing
from callgrove.networks.sizes import TinyConfig
from callgrove.networks.tiny import TinyDecoder
from callgrove.train.batches import (
    ModelBatch,
    attach_routes,
    micro_batch_model_batch,
    packed_model_batch,
    tree_model_batch,
)
from callgrove.train.loss import PolicyTerms, policy_terms, supervised_loss
from callgrove.train.settings import LearnerSettings

# A step's phases as `StepReport.seconds` names them: packing the rows into model batches, the
# forward and backward passes, and gradient clipping with the optimizer's update.
LEARNER_PHASES = ("batching", "forward_backward", "optimizer")
# One token and nothing trained: a pass whose gradient is zero (`ModelLearner.accumulate`).
IDLE_BATCH = packed_model_batch(np.zeros(1, np.int64), np.array([0, 1]), np.zeros(1, np.uint8))


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


@dataclass(slots=True)
class RouteTally:
    """A mixture of experts' routes in the learner since the last report: token-layers
    forwarded, those with a recorded route, those whose learner's own top-k differs from it,
    and steps whose tree packing gave way to packed rows (rows sharing a token routed it
    otherwise)."""

    forwarded: int = 0
    recorded: int = 0
    differing: int = 0
    tree_fallbacks: int = 0
    rows_without: int = 0  # rows whose calls recorded no routes: trained by the learner's own

    def add(self, routing: Routing, batch: ModelBatch) -> None:
        self.forwarded += batch.num_tokens * routing.layers
        self.recorded += routing.replayed
        self.differing += routing.differing

    def metrics(self) -> dict[str, float]:
        """`routes/recorded_share`, `routes/topk_differs` (of the recorded),
        `routes/tree_fallbacks` and `routes/rows_without`; the tally starts again."""
        if not self.forwarded:
            return {}
        found = {
            "routes/recorded_share": self.recorded / self.forwarded,
            "routes/topk_differs": self.differing / self.recorded if self.recorded else math.nan,
            "routes/tree_fallbacks": float(self.tree_fallbacks),
            "routes/rows_without": float(self.rows_without),
        }
        self.forwarded = self.recorded = self.differing = self.tree_fallbacks = 0
        self.rows_without = 0
        return found


class ModelLearner:
    """A model that takes token ids, position ids and an attention layout (the tiny decoder, a
    Hugging Face model behind `HFPolicyModel`), AdamW over its trainable parameters, and its
    version."""

    def __init__(self, model: nn.Module, settings: LearnerSettings = LearnerSettings()):
        self.settings = settings
        self.model = model
        self.routing = Routing.of(model)  # a mixture of experts' routers, None for a dense model
        self.routes = RouteTally()
        self.build_optimizer()
        self._version = 0

    def build_optimizer(self) -> None:
        """AdamW over the model's trainable parameters, as they are now (sharding the model
        replaces them, and a fresh optimizer is built over the shards)."""
        self.trainable = {n: p for n, p in self.model.named_parameters() if p.requires_grad}
        self.optimizer = torch.optim.AdamW(
            self.trainable.values(),
            lr=self.settings.learning_rate,
            weight_decay=self.settings.weight_decay,
        )

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
        if self.routing is not None:
            self.routes.rows_without += sum(sample.routes is None for sample in samples)
        if self.settings.batching == "tree":
            settings = TreeSettings(self.settings.tree_scope)
            dealt = pack_micro_batches(samples, settings, self.settings.seq_len)
            batches = [(tree_model_batch(tree), rows) for tree, rows in dealt]
            if self._routed(batches, samples):
                return batches
            self.routes.tree_fallbacks += 1  # rows sharing a token routed it otherwise: unshared
        packed = pack(samples, PackSettings(seq_len=self.settings.seq_len))
        batches = [
            (micro_batch_model_batch(mb), mb.samples) for mb in packed.ranks[0] if mb.num_tokens
        ]
        self._routed(batches, samples)
        return batches

    def _routed(
        self, batches: list[tuple[ModelBatch, np.ndarray]], samples: Sequence[Sample]
    ) -> bool:
        """Each batch given its rows' recorded routes (a mixture of experts); False where rows
        sharing a forwarded token hold different ones."""
        if self.routing is None:
            return True
        return all(attach_routes(batch, [samples[i] for i in rows]) for batch, rows in batches)

    def loss(self, batch: ModelBatch, denominator: float) -> PolicyTerms | torch.Tensor:
        """The batch's loss: `PolicyTerms` for the RL objective, a tensor for SFT."""
        if self.settings.objective == "sft":
            return supervised_loss(self.model, batch, denominator)
        return policy_terms(self.model, batch, self.settings, denominator)

    def train_step(self, samples: Sequence[Sample]) -> StepReport:
        """One optimizer step over `samples`; `FloatingPointError` (and no step) when the loss
        or the gradient is not finite."""
        started = time.perf_counter()
        reset_peak_memory(self.device)
        with_samples = self.batches_with_samples(samples)
        loss_tokens = sum(s.num_loss_tokens for s in samples)
        batched = time.perf_counter()
        total, measured = self.accumulate(with_samples, step_denominator(self.settings, samples))
        forwarded = time.perf_counter()
        grad_norm = self.update(total, bool(with_samples) and loss_tokens > 0, len(samples))
        self._version += 1
        stepped = time.perf_counter()
        batches = [batch for batch, _ in with_samples]
        return StepReport(
            loss=total,
            samples=len(samples),
            loss_tokens=loss_tokens,
            forwarded_tokens=sum(b.num_tokens for b in batches),
            row_tokens=sum(b.num_row_tokens for b in batches),
            grad_norm=grad_norm,
            mismatch=mismatch_metrics(measured, samples, self._version - 1),
            extra=clip_fraction(measured) | peak_memory(self.device) | self.routes.metrics(),
            seconds=dict(
                zip(
                    LEARNER_PHASES,
                    (batched - started, forwarded - batched, stepped - forwarded),
                    strict=True,
                )
            ),
        )

    @property
    def device(self) -> torch.device:
        """Where the model's parameters are (batches are built on the CPU and moved there)."""
        return next(self.model.parameters()).device

    def accumulate(
        self,
        with_samples: Sequence[tuple[ModelBatch, np.ndarray]],
        denominator: float,
        idle_passes: int = 0,
    ) -> tuple[float, list[Measured]]:
        """Forward and backward every batch, the gradients adding up on the parameters (zeroed
        first): the summed loss and what each forward measured. `idle_passes` more passes of
        no loss (a zero gradient) keep a rank with fewer batches in step with the others,
        whose sharded forwards and backwards it takes part in."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        total = 0.0
        measured = []
        for batch, rows_of in with_samples:
            terms = self._backward(batch, denominator)
            if isinstance(terms, torch.Tensor):
                total += float(terms.detach())
                continue
            total += float(terms.loss.detach())
            versions = batch.target_values.get("policy_versions")
            rows = rows_of[batch.target_rows.numpy()]
            measured.append(Measured.of(terms, rows, None if versions is None else versions))
        for _ in range(idle_passes):
            self._backward(IDLE_BATCH, denominator)
        return total, measured

    def _backward(self, batch: ModelBatch, denominator: float) -> PolicyTerms | torch.Tensor:
        if self.routing is None:
            return self._loss_backward(batch, denominator)
        # around the backward too: a checkpointed layer's forward runs again inside it
        with self.routing.replaying(batch.routes, force=self.settings.route_replay):
            terms = self._loss_backward(batch, denominator)
        self.routes.add(self.routing, batch)
        return terms

    def _loss_backward(self, batch: ModelBatch, denominator: float) -> PolicyTerms | torch.Tensor:
        terms = self.loss(batch.to(self.device), denominator)
        (terms if isinstance(terms, torch.Tensor) else terms.loss).backward()
        return terms

    def update(self, total: float, stepping: bool, samples: int) -> float:
        """Clip the accumulated gradient and take the optimizer step (none unless `stepping`);
        the gradient's norm before clipping. `total`: the whole step's loss, `samples` its
        count (for the error)."""
        if not stepping:
            return 0.0
        norm = torch.nn.utils.clip_grad_norm_(self.trainable.values(), self.settings.max_grad_norm)
        # A sharded model's norm is a DTensor of the whole gradient's norm (`full_tensor`).
        full = getattr(norm, "full_tensor", None)
        grad_norm = float(norm if full is None else full())
        if not (math.isfinite(total) and math.isfinite(grad_norm)):
            # Stepping would write nan into every weight, and all later steps with them.
            self.optimizer.zero_grad(set_to_none=True)
            raise FloatingPointError(
                f"loss {total} and gradient norm {grad_norm} of {samples} samples are "
                "not both finite: no optimizer step taken"
            )
        self.optimizer.step()
        return grad_norm

    def weights(self) -> dict[str, torch.Tensor]:
        """Copies of `trained_weights()`, for a sampler's `load_weights`."""
        return {name: t.detach().clone() for name, t in self.trained_weights().items()}

    def trained_weights(self) -> dict[str, torch.Tensor]:
        """The weights a sampler takes, as the model holds them (the model's state)."""
        return self.model.state_dict()

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
    """What one batch's forward measured on its targets, and whose they are, as arrays (a rank
    of a sharded learner sends them to the process that reports the step)."""

    difference: np.ndarray
    """float64: the learner's log-probability of each target less the sampler's."""
    masked: np.ndarray | None
    """Per target: whether a mismatch correction masked it (None: no correction on)."""
    clipped: np.ndarray | None
    """Per target: whether clipping took its gradient away (None: not measured)."""
    samples: np.ndarray
    """The index in the step's samples of each target's row."""
    versions: np.ndarray | None
    """The policy version that sampled each target (None: not carried)."""

    @classmethod
    def of(cls, terms: PolicyTerms, samples: np.ndarray, versions: torch.Tensor | None) -> Measured:
        def array(tensor: torch.Tensor) -> np.ndarray:
            return tensor.detach().cpu().numpy()

        return cls(
            array(terms.logprobs.double()) - array(terms.sampler_logprobs.double()),
            None if terms.weights is None else array(terms.weights == 0),
            None if terms.clipped is None else array(terms.clipped),
            samples,
            None if versions is None else array(versions),
        )


def step_denominator(settings: LearnerSettings, samples: Sequence[Sample]) -> float:
    """What every micro-batch's loss of a step is divided by, so that they add up to the step's
    loss: its trained tokens (`token` normalisation, and SFT), or its rows that train something
    (`sequence`)."""
    if settings.objective == "sft" or settings.normalisation == "token":
        return float(max(sum(s.num_loss_tokens for s in samples), 1))
    return float(max(sum(1 for s in samples if s.num_loss_tokens), 1))


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
    difference = np.concatenate([m.difference for m in measured])
    masks = [m.masked for m in measured]
    masked = np.concatenate(masks) if all(m is not None for m in masks) else None
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


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> dict[str, float]:
    """On a GPU, the most memory torch held there since `reset_peak_memory`
    (`peak_memory_gib`)."""
    if device.type != "cuda":
        return {}
    return {"peak_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30}


def clip_fraction(measured: Sequence[Measured]) -> dict[str, float]:
    """The share of trained tokens whose gradient clipping took away (`clip_fraction`)."""
    cut = [m.clipped for m in measured if m.clipped is not None]
    tokens = sum(len(c) for c in cut)
    return {"clip_fraction": float(sum(int(c.sum()) for c in cut)) / tokens} if tokens else {}

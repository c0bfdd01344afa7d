"""The trainer seam: what the loop needs of a model that samples and learns.

A policy backend is two objects. The sampler is a `PolicyClient` (environments call it, concurrent
calls may be batched). The `Learner` owns the weights being trained and the optimizer:

    report = learner.train_step(samples)        # one optimizer step on a step's samples
    await sampler.load_weights(learner.weights(), learner.version)

`train_step` takes the step's `callgrove.batch.Sample`s (one per training row, advantages and
sampling logprobs on the loss tokens), forwards them however the backend batches (tree-packed or
packed micro-batches with a step-wide loss denominator), takes exactly one optimizer step and
bumps `version` by one, also when every sample was dropped: the version counts training steps, so
an episode begun on version v and trained at step s missed (s - 1) - v updates
(`callgrove.episode.off_policy_steps`). The sampler loads new weights only between decoding
rounds, so a call never spans two versions.

`state_dict` / `load_state_dict` hold everything a checkpoint needs to continue (weights,
optimizer, version) as torch-serialisable values. `callgrove.models.open_model` builds
them for each kind of a config's `[model]`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from callgrove.batch import Sample
from callgrove.chat import ChatFormat
from callgrove.policy.client import TrainableSampler

if TYPE_CHECKING:  # torch stays unimported for clients that only sample
    from callgrove.train.learner import StepReport


@runtime_checkable
class Learner(Protocol):
    """The weights being trained, and their optimizer."""

    @property
    def version(self) -> int:
        """Training steps taken; the version of `weights()`."""
        ...

    def train_step(self, samples: Sequence[Sample]) -> StepReport:
        """One optimizer step on `samples`; bumps `version` by one."""
        ...

    def weights(self) -> Any:
        """The current weights in the form the paired sampler's `load_weights` takes."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass
class PolicyBackend:
    """What `callgrove.models.open_model` opens of a model: its chat format, and the
    sampler and learner where asked for (a training run asks for both)."""

    chat: ChatFormat
    """How the model's conversations become tokens: sampled prompts and imported transcripts
    (supervised training) alike."""
    sampler: TrainableSampler = None  # type: ignore[assignment]  # None where not asked for
    learner: Learner = None  # type: ignore[assignment]  # None where not asked for
    context: int | None = None
    """The most tokens of prompt and completion the model takes, where known."""

"""The run's model and its learner's step: what `callgrove train` opens of `[model]` and
`[train]`, and one optimizer step that stops the run with a message where it cannot be taken."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from callgrove.batch import Sample
from callgrove.batch.packing import OverlongError, refuse_overlong
from callgrove.models import Learner, PolicyBackend, open_model
from callgrove.orchestrator.config import ConfigError, TrainConfig
from callgrove.orchestrator.errors import RunError
from callgrove.policy.client import TrainableSampler
from callgrove.policy.vllm import VllmError
from callgrove.train.settings import LearnerSettings

if TYPE_CHECKING:
    from callgrove.train.learner import StepReport


def policy_backend(config: TrainConfig, sampler: TrainableSampler | None = None) -> PolicyBackend:
    """The run's learner, chat format and sampler (`sampler`, where one runs elsewhere: Ray's
    sampler actor, which starts any vLLM servers; the driver then keeps the learner alone)."""
    try:
        return open_model(config.model, seed=config.run.seed, learner=config.train, sampler=sampler)
    except (ValueError, FileNotFoundError) as error:
        raise ConfigError(f"model: {error}") from None
    except VllmError as error:  # a server that did not start: its log's end is in the message
        raise RunError(str(error)) from None


def learner_step(
    step: int, learner: Learner, samples: Sequence[Sample], train: LearnerSettings
) -> StepReport:
    """One optimizer step; a row longer than `train.seq_len` (`check_row_lengths`), or a loss or
    gradient that is not finite, stops the run there (the learner took no step, so nothing of
    it is saved)."""
    stops = f"the run stops here, its checkpoint is of step {step - 1}"
    check_row_lengths(samples, train, f"step {step}", stops)
    try:
        return learner.train_step(samples)
    except FloatingPointError as error:
        raise RunError(f"step {step}: {error}; {stops}") from None


def check_row_lengths(
    samples: Sequence[Sample], train: LearnerSettings, where: str, then: str
) -> None:
    """Refuse rows longer than `train.seq_len` where it bounds a micro-batch (packed rows end to
    end, or the trie of tree scope `step`): a `RunError` naming `where` the rows are from, the
    longest row and what to set; `then` says what happens now."""
    if train.batching == "tree" and train.tree_scope != "step":
        return
    try:
        refuse_overlong(samples, train.seq_len)
    except OverlongError as error:
        batch = "packed rows" if train.batching == "packed" else "tree scope step's trie"
        more = f" (and {error.count - 1} more rows)" if error.count > 1 else ""
        raise RunError(
            f"{where}: episode {error.episode} row {error.row} is {error.tokens} tokens, longer "
            f"than train.seq_len {error.seq_len}{more}, which bounds a micro-batch of {batch}: "
            f"set train.seq_len to at least {error.tokens}; {then}"
        ) from None

"""The policy-client interface: token ids in, token ids and sampling log-probabilities out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

from callgrove.formats.ranges import check_range
from callgrove.sampling import Distribution

FinishReason = Literal["stop", "length"]
DEFAULT_MAX_TOKENS = 4096
"""The most tokens a served completion may ask for unless told otherwise (`serve-policy` and
`gateway --max-tokens`; a request that names none gets this many)."""


class SamplingParams(Distribution, frozen=True):
    """How one call is sampled, and a run's `[sampling]`: the distribution (temperature, top-p,
    top-k; no hidden cut) and when sampling ends."""

    max_tokens: int = 64
    stop_token_ids: tuple[int, ...] = ()
    """Sampling ends after any of these tokens, which is kept as the completion's last token
    (a run adds its chat format's)."""
    stop: tuple[str, ...] = ()
    """Sampling ends once the decoded completion ends with any of these strings (backends that
    can decode: a tokenizer is needed to tell)."""
    seed: int | None = None
    """One call's seed (a run seeds its sampler from `run.seed` instead)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        check_range("max_tokens", self.max_tokens, at_least=1)


@dataclass(frozen=True, slots=True)
class Completion:
    """What the policy sampled for one prompt."""

    completion_ids: np.ndarray
    """int32 token ids, the stop token included when one ended sampling."""
    logprobs: np.ndarray
    """float log-probability of each sampled token under the sampling distribution (after
    temperature and top-p), one per completion token: the behaviour policy of the importance
    ratio."""
    policy_version: int
    """The weights' version when sampling started; a call never spans two versions."""
    finish_reason: FinishReason
    """`stop`: a stop token or string ended it; `length`: `max_tokens` did."""
    sampling: dict[str, Any] | None = None
    """The distribution `logprobs` are under, recorded as the call's `sampling`
    (`callgrove.episode.sampling_record`); None where the backend cannot tell."""
    routes: np.ndarray | None = None
    """A mixture of experts' routes for the prompt and completion but its last token (tokens,
    layers, k), recorded as the call's `routes`; None for a dense model or a backend without."""


@runtime_checkable
class PolicyClient(Protocol):
    """A policy that samples completions for token prompts; concurrent calls may be batched."""

    @property
    def version(self) -> int:
        """The policy version that new samples start from (bumped after each optimizer step)."""
        ...

    async def sample(self, prompt_ids: np.ndarray, params: SamplingParams) -> Completion:
        """Sample one completion of `prompt_ids` (int32 token ids)."""
        ...


@runtime_checkable
class TrainableSampler(PolicyClient, Protocol):
    """A sampler that the loop can move to new weights (in process or over the wire)."""

    async def load_weights(self, weights: Any, version: int) -> None:
        """Use `weights` (of `version`) for every call that starts from now on."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of the sampler (its random state); may be empty."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

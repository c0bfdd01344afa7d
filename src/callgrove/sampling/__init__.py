"""The sampling distribution: what a sampler draws from and what a learner scores.

`Distribution` (temperature, top-p, top-k) is the one typed form of it: a run's `[sampling]`
and every call's `SamplingParams` extend it, and `record()` writes it as a call's `sampling`.
`callgrove.sampling.distribution.sampling_distribution` (torch) computes it from logits for
both the samplers (`callgrove.policy`) and the loss (`callgrove.train`), so neither imports the
other for it.
"""

from __future__ import annotations

from typing import Any

import msgspec

from callgrove.episode import sampling_record
from callgrove.episode.record import check_distribution


class Distribution(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Logits divided by `temperature` (0: greedy), cut to the `top_k` most likely tokens
    (None: no cut), then to the smallest set whose mass reaches `top_p`, renormalised."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None

    def __post_init__(self) -> None:
        check_distribution(self.temperature, self.top_p, self.top_k)

    def record(self) -> dict[str, Any]:
        """This distribution as a call's `sampling` (docs/episode-format.md)."""
        return sampling_record(self.temperature, self.top_p, self.top_k)

    @property
    def whole(self) -> bool:
        """Whether nothing is tempered or cut: the model's own distribution."""
        return self.temperature == 1.0 and self.top_p == 1.0 and self.top_k is None


__all__ = ["Distribution"]

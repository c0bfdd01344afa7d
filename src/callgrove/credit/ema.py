"""A moving-average baseline per seat, for groups of one episode (nothing to compare within)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np

from callgrove.credit.algorithm import Algorithm, Credit, Trace
from callgrove.episode import Episode
from callgrove.formats.ranges import check_range


class EMABaseline(
    Algorithm,
    msgspec.Struct,
    kw_only=True,
    forbid_unknown_fields=True,
    tag_field="name",
    tag="ema",
    dict=True,
):
    """Advantage = reward minus the seat's exponential moving average of earlier rewards.

    Traces are seats' traces (`agent_reward`). The state lives on the instance, so one instance
    must see a run's groups in order. Within a group every trace is measured against the
    baseline as it stood before the group; the baseline then moves once per group towards the
    mean reward of the seat's traces there: `b = decay * b + (1 - decay) * mean`. A seat seen for
    the first time starts from `initial`, or from its first group's mean when `initial` is None
    (so its first advantages centre on 0.0).
    """

    decay: float = 0.9
    """How much of the baseline each group keeps."""
    initial: float | None = None
    """A new seat's first baseline (None: its first group's mean)."""

    def __post_init__(self) -> None:
        check_range("decay", self.decay, at_least=0, below=1)
        if self.initial is not None:
            check_range("initial", self.initial)
        # What it learnt, not a setting: kept off the struct's fields, so a config that holds
        # this algorithm never saves it.
        self.baselines: dict[str, float] = {}

    def state_dict(self) -> dict[str, Any]:
        return {"baselines": dict(self.baselines)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.baselines = {str(k): float(v) for k, v in state["baselines"].items()}

    def score_group(self, episodes: Sequence[Episode]) -> list[Credit]:
        by_seat: dict[str, list[Trace]] = {}
        for episode in episodes:
            for trace in self.score_episode(episode):
                by_seat.setdefault(trace.seat or "", []).append(trace)
        credits = []
        for seat, traces in by_seat.items():
            mean = float(np.mean([trace.reward for trace in traces]))
            start = self.initial if self.initial is not None else mean
            baseline = self.baselines.get(seat, start)
            credits += [Credit(t, baseline, t.reward - baseline) for t in traces]
            self.baselines[seat] = self.decay * baseline + (1.0 - self.decay) * mean
        return credits

"""How far off-policy an episode is when it trains: derived from its run, never stored.

The run records the span of policy versions that generated the episode (`run.policy`). Read
at a training step, that span says how many weight updates the episode missed: those that
landed while it was still generating (in flight) and those that landed while it waited to be
trained (in queue). Every reading of staleness goes through `off_policy_steps`.
"""

from __future__ import annotations

from typing import NamedTuple

from callgrove.episode.record import Episode


class OffPolicySteps(NamedTuple):
    """Weight updates an episode missed, split by when they happened."""

    total: int
    in_flight: int
    in_queue: int


NOT_STALE = OffPolicySteps(0, 0, 0)


def off_policy_steps(episode: Episode, training_step: int) -> OffPolicySteps:
    """Staleness of `episode` when it trains at `training_step`.

    The policy trained at step s is version s - 1, so an episode begun on version `start` is
    (s - 1) - start updates behind; of those, the `end - start` updates that landed during
    generation are in flight and the rest happened while it queued. An episode of a frozen
    policy (no `run.policy`) is never stale.
    """
    policy = None if episode.run is None else episode.run.policy
    if policy is None:
        return NOT_STALE
    total = max(0, (training_step - 1) - policy.start)
    in_flight = min(total, policy.end - policy.start)
    return OffPolicySteps(total, in_flight, total - in_flight)

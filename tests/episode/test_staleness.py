"""Staleness is derived from the run's policy span, one function for every reader."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from callgrove.episode import Episode, OffPolicySteps, off_policy_steps
from callgrove.formats.wire import WirePolicy, WireRun


def _episode(policy: WirePolicy | None, step: int = 6, kind: str = "train") -> Episode:
    return Episode("ep", run=WireRun(id="run", type=kind, step=step, policy=policy))


def test_login_bug_train_episode_spanning_v2_to_v4_at_step_6() -> None:
    steps = off_policy_steps(_episode(WirePolicy(start=2, end=4)), 6)
    assert steps == OffPolicySteps(total=3, in_flight=2, in_queue=1)


def test_login_bug_eval_episode_on_one_version_has_no_flight() -> None:
    steps = off_policy_steps(_episode(WirePolicy(start=4, end=4), kind="eval"), 6)
    assert steps == OffPolicySteps(total=1, in_flight=0, in_queue=1)


def test_frozen_policy_is_never_stale() -> None:
    assert off_policy_steps(_episode(None), 1_000) == OffPolicySteps(0, 0, 0)
    assert off_policy_steps(Episode("no run"), 1_000) == OffPolicySteps(0, 0, 0)


def test_an_episode_trained_on_the_policy_that_made_it_is_not_stale() -> None:
    assert off_policy_steps(_episode(WirePolicy(start=5, end=5)), 6).total == 0
    # asked about a step before it was even generated: clamped, never negative
    assert off_policy_steps(_episode(WirePolicy(start=5, end=7)), 2) == OffPolicySteps(0, 0, 0)


@given(start=st.integers(0, 100), drift=st.integers(0, 20), step=st.integers(0, 200))
def test_the_parts_follow_the_definition(start: int, drift: int, step: int) -> None:
    steps = off_policy_steps(_episode(WirePolicy(start=start, end=start + drift)), step)
    assert steps.total == max(0, (step - 1) - start)
    assert steps.in_flight == min(steps.total, drift)
    assert steps.in_queue == steps.total - steps.in_flight >= 0

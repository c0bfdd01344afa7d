"""Every detector measures every call, whatever the order; the drop policy decides apart."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from callgrove.episode import Agent, Call, Episode
from callgrove.orchestrator import degeneracy
from callgrove.orchestrator.degeneracy import DETECTORS, DegeneracyReport, DegeneracySettings
from callgrove.rows import build_rows

END = 3


def episode() -> Episode:
    """Leader call c0 is gibberish and truncated, c1 repeats; helper call c2 is clean."""
    leader = Agent(
        "leader",
        "leader",
        calls=[
            Call.make("c0", 0, [1, 4], [9, 9, 9], [-12.0, -15.0, -0.5]),
            Call.make("c1", 2, [1, 4, 9, 9, 9, 1, 5], [7] * 6 + [END], [-0.001] * 6 + [-0.2]),
        ],
    )
    helper = Agent(
        "helper-1",
        "helper",
        parent="leader",
        start="fresh",
        calls=[Call.make("c2", 1, [1, 6], [5, END], [-0.3, -0.1])],
    )
    for call in [*leader.calls, *helper.calls]:
        call.advantages = 0.5
    return Episode("e", agents=[leader, helper], rewards={"r": 1.0})


def settings(order: tuple[str, ...], drop: tuple[str, ...] = ("gibberish",)) -> DegeneracySettings:
    return DegeneracySettings(
        gibberish_logprob=-10,
        gibberish_tokens=2,
        repetition_run=5,
        drop=drop,
        stop_token_ids=(END,),
    )


@pytest.mark.parametrize("order", list(itertools.permutations(DETECTORS)))
def test_every_measurement_is_present_whatever_the_order(order, monkeypatch):
    monkeypatch.setattr(degeneracy, "DETECTORS", {name: DETECTORS[name] for name in order})
    ep = episode()
    report = DegeneracyReport()
    (kept,) = degeneracy.apply([build_rows(ep)], settings(order), report)
    calls = ep.meta["degeneracy"]["calls"]
    assert {k: {d: calls[k][d] for d in DETECTORS} for k in calls} == {
        "c0": {"gibberish": 2, "repetition": 0, "truncation": 1},
        "c1": {"gibberish": 0, "repetition": 6, "truncation": 0},
        "c2": {"gibberish": 0, "repetition": 0, "truncation": 0},
    }
    assert sorted(calls["c0"]["flags"]) == ["gibberish", "truncation"]
    assert calls["c1"]["flags"] == ["repetition"]
    # The drop policy drops on gibberish only: the leader's row trains c0 and c1 and goes.
    rows = {r["agent"]: r for r in ep.meta["degeneracy"]["rows"]}
    assert rows["leader"]["dropped"] and not rows["helper-1"]["dropped"]
    assert sorted(rows["leader"]["flags"]) == ["gibberish", "repetition", "truncation"]
    assert [row.agent.id for row in kept.rows] == ["helper-1"]
    assert report.dropped_rows == 1 and report.call_flags["leader"] == {
        "gibberish": 1,
        "repetition": 1,
        "truncation": 1,
    }


def test_dropping_nothing_still_measures_everything():
    ep = episode()
    report = DegeneracyReport()
    (kept,) = degeneracy.apply([build_rows(ep)], settings(tuple(DETECTORS), drop=()), report)
    assert len(kept.rows) == 2 and report.dropped_rows == 0
    assert report.row_flags["leader"] == {"gibberish": 1, "repetition": 1, "truncation": 1}
    with pytest.raises(ValueError, match="drop must be one of"):
        DegeneracySettings(drop=("nonsense",))
    assert np.isfinite(report.rows)

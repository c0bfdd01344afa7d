"""`repair`: a harness-shaped episode (fresh readers, a forked editor, a compaction) scored only
by a test suite on the final answer."""

from __future__ import annotations

import re

import numpy as np
import pytest

from callgrove.credit import HierarchicalGRPO
from callgrove.orchestrator.degeneracy import DegeneracySettings
from callgrove.orchestrator.envs import make_env
from callgrove.orchestrator.envs.repair import passed_checks
from callgrove.orchestrator.step import prepare_step
from callgrove.policy import Completion
from callgrove.rows import RowSettings

from .helpers import CHAT, ScriptedPolicy, run


class Solver:
    """Answers every ask of `repair` right, reading what it needs off the prompt's text."""

    async def sample(self, prompt_ids, params) -> Completion:
        text = CHAT.show(prompt_ids)
        asked = re.findall(r"\[user\] ([^⏎]*)", text)[-1]
        reports = re.findall(r"saw (\d+) (\d+)", text)
        if asked.startswith("read"):
            answer = asked.split()[-1]
        elif asked == "edit":
            answer = reports[-1][1] + reports[-1][0]
        elif asked == "sum":
            answer = "".join(reports[-1])
        elif asked.startswith("apply"):
            was = re.findall(r"was (\d+)", text)[-1]
            half = len(was) // 2
            answer = asked.split()[-1][:half] + was[0] + was[half]
        else:
            answer = "ok"
        ids = np.concatenate([CHAT.encode(answer), [CHAT.END]]).astype(np.int32)
        return Completion(ids, np.full(len(ids), -0.5), 0, "stop")


def test_the_episode_has_a_harness_shape_and_only_the_final_answer_is_scored():
    episode = run(make_env("repair"), "3021", ScriptedPolicy("21"))
    assert episode.ok, episode.errors
    starts = {agent.id: agent.start for agent in episode.agents}
    assert starts == {
        "leader": "root",
        "reader-1": "fresh",
        "reader-2": "fresh",
        "editor-3": "fork",
    }
    purposes = [c.purpose for c in episode.agent("leader").calls]
    assert purposes == ["turn", "turn", "compaction", "turn"]
    seats = episode.meta["seats"]
    assert seats["final"] == passed_checks("21", "2132") == 0.5  # digits, and 2 and 1 in place
    assert episode.rewards == {"tests": seats["final"]}
    assert all(agent.rewards is None for agent in episode.agents)


def test_a_policy_that_does_every_part_right_passes_every_check():
    episode = run(make_env("repair"), "3021", Solver())
    assert episode.meta["seats"] == {
        "reader_a": 1.0,
        "reader_b": 1.0,
        "editor": 1.0,
        "summary": 1.0,
        "final": 1.0,
    }
    longer = run(make_env("repair", {"length": 6}), "301122", Solver())
    assert longer.rewards == {"tests": 1.0}


def test_the_suite_counts_length_digits_and_each_digit_in_place():
    assert passed_checks("2132", "2132") == 1.0
    assert passed_checks("", "2132") == 0.0
    assert passed_checks("21x", "2132") == pytest.approx(2 / 6)
    assert passed_checks("21320", "2132") == pytest.approx(
        5 / 6
    )  # digits, all four in place, too long


def test_tasks_are_seeded_and_options_checked():
    env = make_env("repair")
    draws = [env.task(np.random.default_rng(7)) for _ in range(2)]
    assert draws[0] == draws[1] and len(draws[0]) == 4 and set(draws[0]) <= set("0123")
    assert env.eval_tasks() == make_env("repair").eval_tasks()
    with pytest.raises(ValueError, match=r"length: an even number"):
        make_env("repair", {"length": 3})


def test_every_seat_trains_under_exactly_once_and_only_the_leader_under_leader_only():
    group = [run(make_env("repair"), "3021", ScriptedPolicy(reply)) for reply in ("21", "3")]
    for number, episode in enumerate(group):
        episode.id = f"e{number}"
    keep_all = DegeneracySettings(drop=())
    for scheme, seats in (
        ("exactly_once", {"leader", "reader", "editor"}),
        ("leader_only", {"leader"}),
    ):
        step = prepare_step([group], HierarchicalGRPO(), keep_all, rows=RowSettings(scheme=scheme))
        assert {s.seat for s in step.samples if s.num_loss_tokens} == seats

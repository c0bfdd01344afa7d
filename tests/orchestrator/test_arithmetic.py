"""The `arithmetic` environment: the question, the exact and partial scores, the tasks."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest

from callgrove.orchestrator.envs import make_env
from callgrove.orchestrator.envs.arithmetic import Arithmetic, score


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("22", 1.0),
        (" 22.\n", 1.0),
        ("7 + 15 = 22", 0.5),
        ("The answer is 22.", 0.5),
        ("23", 0.0),
        ("7 + 15 = 23", 0.0),
        ("", 0.0),
        ("222", 0.0),
    ],
)
def test_score(answer, expected):
    assert score(answer, 22) == expected


def test_negative_results_and_the_partial_weight():
    assert score("-3", -3) == 1.0
    assert score("5 - 8 = -3", -3, partial=0.25) == 0.25


class Leader:
    def __init__(self, reply: str):
        self.reply = reply
        self.asked: list[str] = []

    async def ask(self, text: str) -> str:
        self.asked.append(text)
        return self.reply


def test_an_episode_asks_once_and_scores_the_reply():
    env = make_env("arithmetic", {"operations": "*", "low": 2, "high": 9})
    task = env.task(np.random.default_rng(0))
    leader = Leader(str(task["a"] * task["b"]))
    rewards = asyncio.run(env.run(SimpleNamespace(leader=leader), task))
    assert rewards == {"score": 1.0}
    assert leader.asked == [f"What is {task['a']} * {task['b']}? Reply with the number only."]


def test_tasks_are_drawn_in_range_and_evaluation_is_fixed():
    env = Arithmetic(low=3, high=5, operations="+-")
    tasks = [env.task(np.random.default_rng(seed)) for seed in range(50)]
    assert all(3 <= t["a"] <= 5 and 3 <= t["b"] <= 5 for t in tasks)
    assert {t["op"] for t in tasks} == {"+", "-"}
    assert env.eval_tasks() == env.eval_tasks() and len(env.eval_tasks()) == 16


@pytest.mark.parametrize(
    "options",
    [{"operations": "/"}, {"operations": ""}, {"low": 5, "high": 1}, {"partial": 2.0}],
)
def test_bad_options_are_refused(options):
    with pytest.raises(ValueError):
        Arithmetic(**options)

"""`arithmetic`: one chat question a small instruct model answers partly right, so RL on a real
checkpoint has a reward to climb.

A task is two operands and an operation (`{"a": 7, "b": 15, "op": "+"}`); the leader is asked
"What is 7 + 15? Reply with the number only." once. `score` gives 1 for exactly the number
(surrounding whitespace and a final period allowed), `partial` (default 0.5) when a longer reply
contains the right number ("7 + 15 = 22"), and 0 otherwise: a policy climbs by getting the
result right and by saying only the result.
"""

from __future__ import annotations

import operator
import re
from typing import Any

import numpy as np

from callgrove.errors import InvalidValue
from callgrove.orchestrator.env import EpisodeRun

OPERATIONS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
_NUMBER = re.compile(r"-?\d+")


def score(answer: str, target: int, partial: float = 0.5) -> float:
    """1 for the bare number, `partial` when a longer reply contains it."""
    bare = answer.strip().removesuffix(".").strip()
    if bare == str(target):
        return 1.0
    return partial if str(target) in _NUMBER.findall(answer) else 0.0


class Arithmetic:
    name = "arithmetic"

    def __init__(
        self,
        low: int = 0,
        high: int = 20,
        operations: str = "+",
        partial: float = 0.5,
        eval_size: int = 16,
    ):
        unknown = set(operations) - set(OPERATIONS)
        if not operations or unknown:
            raise InvalidValue(f"operations: some of {''.join(OPERATIONS)}, not {operations!r}")
        if low > high:
            raise InvalidValue(f"low ({low}) must not be above high ({high})")
        if not 0.0 <= partial <= 1.0:
            raise InvalidValue(f"partial must be within [0, 1], not {partial}")
        self.low, self.high = low, high
        self.operations = operations
        self.partial = partial
        self.eval_size = eval_size

    def task(self, rng: np.random.Generator) -> dict[str, Any]:
        a, b = (int(x) for x in rng.integers(self.low, self.high + 1, 2))
        return {"a": a, "b": b, "op": self.operations[int(rng.integers(len(self.operations)))]}

    def eval_tasks(self) -> list[dict[str, Any]]:
        rng = np.random.default_rng(12345)
        return [self.task(rng) for _ in range(self.eval_size)]

    @staticmethod
    def question(task: dict[str, Any]) -> str:
        return f"What is {task['a']} {task['op']} {task['b']}? Reply with the number only."

    @staticmethod
    def answer(task: dict[str, Any]) -> int:
        return OPERATIONS[task["op"]](task["a"], task["b"])

    async def run(self, episode: EpisodeRun, task: dict[str, Any]) -> dict[str, float]:
        reply = await episode.leader.ask(self.question(task))
        return {"score": score(reply, self.answer(task), self.partial)}

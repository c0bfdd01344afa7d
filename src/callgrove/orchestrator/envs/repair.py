"""`repair`: the shape of a coding harness's episode, on digit strings the reference decoder
learns from scratch: a leader that hands file reads to fresh subagents, forks to write an edit,
compacts, and is scored only by a test suite at the end.

A task is a two-file repository: `length` digits, the first half file `a`, the second file `b`
(task `3021`: `a` holds `30`, `b` holds `21`). The leader

1. is given the issue, which names the files but not their contents (`fix a b`);
2. hands each file to a fresh `reader` (both at once), whose prompt holds the file as a tool
   result would (`read a 30`) and who reports it (`30`);
3. is told what the readers reported (`saw 30 21`);
4. forks an `editor`, which holds the reports only in its copied history and is asked for the
   edit: the two files swapped (`edit` -> `2130`);
5. compacts (its summary should keep the reports: after it the leader holds nothing else) and
   is asked to apply the edit (`apply 2130`).

The final answer is the repository after the edit with the test's own check on the old one:
the edit's first file and the first digit of each old file (`21` + `3` + `2` = `2132`): the
first two are in the prompt, the last two only in the summary. The test suite scores it: one
check for the length, one for being digits only, one per digit in place; the reward is the
share of checks that pass, and nothing else is scored, so every seat takes the episode's.
Every scored answer is in `meta.seats` (`reader_a`, `reader_b`, `editor`, `summary`, `final`),
for reading each seat's skill off the record.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from callgrove.errors import InvalidValue
from callgrove.orchestrator.env import EpisodeRun
from callgrove.orchestrator.envs.digits import DIGITS, SYMBOLS, record_seats


def passed_checks(answer: str, target: str) -> float:
    """The share of checks `answer` passes: its length, its being digits only, and each of
    `target`'s digits in place."""
    checks = [len(answer) == len(target), bool(answer) and all(ch in DIGITS for ch in answer)]
    checks += [a == t for a, t in zip(answer.ljust(len(target)), target, strict=False)]
    return sum(checks) / len(checks)


class Repair:
    name = "repair"

    def __init__(self, length: int = 4, eval_size: int = 16, symbols: str = SYMBOLS):
        if length < 2 or length % 2:
            raise InvalidValue(f"length: an even number of digits, 2 or more, not {length}")
        if not symbols or set(symbols) - set(DIGITS):
            raise InvalidValue(f"symbols: digits to draw tasks from, not {symbols!r}")
        self.length = length
        self.eval_size = eval_size
        self.symbols = symbols

    def task(self, rng: np.random.Generator) -> str:
        drawn = rng.integers(0, len(self.symbols), self.length)
        return "".join(self.symbols[int(d)] for d in drawn)

    def eval_tasks(self) -> list[str]:
        rng = np.random.default_rng(12345)
        return [self.task(rng) for _ in range(self.eval_size)]

    async def run(self, episode: EpisodeRun, task: Any) -> dict[str, float]:
        leader = episode.leader
        half = len(task) // 2
        files = {"a": task[:half], "b": task[half:]}
        await leader.ask("fix a b")
        reports = await asyncio.gather(
            *(leader.spawn("reader").ask(f"read {name} {text}") for name, text in files.items())
        )
        await leader.ask(f"saw {' '.join(reports)}")
        edit = await leader.fork("editor").ask("edit")
        summary = await leader.compact("sum", restart=lambda text: f"was {text}")
        final = await leader.ask(f"apply {edit}")
        seats = {
            "reader_a": passed_checks(reports[0], files["a"]),
            "reader_b": passed_checks(reports[1], files["b"]),
            "editor": passed_checks(edit, files["b"] + files["a"]),
            "summary": passed_checks(summary, task),
            "final": passed_checks(final, files["b"] + files["a"][0] + files["b"][0]),
        }
        record_seats(episode, seats)
        return {"tests": seats["final"]}

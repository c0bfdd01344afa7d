"""Built-in environments on short digit strings, small enough for the reference decoder to
learn from scratch on a laptop.

`relay` holds every shape of a multi-agent episode. Tasks are short strings of digits (by
default three drawn from `0123`). For a task such as `302` the leader:

1. starts a background `checker` (fresh) asked to copy the task; nobody reads its answer;
2. is asked the task itself and answers with a copy of it (its first call);
3. asks two fresh `helper`s for the first and the middle digit (the same seat twice in one
   episode: hierarchical GRPO baselines them within the episode);
4. forks itself as `fork` and asks it for the last digit (the fork's first call resends the
   leader's whole history and extends it);
5. compacts its history (a `compaction` call continuing it, answered with the task), starts over
   from that summary, and gives the final answer: the digits the subagents returned, joined.

Every seat is scored on its own answers (`score`: partial credit for the length, for answering
in digits and for each right character in place), the leader on the mean of its three; the episode reward is
the mean over every seat's answer, so both per-seat and per-episode scoring have signal.

`handoff` is the one where subagents' skill decides the reward (`Handoff`).

`copy` is the single-agent comparison: the leader alone, asked to copy the task, twice.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from callgrove.errors import InvalidValue
from callgrove.orchestrator.env import EpisodeRun

DIGITS = "0123456789"
SYMBOLS = "0123"  # tasks draw from these digits by default: small enough to learn in minutes


CREDIT = (0.2, 0.2, 0.6)


def score(answer: str, target: str, credit: tuple[float, ...] = CREDIT) -> float:
    """Partial credit, so a policy that starts from noise has a slope to climb, weighted by
    `credit`: the length (1 / (1 + the length's distance from the target's)), the share of the
    answer that is digits, and the target's characters matched in place."""
    matches = sum(a == t for a, t in zip(answer, target, strict=False))
    digits = sum(ch in DIGITS for ch in answer) / len(answer) if answer else 0.0
    length = 1.0 / (1.0 + abs(len(answer) - len(target)))
    for_length, for_digits, for_matches = credit
    return for_length * length + for_digits * digits + for_matches * matches / len(target)


class _DigitTasks:
    name = "digits"

    def __init__(
        self,
        length: int = 3,
        eval_size: int = 16,
        credit: tuple[float, ...] | list[float] = CREDIT,
        symbols: str = SYMBOLS,
    ):
        if len(credit) != 3 or abs(sum(credit) - 1.0) > 1e-9:
            raise InvalidValue("credit: three weights (length, digits, matches) that sum to 1")
        if not symbols or set(symbols) - set(DIGITS):
            raise InvalidValue(f"symbols: digits to draw tasks from, not {symbols!r}")
        self.symbols = symbols
        self.length = length
        self.eval_size = eval_size
        self.credit = tuple(credit)

    def score(self, answer: str, target: str) -> float:
        return score(answer, target, self.credit)

    def task(self, rng: np.random.Generator) -> str:
        return "".join(
            self.symbols[int(d)] for d in rng.integers(0, len(self.symbols), self.length)
        )

    def eval_tasks(self) -> list[str]:
        rng = np.random.default_rng(12345)
        return [self.task(rng) for _ in range(self.eval_size)]


class Relay(_DigitTasks):
    name = "relay"

    async def run(self, episode: EpisodeRun, task: Any) -> dict[str, float]:
        leader = episode.leader
        checker = leader.background("checker", lambda agent: agent.ask(f"copy {task}"))
        copied = await leader.ask(f"task {task}")
        first_helper, middle_helper = leader.spawn("helper"), leader.spawn("helper")
        first, middle = await asyncio.gather(
            first_helper.ask(f"first {task}"), middle_helper.ask(f"middle {task}")
        )
        fork = leader.fork("fork")
        last = await fork.ask("last")
        summary = await leader.compact("sum", restart=lambda text: f"was {text}")
        final = await leader.ask(f"join {first} {middle} {last}")

        seats = {
            "helper_first": self.score(first, task[0]),
            "helper_middle": self.score(middle, task[len(task) // 2]),
            "fork": self.score(last, task[-1]),
            "copy": self.score(copied, task),
            "summary": self.score(summary, task),
            "final": self.score(final, first + middle + last),
        }
        first_helper.reward(score=seats["helper_first"])
        middle_helper.reward(score=seats["helper_middle"])
        fork.reward(score=seats["fork"])
        leader.reward(score=float(np.mean([seats["copy"], seats["summary"], seats["final"]])))
        checked = checker.answer()
        if checked is not None:
            seats["checker"] = self.score(checked, task)
            checker.agent.reward(score=seats["checker"])
        record_seats(episode, seats)
        return {"score": float(np.mean(list(seats.values())))}


def record_seats(episode: EpisodeRun, seats: dict[str, float]) -> None:
    """Every answer's score in the episode's `meta.seats`, so the score of one call (such as
    the one after a compaction) can be read off the record, not only its agent's sum."""
    record = episode.episode
    record.meta = {**(record.meta or {}), "seats": seats}


# `Handoff`'s five asks and the line that restarts the leader from its summary, per wording.
HANDOFF_WORDINGS = {
    "terse": {
        "copy": "task {task}",
        "swap": "swap {pair}",
        "last": "last",
        "summary": "sum",
        "restart": "was {summary}",
        "join": "join {swapped} {last}",
    },
    "instruct": {
        "copy": "Repeat these digits exactly: {task}. Reply with the digits only.",
        "swap": "Write these two digits in reverse order: {pair}. Reply with the digits only.",
        "last": "What is the last of the digits you were given? Reply with that digit only.",
        "summary": "Which digits were you given? Reply with the digits only.",
        "restart": "You were given the digits {summary}.",
        "join": (
            "Write {swapped}, then {last}, then the first of the digits you were given, with "
            "no spaces. Reply with the digits only."
        ),
    },
}


class Handoff(_DigitTasks):
    """Where subagents' skill decides the reward: only the final answer is scored, and it can
    only be right if a fresh helper, a fork and a compaction summary did their parts.

    For a task such as `302` the leader is asked the task (its answer, a copy, is not scored);
    a fresh `helper` is asked to swap the first two digits (`03`); a `fork` of the leader,
    holding the task only in its copied history, is asked for the last digit (`2`); the
    leader compacts (its summary should keep the task: after it the leader holds nothing
    else) and is asked to join the helper's and the fork's answers and the task's first digit
    (`0320`): the first three it is given, the last it can only have from its summary. The
    episode reward is that final answer's score; no agent has a reward of its own, so every
    seat is credited with the episode's.

    `wording`: `"terse"` (one-word prompts such as `swap 30`, for the reference decoder that
    learns them from scratch) or `"instruct"` (the same five asks spelled out, "Reply with the
    digits only.", for an instruct model, which answers a terse `swap 30` with prose and so
    scores about 0.01 everywhere: no slope to climb). Targets and scores are the same.
    """

    name = "handoff"

    def __init__(self, wording: str = "terse", **options: Any):
        if wording not in HANDOFF_WORDINGS:
            raise InvalidValue(f"wording: one of {', '.join(HANDOFF_WORDINGS)}, not {wording!r}")
        super().__init__(**options)
        self.prompts = HANDOFF_WORDINGS[wording]

    async def run(self, episode: EpisodeRun, task: Any) -> dict[str, float]:
        leader, prompts = episode.leader, self.prompts
        copied = await leader.ask(prompts["copy"].format(task=task))
        swapped = await leader.spawn("helper").ask(prompts["swap"].format(pair=task[:2]))
        last = await leader.fork("fork").ask(prompts["last"])
        summary = await leader.compact(
            prompts["summary"], restart=lambda text: prompts["restart"].format(summary=text)
        )
        final = await leader.ask(prompts["join"].format(swapped=swapped, last=last))
        seats = {
            "copy": self.score(copied, task),
            "helper": self.score(swapped, task[1] + task[0]),
            "fork": self.score(last, task[-1]),
            "summary": self.score(summary, task),
            "final": self.score(final, task[1] + task[0] + task[-1] + task[0]),
        }
        record_seats(episode, seats)
        return {"score": seats["final"]}


class Copy(_DigitTasks):
    name = "copy"

    async def run(self, episode: EpisodeRun, task: Any) -> dict[str, float]:
        first = await episode.leader.ask(f"copy {task}")
        second = await episode.leader.ask(f"again {task}")
        return {"score": (self.score(first, task) + self.score(second, task)) / 2}

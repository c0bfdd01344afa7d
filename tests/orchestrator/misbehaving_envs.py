"""Environments that misbehave inside an episode, named `orchestrator.misbehaving_envs:NAME` by the
runs the tests start (with `tests/` on the import path). Each asks the policy once; then on task
`301` (group 2's with seed 0) and on task `322` (group 0's) it misbehaves as its name says, and
on the other tasks it scores the answer."""

from __future__ import annotations

import time

from callgrove.orchestrator.envs import Copy


class Misbehaving(Copy):
    async def run(self, episode, task):
        answer = await episode.leader.ask(f"copy {task}")
        if task == "301":
            return self.first()
        if task == "322":
            return self.second()
        return self.score(answer, task)

    def first(self):
        raise NotImplementedError

    def second(self):
        raise NotImplementedError


class Blocks(Misbehaving):
    """A synchronous sleep far longer than any test waits, and a busy loop that never ends."""

    def first(self):
        time.sleep(3600)

    def second(self):
        while True:
            pass


class Exits(Misbehaving):
    """`SystemExit`, and `KeyboardInterrupt`, raised in `run`."""

    def first(self):
        raise SystemExit(3)

    def second(self):
        raise KeyboardInterrupt


class ReturnsNoRewards(Misbehaving):
    """A reward that is no number, and a dict of rewards that are none."""

    def first(self):
        return "high"

    def second(self):
        return {"reward": None, "other": [1]}

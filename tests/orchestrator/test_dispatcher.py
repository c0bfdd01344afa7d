"""The dispatcher under injected faults, and staleness by hand."""

from __future__ import annotations

import asyncio

from callgrove.orchestrator.dispatcher import Dispatcher, DispatchSettings
from callgrove.orchestrator.monitors import seat_metrics

from .helpers import CHAT, PARAMS, ScriptedPolicy


class Faulty:
    """Task k of the launch order: ok, raise, hang, cancel itself, or make a failing call."""

    name = "faulty"
    kinds = ("ok", "raise", "hang", "cancel", "boom")

    def __init__(self):
        self.drawn = 0

    def task(self, rng):
        kind = self.kinds[self.drawn % len(self.kinds)]
        self.drawn += 1
        return kind

    def eval_tasks(self):
        return ["ok", "raise"]

    async def run(self, episode, task):
        helper = episode.leader.spawn("helper")
        await helper.ask("hi")
        if task == "raise":
            raise ValueError("bad task")
        if task == "hang":
            await asyncio.sleep(60)
        if task == "cancel":
            asyncio.current_task().cancel()
            await asyncio.sleep(60)
        await episode.leader.ask(task)
        return 1.0


def dispatcher(env, policy, **settings) -> Dispatcher:
    return Dispatcher(env, policy, CHAT, PARAMS, DispatchSettings(**settings), run_id="run")


def test_faults_are_counted_recorded_and_nothing_is_lost_or_invented():
    async def go():
        d = dispatcher(
            Faulty(),
            ScriptedPolicy(fail_text="boom"),
            group_size=1,
            groups_per_step=5,
            max_off_policy_steps=0,
            max_in_flight=5,
            episode_timeout=0.3,
        )
        d.start()
        collected = await d.collect(1)
        leftovers = await d.stop()
        return d, collected, leftovers

    d, collected, leftovers = asyncio.run(go())
    assert leftovers == [] and not collected.stale
    episodes = {g.task: g.episodes[0] for g in collected.trained}
    assert sorted(episodes) == sorted(Faulty.kinds)
    assert episodes["ok"].ok and episodes["ok"].rewards == {"reward": 1.0}
    errors = {
        task: [(e.type, e.agent if isinstance(e.agent, str) else None) for e in ep.errors]
        for task, ep in episodes.items()
    }
    assert errors == {
        "ok": [],
        "raise": [("ValueError", None)],
        "hang": [("Timeout", None)],
        "cancel": [("Cancelled", None)],
        "boom": [("ConnectionError", "leader")],
    }
    assert dict(d.counters) == {"dispatcher/errored/train": 3, "dispatcher/cancelled/train": 1}
    # Every episode kept only the agents that ran; each started its helper and made its call.
    for episode in episodes.values():
        assert [a.name for a in episode.agents] == ["leader", "helper"]
        assert len(episode.agent("helper-1").calls) == 1
        assert episode.run.policy.start == episode.run.policy.end == 0 and episode.run.step == 1
    metrics = seat_metrics("train", list(episodes.values()))
    # The cancelled episode belongs to no seat; the failed call is charged to the leader.
    assert metrics["train/all/episode/count"] == 4
    assert metrics["train/all/leader/errors/mean"] == 1 / 4
    assert metrics["train/all/helper/errors/mean"] == 0
    assert metrics["train/all/leader/reward/mean"] == 1.0  # only the completed episode
    assert metrics["train/all/episode/ok/mean"] == 1 / 4
    assert metrics["train/all/helper/surprisal/mean"] == 0.5  # every token sampled at -0.5


def test_stop_cancels_what_is_in_flight_and_hands_it_back():
    class Slow(Faulty):
        """Every episode hangs; the fourth to start sets `all_hanging`."""

        kinds = ("hang",)

        def __init__(self):
            super().__init__()
            self.started = 0
            self.all_hanging = asyncio.Event()

        async def run(self, episode, task):
            self.started += 1
            if self.started == 4:
                self.all_hanging.set()
            return await super().run(episode, task)

    async def go():
        env = Slow()
        d = dispatcher(env, ScriptedPolicy(), group_size=2, groups_per_step=1, max_in_flight=4)
        d.start()
        await asyncio.wait_for(env.all_hanging.wait(), timeout=30)
        await asyncio.sleep(0)  # a fifth launch, were it allowed, would start by now
        return d, await d.stop()

    d, leftovers = asyncio.run(go())
    assert len(leftovers) == 4  # two groups of two were in flight (one step ahead allowed)
    assert all([e.type for e in ep.errors] == ["Cancelled"] for ep in leftovers)
    assert dict(d.counters) == {"dispatcher/cancelled/train": 4}


def test_evaluation_is_pinned_and_counted_apart():
    async def go():
        d = dispatcher(Faulty(), ScriptedPolicy(), group_size=1, groups_per_step=1)
        return d, await d.evaluate(step=3, repeats=2)

    d, episodes = asyncio.run(go())
    assert len(episodes) == 4
    assert {(e.run.type, e.run.step, e.run.policy.start, e.run.policy.end) for e in episodes} == {
        ("eval", 3, 0, 0)
    }
    assert dict(d.counters) == {"dispatcher/errored/eval": 2}


class Gated:
    """Group k's episode waits until the test releases k (from the dispatcher's loop: episodes
    run on a loop of their own, so the gate is a plain set, polled)."""

    name = "gated"

    def __init__(self):
        self.drawn = 0
        self.released: set[int] = set()

    def task(self, rng):
        self.drawn += 1
        return self.drawn - 1

    def eval_tasks(self):
        return []

    async def run(self, episode, task):
        await episode.leader.ask("go")
        while task not in self.released:
            await asyncio.sleep(0.001)
        return 1.0


def test_generation_runs_ahead_and_stale_groups_are_dropped_as_computed_by_hand():
    """groups_per_step 1, max_off_policy_steps 1. At version 0, groups 0 and 1 may start.
    Step 1 takes g0 (0 behind). Version 1 lets g2 start; step 2 takes g2, which finished first
    (0 behind). Version 2 lets g3 start. Step 3 meets g1 (begun on v0, ended on v2: (3-1)-0 = 2
    behind, 2 of them in flight): dropped; then takes g3 (begun on v2: 0 behind)."""

    async def go():
        env, policy = Gated(), ScriptedPolicy()
        d = dispatcher(env, policy, group_size=1, groups_per_step=1, max_off_policy_steps=1)
        d.start()

        async def settle():
            for _ in range(20):
                await asyncio.sleep(0.001)

        async def release(k):
            await settle()
            env.released.add(k)

        async def bump(version):
            policy.version = version
            await d.notify()
            await settle()

        await settle()
        launched = [env.drawn]
        await release(0)
        step1 = await d.collect(1)
        await bump(1)
        launched.append(env.drawn)
        await release(2)
        step2 = await d.collect(2)
        await bump(2)
        launched.append(env.drawn)
        await release(1)
        await release(3)
        step3 = await d.collect(3)
        await d.stop()
        return launched, step1, step2, step3, d

    launched, step1, step2, step3, d = asyncio.run(go())
    assert launched == [2, 3, 4]

    def spans(groups):
        return [
            (g.task, g.episodes[0].run.policy.start, g.episodes[0].run.policy.end) for g in groups
        ]

    assert spans(step1.trained) == [(0, 0, 0)] and not step1.stale
    assert spans(step2.trained) == [(2, 1, 1)] and not step2.stale
    assert spans(step3.stale) == [(1, 0, 2)]
    assert spans(step3.trained) == [(3, 2, 2)]
    assert d.counters["dispatcher/stale_groups/train"] == 1

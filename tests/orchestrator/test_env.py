"""Agents record themselves: the forest of a run has the shape its environment meant."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from callgrove.episode import Episode
from callgrove.forest import build_forest, compact_prompts
from callgrove.orchestrator import EpisodeRun
from callgrove.orchestrator.env import EpisodeLoop
from callgrove.orchestrator.envs import make_env
from callgrove.rows import build_rows, check_rows

from .helpers import CHAT, PARAMS, ScriptedPolicy, run


def parents(episode):
    forest = build_forest(episode)
    return {
        call.id: (episode.agent_of(call).id, call.purpose, None if p < 0 else forest.calls[p].id)
        for call, p in zip(forest.calls, forest.parent, strict=True)
    }


def test_relay_episode_has_every_shape_the_env_meant():
    episode = run(make_env("relay"), "372", ScriptedPolicy("3"))
    assert episode.ok, episode.errors
    starts = {agent.id: (agent.start, agent.parent) for agent in episode.agents}
    assert starts == {
        "leader": ("root", None),
        "checker-1": ("background", "leader"),
        "helper-2": ("fresh", "leader"),
        "helper-3": ("fresh", "leader"),
        "fork-4": ("fork", "leader"),
    }
    by_agent = {agent.id: [c.id for c in agent.calls] for agent in episode.agents}
    leader_first, compaction, final = by_agent["leader"]
    shape = parents(episode)
    # The fork's first call is a child of the leader's call it copied.
    assert shape[by_agent["fork-4"][0]] == ("fork-4", "turn", leader_first)
    # The compaction call continues the old history; the call after it is a root.
    assert shape[compaction] == ("leader", "compaction", leader_first)
    assert shape[final] == ("leader", "turn", None)
    # Fresh and background subagents start their own trees.
    for agent in ("checker-1", "helper-2", "helper-3"):
        assert shape[by_agent[agent][0]][2] is None
    # Ledger order: seq is the order calls completed, unique and dense.
    assert sorted(c.seq for c in episode.calls()) == list(range(7))
    assert episode.agent("checker-1").meta == {"ended": "finished"}
    compact_prompts(episode)
    assert not check_rows(build_rows(episode)).violations


def test_prompts_extend_the_agents_previous_sequence_exactly():
    episode = run(make_env("copy"), "123", ScriptedPolicy("9"))
    first, second = episode.agent("leader").calls
    full = episode.full_ids(first)
    assert np.array_equal(episode.prompt_ids(second)[: len(full)], full)
    assert CHAT.text_of(first.completion_ids) == "9"
    assert first.logprobs is not None and len(first.logprobs) == len(first.completion_ids)
    assert first.policy_version == 0


class Hanging:
    """The leader answers, starts a background agent that never finishes, and returns."""

    name = "hanging"

    async def run(self, episode: EpisodeRun, task):
        answered = asyncio.Event()

        async def forever(agent):
            while True:
                await agent.ask("more")
                answered.set()

        episode.leader.background("looper", forever)
        await episode.leader.ask(task)
        await asyncio.wait_for(answered.wait(), timeout=30)  # the looper has a call to keep
        return 1.0


def test_a_background_agent_still_running_is_stopped_and_its_calls_stay():
    episode = run(Hanging(), "go", ScriptedPolicy(delay=0.001))
    assert episode.ok and episode.rewards == {"reward": 1.0}
    looper = episode.agent("looper-1")
    assert looper.meta == {"ended": "stopped"}
    assert looper.calls and all(c.kept for c in looper.calls)


class Raising:
    name = "raising"

    async def run(self, episode: EpisodeRun, task):
        await episode.leader.ask(task)
        raise RuntimeError("the env broke")


def test_an_exception_makes_the_episode_not_ok_with_the_error():
    episode = run(Raising(), "go", ScriptedPolicy())
    assert not episode.ok and episode.rewards == {}
    (error,) = episode.errors
    assert (error.type, error.message) == ("RuntimeError", "the env broke")
    assert [a.id for a in episode.agents] == ["leader"]
    assert len(episode.agent("leader").calls) == 1


def test_a_failed_policy_call_names_its_agent():
    episode = run(make_env("copy"), "123", ScriptedPolicy(fail_on=(1,)))
    (error,) = episode.errors
    assert (error.type, error.agent) == ("ConnectionError", "leader")
    assert not episode.ok


def test_timeout_and_cancellation_are_recorded_errors():
    slow = ScriptedPolicy(delay=10)
    episode = run(make_env("copy"), "123", slow, timeout=0.05)
    assert [e.type for e in episode.errors] == ["Timeout"] and not episode.ok

    class SelfCancelling:
        name = "cancel"

        async def run(self, episode, task):
            await episode.leader.ask(task)
            asyncio.current_task().cancel()
            await asyncio.sleep(1)

    episode = run(SelfCancelling(), "go", ScriptedPolicy())
    assert [e.type for e in episode.errors] == ["Cancelled"]
    assert len(episode.agent("leader").calls) == 1


def test_rewards_per_agent_and_unknown_env():
    episode = run(make_env("relay"), "372", ScriptedPolicy("3"))
    assert episode.agent("helper-2").rewards == {"score": 1.0}  # "first 372" -> "3"
    assert episode.agent("fork-4").rewards == {"score": 0.4}  # a digit of the right length, wrong
    with pytest.raises(ValueError, match="unknown environment 'nope'"):
        make_env("nope")


class Scored:
    """Returns whatever reward it is given, or gives it to an agent of its own."""

    name = "scored"

    def __init__(self, reward, own: bool = False):
        self.reward, self.own = reward, own

    async def run(self, episode, task):
        await episode.leader.ask("go")
        if self.own:
            episode.leader.reward(score=self.reward)
            return 1.0
        return self.reward


BAD_REWARDS = [float("nan"), float("inf"), -float("inf"), 1e308, "1", True, None]


@pytest.mark.parametrize(
    ("reward", "own"),
    [(r, False) for r in [*BAD_REWARDS, {"a": 1.0, "b": "x"}]] + [(r, True) for r in BAD_REWARDS],
)
def test_a_reward_that_is_not_a_sane_number_fails_its_episode_alone(reward, own):
    episode = run(Scored(reward, own), "t", ScriptedPolicy("1"))
    assert not episode.ok and episode.rewards == {}
    assert [e.type for e in episode.errors] == ["RewardError"]
    assert episode.agent("leader").calls  # what ran is kept


@pytest.mark.parametrize("reward", [0, -3, 2.5, np.float32(0.5), {"a": 1, "b": -1e12}])
def test_numbers_are_rewards(reward):
    episode = run(Scored(reward), "t", ScriptedPolicy("1"))
    assert episode.ok, episode.errors
    assert all(type(v) is float for v in episode.rewards.values())


def test_an_episode_cancelled_before_its_first_step_is_recorded_cancelled():
    """Its start and its cancellation reach the episode loop in one batch (the loop is held by
    another episode's synchronous sleep), so its task is cancelled before it ever runs."""

    class Holding:
        name = "hold"

        async def run(self, episode, task):
            if task == "hold":
                time.sleep(0.5)  # holds the episode loop, well under BLOCKED_AFTER
            return {"done": 1.0}

    async def go():
        episodes = EpisodeLoop()
        try:
            holder = asyncio.create_task(
                episodes.run(Holding(), "hold", ScriptedPolicy(), CHAT, PARAMS, Episode(id="h"))
            )
            await asyncio.sleep(0.1)
            cancelled = asyncio.create_task(
                episodes.run(Holding(), "go", ScriptedPolicy(), CHAT, PARAMS, Episode(id="c"))
            )
            await asyncio.sleep(0.05)
            cancelled.cancel()
            return await holder, await cancelled
        finally:
            episodes.close()

    held, cancelled = asyncio.run(go())
    assert held.ok and held.rewards == {"done": 1.0}
    assert not cancelled.ok and cancelled.rewards == {}
    assert [(e.type, e.message) for e in cancelled.errors] == [
        ("Cancelled", "cancelled before it started")
    ]

"""Small episodes for the file tests: a healthy multi-agent one and the two that produced
nothing (cancelled, and the env raised before any agent ran)."""

from __future__ import annotations

from callgrove.episode import Agent, Call, Episode
from callgrove.formats.wire import WireEnv, WireError, WirePolicy, WireRun


def healthy(episode_id: str = "ok-1") -> Episode:
    leader = Agent("L", "leader")
    first = leader.add(Call.make("C1", 1, [1, 2, 3], [4, 5], [-0.1, -0.2], policy_version=2))
    second = leader.add(Call.make("C3", 3, [], [8], [-0.3], policy_version=4))
    second.prompt_from, second.prompt_from_len = first.id, first.full_len
    solver = Agent("S", "solver", parent="L", start="fresh")
    solver.add(Call.make("C2", 2, [9, 9], [6, 7], [-0.5, -0.6], policy_version=3))
    return Episode(
        episode_id,
        [leader, solver],
        group="grp-1",
        env=WireEnv(id="login-bug", name="login"),
        run=WireRun(id="run-a", type="train", step=6, policy=WirePolicy(start=2, end=4)),
        rewards={"tests_pass": 1.0},
    )


def cancelled(episode_id: str = "cancelled-1") -> Episode:
    return Episode(
        episode_id,
        group="grp-1",
        env=WireEnv(id="login-bug", name="login"),
        run=WireRun(id="run-a", type="train", step=6, policy=None),
        ok=False,
        errors=[WireError(type="Cancelled", message="dispatcher cancelled the episode")],
    )


def env_raised(episode_id: str = "raised-1") -> Episode:
    return Episode(
        episode_id,
        group="grp-1",
        env=WireEnv(id="login-bug", name="login"),
        run=WireRun(id="run-a", type="eval", step=6, policy=WirePolicy(start=4, end=4)),
        ok=False,
        errors=[WireError(type="EnvSetupError", message="sandbox failed to start")],
    )

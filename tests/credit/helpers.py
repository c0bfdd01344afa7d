"""Small hand-built episodes for credit tests: each agent makes a few one-token-prompt calls."""

from __future__ import annotations

from itertools import count

from callgrove.episode import Agent, Call, Episode


def agent(
    agent_id: str,
    name: str,
    *,
    calls: int = 1,
    rewards: dict[str, float] | None = None,
    trainable: bool = True,
) -> Agent:
    made = Agent(agent_id, name, rewards=rewards, trainable=trainable)
    for i in range(calls):
        made.add(Call.make(f"{agent_id}.{i}", 0, [1, 2], [3, 4], [-0.5, -0.25]))
    return made


def episode(
    episode_id: str,
    *agents: Agent,
    reward: float = 0.0,
    group: str | None = "g",
    ok: bool = True,
) -> Episode:
    seq = count(1)
    for a in agents:
        for call in a.calls:
            call.seq = next(seq)
    return Episode(episode_id, list(agents), group=group, ok=ok, rewards={"score": reward})


def advantages(ep: Episode) -> dict[str, float | None]:
    """Each kept call's advantage by call id (scalars only)."""
    return {call.id: call.advantages for call in ep.calls()}

"""Load through gateway -> serve-policy on loopback, and a gateway killed with SIGKILL mid-run."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

import httpx
import pytest

from callgrove.episode import read_episodes
from callgrove.gateway.ledger import EPISODES_FILE
from callgrove.rows import build_rows, check_rows

from .helpers import server_process, write_script

pytestmark = pytest.mark.processes

EPISODES = 20
AGENTS = 5
RULES = [
    {"when": "second", "reply": "second answer"},
    {"when": "first", "reply": "first answer, some text to sample"},
]


LEADERS: dict[str, asyncio.Event] = {}  # per episode: its leader (a0) has made its first call


async def agent_calls(
    client: httpx.AsyncClient, episode: str, agent: int, answered=lambda call_id: None
) -> list[str]:
    """Two calls of one agent, the second continuing the first; returns the recorded call ids.
    The subagents (parent `a0`) start once their leader has called, as a parent calls first.

    `answered` hears each call id as soon as its response has completed."""
    leader = LEADERS.setdefault(episode, asyncio.Event())
    if agent:
        await leader.wait()
    headers = {
        "x-callgrove-agent": f"a{agent}",
        "x-callgrove-start": "root" if agent == 0 else "fresh",
    }
    if agent:
        headers["x-callgrove-parent"] = "a0"
    messages = [{"role": "user", "content": f"first task of {agent}"}]
    ids = []
    try:
        first = await client.post(
            f"/e/{episode}/v1/chat/completions", json={"messages": messages}, headers=headers
        )
    finally:
        if not agent:
            leader.set()
    first.raise_for_status()
    ids.append(first.headers["x-callgrove-call"])
    answered(ids[-1])
    messages += [first.json()["choices"][0]["message"], {"role": "user", "content": "second step"}]
    second = await client.post(
        f"/e/{episode}/v1/chat/completions",
        json={"messages": messages, "stream": True},
        headers=headers,
    )
    second.raise_for_status()
    ids.append(second.headers["x-callgrove-call"])
    answered(ids[-1])
    return ids


def check_closed(ledger, expected: dict[str, set[str]]) -> None:
    episodes = {e.id: e for e in read_episodes(ledger / EPISODES_FILE)}
    for episode_id, call_ids in expected.items():
        episode = episodes[episode_id]
        recorded = [c.id for c in episode.calls()]
        assert len(recorded) == len(set(recorded))  # each call once
        assert call_ids <= set(recorded)
        rows = build_rows(episode)
        assert check_rows(rows).ok


def test_200_concurrent_calls_are_each_recorded_once(tmp_path):
    script = write_script(tmp_path / "s.json", RULES)
    ledger = tmp_path / "ledger"
    with (
        server_process("serve-policy", "--script", str(script)) as (_, upstream),
        server_process("gateway", "--upstream", upstream, "--ledger", str(ledger)) as (_, gateway),
    ):

        async def go():
            limits = httpx.Limits(max_connections=200)
            async with httpx.AsyncClient(base_url=gateway, timeout=60, limits=limits) as client:
                tasks = {
                    (e, a): agent_calls(client, f"load-{e}", a)
                    for e in range(EPISODES)
                    for a in range(AGENTS)
                }
                results = await asyncio.wait_for(asyncio.gather(*tasks.values()), 120)
                closed = [
                    await client.post(f"/e/load-{e}/close", json={"rewards": {"r": 1}})
                    for e in range(EPISODES)
                ]
                return dict(zip(tasks, results, strict=True)), closed

        results, closed = asyncio.run(go())
    assert all(r.status_code == 200 for r in closed)
    expected: dict[str, set[str]] = {}
    for (episode, _), ids in results.items():
        expected.setdefault(f"load-{episode}", set()).update(ids)
    assert sum(len(ids) for ids in expected.values()) == EPISODES * AGENTS * 2
    check_closed(ledger, expected)
    for episode in read_episodes(ledger / EPISODES_FILE):
        assert all(len(a.calls) == 2 for a in episode.agents)
        assert all(a.calls[1].prompt_from == a.calls[0].id for a in episode.agents)  # continued


def test_calls_answered_before_a_kill_9_survive_the_restart(tmp_path):
    script = write_script(tmp_path / "s.json", RULES)
    ledger = tmp_path / "ledger"
    completed: dict[str, set[str]] = {}
    with server_process("serve-policy", "--script", str(script)) as (_, upstream):
        with server_process("gateway", "--upstream", upstream, "--ledger", str(ledger)) as (
            process,
            gateway,
        ):

            async def until_killed():
                async with httpx.AsyncClient(base_url=gateway, timeout=30) as client:

                    def answered(episode: str, call_id: str) -> None:
                        completed.setdefault(episode, set()).add(call_id)
                        if sum(map(len, completed.values())) == 60:  # kill at once, mid-run
                            os.killpg(process.pid, signal.SIGKILL)

                    async def one(episode: str, agent: int) -> None:
                        with contextlib.suppress(httpx.HTTPError):  # cut off by the kill
                            await agent_calls(
                                client, episode, agent, lambda c: answered(episode, c)
                            )

                    tasks = [one(f"kill-{e}", a) for e in range(EPISODES) for a in range(AGENTS)]
                    await asyncio.wait_for(asyncio.gather(*tasks), 120)

            asyncio.run(until_killed())
            process.wait(10)
        answered = sum(map(len, completed.values()))
        assert 60 <= answered < EPISODES * AGENTS * 2  # killed mid-run
        with server_process("gateway", "--upstream", upstream, "--ledger", str(ledger)) as (
            _,
            gateway,
        ):

            async def close_all():
                async with httpx.AsyncClient(base_url=gateway, timeout=30) as client:
                    return [
                        await client.post(f"/e/kill-{e}/close", json={}) for e in range(EPISODES)
                    ]

            closed = asyncio.run(close_all())
    assert all(r.status_code == 200 for r in closed)
    check_closed(ledger, completed)

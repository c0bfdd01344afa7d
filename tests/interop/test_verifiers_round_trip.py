"""callgrove -> verifiers -> callgrove gives every episode back field by field: what verifiers'
rows have no field for travels in the traces' `info`; what cannot travel is reported."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from msgspec import UNSET
from typer.testing import CliRunner

from callgrove.cli import app
from callgrove.episode import Agent, Call, Episode, save
from callgrove.episode.provenance import Gap, Spawn
from callgrove.formats.problems import InputError
from callgrove.formats.wire import WireEnv, WireError, WirePolicy, WireRun
from callgrove.interop.verifiers import (
    read_verifiers,
    verifiers_row,
    write_advantages,
    write_verifiers,
)

from .helpers import read_with_verifiers, row_tokens

TOKENS = st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=4)
NAMES = st.sampled_from(["pass", "style", "len"])
FLOATS = st.floats(-4, 4, allow_nan=False, allow_subnormal=False)
LOGPROBS = st.floats(-4, 0, allow_nan=False, allow_subnormal=False)  # a log-probability is <= 0


@st.composite
def calls_of(draw, agent: Agent, ids: itertools.count) -> None:
    """A few calls, each resending the last kept call's whole sequence or starting afresh."""
    history: list[int] = []
    for _ in range(draw(st.integers(0, 4))):
        prompt = (history if history and draw(st.booleans()) else []) + draw(TOKENS)
        completion = draw(TOKENS)
        purpose = draw(st.sampled_from(["turn", "turn", "compaction"]))
        kept = draw(st.booleans()) if draw(st.booleans()) else True
        per_token = st.lists(FLOATS, min_size=len(completion), max_size=len(completion))
        logprobs = st.lists(LOGPROBS, min_size=len(completion), max_size=len(completion))
        call = Call.make(
            f"{agent.id}:{next(ids)}",
            0,  # numbered over the episode below
            prompt,
            completion,
            draw(st.none() | logprobs),
            policy_version=draw(st.none() | st.integers(-(2**63), 2**63 - 1)),
            purpose=purpose,
            kept=kept,
            advantages=draw(st.none() | FLOATS | per_token.map(np.asarray)),
            content=draw(st.none() | st.just({"text": "ok [/] \x1b"})),
        )
        agent.add(call)
        if kept:
            history = prompt + completion


@st.composite
def episodes(draw) -> Episode:
    ids = itertools.count()
    agents: list[Agent] = []
    for number in range(draw(st.integers(0, 3))):
        agent = Agent(
            f"a{number}",
            draw(st.sampled_from(["leader", "explore"])),
            parent=None if number == 0 else "a0",
            start="root" if number == 0 else draw(st.sampled_from(["fresh", "fork", "background"])),
            trainable=draw(st.booleans()),
            rewards=draw(st.none() | st.dictionaries(NAMES, FLOATS, max_size=2)),
            meta=draw(st.none() | st.just({"model": "m", "n": [1, 2]})),
            spawn=None if number == 0 else draw(st.none() | st.just(Spawn(call="x", link="t"))),
        )
        draw(calls_of(agent, ids))
        agents.append(agent)
    calls = [call for agent in agents for call in agent.calls]
    seqs = draw(st.permutations(range(1, 3 * len(calls) + 2)))
    # seqs follow each agent's sending order (a later call resends an earlier one's tokens)
    for call, seq in zip(calls, sorted(seqs[: len(calls)]), strict=True):
        call.seq = seq
    for agent in agents:
        if draw(st.booleans()):
            agent.calls.reverse()  # an agent's calls listed in another order than by seq
    call_ids = [call.id for call in calls]
    agent_ids = [agent.id for agent in agents]
    errors = [
        WireError(
            type=draw(st.sampled_from(["Timeout", "ToolError"])),
            message="m",
            agent=draw(st.sampled_from([UNSET, "elsewhere", *agent_ids])),
            call=draw(st.sampled_from([UNSET, *call_ids])),
        )
        for _ in range(draw(st.integers(0, 3)))
    ]
    run = draw(
        st.none()
        | st.builds(
            WireRun,
            id=st.sampled_from([None, "", "run-1"]),
            type=st.sampled_from(["train", "eval"]),
            step=st.none() | st.integers(0, 9),
            policy=st.none() | st.just(WirePolicy(start=1, end=3)),
        )
    )
    return Episode(
        id=draw(st.sampled_from(["e", "ep [1]"])),
        agents=agents,
        group=draw(st.none() | st.just("g")),
        env=draw(st.none() | st.builds(WireEnv, id=st.sampled_from([None, "", "env"]))),
        task=draw(
            st.none()
            | st.just({"prompt": "p"})
            | st.just({"type": "Login", "data": {"prompt": "p"}})
            | st.just({"type": "callgrove", "data": {"task": 1}})
        ),
        run=run,
        ok=draw(st.booleans()),
        errors=errors,
        rewards=draw(st.dictionaries(NAMES, FLOATS, max_size=2)),
        objective=draw(st.sampled_from([None, "rl", "supervised"])),
        gaps=draw(st.none() | st.just([Gap(kind="subagent_file_missing", agent="a0")])),
        meta=draw(
            st.none() | st.just({"source": "x"}) | st.just({"verifiers": {"is_timeout": True}})
        ),
    )


def fields(episode: Episode) -> dict[str, Any]:
    """Every field of the episode, prompts as their tokens (their reference form may differ)."""

    def plain(value: Any) -> Any:
        return value.tolist() if isinstance(value, np.ndarray) else value

    return {
        **{
            name: getattr(episode, name)
            for name in ("id", "group", "env", "task", "run", "ok", "errors", "rewards")
        },
        **{name: getattr(episode, name) for name in ("objective", "gaps", "meta")},
        "agents": [
            {
                **{
                    name: getattr(agent, name)
                    for name in ("id", "name", "parent", "start", "trainable", "rewards", "meta")
                },
                "spawn": agent.spawn,
                "calls": [
                    {
                        **{
                            name: plain(getattr(call, name))
                            for name in (
                                "id",
                                "seq",
                                "completion_ids",
                                "logprobs",
                                "policy_version",
                                "purpose",
                                "kept",
                                "advantages",
                                "content",
                            )
                        },
                        "prompt_ids": episode.prompt_ids(call).tolist(),
                    }
                    for call in agent.calls
                ],
            }
            for agent in episode.agents
        ],
    }


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(episode=episodes())
def test_episodes_come_back_from_verifiers_field_by_field(tmp_path: Path, episode: Episode) -> None:
    path = tmp_path / "traces.jsonl"
    path.unlink(missing_ok=True)
    notes: list[dict[str, Any]] = []
    row = verifiers_row(episode, notes)
    write_verifiers(path, [episode])
    [back] = read_verifiers(path)
    if episode.agents:
        assert notes == []
        assert fields(back) == fields(episode)
    else:  # no trace to carry the episode's own fields: each one left out is named
        left_out = {note["kind"].removeprefix("episode_") for note in notes}
        want, got = fields(episode), fields(back)
        assert {name for name in want if want[name] != got[name]} == left_out
    assert row_tokens(back) == row_tokens(episode)
    assert json.loads(path.read_bytes()) == json.loads(json.dumps(row))


def test_verifiers_reads_what_carries_the_rest(tmp_path: Path) -> None:
    """The carried fields sit in verifiers' own free-form `info`: its reader takes the rows."""
    leader = Agent("L", "leader")
    leader.add(Call.make("C1", 1, [1, 2], [3], [-0.1], policy_version=4))
    leader.add(Call.make("R", 2, [1, 2], [5], [-0.2], kept=False))
    worker = Agent("W", "explore", parent="L", start="fork")
    worker.add(Call.make("C2", 3, [1, 2, 3, 9], [6], [-0.3], advantages=0.5))
    episode = Episode(
        id="e",
        agents=[leader, worker],
        rewards={"pass": 1.0},
        objective="rl",
        errors=[WireError(type="Timeout", message="slow", agent="W", call="C2")],
        run=WireRun(type="train", step=None),
    )
    write_verifiers(tmp_path / "traces.jsonl", [episode])
    [theirs] = read_with_verifiers(tmp_path)
    carried = theirs.traces[0].info["callgrove"]
    assert carried["episode"]["rewards"] == {"pass": 1.0}
    assert [c["id"] for c in carried["calls"]] == ["C1"]
    assert [c["id"] for c in carried["off_graph"]] == ["R"]
    assert theirs.traces[1].info["callgrove"]["parent"] == "L"
    [back] = read_verifiers(tmp_path / "traces.jsonl")
    assert fields(back) == fields(episode)


def test_credit_goes_back_onto_rows_callgrove_wrote(tmp_path: Path) -> None:
    leader = Agent("L", "leader")
    leader.add(Call.make("C1", 1, [1, 2], [3, 4], [-0.1, -0.2]))
    leader.add(Call.make("R", 2, [1, 2], [5], [-0.2], kept=False))
    leader.add(Call.make("C2", 3, [1, 2, 3, 4, 7], [6], [-0.3]))
    source = tmp_path / "traces.jsonl"
    write_verifiers(source, [Episode(id="e", agents=[leader], rewards={"pass": 1.0})])
    [episode] = read_verifiers(source)
    episode.call("C1").advantages = np.asarray([0.5, 0.25])
    episode.call("R").advantages = 0.0
    episode.call("C2").advantages = -1.0
    credited = tmp_path / "out" / "traces.jsonl"
    credited.parent.mkdir()
    write_advantages(source, [episode], credited)
    [back] = read_verifiers(credited)
    assert fields(back) == fields(episode)
    episode.agents[0].calls[0].id = "renamed"
    with pytest.raises(InputError, match="in no node"):
        write_advantages(source, [episode], tmp_path / "x.jsonl")


def test_convert_names_and_counts_what_an_episode_without_traces_cannot_carry(
    tmp_path: Path,
) -> None:
    source = tmp_path / "in.jsonl"
    save(source, [Episode(id="e", rewards={"pass": 1.0}, objective="rl"), Episode(id="f")])
    result = CliRunner().invoke(app, ["convert", str(source), str(tmp_path / "traces.jsonl")])
    assert result.exit_code == 0, result.output
    assert "not held by verifiers" in result.stderr
    counts = dict(re.findall(r"(episode_\w+)\s*│\s*(\d+)", result.stderr))
    assert counts == {"episode_rewards": "1", "episode_objective": "1", "episode_env": "2"}

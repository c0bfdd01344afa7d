"""ATIF in and out, checked through Harbor's own code: its pydantic models validate what
callgrove writes, its converters wrote the trajectories read here (tests/data/atif, from the
Claude Code and Codex sessions in tests/data), and what callgrove reads from them is compared
with callgrove's own import of the same sessions. harbor is a test dependency (the Makefile
installs it): without it these tests fail at import, they are not skipped."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import orjson
import pytest
from harbor.models.trajectories import Trajectory
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import callgrove as cg
from callgrove.chat import BuiltinFormat
from callgrove.cli import app
from callgrove.episode import Episode
from callgrove.episode.files import FORMATS
from callgrove.formats.looks import suffix_by_content
from callgrove.formats.problems import Diagnostics, InputError
from callgrove.interop.atif import (
    ATIF_VERSIONS,
    episode_trajectory,
    read_atif,
    takes_chat,
    written_losses,
)
from callgrove.rows import build_rows, check_rows
from callgrove.rows.table import row_record
from callgrove.synth.workload import Shape, synth_episode
from callgrove.transcripts import ImportReport, TranscriptRenderer, import_claude_code, import_codex

DATA = Path(__file__).resolve().parent.parent / "data"
CONVERTED = sorted((DATA / "atif").glob("*.json"))
IMPORTERS = {"claude_code": import_claude_code, "codex": import_codex}


def rows_of(episode: Episode) -> list[dict[str, Any]]:
    result = build_rows(episode)
    records = [row_record(result, row, tokens=True) for row in result.rows]
    return orjson.loads(orjson.dumps(records, option=orjson.OPT_SERIALIZE_NUMPY))


def written(episode: Episode) -> dict[str, Any]:
    """The episode as callgrove writes it in ATIF, as a JSON document."""
    return json.loads(msgspec.json.encode(episode_trajectory(episode)))


def harbor_valid(document: dict[str, Any]) -> None:
    Trajectory.model_validate(document)


# --- trajectories Harbor's converters wrote -------------------------------------------------


def test_every_harbor_converted_session_is_here():
    scenarios = {
        f"{harness}_{scenario.name}.json"
        for harness in IMPORTERS
        for scenario in (DATA / harness).iterdir()
        if scenario.is_dir()
    }
    assert {path.name for path in CONVERTED} == scenarios


@pytest.mark.parametrize("path", CONVERTED, ids=lambda p: p.stem)
def test_harbor_converted_trajectories_read_as_callgroves_own_import(path):
    harness = "claude_code" if path.stem.startswith("claude_code") else "codex"
    scenario = path.stem.removeprefix(harness + "_")
    harbor_valid(json.loads(path.read_text()))
    (episode,) = cg.load(path)
    transcripts = IMPORTERS[harness](DATA / harness / scenario / "sessions", ImportReport())
    imported = [TranscriptRenderer().episode(t) for t in transcripts]

    # Every model step Harbor kept is a call, answering what callgrove's import answered.
    steps = json.loads(path.read_text())
    model_steps = _model_steps(steps)
    assert len(list(episode.calls())) == model_steps
    answers = Counter(c.content["response"]["content"] for c in episode.calls())
    own = [c for e in imported for c in e.calls()]
    # Harbor's Claude Code converter writes a compaction's summary as a user step, not as
    # the model call that wrote it; its Codex converter keeps it as an ordinary agent step.
    left_out = [c for c in own if c.purpose == "compaction" and harness == "claude_code"]
    expected = Counter(c.content["response"]["content"] for c in own if c not in left_out)
    assert answers == expected
    assert episode.supervised and not episode.scored
    assert episode.meta["rendered_steps"] == model_steps

    # Each agent is there, linked to its parent; how each began Harbor does not record, and
    # every such link is counted in the gaps.
    # (Harbor writes the two sessions of a forked session as one trajectory.)
    assert len(episode.agents) == max(len(e.agents) for e in imported)
    unknown = [g.agent for g in episode.gaps or [] if g.kind == "atif_start_unknown"]
    assert unknown == [a.id for a in episode.agents if a.parent is not None]
    assert check_rows(build_rows(episode)).ok


def _model_steps(trajectory: dict[str, Any]) -> int:
    own = sum(
        s["source"] == "agent" and not s.get("is_copied_context") and s.get("llm_call_count") != 0
        for s in trajectory["steps"]
    )
    return own + sum(_model_steps(sub) for sub in trajectory.get("subagent_trajectories") or [])


def test_a_folder_of_trajectories_is_read_whole_by_every_command(tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["check", str(DATA / "atif")])
    assert result.exit_code == 0, result.output
    episodes = list(cg.load(DATA / "atif"))
    assert len(episodes) == len(CONVERTED)
    assert len({e.id for e in episodes}) == len(episodes)


# --- callgrove -> ATIF -> callgrove ---------------------------------------------------------

SHAPES = st.builds(
    Shape,
    leader_calls=st.integers(1, 6),
    fresh=st.integers(1, 2),
    forks=st.integers(0, 2),
    fork_depth=st.integers(1, 2),
    background=st.integers(0, 1),
    twins=st.integers(0, 1),
    subagent_calls=st.integers(1, 3),
    compactions=st.integers(0, 2),
    context=st.sampled_from([64, 200, 600]),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=SHAPES, seed=st.integers(0, 2**16))
def test_round_trip_gives_the_same_rows_and_harbor_validates_it(shape, seed):
    episode = synth_episode(shape, seed)
    document = written(episode)
    harbor_valid(document)
    (back,) = _read_back(document)
    assert rows_of(back) == rows_of(episode)
    assert [(a.id, a.name, a.parent, a.start, a.trainable) for a in back.agents] == [
        (a.id, a.name, a.parent, a.start, a.trainable) for a in episode.agents
    ]
    assert back.rewards == episode.rewards and back.run == episode.run


def _read_back(document: dict[str, Any], tmp: Path | None = None) -> list[Episode]:
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trajectory.json"
        path.write_text(json.dumps(document))
        return list(cg.load(path))


def test_convert_to_atif_and_back_on_the_command_line(tmp_path):
    episodes = [
        synth_episode(Shape(leader_calls=3, subagent_calls=2, context=200), s) for s in (1, 2)
    ]
    cg.save(tmp_path / "in.jsonl", episodes)
    runner = CliRunner()
    for out in ("out", "out.jsonl"):
        result = runner.invoke(
            app, ["convert", str(tmp_path / "in.jsonl"), "--to", "atif", str(tmp_path / out)]
        )
        assert result.exit_code == 0, result.output
        result = runner.invoke(
            app, ["convert", str(tmp_path / out), str(tmp_path / f"{out}.back.jsonl")]
        )
        assert result.exit_code == 0, result.output
        back = list(cg.load(tmp_path / f"{out}.back.jsonl"))
        assert [rows_of(e) for e in back] == [rows_of(e) for e in episodes]
    for path in (tmp_path / "out").iterdir():
        harbor_valid(json.loads(path.read_text()))
    one = runner.invoke(
        app, ["convert", str(tmp_path / "in.jsonl"), "--to", "atif", str(tmp_path / "one.json")]
    )
    assert one.exit_code == 1 and "holds one trajectory" in one.output


# --- hand-made trajectories with token ids ---------------------------------------------------


def _step(step_id: int, prompt: list[int], completion: list[int], **extra: Any) -> dict[str, Any]:
    return {
        "step_id": step_id,
        "source": "agent",
        "message": "",
        "metrics": {
            "prompt_token_ids": prompt,
            "completion_token_ids": completion,
            "logprobs": [-0.5] * len(completion),
        },
        **extra,
    }


def _user(step_id: int, text: str = "go", **extra: Any) -> dict[str, Any]:
    return {"step_id": step_id, "source": "user", "message": text, **extra}


def _refs(step: dict[str, Any], *children: tuple[str, str | None]) -> dict[str, Any]:
    step["tool_calls"] = [
        {"tool_call_id": f"t-{c}", "function_name": "spawn", "arguments": {}} for c, _ in children
    ]
    step["observation"] = {
        "results": [
            {
                "source_call_id": f"t-{child}",
                "subagent_trajectory_ref": [
                    {"trajectory_id": child, **({"extra": {"start": start}} if start else {})}
                ],
            }
            for child, start in children
        ]
    }
    return step


def _trajectory(trajectory_id: str, steps: list[dict[str, Any]], **more: Any) -> dict[str, Any]:
    return {
        "schema_version": "ATIF-v1.7",
        "trajectory_id": trajectory_id,
        "agent": {"name": trajectory_id.split("-")[0], "version": "1"},
        "steps": steps,
        **more,
    }


def multi_agent() -> dict[str, Any]:
    """A leader that forks (the fork's first step copies its history), starts a background
    agent and two twins, and compacts its history."""
    leader = [
        _user(1),
        _refs(
            _step(2, [1, 2], [3, 4]),
            ("fork-1", None),
            ("bg-1", "background"),
            ("twin-1", "fresh"),
            ("twin-2", "fresh"),
        ),
        _step(3, [1, 2, 3, 4, 5], [6], extra={"context_management": {"type": "compaction"}}),
        _step(4, [7, 6], [8]),
    ]
    fork = [
        {"step_id": 1, "source": "agent", "message": "", "is_copied_context": True},
        _step(2, [1, 2, 3, 4, 9], [10]),
    ]
    subs = [
        _trajectory("fork-1", fork),
        _trajectory("bg-1", [_step(1, [20], [21])]),
        _trajectory("twin-1", [_step(1, [30], [31])]),
        _trajectory("twin-2", [_step(1, [30], [31])]),
    ]
    return _trajectory("leader-1", leader, session_id="run-7", subagent_trajectories=subs)


def test_hand_made_multi_agent_trajectory():
    document = multi_agent()
    harbor_valid(document)
    (episode,) = _read_back(document)
    starts = {a.id: (a.parent, a.start) for a in episode.agents}
    assert starts == {
        "leader-1": (None, "root"),
        "fork-1": ("leader-1", "fork"),
        "bg-1": ("leader-1", "background"),
        "twin-1": ("leader-1", "fresh"),
        "twin-2": ("leader-1", "fresh"),
    }
    # every start was said or shown; the user step's text is history held as tokens only
    (history,) = episode.gaps
    assert history.kind == "atif_history_text_not_kept" and history.agent == "leader-1"
    assert history.detail == {"messages": 1, "results": 0}
    assert [c.purpose for c in episode.agents[0].calls] == ["turn", "compaction", "turn"]
    assert episode.meta["copied_steps"] == 1
    result = build_rows(episode)
    assert check_rows(result).ok
    trained = Counter(c.id for row in result.rows for c in row.trains)
    assert set(trained) == {c.id for c in episode.calls()} and set(trained.values()) == {1}
    fork_row = next(r for r in result.rows if r.leaf.id == "fork-1/step-2")
    assert [c.id for c in fork_row.path] == ["leader-1/step-2", "fork-1/step-2"]
    assert [r.duplicate_of is not None for r in result.rows].count(True) == 1  # the twins


def test_steps_without_token_ids_beside_ones_with_them_are_counted():
    document = multi_agent()
    document["steps"].append({"step_id": 5, "source": "agent", "message": "done"})
    (episode,) = _read_back(document)
    (gap,) = [g for g in episode.gaps if g.kind != "atif_history_text_not_kept"]
    assert gap.kind == "atif_step_without_token_ids" and gap.call == "leader-1/step-5"


def test_subagent_files_and_continuations_are_followed(tmp_path):
    child = _trajectory("child-1", [_step(1, [5], [6])])
    (tmp_path / "child.json").write_text(json.dumps(child))
    (tmp_path / "leader.cont-1.json").write_text(
        json.dumps(_trajectory("leader-1", [_step(1, [1, 2, 3], [4])]))
    )
    step = _step(1, [1], [2, 3])
    step["observation"] = {
        "results": [{"subagent_trajectory_ref": [{"trajectory_path": "child.json"}]}]
    }
    leader = _trajectory("leader-1", [step], continued_trajectory_ref="leader.cont-1.json")
    (tmp_path / "leader.json").write_text(json.dumps(leader))
    for path in tmp_path.iterdir():
        harbor_valid(json.loads(path.read_text()))
    (episode,) = cg.load(tmp_path)  # the child and the continuation are no episodes of their own
    assert [(a.id, len(a.calls)) for a in episode.agents] == [("leader-1", 2), ("child-1", 1)]
    assert [g.kind for g in episode.gaps] == ["atif_start_unknown"]


def test_every_version_is_read():
    for version in ATIF_VERSIONS:
        document = {**multi_agent(), "schema_version": version}
        assert len(_read_back(document)) == 1


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda d: d.update(schema_version="ATIF-v2.0"), "schema_version 'ATIF-v2.0'"),
        (lambda d: d["steps"][1].update(colour="red"), "colour"),
        (
            lambda d: d["steps"][1]["metrics"].pop("prompt_token_ids"),
            "trajectory leader-1, step 2: completion_token_ids without prompt_token_ids",
        ),
        (
            lambda d: d["steps"][2].update(llm_call_count=2),
            "trajectory leader-1, step 3: llm_call_count 2",
        ),
        (
            lambda d: d["steps"][3]["metrics"].update(logprobs=[0.5]),
            "leader-1/step-4",
        ),
        (
            lambda d: d["steps"][1]["observation"]["results"][0]["subagent_trajectory_ref"][
                0
            ].update(trajectory_id="nobody"),
            "trajectory leader-1, step 2: subagent reference 'nobody' names no embedded",
        ),
    ],
)
def test_a_bad_trajectory_is_an_error_naming_file_trajectory_and_step(tmp_path, change, says):
    document = multi_agent()
    change(document)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(document))
    with pytest.raises(InputError) as raised:
        list(cg.load(path))
    message = str(raised.value)
    assert says in message and "bad.json" in message
    diagnostics = Diagnostics()
    assert list(cg.load(path, diagnostics)) == []
    assert len(diagnostics.errors) == 1


def test_a_bad_file_in_a_folder_is_named_and_the_others_still_read(tmp_path):
    (tmp_path / "good.json").write_text(json.dumps(multi_agent()))
    (tmp_path / "bad.json").write_text(json.dumps({**multi_agent(), "steps": "none"}))
    diagnostics = Diagnostics()
    assert [e.id for e in cg.load(tmp_path, diagnostics)] == ["leader-1"]
    (problem,) = diagnostics.errors
    assert problem.file.endswith("bad.json") and "steps" in problem.message
    result = CliRunner().invoke(app, ["rows", str(tmp_path)])
    assert result.exit_code == 1 and "bad.json" in result.output


def test_callgrove_extra_holding_no_call_field_is_an_error():
    document = written(synth_episode(Shape(leader_calls=2, subagent_calls=1, context=64), 5))
    document["steps"][0]["extra"]["callgrove"]["colour"] = "red"
    with pytest.raises(InputError, match=r"step 1: extra.callgrove holds \['colour'\]"):
        _read_back(document)


def test_steps_a_tool_added_to_a_written_trajectory_are_read_as_atif_says():
    document = written(synth_episode(Shape(leader_calls=2, subagent_calls=1, context=64), 6))
    next_id = len(document["steps"]) + 1
    document["steps"].append({"step_id": next_id, "source": "agent", "message": "a note"})
    document["subagent_trajectories"].append(_trajectory("added-1", [_step(1, [40], [41])]))
    harbor_valid(document)
    (episode,) = _read_back(document)
    added = [a for a in episode.agents if a.id == "added-1"]
    assert [(a.parent, len(a.calls)) for a in added] == [(document["trajectory_id"], 1)]
    kinds = Counter(g.kind for g in episode.gaps or [])
    assert kinds["atif_step_without_token_ids"] == 1


def test_a_job_folder_of_trial_folders_is_read(tmp_path):
    for trial in ("trial-a", "trial-b"):
        (tmp_path / trial / "agent").mkdir(parents=True)
        document = {**multi_agent(), "trajectory_id": None, "session_id": "same-session"}
        (tmp_path / trial / "agent" / "trajectory.json").write_text(json.dumps(document))
    (tmp_path / "trial-a" / "config.json").write_text("{}")  # not a trajectory: not read
    ids = [e.id for e in cg.load(tmp_path)]
    assert ids == ["same-session", "same-session:trial-b/agent/trajectory"]


def _said(step_id: int, text: str, **extra: Any) -> dict[str, Any]:
    return {"step_id": step_id, "source": "agent", "message": text, **extra}


def test_steps_without_token_ids_render_as_a_transcript():
    """Harbor's own summarising agent: a summary subagent, a system step that hands off to
    it (the history replaced), copied steps and deterministic dispatches as history only."""
    summary = _trajectory("summary-1", [_user(1, "summarise"), _said(2, "the summary")])
    handoff = {
        "step_id": 4,
        "source": "system",
        "message": "handed off",
        "observation": {"results": [{"subagent_trajectory_ref": [{"trajectory_id": "summary-1"}]}]},
        "extra": {"context_management": {"type": "compaction", "boundary": "replace"}},
    }
    leader = [
        _user(1, "task"),
        _said(2, "first"),
        _said(3, "dispatched", llm_call_count=0),
        handoff,
        _said(5, "copied", is_copied_context=True),
        _said(6, "after", llm_call_count=2),
    ]
    document = _trajectory("leader-1", leader, subagent_trajectories=[summary])
    harbor_valid(document)
    (episode,) = _read_back(document)
    assert episode.supervised
    calls = {c.id: c for c in episode.calls()}
    assert sorted(calls) == ["leader-1/step-2", "leader-1/step-6", "summary-1/step-2"]
    after = calls["leader-1/step-6"]
    # the handoff replaced the history: the call after it starts afresh, from the handoff on
    assert [m["content"] for m in after.content["prompt"]] == ["handed off", "copied"]
    assert after.prompt_from is None
    assert episode.meta["copied_steps"] == 1 and episode.meta["rendered_steps"] == 3
    kinds = sorted(g.kind for g in episode.gaps)
    assert kinds == ["atif_aggregated_step", "atif_rendered_bytewise", "atif_start_unknown"]
    assert check_rows(build_rows(episode)).ok


# --- what a token trajectory says besides its tokens -----------------------------------------


def talking() -> dict[str, Any]:
    """A token trajectory whose steps say things: system and user text, an answer with
    reasoning and a tool call, the tool's result, and a subagent started by a tool call."""
    answer = _step(3, [1, 2], [3, 4])
    answer.update(
        message="I will look",
        reasoning_content="first, the files",
        model_name="m-7",
        timestamp="2025-01-02T03:04:05Z",
        tool_calls=[
            {"tool_call_id": "t-ls", "function_name": "ls", "arguments": {"path": "."}},
            {"tool_call_id": "t-sub", "function_name": "spawn", "arguments": {"task": "x"}},
        ],
        observation={
            "results": [
                {"source_call_id": "t-ls", "content": "a.py b.py"},
                {
                    "source_call_id": "t-sub",
                    "subagent_trajectory_ref": [
                        {"trajectory_id": "sub-1", "extra": {"start": "fresh"}}
                    ],
                },
            ]
        },
    )
    answer["metrics"].update(prompt_tokens=2, cached_tokens=1, cost_usd=0.5)
    leader = [
        {"step_id": 1, "source": "system", "message": "be brief"},
        _user(2, "list the files"),
        answer,
        _step(4, [1, 2, 3, 4, 5], [6], message="done"),
    ]
    document = _trajectory(
        "leader-1", leader, subagent_trajectories=[_trajectory("sub-1", [_step(1, [9], [8])])]
    )
    document["agent"].update(version="2.1.0", model_name="m-7")
    return document


def test_a_token_step_keeps_its_message_reasoning_and_tool_calls():
    document = talking()
    harbor_valid(document)
    (episode,) = _read_back(document)
    leader = episode.agents[0]
    assert leader.meta["version"] == "2.1.0" and leader.meta["model_name"] == "m-7"
    first = leader.calls[0]
    assert first.content["response"] == {
        "role": "assistant",
        "content": "I will look",
        "reasoning_content": "first, the files",
        "tool_calls": [
            {
                "id": "t-ls",
                "type": "function",
                "function": {"name": "ls", "arguments": {"path": "."}},
            },
            {
                "id": "t-sub",
                "type": "function",
                "function": {"name": "spawn", "arguments": {"task": "x"}},
            },
        ],
    }
    assert first.content["model"] == "m-7" and first.content["timestamp"] == "2025-01-02T03:04:05Z"
    assert first.content["usage"] == {"prompt_tokens": 2, "cached_tokens": 1, "cost_usd": 0.5}
    assert episode.agent("sub-1").spawn.tool_call_id == "t-sub"
    # the system and user text and the ls result are history held as tokens only: counted
    (history,) = episode.gaps
    assert (history.kind, history.agent) == ("atif_history_text_not_kept", "leader-1")
    assert history.detail == {"messages": 2, "results": 1}


def test_what_a_token_step_says_survives_atif_callgrove_atif():
    document = talking()
    (episode,) = _read_back(document)
    again = written(episode)
    harbor_valid(again)
    (back,) = _read_back(again)
    third = written(back)
    harbor_valid(third)
    for out in (again, third):
        assert out["agent"]["version"] == "2.1.0" and out["agent"]["model_name"] == "m-7"
        step = out["steps"][0]
        for name in ("message", "reasoning_content", "tool_calls", "model_name", "timestamp"):
            assert step[name] == document["steps"][2][name], name
        assert step["metrics"]["cached_tokens"] == 1 and step["metrics"]["cost_usd"] == 0.5
        assert out["steps"][1]["message"] == "done"
        # the subagent's reference names the tool call that started it
        (result,) = step["observation"]["results"]
        assert result["source_call_id"] == "t-sub"
    assert [c.content for c in back.calls()] == [c.content for c in episode.calls()]
    assert [g.kind for g in back.gaps] == ["atif_history_text_not_kept"]  # carried, not doubled
    assert rows_of(back) == rows_of(episode)


def test_tool_call_arguments_that_are_no_object_survive_a_round_trip():
    (episode,) = _read_back(talking())
    first = episode.agents[0].calls[0]
    first.content["response"]["tool_calls"][0]["function"]["arguments"] = "ls -la"
    document = written(episode)
    harbor_valid(document)
    (tool_call, _spawn) = document["steps"][0]["tool_calls"]
    assert tool_call["arguments"] == {}
    assert tool_call["extra"] == {"callgrove": {"arguments": "ls -la"}}
    (back,) = _read_back(document)
    assert back.agents[0].calls[0].content == first.content
    # a trajectory not written by callgrove: the carried arguments are read from the step
    document["steps"][0]["extra"].pop("callgrove")
    document.pop("extra")
    (bare,) = _read_back(document)
    arguments = bare.agents[0].calls[0].content["response"]["tool_calls"][0]["function"]
    assert arguments["arguments"] == "ls -la"


def test_writing_loses_nothing_and_keeps_the_agents_order():
    episodes = [
        synth_episode(Shape(leader_calls=3, forks=1, twins=1, context=200), s) for s in (1, 2)
    ]
    transcripts = import_codex(DATA / "codex" / "fork_subagent" / "sessions", ImportReport())
    episodes += [TranscriptRenderer().episode(t) for t in transcripts]
    (read,) = _read_back(talking())
    episodes.append(read)
    for episode in episodes:
        assert written_losses(episode) == {}, episode.id
    # the root need not come first
    episode = episodes[0]
    episode.agents.append(episode.agents.pop(0))
    episode.ledger()
    (back,) = _read_back(written(episode))
    assert [a.id for a in back.agents] == [a.id for a in episode.agents]
    assert written_losses(episode) == {}


def test_written_losses_names_what_does_not_come_back(monkeypatch):
    from callgrove.interop import atif

    episode = synth_episode(Shape(leader_calls=3, subagent_calls=2, context=200), 3)
    episode.agents.append(episode.agents.pop(0))
    episode.ledger()
    writer = atif.episode_trajectory

    def forgetful(episode: Episode):
        trajectory = writer(episode)
        del trajectory.extra["callgrove"]["agent_order"]
        del trajectory.extra["callgrove"]["episode"]["rewards"]
        trajectory.steps[0].extra["callgrove"].pop("kept", None)
        trajectory.steps[0].extra["callgrove"]["purpose"] = "compaction"
        return trajectory

    episode.rewards = {"r": 1.0}
    monkeypatch.setattr(atif, "episode_trajectory", forgetful)
    losses = atif.written_losses(episode)
    assert losses == {"agent_order": 1, "episode.rewards": 1, "call.purpose": 1}


def test_a_folder_writer_never_overwrites_an_episode(tmp_path):
    episodes = [synth_episode(Shape(leader_calls=2, context=64), s) for s in (1, 2)]
    episodes[0].id, episodes[1].id = "a/b", "a_b"
    cg.save(tmp_path / "out", episodes, format="atif")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["a_b.2.json", "a_b.json"]
    assert sorted(e.id for e in cg.load(tmp_path / "out")) == ["a/b", "a_b"]


# --- trajectories without token ids: the chat format they are rendered with ------------------


def _text_only() -> dict[str, Any]:
    return _trajectory("leader-1", [_user(1, "task"), _said(2, "answer")])


class _NamedFormat(BuiltinFormat):
    name = "the-model"


def test_text_only_trajectories_render_with_the_chat_format_given(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(_text_only()))
    (bytewise,) = cg.load(path)
    assert [g.kind for g in bytewise.gaps] == ["atif_rendered_bytewise"]
    assert "--tokenizer" in bytewise.gaps[0].reason
    for options in ({"format": "atif"}, {}):
        (rendered,) = cg.load(path, chat=_NamedFormat(), **options)
        assert rendered.meta["renderer"] == "the-model" and not rendered.gaps
        assert rows_of(rendered) == rows_of(bytewise)  # the same bytes, told apart by name
    (direct,) = [e for _n, e in read_atif(path, chat=_NamedFormat())]
    assert direct.meta["renderer"] == "the-model"


def test_only_the_atif_reader_takes_a_chat_format():
    assert takes_chat(FORMATS["atif"])
    assert not any(takes_chat(form) for name, form in FORMATS.items() if name != "atif")


# --- versions of every trajectory read --------------------------------------------------------


def test_an_embedded_subagent_of_an_unknown_version_is_an_error(tmp_path):
    document = multi_agent()
    document["subagent_trajectories"][1]["schema_version"] = "ATIF-v0.9"
    path = tmp_path / "t.json"
    path.write_text(json.dumps(document))
    with pytest.raises(InputError) as raised:
        list(cg.load(path))
    message = str(raised.value)
    assert "t.json" in message and "trajectory bg-1" in message and "'ATIF-v0.9'" in message


def _linked(tmp_path: Path, version_of: str) -> Path:
    """A leader, a subagent file it references and a continuation; `version_of` names the
    file whose schema_version is one no reader knows."""
    files = {
        "child.json": _trajectory("child-1", [_step(1, [5], [6])]),
        "leader.cont-1.json": _trajectory("leader-1", [_step(1, [1, 2, 3], [4])]),
    }
    step = _step(1, [1], [2, 3])
    step["observation"] = {
        "results": [{"subagent_trajectory_ref": [{"trajectory_path": "child.json"}]}]
    }
    files["leader.json"] = _trajectory(
        "leader-1", [step], continued_trajectory_ref="leader.cont-1.json"
    )
    files[version_of]["schema_version"] = "ATIF-v0.9"
    for name, document in files.items():
        (tmp_path / name).write_text(json.dumps(document))
    return tmp_path / "leader.json"


@pytest.mark.parametrize(
    ("version_of", "trajectory"),
    [("child.json", "child-1"), ("leader.cont-1.json", "leader-1"), ("leader.json", "leader-1")],
)
def test_a_referenced_or_continued_trajectory_of_an_unknown_version_is_an_error(
    tmp_path, version_of, trajectory
):
    leader = _linked(tmp_path, version_of)
    with pytest.raises(InputError) as raised:
        list(cg.load(leader))
    problem = raised.value.problem
    assert problem.file.endswith(version_of)
    assert f"trajectory {trajectory}: schema_version 'ATIF-v0.9'" in problem.message
    diagnostics = Diagnostics()
    assert list(cg.load(leader, diagnostics)) == []
    assert diagnostics.errors


# --- a pretty-printed trajectory through a pipe -----------------------------------------------

CALLGROVE = Path(sys.executable).with_name("callgrove")


def test_a_pretty_printed_trajectory_is_named_json_by_its_content():
    pretty = json.dumps(multi_agent(), indent=2).encode()
    assert suffix_by_content(pretty[:4096]) == ".json"
    assert suffix_by_content(json.dumps(multi_agent()).encode() + b"\n") == ".jsonl"
    assert suffix_by_content(json.dumps({"id": "x"}, indent=2).encode()) == ".jsonl"
    assert suffix_by_content(b"\x1f\x8b\x08") == ".jsonl.gz"


@pytest.mark.parametrize("source", ["tokens", "harbor"])
def test_a_pretty_printed_trajectory_reads_through_every_pipe_spelling(tmp_path, source):
    if source == "tokens":
        path = tmp_path / "t.json"
        path.write_text(json.dumps(multi_agent(), indent=2))
    else:
        path = CONVERTED[0]

    def rows(command: str, **options: Any) -> str:
        result = subprocess.run(
            command, shell=True, executable="/bin/bash", capture_output=True, timeout=120, **options
        )
        assert result.returncode == 0, result.stderr.decode()
        return result.stdout.decode()

    expected = rows(f"{CALLGROVE} rows --json {path}")
    assert expected.count('"leaf"') >= 1
    with path.open("rb") as stdin:
        assert rows(f"{CALLGROVE} rows --json -", stdin=stdin) == expected
    with path.open("rb") as stdin:
        assert rows(f"{CALLGROVE} rows --json /dev/stdin", stdin=stdin) == expected
    assert rows(f"bash -c '{CALLGROVE} rows --json <(cat {path})'") == expected


# --- rewards -----------------------------------------------------------------------------------


def test_rewards_alone_under_extra_callgrove_are_read():
    for document in (multi_agent(), _text_only()):
        document["extra"] = {"callgrove": {"episode": {"rewards": {"pass": 1.0}}}}
        harbor_valid(document)
        (episode,) = _read_back(document)
        assert episode.rewards == {"pass": 1.0} and episode.id == "leader-1"
        assert episode.meta["source"] == "atif"
    assert episode.supervised and len(list(episode.calls())) == 1  # still rendered


def _trial(folder: Path, document: dict[str, Any], result: dict[str, Any], step: str = "") -> Path:
    agent = folder / (f"steps/{step}/agent" if step else "agent")
    agent.mkdir(parents=True)
    (agent / "trajectory.json").write_text(json.dumps(document))
    (folder / "result.json").write_text(json.dumps(result))
    return agent / "trajectory.json"


def test_a_harbor_trials_rewards_are_read_from_its_result(tmp_path):
    job = tmp_path / "job"
    _trial(job / "trial-a", multi_agent(), {"verifier_result": {"rewards": {"reward": 1}}})
    said = {**multi_agent(), "trajectory_id": "leader-2"}
    said["extra"] = {"callgrove": {"episode": {"rewards": {"mine": 0.5}}}}
    _trial(job / "trial-b", said, {"verifier_result": {"rewards": {"reward": 0}}})
    _trial(
        job / "trial-c",
        {**multi_agent(), "trajectory_id": "leader-3"},
        {"step_results": [{"step_name": "two", "verifier_result": {"rewards": {"r": 0.25}}}]},
        step="two",
    )
    _trial(
        job / "trial-d", {**multi_agent(), "trajectory_id": "leader-4"}, {"verifier_result": None}
    )
    rewards = {e.id: e.rewards for e in cg.load(job)}
    assert rewards == {
        "leader-1": {"reward": 1.0},
        "leader-2": {"mine": 0.5},  # extra.callgrove first
        "leader-3": {"r": 0.25},
        "leader-4": {},
    }
    (alone,) = cg.load(job / "trial-a" / "agent" / "trajectory.json")
    assert alone.rewards == {"reward": 1.0}
    assert alone.meta["rewards_from"] == str(job / "trial-a" / "result.json")


def test_a_harbor_result_that_cannot_be_read_is_named(tmp_path):
    path = _trial(tmp_path / "trial", multi_agent(), {"verifier_result": {"rewards": {"r": "x"}}})
    with pytest.raises(InputError) as raised:
        list(cg.load(path))
    assert raised.value.problem.file.endswith("result.json")

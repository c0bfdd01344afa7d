"""Fields the format requires are required on read: a record that lacks one is refused, naming
the field, and nothing is filled in (only `kept` has a default, true). JSON and the binary form
say it with the same message."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from callgrove.cli import app
from callgrove.episode import encode_episode, load, save
from callgrove.episode.checks import (
    REQUIRED_AGENT,
    REQUIRED_CALL,
    REQUIRED_ENV,
    REQUIRED_EPISODE,
    REQUIRED_RUN,
    lacks,
)
from callgrove.formats import Diagnostics, InputError

from .helpers import env_raised, healthy


def _record() -> dict:
    record = json.loads(encode_episode(healthy("ep")))
    record["errors"] = [{"type": "Timeout", "message": "ran long"}]
    return record


def _refused(tmp_path, record: dict) -> InputError:
    path = tmp_path / "traces.jsonl"
    path.write_bytes(
        encode_episode(healthy("before"))
        + json.dumps(record).encode()
        + b"\n"
        + encode_episode(healthy("after"))
    )
    diagnostics = Diagnostics()
    assert [e.id for e in load(path, diagnostics)] == ["before", "after"]
    assert len(diagnostics.errors) == 1
    with pytest.raises(InputError) as raised:
        list(load(path))
    assert raised.value.problem.line == 2
    return raised.value


def test_an_episode_of_only_format_and_id_is_refused(tmp_path):
    error = _refused(tmp_path, {"format": "callgrove.episode/1", "id": "ep"})
    assert error.problem.episode == "ep"
    assert error.problem.message == lacks("episode", REQUIRED_EPISODE)


def _parts(record: dict) -> dict[str, tuple[dict, tuple[str, ...], str | None]]:
    call = record["agents"][0]["calls"][0]
    return {
        "episode": (record, REQUIRED_EPISODE, None),
        "env": (record["env"], REQUIRED_ENV, None),
        "run": (record["run"], REQUIRED_RUN, None),
        "errors[0]": (record["errors"][0], ("message",), None),
        "agent 'L'": (record["agents"][0], REQUIRED_AGENT, None),
        "call": (call, REQUIRED_CALL, call["id"]),
    }


CASES = [
    (subject, name)
    for subject, (_part, names, _call) in _parts(_record()).items()
    for name in names
]


@pytest.mark.parametrize(("subject", "name"), CASES)
def test_each_required_field_is_required(tmp_path, subject, name):
    record = _record()
    part, _names, call = _parts(record)[subject]
    del part[name]
    error = _refused(tmp_path, record)
    assert (error.problem.episode, error.problem.call) == ("ep", call)
    assert error.problem.message == lacks(subject, [name])


@pytest.mark.parametrize(
    "field", ["ok", "rewards", "logprobs", "start", "policy_version", "purpose"]
)
def test_the_fields_once_filled_in_are_named(tmp_path, field):
    """The examples that used to become invented values: reward 0.0, ok true, null logprobs,
    a root agent, no policy version, an ordinary turn."""
    record = _record()
    holder = {"ok": record, "rewards": record, "start": record["agents"][1]}.get(
        field, record["agents"][0]["calls"][0]
    )
    del holder[field]
    assert f"required field {field} " in _refused(tmp_path, record).problem.message


def test_nullable_fields_are_present_as_null_and_kept_defaults_to_true(tmp_path):
    record = _record()
    record.update(group=None, env=None, task=None, run=None)
    call = record["agents"][0]["calls"][0]
    call.update(logprobs=None, policy_version=None)
    record["agents"][0]["parent"] = None
    del call["kept"]
    path = tmp_path / "traces.jsonl"
    path.write_text(json.dumps(record) + "\n")
    (episode,) = load(path)
    first = episode.agents[0].calls[0]
    assert first.kept is True and first.logprobs is None and first.policy_version is None
    assert (episode.group, episode.env, episode.run) == (None, None, None)


def test_an_episode_that_produced_nothing_still_has_every_field(tmp_path):
    path = tmp_path / "traces.jsonl"
    save(path, [env_raised("raised")])
    line = json.loads(path.read_text())
    assert set(REQUIRED_EPISODE) <= set(line)
    assert [e.id for e in load(path)] == ["raised"]


@pytest.mark.parametrize("column", ["ok", "rewards", "errors", "agents"])
@pytest.mark.parametrize("suffix", [".parquet"])
def test_a_null_in_a_binary_column_is_the_same_missing_field(tmp_path, column, suffix):
    path = tmp_path / f"traces{suffix}"
    save(path, [healthy("a"), healthy("b")])
    table = pq.read_table(path)
    index = table.schema.get_field_index(column)
    values = table.column(column).to_pylist()
    values[1] = None
    nulled = pa.array(values, type=table.schema.field(column).type)
    # the file's own schema marks the column non-null: write it as a damaged file would hold it
    field = table.schema.field(column).with_nullable(True)
    table = table.set_column(index, field, nulled)
    pq.write_table(table, path)
    diagnostics = Diagnostics()
    assert [e.id for e in load(path, diagnostics)] == ["a"]
    (problem,) = diagnostics.errors
    assert (problem.line, problem.episode) == (2, "b")
    assert problem.message == lacks("episode", [column])


def test_rows_of_an_episode_without_rewards_are_not_trained_with_reward_zero(tmp_path):
    record = _record()
    del record["rewards"]
    path = tmp_path / "traces.jsonl"
    path.write_text(json.dumps(record) + "\n")
    result = CliRunner().invoke(app, ["rows", str(path), "--json"])
    assert result.exit_code == 1
    assert result.stdout == ""
    assert "episode ep: episode lacks required field rewards" in result.stderr

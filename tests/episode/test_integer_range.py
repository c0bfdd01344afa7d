"""Integers the format stores as signed 64-bit values: JSON can carry larger ones, every reader
and writer refuses them with an error naming the episode (and the call), and nothing is left
half written."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from callgrove.cli import app
from callgrove.episode import encode_episode, load, save
from callgrove.formats import Diagnostics, InputError

from .helpers import healthy

SUFFIXES = [".jsonl", ".jsonl.gz", ".jsonl.zst", ".parquet", ".arrow"]
TOO_BIG = [2**63, 2**64 + 5, -(2**63) - 1, 10**30]


def _set(record: dict, field: str, value: int) -> str | None:
    """Put `value` into `field` of an encoded episode; the call it lands on, if any."""
    if field.startswith("run."):
        target = record["run"]
        *parents, name = field.split(".")[1:]
        for parent in parents:
            target = target[parent]
        target[name] = value
        return None
    call = record["agents"][0]["calls"][0]
    call[field] = value
    return call["id"]


FIELDS = ["seq", "policy_version", "run.step", "run.policy.start", "run.policy.end"]


@pytest.mark.parametrize("value", TOO_BIG)
@pytest.mark.parametrize("field", FIELDS)
def test_json_integer_past_64_bits_names_its_episode_and_call(tmp_path, field, value):
    record = json.loads(encode_episode(healthy("big")))
    if field == "run.policy.start" and value > 0:
        record["run"]["policy"]["end"] = value  # keeps end >= start: only the range is wrong
    call = _set(record, field, value)
    path = tmp_path / "traces.jsonl"
    lines = [encode_episode(healthy("before")), json.dumps(record).encode() + b"\n"]
    path.write_bytes(b"".join([*lines, encode_episode(healthy("after"))]))
    with pytest.raises(InputError) as raised:
        list(load(path))
    problem = raised.value.problem
    assert (problem.episode, problem.call, problem.line) == ("big", call, 2)
    assert "does not fit a signed 64-bit integer" in problem.message
    assert field in problem.message and str(value) in problem.message
    diagnostics = Diagnostics()
    assert [e.id for e in load(path, diagnostics)] == ["before", "after"]
    assert len(diagnostics.errors) == 1


def test_the_largest_64_bit_integers_are_held_by_every_form(tmp_path):
    episode = healthy("edge")
    episode.agents[1].calls[0].seq = 2**63 - 1  # the solver's call: no prompt refers to it
    episode.agents[1].calls[0].policy_version = -(2**63)
    episode.run.step = 2**63 - 1
    for suffix in SUFFIXES:
        path = tmp_path / f"traces{suffix}"
        save(path, [episode])
        (back,) = load(path)
        call = back.agents[1].calls[0]
        assert (call.seq, call.policy_version, back.run.step) == (2**63 - 1, -(2**63), 2**63 - 1)


@pytest.mark.parametrize("suffix", SUFFIXES)
@pytest.mark.parametrize("field", ["seq", "policy_version", "step"])
def test_saving_an_integer_past_64_bits_leaves_the_earlier_file(tmp_path, suffix, field):
    path = tmp_path / f"traces{suffix}"
    save(path, [healthy("earlier")])
    before = path.read_bytes()
    big = healthy("big")
    if field == "step":
        big.run.step = 2**63
    else:
        setattr(big.agents[0].calls[0], field, 2**64)
    with pytest.raises(InputError) as raised:
        save(path, [healthy("fine"), big])
    assert raised.value.problem.episode == "big"
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary left


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_convert_of_an_integer_past_64_bits_fails_cleanly(tmp_path, suffix):
    record = json.loads(encode_episode(healthy("big")))
    record["agents"][0]["calls"][0]["policy_version"] = 2**63
    source = tmp_path / "in.jsonl"
    source.write_bytes(encode_episode(healthy("fine")) + json.dumps(record).encode() + b"\n")
    target = tmp_path / f"out{suffix}"
    result = CliRunner().invoke(
        app, ["convert", str(source), str(target), "--from", "callgrove", "--to", "callgrove"]
    )
    assert result.exit_code == 1, result.output
    assert "big" in result.output and "64-bit" in result.output
    assert isinstance(result.exception, SystemExit)  # an error in the usual shape, no traceback
    assert sorted(p.name for p in tmp_path.iterdir()) == [source.name]

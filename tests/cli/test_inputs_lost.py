"""An episode lost in reading is an error, never a warning with exit 0: a line cut off mid-write
(in the middle of a file or at its end) or impossible values on a call (a logprob above 0, not
finite, of the wrong length; a negative token id), named by file, line, episode and call, in
every reading command and form; and `samples --algorithm` scores no group that lost one."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import orjson
import pytest
from typer.testing import CliRunner

import callgrove as cg
from callgrove.cli import app
from callgrove.episode import write_binary_episodes, write_episodes
from callgrove.formats.problems import Diagnostics

ROOT = Path(__file__).parents[2]
GROUP = ROOT / "examples/login_group.jsonl"
runner = CliRunner()
COMMANDS = ["rows", "check", "stats", "show", "samples", "convert"]


def run(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def command_args(command: str, path: Path, tmp_path: Path) -> list[object]:
    extra = {
        "samples": ["-o", tmp_path / "samples.jsonl", "--algorithm", "grpo"],
        "convert": [tmp_path / "converted.jsonl", "--skip-bad"],
        "stats": ["--skip-bad"],
    }
    return [command, path, *extra.get(command, [])]


def two_groups(path: Path) -> list[bytes]:
    """grp-login's four episodes, then grp-other's four (copies under other ids)."""
    lines = GROUP.read_bytes().splitlines()
    others = [
        line.replace(b'"id":"login-bug-', b'"id":"other-', 1).replace(
            b'"group":"grp-login"', b'"group":"grp-other"', 1
        )
        for line in lines
    ]
    path.write_bytes(b"\n".join([*lines, *others]) + b"\n")
    return [*lines, *others]


@pytest.mark.parametrize("where", ["middle", "end"])
@pytest.mark.parametrize("command", COMMANDS)
def test_a_cut_line_is_an_error_in_every_command(command, where, tmp_path):
    lines = GROUP.read_bytes().splitlines(keepends=True)
    path = tmp_path / "cut.jsonl"
    if where == "middle":  # a crash cut episode 2; a later write ended the line and went on
        path.write_bytes(lines[0] + lines[1][:300] + b"\n" + lines[2] + lines[3])
        line, episode = 2, "login-bug-g1"
    else:  # the last line was being written
        path.write_bytes(b"".join(lines[:3]) + lines[3][:300])
        line, episode = 4, "login-bug-g3"
    result = run(*command_args(command, path, tmp_path))
    assert result.exit_code == 1, result.output
    assert f"error: {path}:{line}: episode {episode}: truncated" in result.stderr
    assert "its episode is lost" in result.stderr


def test_help_says_a_cut_final_line_fails():
    text = run("stats", "--help").stdout
    assert "only a warning" not in text and "final or not" in text


def test_samples_scores_no_group_that_lost_an_episode(tmp_path):
    path = tmp_path / "groups.jsonl"
    lines = two_groups(path)
    # grp-login's second episode was cut short and ended by a later write
    lines[1] = lines[1][:400]
    path.write_bytes(b"\n".join(lines) + b"\n")
    out = tmp_path / "samples.jsonl"
    result = run("samples", path, "-o", out, "--algorithm", "grpo", "--json")
    assert result.exit_code == 1, result.output
    summary = json.loads(result.stdout)
    assert summary["groups_scored"] == 1  # grp-other only
    assert summary["skipped"] == {"in a group that was not scored": 3}
    assert summary["episodes_sampled"] == 4
    assert (
        f"error: {path}:1: episode login-bug-g0: group 'grp-login' not scored: an episode of it "
        f"was lost ({path}:2)"
    ) in result.stderr
    written = {orjson.loads(line)["episode"] for line in out.read_bytes().splitlines()}
    assert written == {f"other-g{i}" for i in range(4)}


def test_samples_scores_no_group_when_a_lost_episode_has_no_group_to_read(tmp_path):
    path = tmp_path / "groups.jsonl"
    lines = two_groups(path)
    lines[5] = lines[5][:40]  # cut inside the id: its group cannot be read
    path.write_bytes(b"\n".join(lines) + b"\n")
    result = run("samples", path, "-o", tmp_path / "s.jsonl", "--algorithm", "grpo", "--json")
    assert result.exit_code == 1
    summary = json.loads(result.stdout)
    assert summary["groups_scored"] == 0
    assert summary["skipped"] == {"in a group that was not scored": 7}
    assert "an episode whose group could not be read was lost" in result.stderr


def test_convert_onto_scores_no_group_that_lost_an_episode(tmp_path):
    """`convert --onto --algorithm --skip-bad` scores groups as samples does."""
    verifiers = tmp_path / "traces.jsonl"
    cg.save(verifiers, cg.load(GROUP), format="verifiers")
    lines = verifiers.read_bytes().splitlines()
    lines[2] = lines[2][:300]
    source = tmp_path / "cut.jsonl"
    source.write_bytes(b"\n".join(lines) + b"\n")
    result = run(
        "convert", source, "--from", "verifiers", "--to", "verifiers", "--onto", verifiers,
        "--algorithm", "grpo", "--skip-bad", tmp_path / "credited.jsonl",
    )  # fmt: skip
    assert result.exit_code == 1
    assert "not scored: an episode whose group could not be read was lost" in result.stderr
    assert not (tmp_path / "credited.jsonl").exists()


# Impossible values on a call, each with what the error says.
def _positive(call) -> None:
    call.logprobs[1] = 0.25


def _not_a_number(call) -> None:
    call.logprobs[0] = np.nan


def _infinite(call) -> None:
    call.logprobs[0] = -np.inf


def _short(call) -> None:
    call.logprobs = call.logprobs[:-1]


def _negative_token(call) -> None:
    call.completion_ids = call.completion_ids.copy()
    call.completion_ids[0] = -5


IMPOSSIBLE = {
    "positive logprob": (_positive, "logprobs holds a value above 0"),
    # JSON holds no NaN or infinity: the writer writes null, which the reader names
    "NaN logprob": (_not_a_number, "logprobs"),
    "infinite logprob": (_infinite, "logprobs"),
    "logprobs of the wrong length": (_short, "logprobs has 6 values but completion_ids has 7"),
    "negative token id": (_negative_token, "completion_ids holds a negative token id"),
}


@pytest.mark.parametrize("form", [".jsonl", ".parquet", ".arrow"])
@pytest.mark.parametrize("value", sorted(IMPOSSIBLE))
def test_an_impossible_value_is_an_error_naming_file_line_episode_and_call(value, form, tmp_path):
    spoil, message = IMPOSSIBLE[value]
    episodes = list(cg.load(GROUP))
    call = episodes[2].agents[0].calls[0]
    call.logprobs = np.array(call.logprobs, dtype=np.float32)
    spoil(call)
    path = tmp_path / f"spoiled{form}"
    (write_episodes if form == ".jsonl" else write_binary_episodes)(path, episodes)
    diagnostics = Diagnostics()
    assert [e.id for e in cg.load(path, diagnostics)] == [
        "login-bug-g0",
        "login-bug-g1",
        "login-bug-g3",
    ]
    (problem,) = diagnostics.problems
    assert (problem.file, problem.line, problem.episode, problem.call) == (
        str(path),
        3,
        "login-bug-g2",
        call.id,
    )
    assert problem.severity == "error" and message in problem.message
    result = run("check", path)
    assert result.exit_code == 1
    assert f"error: {path}:3: episode login-bug-g2, call {call.id}: " in result.stderr

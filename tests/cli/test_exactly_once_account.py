""" "Each trained exactly once" only when it is true: every command that reads episodes keeps one
account of its inputs (used, lost, read twice, sampled calls lost inside an episode), prints it
the same way, and exits 0 only when nothing was lost or doubled (or `--accept-loss` says so)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import callgrove as cg
from callgrove.cli import app
from callgrove.episode.intake import Intake, seen
from interop.test_atif import _step

runner = CliRunner()
EXAMPLES = Path(__file__).parents[2] / "examples"
GROUP = EXAMPLES / "login_group.jsonl"
GROUP_EPISODES = 4
READING = ("rows", "check", "show", "stats")


def run(*args: object):
    return runner.invoke(app, [str(a) for a in args])


def atif_with_a_step_without_tokens(path: Path) -> Path:
    """Two model steps with token ids and one without: the one without is a lost call."""
    trajectory = {
        "schema_version": "ATIF-v1.7",
        "trajectory_id": "lead",
        "agent": {"name": "lead", "version": "1"},
        "steps": [
            {"step_id": 1, "source": "user", "message": "go"},
            _step(2, [1, 2, 3], [4, 5]),
            _step(3, [1, 2, 3, 4, 5, 6], [7]),
            {"step_id": 4, "source": "agent", "message": "no tokens here"},
        ],
        "extra": {"callgrove": {"episode": {"rewards": {"r": 1.0}}}},
    }
    path.write_text(json.dumps(trajectory, indent=2))
    return path


@pytest.mark.parametrize("command", READING)
def test_a_model_step_without_token_ids_is_a_loss_every_command_reports(tmp_path, command):
    path = atif_with_a_step_without_tokens(tmp_path / "t.json")
    result = run(command, path)
    assert result.exit_code == 1, result.output
    assert "each trained exactly once" not in result.stdout
    assert "atif_step_without_token_ids" in result.stderr
    assert "lost: 1 sampled call(s) not in the episodes" in result.stderr
    accepted = run(command, path, "--accept-loss")
    assert accepted.exit_code == 0
    assert "lost: 1 sampled call(s)" in accepted.stderr and "--accept-loss" in accepted.stderr


def test_check_says_not_exactly_once_while_a_call_is_lost(tmp_path):
    path = atif_with_a_step_without_tokens(tmp_path / "t.json")
    result = run("check", path)
    assert result.stdout.rstrip().splitlines()[-1] == (
        "total: 2 kept calls in 1 episode; NOT exactly once: sampled calls lost (1)"
    )
    record = json.loads(run("check", path, "--json").stdout)
    assert record["total"]["lost_calls"] == 1 and record["total"]["exactly_once"] is False
    assert record["episodes"][0]["lost_calls"] == 1


def test_samples_and_convert_count_the_lost_call(tmp_path):
    path = atif_with_a_step_without_tokens(tmp_path / "t.json")
    samples = run("samples", path, "-o", tmp_path / "s.parquet", "--json")
    assert samples.exit_code == 1
    record = json.loads(samples.stdout)
    assert record["lost_calls"] == 1 and record["exactly_once"] is False
    converted = run("convert", path, tmp_path / "e.jsonl", "--json")
    assert converted.exit_code == 1
    record = json.loads(converted.stdout.splitlines()[0])
    assert record["lost_calls"] == 1 and record["episodes_written"] == 1
    # the gap travels with the episode: the converted file still says the call is lost
    assert run("check", tmp_path / "e.jsonl").exit_code == 1


@pytest.mark.parametrize("jobs", [1, 2])
def test_the_same_episodes_in_two_files_train_once(tmp_path, jobs):
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(GROUP.read_bytes())
    out = tmp_path / "rows.parquet"
    result = run("rows", GROUP, copy, "-o", out, "--jobs", jobs)
    assert result.exit_code == 1
    once = pq.read_table(out).to_pylist()
    alone = [json.loads(line) for line in run("rows", GROUP, "--json").stdout.splitlines()]
    assert [(r["episode"], r["row"]) for r in once] == [(r["episode"], r["row"]) for r in alone]
    assert result.stderr.count("its calls would train twice") == GROUP_EPISODES
    assert f"read: {GROUP_EPISODES} episode(s) used, {GROUP_EPISODES} read twice" in result.stderr


def test_check_of_a_file_given_twice_is_not_exactly_once():
    result = run("check", GROUP, GROUP)
    assert result.exit_code == 1
    assert result.stdout.rstrip().splitlines()[-1] == (
        "total: 48 kept calls in 4 episodes; NOT exactly once: episodes read twice (4)"
    )


def test_the_same_calls_under_another_id_in_another_file_are_read_twice(tmp_path):
    renamed = tmp_path / "renamed.jsonl"
    with renamed.open("w") as out:
        for line in GROUP.read_text().splitlines():
            record = json.loads(line)
            record["id"] = "copy-" + record["id"]
            out.write(json.dumps(record) + "\n")
    result = run("check", GROUP, renamed)
    assert result.exit_code == 1
    assert result.stderr.count("the same calls as episode login-bug-g") == GROUP_EPISODES
    stats = run("stats", GROUP, renamed, "--skip-bad")
    assert stats.exit_code == 1 and stats.stderr.count("the same calls as") == GROUP_EPISODES
    # within one file two episodes may hold the same calls (a greedy group): not a repeat
    both = tmp_path / "both.jsonl"
    both.write_text(GROUP.read_text() + renamed.read_text())
    assert run("check", both).exit_code == 0


def test_samples_of_a_resumed_run_read_twice_say_so(tmp_path):
    copy = tmp_path / "step_2.jsonl"
    copy.write_bytes(GROUP.read_bytes())
    result = run("samples", GROUP, copy, "-o", tmp_path / "s.parquet", "--json")
    record = json.loads(result.stdout)
    assert result.exit_code == 1
    assert record["read_twice"] == GROUP_EPISODES and record["episodes_read"] == GROUP_EPISODES


def test_an_unreadable_file_is_never_called_exactly_once(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("garbage\n")
    result = run("check", bad)
    assert result.exit_code == 1
    assert "each trained exactly once" not in result.stdout
    assert "NOT exactly once: input lost (1)" in result.stdout


def test_convert_that_wrote_nothing_says_none_written(tmp_path):
    bad = tmp_path / "mixed.jsonl"
    bad.write_text(GROUP.read_text().splitlines()[0] + "\n" + "{not json\n")
    result = run("convert", bad, tmp_path / "out.jsonl", "--json")
    record = json.loads(result.stdout.splitlines()[0])
    assert result.exit_code == 1
    assert record["episodes"] == 1 and record["errors"] == 1


def test_a_whole_input_is_still_exactly_once():
    result = run("check", GROUP)
    assert result.exit_code == 0
    assert result.stdout.rstrip().endswith("each trained exactly once")
    assert "read:" not in result.stderr  # nothing to account for


def test_text_only_steps_rendered_with_callgroves_bytes_are_said_aloud(tmp_path):
    path = tmp_path / "text.json"
    path.write_text(
        json.dumps(
            {
                "schema_version": "ATIF-v1.7",
                "trajectory_id": "lead",
                "agent": {"name": "lead", "version": "1"},
                "steps": [
                    {"step_id": 1, "source": "user", "message": "go"},
                    {"step_id": 2, "source": "agent", "message": "hello"},
                ],
            }
        )
    )
    result = run("rows", path)
    assert result.exit_code == 0
    assert "atif_rendered_bytewise 1" in result.stderr


def _key_sets(draw_ids: list[int], files: int) -> list[list[int]]:
    return [draw_ids[i::files] for i in range(files)]


@settings(max_examples=40, deadline=None)
@given(
    ids=st.lists(st.integers(0, GROUP_EPISODES - 1), min_size=1, max_size=20),
    files=st.integers(1, 4),
)
def test_the_intake_admits_each_episode_once_whatever_the_files(ids, files):
    """Against a plain reference: an episode id is used the first time it is read, in file
    order, and every later copy is counted as read twice."""
    episodes = list(cg.load(GROUP))
    for number, episode in enumerate(episodes):  # four samplings: no two hold the same calls
        next(episode.calls()).logprobs[0] -= number
    intake = Intake()
    used: list[int] = []
    for number, chunk in enumerate(_key_sets(ids, files)):
        seen_here: set[int] = set()
        for line, key in enumerate(chunk, start=1):
            if key in seen_here:
                continue  # a reader refuses an id twice in one file before the intake sees it
            seen_here.add(key)
            if intake.admit(seen(episodes[key], f"f{number}.jsonl", line)):
                used.append(key)
    firsts = list(dict.fromkeys(k for chunk in _key_sets(ids, files) for k in chunk))
    assert used == firsts
    reads = sum(len(set(chunk)) for chunk in _key_sets(ids, files))
    assert intake.read_twice == reads - len(firsts)
    assert intake.whole == (reads == len(firsts))

"""A run killed with SIGKILL after step k and resumed, or finished and continued to more steps,
samples what an unkilled run samples: the dispatcher's room ahead of training is restored with
its checkpoint, so no group launched on resume goes stale; every episode, group and call still
trains exactly once. Ctrl-C stops a run with one line, and it resumes the same way."""

from __future__ import annotations

import signal
import subprocess

import pytest

from .train_process import account, finish, kill_after, start, steps_done, write_config

pytestmark = pytest.mark.processes

STEPS = 6


def check_trained_once(result: dict) -> None:
    assert all(n == 1 for n in result["episodes"].values()), "an episode trained twice"
    assert all(n == 1 for n in result["groups"].values()), "a group trained in two steps"
    assert all(n == 1 for n in result["calls"].values()), "a call trained twice"
    assert len(result["groups"]) == STEPS * 2  # groups_per_step, each step full


@pytest.mark.parametrize("killed_after", [3])
def test_a_run_killed_after_step_k_drops_no_stale_group_on_resume(tmp_path, killed_after):
    out = tmp_path / "run"
    config = write_config(tmp_path / "c.toml", out, STEPS)
    process = start(config)
    kill_after(process, out, killed_after)
    process.wait(timeout=60)
    assert steps_done(out) < STEPS
    finish(config)
    result = account(out, STEPS)
    check_trained_once(result)
    assert result["stale"] == 0, f"{result['stale']} episodes dropped as stale after the resume"
    assert result["final"][-1].get("dispatcher/stale_episodes/train", 0) == 0


def test_a_finished_run_continued_to_more_steps_drops_no_stale_group(tmp_path):
    out = tmp_path / "run"
    finish(write_config(tmp_path / "short.toml", out, STEPS // 2))
    finish(write_config(tmp_path / "long.toml", out, STEPS))
    result = account(out, STEPS)
    check_trained_once(result)
    assert result["stale"] == 0, f"{result['stale']} episodes dropped as stale after continuing"
    assert result["final"][-1].get("dispatcher/stale_episodes/train", 0) == 0


def test_ctrl_c_during_a_step_stops_with_one_line_and_the_run_resumes_whole(tmp_path):
    out = tmp_path / "run"
    config = write_config(tmp_path / "c.toml", out, STEPS)
    process = start(config, stderr=subprocess.PIPE)
    kill_after(process, out, 2, how=signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr.decode()[-3000:]
    assert stderr.decode().strip().splitlines() == [
        "interrupted: every step finished is kept; run the same command again to continue"
    ]
    assert steps_done(out) < STEPS
    finish(config)
    result = account(out, STEPS)
    check_trained_once(result)
    assert result["stale"] == 0

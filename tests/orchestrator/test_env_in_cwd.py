"""An environment module in the folder `callgrove train` runs in is found without PYTHONPATH,
as `python -m` would find it, locally and on Ray's workers; one found nowhere is an error saying
where it was looked for."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from .train_process import ROOT, command, write_config

pytestmark = pytest.mark.processes

MODULE = """
from callgrove.orchestrator.envs import Copy


class HereEnv(Copy):
    name = "here"
"""


def train_in(folder, env: str, *args: str) -> subprocess.CompletedProcess:
    config = write_config(folder / "c.toml", folder / "run", 1, env=env)
    return subprocess.run(
        # -P: no current folder on the import path, as the installed `callgrove` command runs
        [sys.executable, "-P", *command(config, *args)[1:]],
        cwd=folder,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize("executor", ["local", "ray"])
def test_an_environment_in_the_current_folder_is_found(tmp_path, executor):
    (tmp_path / "env_beside_the_config.py").write_text(MODULE)
    done = train_in(tmp_path, "env_beside_the_config:HereEnv", "--executor", executor)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "run" / "step_1" / "train" / "traces.jsonl").exists()


def test_an_environment_found_nowhere_says_where_it_was_looked_for(tmp_path):
    done = train_in(tmp_path, "env_that_is_nowhere:Env")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    message = " ".join(done.stderr.split())
    assert "cannot import env_that_is_nowhere" in message
    assert f"searched the current folder {tmp_path}" in message

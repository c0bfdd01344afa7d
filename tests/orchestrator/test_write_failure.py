"""A write that fails for real (the kernel refuses it: here a file-size limit, as a full disk
does) stops `callgrove train` with one line naming the file, exit 1; what it left is resumed
from once there is room again, nothing lost or trained twice."""

from __future__ import annotations

import resource
import signal
import subprocess

import pytest

from .train_process import ENV, account, command, finish, metrics, steps_done, write_config

pytestmark = pytest.mark.processes

LIMIT = 150_000
"""Bytes a file may grow to: the checkpoint (about 95 kB) fits, metrics.jsonl outgrows it at
about step 30."""


def limited() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past it fails instead of killing


def test_a_refused_write_is_one_line_and_the_run_resumes_whole(tmp_path):
    out = tmp_path / "run"
    config = write_config(tmp_path / "c.toml", out, 40)
    done = subprocess.run(
        command(config), env=ENV, capture_output=True, text=True, timeout=600, preexec_fn=limited
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"error: {out}/") and line.endswith(": File too large"), line
    stopped = steps_done(out)
    assert 0 < stopped < 40
    finish(config, timeout=600)
    result = account(out, 40)
    assert all(n == 1 for n in result["episodes"].values())
    assert all(n == 1 for n in result["groups"].values()) and len(result["groups"]) == 80
    assert [m["step"] for m in metrics(out) if not m.get("final")] == list(range(1, 41))

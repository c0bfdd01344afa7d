"""A server a test starts dies with the test process, even one killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.processes

HERE = str(Path(__file__).resolve().parent)
ROOT = str(Path(__file__).resolve().parents[2])

# The test process: starts a long-lived child as `server_process` does, says its pid, waits.
PARENT = f"""
import subprocess, sys, time
sys.path.insert(0, {HERE!r})  # by path: an installed package may also be named `tests`
from helpers import die_with_parent
child = subprocess.Popen(
    [sys.executable, "-c", "import time; time.sleep(120)"],
    start_new_session=True,
    preexec_fn=die_with_parent,
)
print(child.pid, flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited


def test_a_killed_test_process_leaves_no_server_behind():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([f"{ROOT}/src", ROOT])}
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, env=env)
    child = int(parent.stdout.readline())
    try:
        assert _alive(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child)
    finally:
        if _alive(child):
            os.kill(child, signal.SIGKILL)

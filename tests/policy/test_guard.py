"""A guarded process group ends with its starter or its leader, however they end: the starter
killed with SIGKILL, the starter and its direct children killed (as Ray kills an actor), the
leader gone on its own; a worker that ignores SIGTERM gets SIGKILL; the guard leaves with them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from callgrove.policy.guard import guard_group, live_members

pytestmark = [
    pytest.mark.processes,
    pytest.mark.skipif(sys.platform != "linux", reason="pidfds are Linux's"),
]
SRC = str(Path(__file__).resolve().parents[2] / "src")
GRACE = 1.0

# A leader in its own session with two workers of its own: one stops on SIGTERM, one ignores it.
LEADER = """
import signal, subprocess, sys, time
polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
stubborn = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); "
    "time.sleep(300)"], stdout=subprocess.PIPE)
stubborn.stdout.readline()  # it ignores SIGTERM from here on
print(polite.pid, stubborn.pid, flush=True)
time.sleep(300)
"""

# The starter: starts the leader as callgrove starts a server, guards its group, says the pids.
STARTER = f"""
import subprocess, sys, time
from callgrove.policy.guard import guard_group
leader = subprocess.Popen([sys.executable, "-c", {LEADER!r}], stdout=subprocess.PIPE,
                          start_new_session=True)
workers = leader.stdout.readline().decode().split()
guard_group(leader.pid, grace={GRACE})
print(leader.pid, *workers, flush=True)
time.sleep(300)
"""


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def guards_of(leader: int) -> list[int]:
    found = subprocess.run(
        ["pgrep", "-f", f"guard.py [0-9]+ {leader} "], capture_output=True, text=True
    )
    return [int(pid) for pid in found.stdout.split()]


def wait_until_gone(pids: list[int], within: float = 20.0) -> list[int]:
    deadline = time.monotonic() + within
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


@pytest.fixture
def started():
    """(starter, leader pid, worker pids) with the leader's group guarded."""
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": SRC},
    )
    leader, *workers = (int(pid) for pid in starter.stdout.readline().split())
    try:
        assert all(alive(p) for p in (leader, *workers))
        assert len(guards_of(leader)) == 1
        assert os.getpgid(workers[0]) == os.getpgid(workers[1]) == leader
        yield starter, leader, workers
    finally:
        for pid in (starter.pid, leader, *workers, *guards_of(leader)):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        starter.wait()


def test_the_starter_killed_takes_the_group_with_it(started):
    starter, leader, workers = started
    guard = guards_of(leader)
    starter.send_signal(signal.SIGKILL)
    starter.wait()
    assert wait_until_gone([leader, *workers]) == []
    assert wait_until_gone(guard) == [], "the guard outlived its group"


def test_the_starter_and_its_direct_children_killed_take_the_workers_too(started):
    starter, leader, workers = started
    os.kill(leader, signal.SIGKILL)  # Ray kills an actor's direct children so
    starter.send_signal(signal.SIGKILL)
    starter.wait()
    assert wait_until_gone(workers) == []
    assert wait_until_gone(guards_of(leader)) == []


def test_a_leader_gone_on_its_own_leaves_no_worker_and_the_starter_runs_on(started):
    starter, leader, workers = started
    os.kill(leader, signal.SIGKILL)
    assert wait_until_gone(workers) == []
    assert wait_until_gone(guards_of(leader)) == []
    assert starter.poll() is None


def test_a_group_already_gone_is_no_error():
    leader = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    leader.wait()
    guard_group(leader.pid, grace=GRACE)
    assert wait_until_gone(guards_of(leader.pid)) == []
    assert live_members(leader.pid) == []

"""A started server never outlives the process that started it: killed before it could stop
its servers (SIGKILL, no atexit), that process leaves neither the server nor the workers the
server started (`callgrove.policy.vllm.spawn_group`)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from callgrove.policy.vllm import spawn_group

SRC = str(Path(__file__).resolve().parents[2] / "src")

# A stand-in server: it starts a worker of its own, as vLLM starts its engine, and waits.
SERVER = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); time.sleep(600)"

STARTER = f"""
import os, signal, sys, time
from pathlib import Path

from callgrove.policy.vllm import spawn_group
from callgrove.policy.vllm import spawn_group
process = spawn_group([sys.executable, "-c", {SERVER!r}], Path(sys.argv[1]), dict(os.environ))
print(process.pid, flush=True)
time.sleep(600)
"""


def group_members(group: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == group:
                    members.append(int(entry.name))
            except ProcessLookupError:
                continue
    return members


def test_a_killed_starter_leaves_no_server_and_no_worker(tmp_path):
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER, str(tmp_path / "server.log")],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": SRC},
    )
    group = int(starter.stdout.readline())
    deadline = time.monotonic() + 30
    while len(group_members(group)) < 3:  # the guard, the server, its worker
        assert time.monotonic() < deadline, group_members(group)
        time.sleep(0.1)
    starter.kill()
    starter.wait()
    deadline = time.monotonic() + 15
    while group_members(group):
        assert time.monotonic() < deadline, f"left behind: {group_members(group)}"
        time.sleep(0.1)


def test_the_guard_ends_as_its_server_ends(tmp_path):
    """The guard's exit is the server's: its code, or the signal that ended it."""
    for code, server in (
        (3, "import sys; sys.exit(3)"),
        (-9, "import os; os.kill(os.getpid(), 9)"),
    ):
        process = spawn_group([sys.executable, "-c", server], tmp_path / "log", dict(os.environ))
        assert process.wait(timeout=30) == code

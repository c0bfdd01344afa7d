"""A guard that ends a process group once the process that started it, or the group's leader,
is gone: what keeps a server's workers from outliving a starter killed with SIGKILL.

A server started in its own session (so that stopping its group reaches its workers) is not
ended by the kernel with its starter: `PR_SET_PDEATHSIG` reaches the direct child only, and a
supervisor such as Ray kills an actor's direct children with SIGKILL, which leaves the leader's
own children (vLLM's engine workers, a harness CLI's subprocesses) running, each holding gigabytes.

The guard is a separate process and nobody's child: an intermediate process forks it and exits,
so whatever kills the starter's children spares it. It watches the starter and the leader
through pidfds (no pid can be reused under it) and, when either ends, sends SIGTERM to the
group, then SIGKILL to what is left of it after a grace period, and exits. Run as a script (by
`guard_group`), it imports the standard library alone.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

GRACE = 10.0
"""Seconds between the guard's SIGTERM to the group and its SIGKILL."""


def guard_group(leader_pid: int, grace: float = GRACE) -> None:
    """Start a guard for process group `leader_pid` (a process this one started with
    `start_new_session`). Linux only, where pidfds exist; elsewhere a no-op."""
    if sys.platform != "linux":
        return
    intermediate = subprocess.run(  # it ends once the guard is forked off
        [sys.executable, "-I", "-S", __file__, str(os.getpid()), str(leader_pid), str(grace)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,  # out of this process's group, which a supervisor may kill
    )
    if intermediate.returncode:
        # Imported here: run as a script, this module imports the standard library alone.
        from callgrove.errors import StateError

        raise StateError(
            f"the guard of process group {leader_pid} did not start (exit code "
            f"{intermediate.returncode}): {intermediate.stderr.decode(errors='replace')[-2000:]}"
        )


def live_members(group: int) -> list[int]:
    """The pids of the processes in `group` that have not exited (zombies excluded)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        state, _parent, process_group = stat.rsplit(")", 1)[1].split()[:3]
        if int(process_group) == group and state != "Z":
            members.append(int(entry.name))
    return members


def end_group(group: int, grace: float) -> None:
    """SIGTERM to the group, then SIGKILL to whatever of it is still running after `grace`."""
    for sent in (signal.SIGTERM, signal.SIGKILL):
        if not live_members(group):
            return
        try:
            os.killpg(group, sent)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while live_members(group) and time.monotonic() < deadline:
            time.sleep(0.2)


def _watch(starter: int, leader: int, grace: float) -> None:
    # Opened while the starter waits for this process, so both pids are still theirs.
    try:
        watched = [os.pidfd_open(starter), os.pidfd_open(leader)]
    except ProcessLookupError:  # the leader is gone already: only its group is left to end
        watched = []
    if os.fork():
        os._exit(0)
    quiet = os.open(os.devnull, os.O_RDWR)
    os.dup2(quiet, 2)  # the starter reads the intermediate's stderr to its end
    if watched:
        poller = select.poll()
        for pidfd in watched:
            poller.register(pidfd, select.POLLIN)
        poller.poll()
    end_group(leader, grace)


if __name__ == "__main__":
    _watch(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]))

"""A `callgrove train --executor ray` killed with SIGKILL leaves no process of the Ray it started
running: its holder, Ray's servers, agents and workers all end within a bounded time. An actor of
the run that dies stops it with a one-line error naming what died, and the run resumes; a
cluster address where nothing answers is said at once."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from .train_process import ENV, command, finish, kill_after, start, steps_done, write_config

pytestmark = pytest.mark.processes

pytest.importorskip("ray")


def process_tree(root: int) -> dict[tuple[int, str], str]:
    """{(pid, start time): command} of `root` and every process below it."""
    children: dict[int, list[int]] = {}
    seen: dict[int, tuple[str, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:  # not a process, or gone meanwhile
            continue
        fields = stat.rsplit(")", 1)[1].split()
        children.setdefault(int(fields[1]), []).append(int(entry.name))
        seen[int(entry.name)] = (fields[19], command)
    tree, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in seen:
            tree[(pid, seen[pid][0])] = seen[pid][1]
        todo += children.get(pid, [])
    return tree


def running(processes: dict[tuple[int, str], str]) -> dict[tuple[int, str], str]:
    """Those of `processes` still running (the same pid and start time, not a zombie)."""
    alive = {}
    for (pid, started), line in processes.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[19] == started and fields[0] != "Z":
            alive[(pid, started)] = line
    return alive


def test_no_ray_process_outlives_a_driver_killed_with_sigkill(tmp_path):
    out = tmp_path / "run"
    config = write_config(tmp_path / "c.toml", out, 50, "[ray]\nenv_workers = 2")
    driver = start(config, "--executor", "ray")
    try:
        kill_after(driver, out, 1)  # a step done: Ray, its agents and every actor are up
        ray_processes = process_tree(driver.pid)
        ray_processes.pop(next(k for k in ray_processes if k[0] == driver.pid))
        assert any("raylet" in command for command in ray_processes.values()), ray_processes
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    deadline = time.monotonic() + 30
    while running(ray_processes) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not running(ray_processes), f"outlived the driver: {running(ray_processes)}"


def test_the_sampler_actor_dying_stops_the_run_with_one_line_and_it_resumes(tmp_path):
    out = tmp_path / "run"
    config = write_config(tmp_path / "c.toml", out, 6, "[ray]\nenv_workers = 2")
    driver = start(config, "--executor", "ray", stderr=subprocess.PIPE)
    try:
        kill_after(driver, out, 1, how=signal.SIGCONT)  # a step done, the run goes on
        (sampler,) = [
            pid
            for (pid, _), command in process_tree(driver.pid).items()
            if command.startswith("ray::SamplerActor")
        ]
        os.kill(sampler, signal.SIGKILL)
        _, stderr = driver.communicate(timeout=120)
    finally:
        driver.kill()
    message = stderr.decode().strip().splitlines()[-1]
    assert driver.returncode == 1, stderr.decode()[-3000:]
    assert "Traceback" not in stderr.decode(), stderr.decode()[-3000:]
    assert message.startswith("error: ") and "sampler actor" in message and "died" in message
    finished = steps_done(out)
    assert finished < 6
    finish(config, "--executor", "ray")
    assert steps_done(out) == 6


def test_a_cluster_address_where_nothing_answers_is_one_line_at_once(tmp_path):
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    config = write_config(
        tmp_path / "c.toml", tmp_path / "run", 1, f'[ray]\naddress = "127.0.0.1:{port}"'
    )
    done = subprocess.run(
        command(config, "--executor", "ray"), env=ENV, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert f"error: ray.address '127.0.0.1:{port}': nothing answers there" in done.stderr

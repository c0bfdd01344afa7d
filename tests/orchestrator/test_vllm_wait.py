"""Waiting for a started vLLM server says so on stderr, when the wait begins and as it goes on:
a real process that never answers stands for a server still loading its model."""

from __future__ import annotations

import subprocess
import sys

import pytest

from callgrove.policy import vllm
from callgrove.policy.vllm import VllmError, VllmServer, VllmSettings, free_port

pytestmark = pytest.mark.processes


def test_waiting_for_a_server_prints_where_it_stands(tmp_path, capfd, monkeypatch):
    monkeypatch.setattr(vllm, "STARTING_REPORT_EVERY", 0.5)
    log = tmp_path / "vllm.log"
    log.write_text("loading weights\n")
    silent = subprocess.Popen(  # its own session, as a started server's (stop ends its group)
        [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True
    )
    server = VllmServer(
        silent, f"http://127.0.0.1:{free_port()}", log, (tmp_path, VllmSettings(), 0)
    )
    with pytest.raises(VllmError, match="was not ready after 2 s"):
        server.wait_ready(2.0)
    lines = [line for line in capfd.readouterr().err.splitlines() if "waiting for the vLLM" in line]
    assert len(lines) >= 3, lines  # at once, then as the wait goes on
    assert lines[0].startswith(
        f"waiting for the vLLM server {server.url} to start: 0 s of at most 2 s"
    )
    assert str(log) in lines[0]
    assert silent.poll() is not None  # the wait that gave up stopped it

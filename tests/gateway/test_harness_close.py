"""How `callgrove harness` closes its episode: a reward only where a check ran, and a clear
error (not a traceback) where the gateway cannot be reached or refuses the close."""

from __future__ import annotations

import json
import socket

import httpx
import pytest
from typer.testing import CliRunner

from callgrove.chat import BuiltinFormat
from callgrove.cli.app import app
from callgrove.gateway import harness
from callgrove.gateway.in_training import LocalGateway
from callgrove.serving.policy_server import PolicyThread

from .helpers import scripted, write_script


@pytest.fixture
def gateway(tmp_path):
    policy = scripted(write_script(tmp_path / "s.json", [{"when": "hi", "reply": "hello"}]))
    sampler = PolicyThread(policy)
    with LocalGateway(policy, sampler.loop, BuiltinFormat(), tmp_path / "ledger") as served:
        yield served.url
    sampler.close()


@pytest.fixture
def fake_cli(monkeypatch, tmp_path):
    """The CLI run replaced by one call to the gateway (what a harness would have made)."""
    calls = []

    def run_cli(argv, work, env, timeout, stop):
        url, episode = calls[0]
        httpx.post(
            f"{url}/e/{episode}/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "hi"}]},
        ).raise_for_status()
        return 0, "", ""

    monkeypatch.setattr(harness, "_run_cli", run_cli)
    cli = tmp_path / "fake-cli"
    cli.write_text("#!/bin/sh\n")
    cli.chmod(0o755)
    return calls, str(cli)


def test_without_a_check_the_episode_closes_without_a_reward(tmp_path, gateway, fake_cli):
    calls, cli = fake_cli
    calls.append((gateway, "plain"))
    run = harness.run_harness("codex", "hi", gateway, "plain", tmp_path / "runs", cli=cli)
    assert run.reward is None and run.record["rewards"] == {}
    calls[0] = (gateway, "checked")
    checked = harness.run_harness(
        "codex", "hi", gateway, "checked", tmp_path / "runs", cli=cli, check="false"
    )
    assert checked.reward == 0.0 and checked.record["rewards"] == {"check": 0.0}


def test_an_unreachable_gateway_at_close_is_a_clear_error(tmp_path, fake_cli, monkeypatch):
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{free.getsockname()[1]}"
    monkeypatch.setattr(harness, "_run_cli", lambda *args: (0, "", ""))
    _, cli = fake_cli
    with pytest.raises(harness.CloseFailed, match="did not answer"):
        harness.run_harness("codex", "hi", url, "ep", tmp_path / "runs", cli=cli)
    folder = str(tmp_path / "cli-runs")
    options = ["--gateway", url, "--episode", "ep", "--cli", cli, "--folder", folder]
    result = CliRunner().invoke(app, ["harness", "codex", "hi", *options], catch_exceptions=False)
    assert result.exit_code == 1 and "did not answer" in result.output


def test_a_refused_close_names_the_gateways_reason(tmp_path, gateway, fake_cli, monkeypatch):
    monkeypatch.setattr(harness, "_run_cli", lambda *args: (0, "", ""))  # no call: no ledger
    _, cli = fake_cli
    with pytest.raises(harness.CloseFailed, match="404"):
        harness.run_harness("codex", "hi", gateway, "never", tmp_path / "runs", cli=cli)


def test_callgrove_close_closes_an_episode_of_two_agents(tmp_path, gateway):
    """The README's capture example: two agents call under one episode, `callgrove close`
    closes it with a reward, and `callgrove rows` reads the record."""
    chat = f"{gateway}/e/ep1/v1/chat/completions"
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    httpx.post(chat, json=body, headers={"X-Callgrove-Agent": "lead"}).raise_for_status()
    helper = {
        "X-Callgrove-Agent": "helper",
        "X-Callgrove-Parent": "lead",
        "X-Callgrove-Start": "fresh",
    }
    httpx.post(chat, json=body, headers=helper).raise_for_status()
    runner = CliRunner()
    closed = runner.invoke(
        app, ["close", "ep1", "--gateway", gateway, "--reward", "tests=1", "--json"]
    )
    assert closed.exit_code == 0, closed.output
    record = json.loads(closed.stdout)
    assert record["rewards"] == {"tests": 1.0} and record["ok"] is True
    assert {(a["id"], a["parent"], a["start"]) for a in record["agents"]} == {
        ("lead", None, "root"),
        ("helper", "lead", "fresh"),
    }
    rows = runner.invoke(app, ["rows", str(tmp_path / "ledger" / "episodes.jsonl"), "--json"])
    assert sorted((r["agent"], r["reward"]) for r in map(json.loads, rows.stdout.splitlines())) == [
        ("helper", 1.0),
        ("lead", 1.0),
    ]
    again = runner.invoke(app, ["close", "ep1", "--gateway", gateway])
    assert again.exit_code == 1 and "refused to close episode 'ep1'" in again.stderr


def test_callgrove_close_refuses_a_reward_that_is_not_a_number(gateway):
    result = CliRunner().invoke(app, ["close", "ep1", "--gateway", gateway, "--reward", "tests"])
    assert result.exit_code == 2 and "expected NAME=NUMBER" in result.stderr

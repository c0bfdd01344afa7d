"""Real harness CLIs as environments: run one on a task through the gateway, score it, close it.

`run_harness` gives the CLI a fresh home and working folder, points it at the gateway under the
episode's URL prefix, and runs it in a network namespace whose only interface is loopback (its
loopback port relayed to the gateway through a Unix socket, see `relay`), bounded by `timeout`.
The task's check command then runs in the working folder (exit 0: reward 1, else 0) and the
episode is closed with that reward; the closed record comes back.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

import callgrove
from callgrove.episode import Episode, episode_from_wire
from callgrove.errors import InvalidValue, RunFailed
from callgrove.formats.jsonl import decode_episode_line
from callgrove.gateway.attribution import valid_episode
from callgrove.gateway.relay import UnixToTcp
from callgrove.policy.guard import guard_group

HARNESSES = ("claude-code", "codex")
INSIDE_PORT = 8123
QUIET = {
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    "DISABLE_TELEMETRY": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "DISABLE_AUTOUPDATER": "1",
    "NO_COLOR": "1",
}
# Inside the namespace: bring loopback up, start the relay, wait for it, run the CLI bounded.
_INSIDE = """
set -e
ip link set lo up
"$CALLGROVE_PYTHON" -m callgrove.gateway.relay {port} "$CALLGROVE_SOCKET" &
for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null && break; sleep 0.05; done
set +e
timeout -k 5 {timeout} "$@"
status=$?
kill %1 2>/dev/null
exit $status
"""


@dataclass
class HarnessRun:
    """One harness run: how the CLI ended, the check's reward and the closed episode."""

    harness: str
    episode: str
    returncode: int
    stdout: str
    stderr: str
    reward: float | None  # None: no check ran (the episode is closed without a reward)
    record: dict[str, Any]
    seconds: float
    closed: Episode | None = None
    """The closed record as an episode, parsed from the gateway's answer once (None: left open)."""


class CloseFailed(RunFailed, RuntimeError):
    """The gateway could not be reached to close the episode, or refused the close."""


def default_cli(harness: str) -> str | None:
    return shutil.which("claude" if harness == "claude-code" else "codex")


def _command(harness: str, cli: str, prompt: str, model: str | None, extra: list[str]) -> list[str]:
    if harness == "claude-code":
        return [
            cli,
            "-p",
            prompt,
            "--output-format",
            "json",
            "--model",
            model or "claude-sonnet-4-5",
            *extra,
        ]
    return [cli, "exec", "--skip-git-repo-check", "--json", *extra, prompt]


def _environment(harness: str, home: Path, base: str, key: str) -> dict[str, str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        **QUIET,
    }
    if harness == "claude-code":
        env.update(ANTHROPIC_BASE_URL=base, ANTHROPIC_API_KEY=key)
        if os.geteuid() == 0:  # the CLI refuses some modes as root outside a declared sandbox
            env["IS_SANDBOX"] = "1"
        return env
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(
        'model = "policy"\nmodel_provider = "callgrove"\napproval_policy = "never"\n'
        "[model_providers.callgrove]\n"
        'name = "callgrove gateway"\n'
        f'base_url = "{base}/v1"\n'
        'wire_api = "responses"\n'
        'env_key = "CALLGROVE_KEY"\n'
    )
    env.update(CODEX_HOME=str(codex_home), CALLGROVE_KEY=key)
    return env


def run_harness(
    harness: str,
    prompt: str,
    gateway: str,
    episode: str,
    folder: str | os.PathLike[str],
    *,
    check: str | None = None,
    timeout: float = 120.0,
    cli: str | None = None,
    model: str | None = None,
    key: str = "callgrove",
    extra_args: list[str] | None = None,
    task: Any = None,
    close: bool = True,
    env: dict[str, str] | None = None,
    stop: threading.Event | None = None,
) -> HarnessRun:
    """Run HARNESS on PROMPT against GATEWAY as EPISODE, check the result, close the episode.

    With `close=False` the episode stays open (the record is empty): a later run in the same
    folder and episode continues the session (`--continue`, `resume`) and closes it. `env` adds
    variables to the CLI's environment (the harness's own settings, such as when to compact).
    Setting `stop` kills the CLI and raises `Stopped` (the episode is left open).
    """
    if harness not in HARNESSES:
        raise InvalidValue(f"unknown harness {harness!r}; known: {', '.join(HARNESSES)}")
    valid_episode(episode)
    cli = cli or default_cli(harness)
    if cli is None:
        raise FileNotFoundError(f"no {harness} CLI found on PATH; pass its path")
    root = Path(folder) / episode
    home, work = root / "home", root / "work"
    home.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    address = urlsplit(gateway)
    base = f"http://127.0.0.1:{INSIDE_PORT}/e/{episode}"
    env = {**_environment(harness, home, base, key), **(env or {})}
    socket_dir = tempfile.mkdtemp(prefix="cg-relay-")  # short: socket paths are limited
    socket_path = os.path.join(socket_dir, "gateway.sock")
    env.update(
        CALLGROVE_PYTHON=sys.executable,
        CALLGROVE_SOCKET=socket_path,
        PYTHONPATH=str(Path(callgrove.__file__).resolve().parents[1]),
    )
    isolate = ["unshare", "-n"] if os.geteuid() == 0 else ["unshare", "-rn"]
    script = _INSIDE.format(port=INSIDE_PORT, timeout=int(timeout))
    argv = [
        *isolate,
        "bash",
        "-c",
        script,
        "harness",
        *_command(harness, cli, prompt, model, extra_args or []),
    ]
    started = time.monotonic()
    try:
        with UnixToTcp(socket_path, address.hostname or "127.0.0.1", address.port or 80):
            returncode, stdout, stderr = _run_cli(argv, work, env, timeout + 30, stop)
    finally:
        shutil.rmtree(socket_dir, ignore_errors=True)
    seconds = time.monotonic() - started
    reward = None
    if check:
        checked = subprocess.run(["bash", "-c", check], cwd=work, capture_output=True, timeout=120)
        reward = 1.0 if checked.returncode == 0 else 0.0
    if not close:
        return HarnessRun(harness, episode, returncode, stdout, stderr, reward, {}, seconds)
    body: dict[str, Any] = {
        "ok": returncode == 0,
        "task": task if task is not None else {"harness": harness, "prompt": prompt},
    }
    if reward is not None:  # no check, no reward: a 0 would read as a failed check
        body["rewards"] = {"check": reward}
    record, closed = close_episode(gateway, episode, key, body)
    return HarnessRun(harness, episode, returncode, stdout, stderr, reward, record, seconds, closed)


def close_episode(
    gateway: str, episode: str, key: str, body: dict[str, Any]
) -> tuple[dict[str, Any], Episode]:
    """POST the close and return the record, as JSON and as an episode; `CloseFailed` saying
    why where there is none."""
    url = f"{gateway.rstrip('/')}/e/{episode}/close"
    try:
        closed = httpx.post(url, json=body, headers={"x-api-key": key}, timeout=60)
    except httpx.HTTPError as error:
        raise CloseFailed(
            f"could not close episode {episode!r}: the gateway at {gateway} did not answer "
            f"({type(error).__name__}: {error}); its calls stay in the ledger, open"
        ) from None
    if closed.status_code != 200:
        try:
            said = closed.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            said = closed.text[:300]
        raise CloseFailed(
            f"the gateway at {gateway} refused to close episode {episode!r} "
            f"({closed.status_code}): {said}"
        )
    return closed.json(), episode_from_wire(decode_episode_line(closed.content))


class Stopped(RunFailed, RuntimeError):
    """The harness run was stopped from outside (its episode was cancelled)."""


def _run_cli(
    argv: list[str], work: Path, env: dict[str, str], timeout: float, stop: threading.Event | None
) -> tuple[int, str, str]:
    """Run the CLI bounded by `timeout`; killed (its whole process group) once `stop` is set."""
    process = subprocess.Popen(
        argv,
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    guard_group(process.pid)  # its subprocesses end with this process, however it ends
    deadline = time.monotonic() + timeout
    while True:
        try:
            stdout, stderr = process.communicate(timeout=0.25)
            return process.returncode, stdout, stderr
        except subprocess.TimeoutExpired:
            stopped = stop is not None and stop.is_set()
            if not stopped and time.monotonic() < deadline:
                continue
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
            if stopped:
                raise Stopped("the harness CLI was stopped before it finished") from None
            raise subprocess.TimeoutExpired(argv, timeout, stdout, stderr) from None

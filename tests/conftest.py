"""Shared fixtures. One real vLLM server of SmolLM2-135M-Instruct for the whole test session (the `vllm` tests).

It is started from `.venv-vllm` (`make vllm`, which `make test` runs; `CALLGROVE_VLLM_PYTHON`
names another interpreter), on loopback, with a bounded wait, and stopped when the session
ends. The tests that change its weights put the original ones back. No other vLLM process a
`vllm` test starts may outlive it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from callgrove.policy.vllm import VllmServer, VllmSettings

ROOT = Path(__file__).resolve().parents[1]
MAX_LORA_RANK = 16
# Inherited by every process this test process starts, so its vLLM processes are told from
# those of another worker or run.
SESSION = os.environ["CALLGROVE_TEST_SESSION"] = uuid.uuid4().hex
SESSION_SERVER_GROUPS: set[int] = set()
"""The process groups of the servers the session fixtures hold."""


def session_vllm_processes() -> dict[int, tuple[int, str]]:
    """{pid: (process group, command line)} of the running vLLM processes this session started,
    wherever they were reparented (a server's engine workers outlive a killed leader)."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
            if not ("vllm.entrypoints" in command or command.startswith("VLLM::")):
                continue
            if f"CALLGROVE_TEST_SESSION={SESSION}".encode() not in (entry / "environ").read_bytes():
                continue
            state, _parent, group = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):  # not a process, or gone meanwhile
            continue
        if state != "Z":
            found[int(entry.name)] = (int(group), command)
    return found


@pytest.fixture(autouse=True)
def no_vllm_process_outlives_its_test(request):
    """A `vllm` test leaves none of its own vLLM processes running: a leak fails where it
    happens, not as a later test's lack of memory."""
    if request.node.get_closest_marker("vllm") is None or sys.platform != "linux":
        yield
        return
    before = set(session_vllm_processes())

    def left() -> dict[int, str]:
        return {
            pid: command
            for pid, (group, command) in session_vllm_processes().items()
            if pid not in before and group not in SESSION_SERVER_GROUPS
        }

    yield
    deadline = time.monotonic() + 30
    while left() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left(), f"vLLM processes outlived the test: {left()}"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Under `--dist loadgroup` each `xdist_group` runs on one worker (the `vllm` tests share
    one server; two would not fit in CI's memory). pytest-xdist groups by suffixing the node
    ids; where it could not, each grouped test fails here, before its fixtures start anything."""
    grouped = item.get_closest_marker("xdist_group") is not None
    if grouped and getattr(item.config.option, "loadgroup", False) and "@" not in item.nodeid:
        pytest.fail(
            "--dist loadgroup left this test ungrouped: this pytest-xdist cannot suffix this "
            "pytest's node ids (install the test extra, which pins a pytest it can)",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def train_cli():
    """`train_cli(config)`: `callgrove train CONFIG` in a fresh process of this checkout's
    source, bounded in time; fails the test, quoting its output, unless it succeeds."""

    def run(config: Path, timeout: float = 900) -> subprocess.CompletedProcess:
        command = [sys.executable, "-c", "from callgrove.cli import main; main()", "train"]
        done = subprocess.run(
            [*command, str(config)],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
            timeout=timeout,
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        return done

    return run


@pytest.fixture(scope="session")
def vllm_settings():
    """Started servers' settings for tests (a small KV cache, the test venv's interpreter),
    with any of them changed: `vllm_settings()`."""
    python = os.environ.get("CALLGROVE_VLLM_PYTHON", str(ROOT / ".venv-vllm" / "bin" / "python"))
    if not Path(python).is_file():
        pytest.fail(f"no vLLM at {python}: run `make vllm` (or set CALLGROVE_VLLM_PYTHON)")
    base = {"python": python, "kv_cache_gb": 1, "max_model_len": 1024, "startup_timeout": 400.0}

    def settings(**changes) -> VllmSettings:
        return VllmSettings(**{**base, **changes})

    return settings


@pytest.fixture(scope="session")
def smollm2_folder() -> Path:
    from callgrove.networks.hf import checkpoint_folder, resolve_model

    return checkpoint_folder(resolve_model("smollm2-135m"))


@pytest.fixture(scope="session")
def vllm_url(smollm2_folder, request):
    """The session server's base URL (`CALLGROVE_VLLM_URL`: one already running, started with
    the settings below, which the session then leaves running)."""
    if os.environ.get("CALLGROVE_VLLM_URL"):
        yield os.environ["CALLGROVE_VLLM_URL"]
        return
    settings = request.getfixturevalue("vllm_settings")()
    server = VllmServer.start(smollm2_folder, settings, lora_rank=MAX_LORA_RANK)
    SESSION_SERVER_GROUPS.add(server.process.pid)
    try:
        server.wait_ready(settings.startup_timeout)
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def vllm_weights_restored(vllm_url, smollm2_folder):
    """The session server's URL, its original weights pushed back after the test (for tests
    whose training pushes new weights into it). They go back the way the sampler pushes them:
    reloading the checkpoint folder itself would leave the server's tied output head on the
    trained tensor, since the folder's file names the embedding alone."""
    import asyncio

    from safetensors.torch import load_file

    from callgrove.policy.vllm import VllmSampler

    yield vllm_url

    async def restore() -> None:
        sampler = VllmSampler([vllm_url])
        try:
            await sampler.load_weights(load_file(smollm2_folder / "model.safetensors"), 0)
            assert not sampler.dropped_reasons(), sampler.dropped_reasons()
        finally:
            await sampler.aclose()

    asyncio.run(restore())


def pytest_collection_finish(session: pytest.Session) -> None:
    """One torch thread per test process: the suite runs a process per core, and torch's own
    pool of one thread per core in each made the tiny models' forwards about 100 times slower
    on two loaded cores. Set after collection, so torch is never imported for this alone."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)

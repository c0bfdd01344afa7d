"""vLLM servers as Ray actors, on a local Ray bounded to two CPUs: an actor owns its server's
process, reports its URL and takes the server with it when killed; `callgrove train` on Ray
samples through servers its sampler actor started so, pushes each step's weights into them, and
leaves none running."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.processes, pytest.mark.xdist_group("vllm")]
ray = pytest.importorskip("ray")
SRC = str(Path(__file__).resolve().parents[2] / "src")
# A context length no other server here uses, so the test finds its own servers' processes.
TAG = 640


@pytest.fixture
def local_ray():
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        runtime_env={"env_vars": {"PYTHONPATH": SRC}},
    )
    try:
        yield
    finally:
        ray.shutdown()


def tagged_servers() -> list[str]:
    found = subprocess.run(
        ["pgrep", "-f", f"vllm.entrypoints.openai.api_server .*--max-model-len {TAG} "],
        capture_output=True,
        text=True,
    )
    return found.stdout.split()


def gone(pid: int, within: float = 60.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.5)
    return False


def test_a_server_actor_reports_its_url_and_its_server_goes_when_it_is_killed(
    local_ray, smollm2_folder, vllm_settings
):
    from callgrove.orchestrator.ray_executor import RayVllmServer
    from callgrove.policy import SamplingParams
    from callgrove.policy.vllm import VllmSampler

    server = RayVllmServer.start(smollm2_folder, vllm_settings(max_model_len=TAG), 0)
    pid = ray.get(server.actor.pid.remote())
    try:
        server.wait_ready(server.startup_timeout)
        assert server.url.startswith("http://127.0.0.1:")
        assert httpx.get(server.url + "/health", timeout=10).status_code == 200
        assert server.exit_code is None

        async def one_call():
            sampler = VllmSampler([server.url])  # HTTP to the URL the actor reported
            try:
                return await sampler.sample([1, 2, 3], SamplingParams(max_tokens=4))
            finally:
                await sampler.aclose()

        sample = asyncio.run(one_call())
        assert len(sample.completion_ids) == 4 and sample.policy_version == 0
    finally:
        ray.kill(server.actor)
    assert gone(pid), "the server outlived its actor"
    with pytest.raises(httpx.HTTPError):
        httpx.get(server.url + "/health", timeout=5)


def test_callgrove_train_on_ray_samples_with_server_actors(
    tmp_path, local_ray, smollm2_folder, vllm_settings
):
    from callgrove.episode import load
    from callgrove.orchestrator.config import config_from_dict
    from callgrove.orchestrator.loop import train

    python = vllm_settings().python
    config = config_from_dict(
        {
            "run": {"steps": 2, "out": str(tmp_path), "executor": "ray"},
            "env": {"name": "arithmetic"},
            "model": {
                "name": "smollm2-135m",
                "vllm": {"python": python, "kv_cache_gb": 1, "max_model_len": TAG},
            },
            "sampling": {"max_tokens": 8, "temperature": 0.7, "top_p": 0.9},
            "dispatch": {"group_size": 2, "groups_per_step": 1, "max_off_policy_steps": 0},
            "algorithm": {"name": "grpo"},
            "train": {"learning_rate": 1e-4},
            "degeneracy": {"drop": []},
            "monitor": {"live": False, "plot": False},
            "ray": {"env_workers": 1},
        }
    )
    elsewhere = set(tagged_servers())  # another test's server may still be shutting down
    summary = train(config)
    steps = [m for m in summary.metrics if not m.get("final")]
    assert [m["policy/version"] for m in steps] == [1, 2]
    for step in (1, 2):
        episodes = list(load(tmp_path / f"step_{step}" / "train" / "traces.jsonl"))
        assert len(episodes) == 2 and all(e.ok for e in episodes), [e.errors for e in episodes]
        # Step 2 is sampled by the weights step 1 made, pushed through the sampler actor.
        assert {c.policy_version for e in episodes for c in e.calls()} == {step - 1}
    for m in steps:  # the server held the weights the learner scores the calls with
        assert m["train/mismatch/on_policy/mean_abs"] < 1e-4
    deadline = time.monotonic() + 30
    while set(tagged_servers()) - elsewhere and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not set(tagged_servers()) - elsewhere, "a server outlived the run"
    assert json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])["final"]

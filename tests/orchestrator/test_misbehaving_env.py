"""An environment that blocks its event loop (a synchronous sleep, a busy loop), or raises
`SystemExit` or `KeyboardInterrupt`, fails its own episodes, recorded and counted, while the run
goes on to its end and its process exits: locally and on Ray."""

from __future__ import annotations

import pytest

from .train_process import episodes, finish, metrics, write_config

pytestmark = pytest.mark.processes

HERE = "orchestrator.misbehaving_envs"


def run_of(tmp_path, env: str, executor: str = "local", timeout: float = 5.0) -> tuple:
    """A two-step run of `env` to its end within a bounded time: every episode it holds, and its
    final metrics line."""
    out = tmp_path / "run"
    config = write_config(
        tmp_path / "c.toml",
        out,
        2,
        "[ray]\nenv_workers = 2",
        env=f"{HERE}:{env}",
        dispatch=f"episode_timeout = {timeout}",
    )
    finish(config, "--executor", executor, timeout=240)
    (final,) = [m for m in metrics(out) if m.get("final")]
    return episodes(out), final


def check_failed_alone(all_episodes: list, final: dict, expected: dict[str, str]) -> list:
    """Every episode of a misbehaving task (`expected`: task -> error type) failed with its error
    (or was cancelled at the end), every other one is ok (or cancelled), and the counters count
    the failures; returns the failed."""
    errored = [e for e in all_episodes if not e.ok and e.errors[-1].type != "Cancelled"]
    assert {e.task for e in errored} == set(expected), "a task did not misbehave: no proof"
    for episode in all_episodes:
        ended = "Cancelled" if episode.ok else episode.errors[-1].type
        assert ended in (expected.get(episode.task, "Cancelled"), "Cancelled"), (
            episode.id,
            episode.errors,
        )
    for episode in errored:
        assert len(episode.agent("leader").calls) == 1  # what it recorded is kept
    assert final.get("dispatcher/errored/train", 0) == len(errored)
    return errored


@pytest.mark.parametrize("executor", ["local", "ray"])
def test_an_environment_blocking_its_loop_times_out_and_the_run_goes_on(tmp_path, executor):
    all_episodes, final = run_of(tmp_path, "Blocks", executor)
    timeouts = {"301": "Timeout", "322": "Timeout"}
    for episode in check_failed_alone(all_episodes, final, timeouts):
        assert "blocked its event loop" in episode.errors[-1].message


def test_an_environment_raising_systemexit_or_keyboardinterrupt_fails_its_episode_alone(tmp_path):
    all_episodes, final = run_of(tmp_path, "Exits", timeout=60.0)
    check_failed_alone(all_episodes, final, {"301": "SystemExit", "322": "KeyboardInterrupt"})

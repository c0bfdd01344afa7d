"""The Ray executor on a tiny config: environment workers and the sampler as actors."""

from __future__ import annotations

import pytest

from callgrove.episode import load
from callgrove.models import open_model
from callgrove.orchestrator.config import config_from_dict
from callgrove.orchestrator.loop import train
from callgrove.orchestrator.sinks import load_checkpoint
from callgrove.rows import build_rows, check_rows

pytestmark = pytest.mark.processes

pytest.importorskip("ray")
torch = pytest.importorskip("torch")


def test_a_tiny_run_on_local_ray(tmp_path):
    config = config_from_dict(
        {
            "run": {"steps": 2, "out": str(tmp_path), "executor": "ray", "eval_every": 2},
            "model": {"d_model": 16, "n_heads": 2, "d_ff": 32},
            "env": {"name": "relay", "options": {"eval_size": 2}},
            "sampling": {"max_tokens": 4},
            "dispatch": {"group_size": 2, "groups_per_step": 2},
            "monitor": {"live": False, "plot": False},
            "ray": {"env_workers": 2},
        }
    )
    summary = train(config)
    steps = [m for m in summary.metrics if not m.get("final")]
    assert [m["step"] for m in steps] == [1, 2]
    assert steps[-1]["policy/version"] == 2
    for step in (1, 2):
        episodes = list(load(tmp_path / f"step_{step}" / "train" / "traces.jsonl"))
        assert len(episodes) >= 4
        for episode in episodes:
            assert episode.ok, episode.errors
            assert {a.name for a in episode.agents} == {"leader", "checker", "helper", "fork"}
            assert episode.run.step == step
            assert not check_rows(build_rows(episode)).violations
    # Evaluation after step 2 sampled on the remote sampler with the weights of version 2.
    evaluated = list(load(tmp_path / "step_2" / "eval" / "traces.jsonl"))
    assert {c.policy_version for e in evaluated for c in e.calls()} == {2}
    # The checkpoint holds the sampler actor's state, the random state its sampling moved on,
    # not that of a copy in the driver, which the driver no longer has.
    kept = load_checkpoint(tmp_path)["sampler"]
    fresh = open_model(config.model, seed=config.run.seed).sampler
    assert kept["version"] == 2
    assert not torch.equal(kept["generator"], fresh.state_dict()["generator"])

"""Optional metric sinks take the same metrics and sample tables; rewinding forgets later steps."""

from __future__ import annotations

import json

import pytest

from callgrove.orchestrator import sinks


def test_rewind_cuts_metrics_and_later_steps(tmp_path):
    jsonl = sinks.JsonlSink(tmp_path)
    for step in (1, 2, 3):
        jsonl.log(step, {"x": float(step)})
        (tmp_path / f"step_{step}").mkdir()
    jsonl.close()
    with (tmp_path / "metrics.jsonl").open("a") as stream:
        stream.write('{"step": 4, "x"')  # a line cut by a crash
    sinks.rewind(tmp_path, 2)
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").open()] == [1, 2]
    assert sorted(p.name for p in tmp_path.glob("step_*")) == ["step_1", "step_2"]


def test_tensorboard_sink_writes_events(tmp_path):
    pytest.importorskip("tensorboard")
    sink = sinks.TensorBoardSink(tmp_path)
    sink.log(1, {"train/all/leader/reward/mean": 0.5})
    sink.log_samples(1, [{"agent": "leader", "branch_idx": 0, "text": "7⏎", "reward": 0.5}])
    sink.close()
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))


def test_wandb_sink_runs_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    sink = sinks.WandbSink(tmp_path, "callgrove-test", {"run": {"steps": 1}}, "test")
    sink.log(1, {"train/all/leader/reward/mean": 0.5})
    sink.log_samples(1, [{"agent": "leader", "branch_idx": 0, "text": "7", "reward": 0.5}])
    sink.close()
    assert list((tmp_path / "wandb").glob("offline-run-*"))

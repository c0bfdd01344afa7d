"""Optional metric sinks take the same metrics and sample tables; rewinding forgets later steps."""

from __future__ import annotations

import json

import pytest

from callgrove.orchestrator import sinks
from callgrove.orchestrator.config import ConfigError, MonitorSection, load_config


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
    monitor = MonitorSection(wandb_project="callgrove-test")
    sink = sinks.WandbSink(tmp_path, monitor, {"run": {"steps": 1}}, "test")
    sink.log(1, {"train/all/leader/reward/mean": 0.5})
    sink.log_samples(1, [{"agent": "leader", "branch_idx": 0, "text": "7", "reward": 0.5}])
    sink.close()
    assert list((tmp_path / "wandb").glob("offline-run-*"))


def test_wandb_sink_takes_project_entity_and_name(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    taken = {}

    class Run:
        def finish(self):
            pass

    monkeypatch.setattr(wandb, "init", lambda **options: taken.update(options) or Run())
    monitor = MonitorSection(wandb_project="p", wandb_entity="team", wandb_name="relay-a")
    sinks.WandbSink(tmp_path, monitor, {}, "run-id").close()
    assert (taken["project"], taken["entity"], taken["name"], taken["mode"]) == (
        "p",
        "team",
        "relay-a",
        "offline",
    )
    sinks.WandbSink(tmp_path, MonitorSection(), {}, "run-id").close()
    assert (taken["entity"], taken["name"], taken["mode"]) == (None, "run-id", "offline")


def test_wandb_mode_is_offline_or_online():
    assert load_config(None, {"monitor.wandb_mode": "online"}).monitor.wandb_mode == "online"
    with pytest.raises(ConfigError, match="wandb_mode"):
        load_config(None, {"monitor.wandb_mode": "cloud"})

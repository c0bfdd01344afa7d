"""A run that cannot go on says why and stops; a run folder is continued only as it was started;
a checkpoint is data; bad rewards fail their episode alone."""

from __future__ import annotations

import asyncio
import errno
import fcntl
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from callgrove.cli import app
from callgrove.episode import load
from callgrove.orchestrator import sinks
from callgrove.orchestrator.config import ConfigError, config_from_dict
from callgrove.orchestrator.dispatcher import Dispatcher
from callgrove.orchestrator.envs import Copy
from callgrove.orchestrator.errors import RunError
from callgrove.orchestrator.loop import train, train_async
from callgrove.train.learner import ModelLearner

HERE = __name__  # environments below are named `module:attribute`, as a user's would be
TINY = {
    "model": {"d_model": 16, "n_heads": 2, "d_ff": 32},
    "env": {"name": "copy", "options": {"eval_size": 2}},
    "sampling": {"max_tokens": 4},
    "dispatch": {"group_size": 2, "groups_per_step": 2},
    "monitor": {"live": False, "plot": False},
}


def tiny(out: Path, **sections) -> dict:
    config = {key: dict(value) for key, value in TINY.items()}
    config["run"] = {"out": str(out), "steps": 2}
    for dotted, value in sections.items():
        section, key = dotted.split("__")
        config.setdefault(section, {})[key] = value
    return config


def run_within(raw: dict, seconds: float = 120):
    """Train, failing (not hanging) if the run does not end in time."""
    config = config_from_dict(raw)
    return asyncio.run(asyncio.wait_for(train_async(config, Console(quiet=True)), seconds))


class TaskRaises(Copy):
    def task(self, rng):
        raise KeyError("no tasks today")


class EvalRaises(Copy):
    def eval_tasks(self):
        raise OSError("eval set unreadable")


class RewardsSometimesNan(Copy):
    async def run(self, episode, task):
        reward = await super().run(episode, task)
        return float("nan") if task.endswith("1") else reward


def not_an_environment(**options):
    return {"name": "dict"}


def refuses_to_build(**options):
    raise RuntimeError("licence server down")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (f"{HERE}:TaskRaises", r"task\(\) of group 0 raised KeyError: 'no tasks today'"),
        (f"{HERE}:EvalRaises", r"eval_tasks\(\) raised OSError: eval set unreadable"),
    ],
)
def test_an_environment_failing_outside_any_episode_stops_the_run_with_its_cause(
    tmp_path, env, message
):
    with pytest.raises(RunError, match=message):
        run_within(tiny(tmp_path, env__name=env, run__eval_every=1), seconds=30)


def test_a_factory_that_returns_no_environment_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"returned dict, not an environment"):
        run_within(tiny(tmp_path, env__name=f"{HERE}:not_an_environment"), seconds=30)


def test_a_bad_reward_fails_its_episode_and_the_run_goes_on(tmp_path):
    summary = run_within(tiny(tmp_path, env__name=f"{HERE}:RewardsSometimesNan"))
    assert summary.last_step == 2
    episodes = [e for s in (1, 2) for e in load(tmp_path / f"step_{s}" / "train" / "traces.jsonl")]
    failed = [e for e in episodes if not e.ok]
    assert failed and all([x.type for x in e.errors] == ["RewardError"] for e in failed)
    assert all(e.task.endswith("1") for e in failed)


def test_a_non_finite_loss_stops_the_run_and_saves_nothing_of_it(tmp_path, monkeypatch):
    monkeypatch.setattr(
        ModelLearner, "loss", lambda self, batch, d: self.model.embed.weight.sum() * np.nan
    )
    with pytest.raises(RunError, match=r"step 1: loss nan .* checkpoint is of step 0"):
        run_within(tiny(tmp_path))
    checkpoint = sinks.load_checkpoint(tmp_path)
    assert checkpoint["progress"]["step"] == 0
    assert all(torch.isfinite(t).all() for t in checkpoint["learner"]["model"].values())
    assert not (tmp_path / "step_1").exists()


# -- resuming -------------------------------------------------------------------------------


def test_a_folder_without_its_checkpoint_is_refused_untouched(tmp_path):
    train(config_from_dict(tiny(tmp_path)))
    (tmp_path / "checkpoint.pt").unlink()
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(RunError, match=r"holds a run .* but no checkpoint\.pt"):
        train(config_from_dict(tiny(tmp_path, run__steps=3)))
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before


@pytest.mark.parametrize(
    ("key", "value"),
    [("dispatch__group_size", 3), ("run__seed", 7), ("train__learning_rate", 0.5)],
)
def test_a_changed_setting_on_resume_is_refused_by_name(tmp_path, key, value):
    train(config_from_dict(tiny(tmp_path)))
    written = (tmp_path / "config.toml").read_text()
    with pytest.raises(ConfigError, match=rf"{key.replace('__', '.')} .* -> {value!r}"):
        train(config_from_dict(tiny(tmp_path, run__steps=3, **{key: value})))
    assert (tmp_path / "config.toml").read_text() == written


def test_what_may_change_does_and_a_finished_run_is_left_as_it_is(tmp_path):
    train(config_from_dict(tiny(tmp_path)))
    metrics = (tmp_path / "metrics.jsonl").read_bytes()
    again = train(config_from_dict(tiny(tmp_path)))  # finished: nothing to do
    assert (again.first_step, again.last_step) == (2, 2)
    assert (tmp_path / "metrics.jsonl").read_bytes() == metrics
    longer = train(config_from_dict(tiny(tmp_path, run__steps=3, monitor__samples_per_step=2)))
    assert (longer.first_step, longer.last_step) == (2, 3)
    lines = sinks.read_metrics(tmp_path)
    assert [m["step"] for m in lines if not m.get("final")] == [1, 2, 3]
    assert [m.get("final", False) for m in lines].count(True) == 1 and lines[-1]["final"]


def test_a_second_train_on_a_folder_in_use_is_refused(tmp_path):
    tmp_path.mkdir(exist_ok=True)
    with (tmp_path / ".lock").open("a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(RunError, match="in use by another callgrove train"):
            train(config_from_dict(tiny(tmp_path)))
    assert not (tmp_path / "checkpoint.pt").exists()


# -- checkpoints are data -------------------------------------------------------------------


class RunsCode:
    """Unpickled, it would create `marker`: what a crafted checkpoint could do instead."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (self.marker.touch, ())


def test_a_checkpoint_that_would_run_code_is_refused_unrun(tmp_path):
    train(config_from_dict(tiny(tmp_path)))
    checkpoint = sinks.load_checkpoint(tmp_path)
    marker = tmp_path.parent / f"{tmp_path.name}-ran"
    checkpoint["progress"] = RunsCode(marker)
    torch.save(checkpoint, tmp_path / "checkpoint.pt")
    with pytest.raises(RunError, match="cannot be read as a checkpoint"):
        train(config_from_dict(tiny(tmp_path, run__steps=3)))
    assert not marker.exists()


# -- messages, not tracebacks ---------------------------------------------------------------


def cli(args: list[str]):
    result = CliRunner().invoke(app, ["train", *map(str, args), "--quiet"])
    output = result.output + (result.stderr if result.stderr_bytes is not None else "")
    # An exception other than the exit would be a traceback in a terminal.
    assert result.exception is None or isinstance(result.exception, SystemExit), output
    return result.exit_code, output


def write(tmp_path: Path, raw: dict) -> Path:
    path = tmp_path / "c.toml"
    path.write_text(
        "\n".join(
            f"[{section}]\n" + "\n".join(f"{k} = {json.dumps(v)}" for k, v in values.items())
            for section, values in raw.items()
            if section != "env" or not values.get("options")
        )
        + f'\n[env]\nname = "{raw["env"]["name"]}"\n'
    )
    return path


def _corrupt(out: Path) -> None:
    (out / "checkpoint.pt").write_bytes(b"\x00not a checkpoint")


def _other_model(out: Path) -> None:
    checkpoint = sinks.load_checkpoint(out)
    checkpoint["learner"]["model"] = {"embed.weight": torch.zeros(3, 3)}
    torch.save(checkpoint, out / "checkpoint.pt")


def _junk_metrics(out: Path) -> None:
    with (out / "metrics.jsonl").open("a") as stream:
        stream.write("oops, not json\n")


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"env__name": "no_such_module_here:Env"}, r"cannot import no_such_module_here"),
        ({"env__name": f"{HERE}:Missing"}, r"has no Missing"),
        ({"env__name": "nope"}, r"unknown environment 'nope'"),
        ({"env__name": f"{HERE}:refuses_to_build"}, r"RuntimeError: licence server down"),
        ({"model__name": "Qwen/Qwen2-0.5B"}, r"hub ids .* are not fetched"),
        ({"model__name": "hf:/no/such/model"}, r"neither a checkpoint folder"),
        ({"model__n_heads": 3}, r"heads of even width"),
        ({"algorithm__scope": "galaxy"}, r"scope must be one of"),
    ],
)
def test_bad_settings_are_messages(tmp_path, setting, message):
    code, output = cli([write(tmp_path, tiny(tmp_path / "run", **setting))])
    assert code == 2 and "error:" in output
    assert re.search(message, " ".join(output.split())), output


def test_options_the_environment_rejects_are_a_message(tmp_path):
    code, output = cli(
        [write(tmp_path, tiny(tmp_path / "run")), "--set", "env.options={ colour = 1 }"]
    )
    assert code == 2 and "could not be built: TypeError" in output and "colour" in output


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (_corrupt, "cannot be read as a checkpoint"),
        (_other_model, "its learner does not fit this run"),
        (_junk_metrics, "metrics.jsonl line 3: not a metrics record"),
    ],
)
def test_a_damaged_run_folder_is_a_message(tmp_path, damage, message):
    out = tmp_path / "run"
    config = write(tmp_path, tiny(out, run__steps=1))
    assert cli([config])[0] == 0
    damage(out)
    code, output = cli([config, "--steps", "2"])
    assert code == 1 and message in " ".join(output.split()), output


def test_an_out_folder_that_is_a_file_or_unwritable_is_a_message(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("x")
    code, output = cli([write(tmp_path, tiny(tmp_path / "file"))])
    assert code == 1 and "a file is in the way" in output
    real_open = Path.open

    def refuse_lock(self, *args, **kwargs):
        if self.name == ".lock":
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", refuse_lock)
    code, output = cli([write(tmp_path, tiny(tmp_path / "run"))])
    assert code == 1 and "cannot write there (Permission denied)" in output


def test_a_full_disk_is_a_message(tmp_path, monkeypatch):
    def full(out, state):
        raise OSError(errno.ENOSPC, "No space left on device", str(out / "checkpoint.pt"))

    monkeypatch.setattr(sinks, "save_checkpoint", full)
    code, output = cli([write(tmp_path, tiny(tmp_path / "run"))])
    assert code == 1 and "checkpoint.pt: No space left on device" in " ".join(output.split())


# `callgrove train` where importing torch fails as it does when torch is not installed.
WITHOUT_TORCH = """
import sys
sys.modules["torch"] = None
from callgrove.cli import main
sys.argv = ["callgrove", "train", "--steps", "1", "--out", sys.argv[1], "--quiet"]
main()
"""


def test_train_without_torch_names_the_extra(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_TORCH, str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert "pip install 'callgrove[train]'" in done.stderr and "Traceback" not in done.stderr


def test_a_runner_failing_outside_its_episode_stops_the_run(tmp_path, monkeypatch):
    async def broken(self, episode, task):
        raise ConnectionResetError("worker lost")

    monkeypatch.setattr(Dispatcher, "_run_here", broken)
    with pytest.raises(RunError, match="generation failed: ConnectionResetError: worker lost"):
        run_within(tiny(tmp_path), seconds=30)

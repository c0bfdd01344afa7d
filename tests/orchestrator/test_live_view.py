"""The training view: the live progress line (loss, elapsed, ETA, staleness said in words),
the live view in a real terminal (tmux), and the plot's title and panels."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from callgrove.orchestrator import monitors

SRC = str(Path(monitors.__file__).resolve().parents[2])  # the callgrove these tests import
METRICS = {
    "train/loss": 0.01234,
    "train/all/leader/reward/mean": 0.5,
    "train/all/helper/reward/mean": 0.25,
    "throughput/tokens_per_s": 1234.0,
    "off_policy/mean": 1.0,
    "off_policy/max": 2.0,
    "train/mismatch/all/mean_abs": 0.001,
}


def test_progress_line_has_loss_elapsed_eta_and_explained_staleness():
    line = monitors.progress_line(10, 80, METRICS, 3, elapsed_s=100.0, steps_done=10)
    assert line.startswith("step 10/80  loss 0.01234  reward helper 0.25  leader 0.50")
    assert "elapsed 1:40" in line and "ETA 11:40" in line  # 70 steps at 10 s each
    assert "calls 1.00 versions behind (max 2)" in line and "stale" not in line
    assert "tok/s 1234" in line and "in flight 3" in line


def test_the_eta_is_paced_by_this_sessions_steps():
    """A resumed run (steps 1..40 done before) paces its ETA by the steps it took itself."""
    line = monitors.progress_line(50, 80, METRICS, 0, elapsed_s=100.0, steps_done=10)
    assert "ETA 5:00" in line


def test_clock():
    assert [monitors.clock(s) for s in (0, 59.6, 61, 3600, 3725)] == [
        "0:00",
        "1:00",
        "1:01",
        "1:00:00",
        "1:02:05",
    ]


def test_live_display_prints_the_line_without_a_terminal():
    console = Console(record=True, force_terminal=False, width=300)
    display = monitors.LiveDisplay(console, 80, enabled=True, first_step=40)
    display.update(41, METRICS, 2)
    text = console.export_text()
    assert text.startswith("step 41/80  loss 0.01234") and "ETA" in text


LIVE_SCRIPT = """
import time
from rich.console import Console
from callgrove.orchestrator import monitors
metrics = {METRICS!r}
display = monitors.LiveDisplay(Console(), 5, enabled=True)
for step in range(1, 4):
    display.update(step, metrics, 1)
    time.sleep(0.2)
display.close()
time.sleep(30)
"""


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_live_view_in_a_terminal(tmp_path):
    """What a user sees in a real terminal: the seats table, the progress line in its caption,
    and what "versions behind" means."""
    script = tmp_path / "live.py"
    script.write_text(LIVE_SCRIPT.format(METRICS=METRICS))
    session = f"callgrove-live-{os.getpid()}"
    env = f"PYTHONPATH={SRC}"
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", session, "-x", "220", "-y", "40",
         f"env {env} {sys.executable} {script}"],
        check=True,
    )  # fmt: skip
    try:
        screen = ""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "step 3/5" not in screen:
            time.sleep(0.5)
            screen = subprocess.run(
                ["tmux", "capture-pane", "-p", "-t", session], capture_output=True, text=True
            ).stdout
        assert "callgrove train · step 3/5" in screen, screen
        assert "loss 0.01234" in screen and "elapsed" in screen and "ETA" in screen
        assert "versions behind: policy versions between the weights that sampled" in screen
        assert "leader" in screen and "helper" in screen
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], check=False)


def _lines(steps: int) -> list[dict]:
    return [
        {
            "step": step,
            **METRICS,
            "train/all/leader/tokens/mean": 40.0 + step,
            "train/all/helper/tokens/mean": 10.0,
            "train/all/leader/surprisal/mean": 1.5,
            "train/grad_norm": 0.5,
            "train/clip_fraction": 0.1,
            "train/forwarded_token_ratio": 1.8,
        }
        for step in range(1, steps + 1)
    ]


def test_plot_panels_are_what_the_metrics_hold():
    names = {panel[0]: series for panel, series in monitors.plotted_panels(_lines(4))}
    assert list(names) == [
        "reward",
        "loss",
        "entropy and sampler/learner mismatch",
        "clip fraction",
        "gradient norm",
        "completion length per seat",
        "throughput",
        "staleness",
    ]
    assert [label for label, _s, _v in names["completion length per seat"]] == ["helper", "leader"]
    leader = next(v for label, _s, v in names["completion length per seat"] if label == "leader")
    assert leader == (41.0, 42.0, 43.0, 44.0)
    without = [{k: v for k, v in m.items() if k != "train/clip_fraction"} for m in _lines(3)]
    assert "clip fraction" not in {panel[0] for panel, _ in monitors.plotted_panels(without)}


def test_plot_is_written_with_the_runs_title(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    import matplotlib.figure

    titles = []
    original = matplotlib.figure.Figure.suptitle
    monkeypatch.setattr(
        matplotlib.figure.Figure,
        "suptitle",
        lambda self, text, **kw: titles.append(text) or original(self, text, **kw),
    )
    path = monitors.plot_run(_lines(6), tmp_path / "rewards.png", "callgrove train · relay")
    assert path.read_bytes().startswith(b"\x89PNG")
    assert titles == ["callgrove train · relay · 6 steps"]


def test_the_live_line_says_where_the_step_went():
    timed = {
        **METRICS,
        "time/step_s": 2.0,
        "time/sampling_s": 1.25,
        "time/forward_backward_s": 0.5,
        "time/optimizer_s": 0.1,
        "time/credit_s": 0.001,  # under 1% of the step: left out
    }
    line = monitors.progress_line(10, 80, timed, 3, elapsed_s=100.0, steps_done=10)
    assert line.endswith("step 2.00s = sampling 1.25 + fwd+bwd 0.50 + optimizer 0.10")
    assert "credit" not in line
    assert "step " not in monitors.progress_line(10, 80, METRICS, 3, 100.0, 10).split("  ")[-1]


def test_scoring_is_the_environments_own_time_within_the_wait():
    from callgrove.episode import Episode
    from callgrove.orchestrator.step import PreparedStep

    def episode(seconds: float, policy_seconds: float) -> Episode:
        return Episode(id="e", meta={"seconds": seconds, "policy_seconds": policy_seconds})

    prepared = PreparedStep([], [], None, seconds={"credit": 0.25, "batching": 0.5})
    profile = monitors.step_profile(
        waited=3.0,
        episodes=[episode(2.0, 1.5), episode(1.0, 0.25)],
        prepared=prepared,
        learner={"batching": 0.125, "forward_backward": 1.0, "optimizer": 0.5},
        train=1.75,
        weight_push=0.0625,
        evaluation=0.0,
        write=0.03125,
    )
    assert profile["time/scoring_s"] == 1.25 and profile["time/sampling_s"] == 1.75
    assert profile["time/batching_s"] == 0.625 and profile["time/credit_s"] == 0.25
    # More environment time than the wait (episodes that ran during the last step): capped.
    capped = monitors.step_profile(
        waited=0.5,
        episodes=[episode(2.0, 0.0)],
        prepared=prepared,
        learner={},
        train=1.75,
        weight_push=0.0,
        evaluation=0.0,
        write=0.0,
    )
    assert (capped["time/scoring_s"], capped["time/sampling_s"]) == (0.5, 0.0)
    assert capped["time/forward_backward_s"] == 1.75  # a learner that reports no phases

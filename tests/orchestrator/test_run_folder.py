"""A run folder holding what the run did not write, or a checkpoint damaged in part, is one
line naming what is wrong (exit 1) before anything is written; what is not in the run's way
is left alone."""

from __future__ import annotations

import pytest
import torch

from callgrove.orchestrator import sinks

from .test_trust import cli, tiny, write


def started(tmp_path, steps: int = 1):
    """A finished run of `steps` steps, and its config."""
    out = tmp_path / "run"
    config = write(tmp_path, tiny(out, run__steps=steps))
    assert cli([config])[0] == 0
    return out, config


def files_of(out):
    return {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".lock"}


def test_a_stray_file_named_like_a_later_step_is_named_before_anything_is_written(tmp_path):
    out, config = started(tmp_path)
    (out / "step_3").write_text("notes\n")
    before = files_of(out)
    code, output = cli([config, "--steps", "4"])
    assert code == 1 and "Traceback" not in output, output
    assert "a file step_3 where the run writes step 3's folder" in " ".join(output.split())
    assert files_of(out) == before


def test_stray_files_out_of_the_runs_way_are_left_alone(tmp_path):
    out, config = started(tmp_path)
    (out / "step_9").write_text("notes\n")
    (out / "step_old").mkdir()
    code, output = cli([config, "--steps", "2"])
    assert code == 0, output
    assert (out / "step_9").read_text() == "notes\n" and (out / "step_old").is_dir()
    assert (out / "step_2" / "train" / "traces.jsonl").exists()


@pytest.mark.parametrize(
    ("name", "kind"), [("unused", "file"), ("metrics.jsonl", "folder"), ("rewards.png", "folder")]
)
def test_an_entry_of_the_wrong_kind_where_the_run_writes_is_named(tmp_path, name, kind):
    out, config = started(tmp_path)
    target = out / name
    if target.is_dir():
        for path in sorted(target.rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
        target.rmdir()
    elif target.exists():
        target.unlink()
    target.mkdir() if kind == "folder" else target.write_text("x")
    code, output = cli([config, "--steps", "2"])
    assert code == 1 and "Traceback" not in output, output
    assert f"a {kind} {name} where the run writes" in " ".join(output.split()), output


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda c: c["progress"].pop("step"), "its progress is damaged"),
        (lambda c: c["progress"].update(step=-2), "its progress is damaged"),
        (lambda c: c["progress"].update(pending=["g0"]), "its progress is damaged"),
        (lambda c: c.update(config="oops"), "its config is damaged"),
    ],
)
def test_a_checkpoint_damaged_in_part_is_one_line(tmp_path, damage, message):
    out, config = started(tmp_path)
    checkpoint = sinks.load_checkpoint(out)
    damage(checkpoint)
    torch.save(checkpoint, out / "checkpoint.pt")
    before = files_of(out)
    code, output = cli([config, "--steps", "2"])
    assert code == 1 and "Traceback" not in output, output
    assert message in " ".join(output.split()), output
    assert files_of(out) == before

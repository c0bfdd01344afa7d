"""The learner as ranks of torch.distributed (FSDP2 over gloo): a 2-rank step is the 1-process
step (float64, within 1e-6), a checkpoint moves between world sizes, and a rank that dies or
fails alone stops the learner with an error naming it, nothing left running or waiting."""

from __future__ import annotations

import io
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import replace
from functools import partial
from pathlib import Path

import msgspec
import numpy as np
import psutil
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from callgrove.batch import Sample
from callgrove.batch.packing import deal
from callgrove.batch.tree import trie_nodes
from callgrove.train.ranks import RankedLearner, RankFailed
from callgrove.train.settings import LearnerSettings
from orchestrator.train_process import account, finish, start, steps_done, write_config

from . import ranked_builds
from .ranked_builds import step_samples

pytestmark = pytest.mark.processes

TIMEOUT_S = 60.0  # every collective, and every start
TOLERANCE = 1e-6

KINDS = {
    "tiny tree-packed": (ranked_builds.tiny, LearnerSettings(learning_rate=1e-2)),
    "tiny tree scope step": (
        ranked_builds.tiny,
        LearnerSettings(learning_rate=1e-2, tree_scope="step", seq_len=300),
    ),
    "tiny packed": (
        ranked_builds.tiny,
        LearnerSettings(learning_rate=1e-2, batching="packed", seq_len=256),
    ),
    "hf full tree-packed": (
        partial(ranked_builds.hf, False),
        LearnerSettings(learning_rate=1e-2, normalisation="sequence"),
    ),
    "hf lora packed": (
        partial(ranked_builds.hf, True),
        LearnerSettings(learning_rate=1e-2, batching="packed", seq_len=256),
    ),
}


def at(settings: LearnerSettings, world_size: int) -> LearnerSettings:
    return msgspec.structs.replace(settings, world_size=world_size)


def ranked(build, settings: LearnerSettings) -> RankedLearner:
    """Two ranks; the forkserver they come from imports the Hugging Face modules once."""
    return RankedLearner(
        build, at(settings, 2), timeout_s=TIMEOUT_S, preload=["transformers.modeling_utils", "peft"]
    )


def through_a_file(state: dict) -> dict:
    """A state as a checkpoint keeps it: saved, and read back as data."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def assert_same_weights(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for name, value in want.items():
        assert got[name].dtype == torch.float64
        error = float((got[name] - value).abs().max()) if value.numel() else 0.0
        assert error <= TOLERANCE, f"{name} differs by {error}"


def assert_gone(pids: list[int]) -> None:
    """No rank process is left (a zombie its starter has not reaped yet counts as gone)."""
    deadline = time.monotonic() + 10
    left = pids
    while left and time.monotonic() < deadline:
        left = [p for p in pids if _running(p)]
        time.sleep(0.05)
    assert not left, f"rank processes still running: {left}"


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize(
    "kind", [pytest.param(kind, marks=[pytest.mark.hf] if "hf" in kind else []) for kind in KINDS]
)
def test_two_ranks_step_as_one_process_and_checkpoints_move_between_world_sizes(kind):
    """Step A on 1 process and on 2 ranks: the same parameters and the same report (loss,
    gradient norm, every mismatch metric per seat, clip fraction, tokens). Then 2 -> 1: a
    process loads the ranks' state and takes step B; 1 -> 2: the ranks load the process's
    state after B and take step C; both equal the uninterrupted process's."""
    build, base = KINDS[kind]
    a, b, c = step_samples(0), step_samples(100), step_samples(200)
    one = build(base)
    ranks = ranked(build, base)
    pids = ranks.pids
    try:
        assert_same_weights(ranks.weights(), one.weights())  # every rank built the same model
        want, got = one.train_step(a), ranks.train_step(a)
        assert_same_weights(ranks.weights(), one.weights())
        assert got.loss == pytest.approx(want.loss, rel=1e-9)
        assert got.grad_norm == pytest.approx(want.grad_norm, rel=1e-9)
        assert (got.samples, got.loss_tokens, got.row_tokens) == (
            want.samples,
            want.loss_tokens,
            want.row_tokens,
        )
        if base.tree_scope != "step":  # whole tries on each rank: the same nodes forwarded
            assert got.forwarded_tokens == want.forwarded_tokens
        assert got.mismatch.keys() == want.mismatch.keys()
        assert {k.split("/")[0] for k in got.mismatch} >= {"all", "on_policy", "leader"}
        for key, value in want.mismatch.items():
            assert got.mismatch[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
        assert got.extra["clip_fraction"] == want.extra["clip_fraction"]
        assert ranks.version == one.version == 1

        # Other initial weights, which the state must replace (with LoRA it holds the adapters
        # alone: the frozen base is the model's files, the same for every seed).
        resumed = build(base, seed=0 if "lora" in kind else 7)
        resumed.load_state_dict(through_a_file(ranks.state_dict()))
        one.train_step(b)
        resumed.train_step(b)
        assert_same_weights(resumed.weights(), one.weights())

        ranks.load_state_dict(through_a_file(one.state_dict()))
        assert ranks.version == 2
        one.train_step(c)
        ranks.train_step(c)
        assert_same_weights(ranks.weights(), one.weights())
        assert ranks.version == 3
    finally:
        ranks.close()
    assert_gone(pids)


def test_a_rank_killed_during_steps_stops_the_learner_with_an_error_naming_it():
    build, base = KINDS["tiny tree-packed"]
    samples = step_samples(0, groups=4)
    ranks = ranked(build, base)
    pids = ranks.pids
    killer = threading.Timer(1.0, psutil.Process(pids[1]).send_signal, [signal.SIGKILL])
    started = time.monotonic()
    killer.start()
    try:
        with pytest.raises(RankFailed) as failed:
            while time.monotonic() - started < TIMEOUT_S:
                ranks.train_step(samples)
    finally:
        killer.cancel()
    assert time.monotonic() - started < 20  # at once: not a collective's timeout later
    assert re.fullmatch(
        rf"learner rank 1 of 2 \(pid {pids[1]}\) was killed by SIGKILL during train_step; "
        "its other ranks were stopped",
        str(failed.value),
    )
    assert_gone(pids)
    with pytest.raises(RankFailed, match="the learner stopped earlier: learner rank 1 of 2"):
        ranks.weights()


def test_an_error_in_one_rank_alone_stops_the_learner_at_once():
    """One rank's share lacks advantages (its loss refuses it) while the other waits for it in
    a collective: the learner raises the rank's own error at once and stops both ranks."""
    build, base = KINDS["tiny tree-packed"]
    samples = step_samples(0, groups=2)
    uncredited = samples[0].group
    samples = [s if s.group != uncredited else replace(s, advantages=None) for s in samples]
    ranks = ranked(build, base)
    pids = ranks.pids
    started = time.monotonic()
    with pytest.raises(ValueError, match=r"^learner rank [01]: policy loss needs \['advantages'\]"):
        ranks.train_step(samples)
    assert time.monotonic() - started < 20
    assert_gone(pids)


def test_a_rank_that_cannot_start_is_named_and_none_is_left():
    build, base = KINDS["tiny tree-packed"]
    with pytest.raises(ValueError, match=r"^learner rank [01]: .*hidden size"):
        ranked(partial(_unbuildable, build), base)
    assert not [p for p in learner_ranks(os.getpid()) if _running(p.pid)]


def _unbuildable(build, settings: LearnerSettings):
    raise ValueError("hidden size 7 does not split into 2 heads")


def test_a_step_whose_loss_is_not_finite_is_refused_by_every_rank_and_the_learner_goes_on():
    build, base = KINDS["tiny tree-packed"]
    samples = step_samples(0, groups=2)
    poisoned = [replace(s, advantages=np.full_like(s.advantages, np.nan)) for s in samples]
    ranks = ranked(build, base)
    try:
        before = ranks.weights()
        with pytest.raises(FloatingPointError, match="not both finite: no optimizer step taken"):
            ranks.train_step(poisoned)
        assert_same_weights(ranks.weights(), before)
        assert ranks.version == 0  # as one process: a refused step is no step
        ranks.train_step(samples)  # the ranks are still in step
        assert ranks.version == 1
    finally:
        ranks.close()


def test_a_run_whose_rank_is_killed_stops_naming_it_and_the_same_command_resumes(tmp_path):
    """`callgrove train` with `world_size = 2`: a rank killed after step 2 ends the run with
    exit 1 and one error naming the rank, no traceback; the same command (here with the
    learner in one process) then finishes the run, every group, episode and call trained
    exactly once."""
    steps = 4
    out = tmp_path / "run"
    config = write_config(tmp_path / "c.toml", out, steps, "[train]\nworld_size = 2")
    process = start(config, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 240
        while steps_done(out) < 2 and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        ranks = learner_ranks(process.pid)
        assert len(ranks) == 2
        rank = ranks[0]
        rank.send_signal(signal.SIGKILL)
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    message = " ".join(stderr.decode().split())
    assert process.returncode == 1, message
    assert "Traceback" not in message
    assert re.search(
        rf"error: learner rank [01] of 2 \(pid {rank.pid}\) was killed by SIGKILL during "
        r"(train_step|weights|state_dict); its other ranks were stopped$",
        message,
    ), message
    assert steps_done(out) < steps
    assert_gone([p.pid for p in ranks])
    finish(config, "--set", "train.world_size=1")  # the ranks' checkpoint, in one process
    result = account(out, steps)
    for kind in ("episodes", "groups", "calls"):
        assert set(result[kind].values()) == {1}, f"{kind} trained twice"
    assert len(result["groups"]) == steps * 2  # groups_per_step, every step full


def learner_ranks(pid: int) -> list[psutil.Process]:
    """The learner's rank processes under process `pid` (the forkserver's children)."""
    for child in psutil.Process(pid).children(recursive=True):
        try:
            if "multiprocessing.forkserver" in " ".join(child.cmdline()):
                return child.children()
        except psutil.NoSuchProcess:  # a short-lived helper, gone meanwhile
            continue
    return []


# A process holding a learner of two ranks, which it names, until it is killed.
DRIVER = """
import sys, time
sys.path.insert(0, {tests!r})
from train import ranked_builds
from callgrove.train.ranks import RankedLearner
from callgrove.train.settings import LearnerSettings
learner = RankedLearner(ranked_builds.tiny, LearnerSettings(world_size=2), timeout_s=60)
print(*learner.pids, flush=True)
time.sleep(600)
"""


def test_the_ranks_and_their_forkserver_end_when_their_driver_is_killed():
    program = DRIVER.format(tests=str(Path(__file__).resolve().parents[1]))
    driver = subprocess.Popen([sys.executable, "-c", program], stdout=subprocess.PIPE)
    watchdog = threading.Timer(240, driver.kill)
    watchdog.start()
    try:
        ranks = [int(pid) for pid in driver.stdout.readline().split()]
        forkservers = [p.pid for p in psutil.Process(driver.pid).children() if p.pid not in ranks]
        driver.send_signal(signal.SIGKILL)
        driver.wait(10)
    finally:
        watchdog.cancel()
        driver.kill()
    assert len(ranks) == 2
    assert_gone(ranks + forkservers)


def test_world_size_is_checked_with_the_settings():
    with pytest.raises(ValueError, match="world_size must be >= 1, not 0"):
        LearnerSettings(world_size=0)


@settings(max_examples=40, deadline=None)
@given(
    scope=st.sampled_from(["tree", "episode", "group", "step", "packed"]),
    groups=st.integers(1, 4),
    ranks=st.integers(1, 5),
)
def test_dealing_keeps_units_whole_and_ranks_balanced(scope, groups, ranks):
    samples = _dealt_samples(groups)
    if scope == "packed":
        dealt = deal(samples, ranks, batching="packed", tree_scope="group")
    else:
        dealt = deal(samples, ranks, batching="tree", tree_scope=scope)
    assert len(dealt) == ranks
    assert sorted(np.concatenate(dealt).tolist()) == list(range(len(samples)))
    unit = _unit_of(scope)
    owner = {}
    for rank, indices in enumerate(dealt):
        for i in indices.tolist():
            assert owner.setdefault(unit(samples[i]), rank) == rank, "a unit split across ranks"
    loads = [_forwarded([samples[i] for i in indices], scope, unit) for indices in dealt]
    heaviest = max(
        _forwarded([s for s in samples if unit(s) == u], scope, unit)
        for u in {unit(s) for s in samples}
    )
    assert max(loads) - min(loads) <= heaviest


def _unit_of(scope: str):
    if scope == "packed":
        return lambda s: (s.episode, s.row)
    if scope == "tree":
        return lambda s: (s.episode, s.root)
    if scope == "episode":
        return lambda s: s.episode
    return lambda s: s.group


def _forwarded(samples: list[Sample], scope: str, unit) -> int:
    units = Counter(unit(s) for s in samples)
    return sum(trie_nodes([s.token_ids for s in samples if unit(s) == u]) for u in units)


_SAMPLES: dict[int, list[Sample]] = {}


def _dealt_samples(groups: int) -> list[Sample]:
    if groups not in _SAMPLES:
        _SAMPLES[groups] = step_samples(10 * groups, groups)
    return _SAMPLES[groups]

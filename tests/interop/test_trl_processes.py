"""`SamplesGRPOTrainer.train()` on two processes (torch.distributed over gloo, on CPU) moves the
weights exactly as on one process over the same global batch, and a pass trains every sample
once, a remainder in a last, smaller generation batch.

TRL's `dapo` divides each process's loss by `num_items_in_batch / num_processes` and data
parallelism averages the gradients, so the count must be the global one. With each process's
own count, the two-process update here was 2.0x the one-process one (2.10x on another split).
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

import pytest
import torch

from callgrove.interop.trl import OncePerPass

from .reference_loss import Clip, clipped_share, reference_loss
from .trainer_samples import plain_copy, reference_model
from .trl_ranks import LEARNING_RATE, SEED, Run, login_samples, train_pass

pytestmark = pytest.mark.hf

TOLERANCE = 1e-5
TIMEOUT_S = 300
SCRIPT = Path(__file__).with_name("trl_ranks.py")
TESTS = Path(__file__).resolve().parents[1]
CLIP = Clip(clip_low=0.2, clip_high=0.25)  # trl_ranks.grpo_config's epsilon and epsilon_high
# One generation batch (one optimizer step) of 20 samples, 10 on each process; and 20 samples
# in batches of 8, the last holding the remaining 4 and 4 rows without loss.
RUNS = {
    "dapo": Run("dapo", 20, 20, shuffle=True),
    "grpo": Run("grpo", 20, 20, shuffle=True),
    "bnpo": Run("bnpo", 20, 20, shuffle=True),
    "dapo_remainder": Run("dapo", 20, 8, shuffle=True),
}
EQUAL_ON_ANY_PROCESSES = ("dapo", "grpo", "dapo_remainder")


def free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch(runs: Iterable[Run], processes: int = 2) -> dict[str, dict[str, torch.Tensor]]:
    """Each run's parameter update, trained by `processes` processes of trl_ranks.py."""
    runs = list(runs)
    with tempfile.TemporaryDirectory() as scratch:
        output = Path(scratch) / "updates.pt"
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc_per_node={processes}",
            "--master_addr=127.0.0.1",
            f"--master_port={free_loopback_port()}",
            str(SCRIPT),
            str(output),
            *(run.name for run in runs),
        ]
        env = os.environ | {
            "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
            "GLOO_SOCKET_IFNAME": "lo",  # gloo's own interface choice need not be loopback
            "OMP_NUM_THREADS": "1",
        }
        # Its own session, so that the launcher and its workers end together, however it ends.
        launcher = subprocess.Popen(
            command,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            log, _ = launcher.communicate(timeout=TIMEOUT_S)
        finally:
            with contextlib.suppress(ProcessLookupError):  # none left: nothing to end
                os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
        if launcher.returncode != 0:
            raise AssertionError(f"{processes} processes failed:\n{log[-6000:]}")
        saved = torch.load(output)
    assert saved["processes"] == processes
    return saved["updates"]


@functools.cache
def one_process(run: Run) -> dict[str, torch.Tensor]:
    with tempfile.TemporaryDirectory() as scratch:
        return train_pass(run, 1, scratch)


def relative_difference(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    """The largest over parameters of |got - want| / max(|want|, |whole want|)."""
    whole = torch.cat([update.flatten() for update in want.values()]).norm()
    return max(
        float((got[name] - update).norm() / max(update.norm(), whole))
        for name, update in want.items()
    )


def measure_processes(names: Iterable[str] = EQUAL_ON_ANY_PROCESSES) -> float:
    """The largest relative difference of a two-process update from the one-process update over
    the same global batch, over the runs `names` (loss types whose update does not depend on
    how the batch is split)."""
    names = list(names)
    two = launch(RUNS[name] for name in names)
    return max(relative_difference(two[RUNS[n].name], one_process(RUNS[n])) for n in names)


@pytest.fixture(scope="module")
def two_processes() -> dict[str, dict[str, torch.Tensor]]:
    return launch(RUNS.values())


@pytest.mark.processes
@pytest.mark.parametrize("name", EQUAL_ON_ANY_PROCESSES)
def test_two_processes_update_the_weights_as_one_does(two_processes, name):
    run = RUNS[name]
    assert relative_difference(two_processes[run.name], one_process(run)) <= TOLERANCE


def generation_batches(run: Run) -> list[list[int]]:
    """The sample indices of each generation batch of `run`'s pass (fillers left out)."""
    fillers = -run.samples % run.generation_batch if run.loss_type == "dapo" else 0
    order = list(OncePerPass(run.samples, fillers, run.generation_batch, 1, run.shuffle, SEED))
    batches = [
        order[i : i + run.generation_batch] for i in range(0, len(order), run.generation_batch)
    ]
    return [[index for index in batch if index < run.samples] for batch in batches]


def sgd_on_the_reference(batches: list[list[int]], parts: int = 1) -> dict[str, torch.Tensor]:
    """The update of plain SGD on the reference loss, one step per batch; with `parts`, each
    step's gradient is the mean of the token-normalised gradients of the batch's `parts` equal
    slices (what `bnpo` on that many processes takes)."""
    samples = login_samples(max(i for batch in batches for i in batch) + 1)
    model = plain_copy(reference_model(torch.float64))
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    first = [samples[i] for i in batches[0]]
    assert 0 < clipped_share(model, first, CLIP) < 1  # clipping is compared, not only the ratio
    for batch in batches:
        model.zero_grad()
        width = len(batch) // parts
        for part in range(parts):
            chosen = [samples[i] for i in batch[part * width : (part + 1) * width]]
            (reference_loss(model, chosen, CLIP) / parts).backward()
        with torch.no_grad():
            for parameter in model.parameters():
                parameter -= LEARNING_RATE * parameter.grad
    return {name: p.detach() - before[name] for name, p in model.named_parameters()}


def test_a_pass_trains_every_sample_once_the_remainder_in_a_last_smaller_batch():
    run = RUNS["dapo_remainder"]
    batches = generation_batches(run)
    assert [len(batch) for batch in batches] == [8, 8, 4]
    assert sorted(i for batch in batches for i in batch) == list(range(run.samples))
    got = one_process(run)
    assert relative_difference(got, sgd_on_the_reference(batches)) <= TOLERANCE


@pytest.mark.processes
def test_bnpo_on_two_processes_normalises_each_process_batch_by_its_own_tokens(two_processes):
    """TRL's `bnpo` divides each process's micro-batch by its own trained tokens: its update
    depends on how the batch is split (docs/trainers-trl.md), unlike `dapo`'s and `grpo`'s."""
    run = RUNS["bnpo"]
    got = two_processes[run.name]
    assert relative_difference(got, sgd_on_the_reference(generation_batches(run), parts=2)) <= (
        TOLERANCE
    )
    assert relative_difference(got, one_process(run)) > 1e-3

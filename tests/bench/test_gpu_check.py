"""`benchmarks/gpu_check.py`, the learner's GPU check, runs whole on a CPU with `--tiny` and
prints its one table; its samples are the harness episodes it names."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

pytestmark = [pytest.mark.processes, pytest.mark.hf]
TINY_ON_A_CPU = ("--tiny", "--device", "cpu", "--groups", "1", "--threads", "1")


def test_the_gpu_check_runs_on_a_cpu_and_prints_its_table():
    done = subprocess.run(
        [sys.executable, "benchmarks/gpu_check.py", *TINY_ON_A_CPU],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    paths = ["one process, row-wise", "one process, tree-packed", "FSDP2, 1 rank, tree-packed"]
    table = {line.split("  ")[0]: line.split() for line in lines if line.startswith(tuple(paths))}
    assert list(table) == paths
    losses = [float(row[-1]) for row in table.values()]
    # Every path's first step, from the same weights, each batching the rows its own way.
    assert max(losses) - min(losses) <= 1e-5 * max(abs(loss) for loss in losses)
    row_wise, tree = table["one process, row-wise"], table["one process, tree-packed"]
    assert int(tree[4]) < int(row_wise[4])  # forwarded tokens
    assert any(line.startswith("tree-packed vs row-wise: ") for line in lines)
    assert any(line.startswith("FSDP2 weights gathered for a sampler: ") for line in lines)


def test_its_samples_are_the_recorded_harness_groups():
    from gpu_check import harness_samples

    samples = harness_samples(groups=1)
    assert len(samples) == 4  # a group of 2 episodes from each harness, one row each
    assert len({s.group for s in samples}) == 2
    assert min(s.num_tokens for s in samples) > 30_000
    assert all(s.advantages is not None and s.logprobs is not None for s in samples)
